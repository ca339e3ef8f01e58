// checkpoint: activation checkpointing by replay in a nested, isolated backward pass.

#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/custom_gradient.hpp"

namespace riftco_transformer {
using detail::Node;

namespace {

// What one run of a checkpointed function read: the leaves requiring gradients reachable from
// its output, after checking that it captured nothing undeclared.
struct ReplayCheck {
    Shape shape;
    ExecutionBackend backend = ExecutionBackend::Cpu;
};

// Validates one run (the first, or a replay) of recompute; `replay_input` is the fresh leaf it
// was given and `first_serial` the first serial number the run could create.
ReplayCheck check_run(const Variable& output, const Variable& replay_input,
                      std::span<const Variable> dependencies, ExecutionBackend backend,
                      std::uint64_t first_serial, const char* phase) {
    const auto fail = [phase](const std::string& what) {
        throw std::logic_error(std::string("checkpoint (") + phase + "): " + what);
    };
    if (!output.defined())
        fail("recompute returned an empty Variable");
    if (!output.requires_gradient())
        fail("the output does not require gradients");
    if (output.backend() != backend) {
        fail(std::string("the output is on ") +
             std::string(execution_backend_name(output.backend())) + ", the input on " +
             std::string(execution_backend_name(backend)));
    }
    // Every declared dependency may be read; those still requiring gradients must be (a
    // dependency frozen after the forward pass is simply skipped, as in a plain graph).
    std::unordered_set<const Node*> declared;
    std::size_t required_dependencies = 0;
    for (const Variable& dependency : dependencies) {
        declared.insert(dependency.node().get());
        required_dependencies += dependency.requires_gradient() ? 1 : 0;
    }
    bool saw_input = false;
    std::unordered_set<const Node*> seen_dependencies;
    std::unordered_set<const Node*> visited{output.node().get()};
    std::vector<const Node*> stack{output.node().get()};
    while (!stack.empty()) {
        const Node* node = stack.back();
        stack.pop_back();
        if (node == replay_input.node().get()) {
            saw_input = true;
            continue;
        }
        if (declared.contains(node)) {
            seen_dependencies.insert(node);
            continue;
        }
        if (node->leaf) {
            fail(node->serial >= first_serial
                     ? "recompute created a differentiable leaf of its own; declare it as a "
                       "dependency (created outside) or make it a constant"
                     : "recompute read a differentiable leaf that is not a declared dependency");
        }
        if (node->serial < first_serial) {
            fail(std::string("recompute read a graph node created outside it ('") +
                 std::string(node->operation) + "') that it was not given");
        }
        for (const detail::Edge& edge : node->parents) {
            if (edge.node && edge.node->requires_gradient &&
                visited.insert(edge.node.get()).second) {
                stack.push_back(edge.node.get());
            }
        }
    }
    if (replay_input.requires_gradient() && !saw_input) {
        fail("the output does not depend on the input");
    }
    if (seen_dependencies.size() != required_dependencies) {
        fail("the output does not depend on every declared dependency");
    }
    return {output.shape(), output.backend()};
}

}  // namespace

Variable checkpoint(const Variable& input, std::span<const Variable> dependencies,
                    Recompute recompute) {
    constexpr std::string_view op = "checkpoint";
    if (!recompute) {
        throw std::invalid_argument("checkpoint: the recompute callable is empty");
    }
    const auto& input_node = detail::require_defined(input, op, "input");
    if (gradient_recording_disabled()) {
        // No graph is being recorded (NoGradientGuard): there is nothing to save or replay.
        return recompute(input);
    }
    const ExecutionBackend backend = input_node->value.backend();
    std::unordered_set<const Node*> unique;
    for (std::size_t i = 0; i < dependencies.size(); ++i) {
        const auto& node = detail::require_defined(dependencies[i], op, "dependency");
        std::ostringstream where;
        where << "checkpoint: dependency " << i;
        if (!node->leaf || !node->requires_gradient) {
            throw std::invalid_argument(where.str() + " is not a leaf that requires gradients");
        }
        if (!unique.insert(node.get()).second) {
            throw std::invalid_argument(where.str() + " is declared twice");
        }
        if (node->value.backend() != backend) {
            throw std::invalid_argument(where.str() + " is on another backend than the input");
        }
    }
    if (!input_node->requires_gradient && dependencies.empty()) {
        throw std::invalid_argument(
            "checkpoint: nothing is differentiable (the input does not require gradients and "
            "there are no dependencies)");
    }

    // First run: on a fresh leaf, so its internal graph can be checked and then dropped.
    const bool input_requires = input_node->requires_gradient;
    const std::uint64_t first_serial = detail::next_node_serial();
    const Variable first_input(input_node->value, input_requires);
    const Variable first_output = recompute(first_input);
    const ReplayCheck expected =
        check_run(first_output, first_input, dependencies, backend, first_serial, "first run");

    std::vector<Variable> parents;
    parents.reserve(dependencies.size() + 1);
    parents.push_back(input);
    parents.insert(parents.end(), dependencies.begin(), dependencies.end());
    std::vector<Variable> saved_dependencies(dependencies.begin(), dependencies.end());
    const Tensor saved_input = input_node->value;

    return detail::make_result(
        op, first_output.value(), parents,
        [recompute = std::move(recompute), saved_input, input_requires, saved_dependencies,
         expected, backend](const Tensor& g, std::span<const bool> needed) {
            const std::uint64_t replay_serial = detail::next_node_serial();
            const Variable replay_input(saved_input, input_requires);
            const Variable replay_output = recompute(replay_input);
            const ReplayCheck replayed = check_run(replay_output, replay_input, saved_dependencies,
                                                   backend, replay_serial, "replay");
            if (replayed.shape != expected.shape) {
                throw std::logic_error("checkpoint (replay): the output shape changed from " +
                                       shape_to_string(expected.shape) + " to " +
                                       shape_to_string(replayed.shape));
            }
            // A nested, isolated pass: nothing is published to the dependencies here; the outer
            // pass adds exactly these contributions.
            auto inner = detail::compute_leaf_gradients(replay_output.node(), g, false);
            std::vector<Tensor> gradients(needed.size());
            const auto take = [&inner](const Variable& leaf) {
                auto found = inner.find(leaf.node().get());
                return found == inner.end() ? Tensor() : std::move(found->second.gradient);
            };
            if (needed[0])
                gradients[0] = take(replay_input);
            for (std::size_t i = 0; i < saved_dependencies.size(); ++i) {
                if (needed[i + 1])
                    gradients[i + 1] = take(saved_dependencies[i]);
            }
            return gradients;
        });
}

}  // namespace riftco_transformer
