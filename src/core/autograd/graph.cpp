// Graph construction, the backward engine and graph destruction.

#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

namespace riftco_transformer::detail {

namespace {
thread_local bool recording_disabled = false;
}  // namespace

CounterCells& counter_cells() noexcept {
    static CounterCells cells;
    return cells;
}

std::uint64_t next_node_serial() noexcept {
    static std::atomic<std::uint64_t> serial{0};
    return ++serial;
}

Node::~Node() {
    // Release parents without recursion: a node whose last owner is this chain is taken
    // apart here, its own parents joining the work list, so a 100,000-op chain is freed in a
    // loop instead of 100,000 nested destructor calls.
    std::vector<std::shared_ptr<Node>> pending;
    for (Edge& edge : parents) {
        if (edge.node)
            pending.push_back(std::move(edge.node));
    }
    parents.clear();
    while (!pending.empty()) {
        std::shared_ptr<Node> node = std::move(pending.back());
        pending.pop_back();
        if (node.use_count() == 1) {
            for (Edge& edge : node->parents) {
                if (edge.node)
                    pending.push_back(std::move(edge.node));
            }
            node->parents.clear();
            node->backward = nullptr;  // a rule may hold the last handle on other nodes
        }
    }
}

const std::shared_ptr<Node>& require_defined(const Variable& variable, std::string_view operation,
                                             std::string_view argument) {
    if (!variable.defined()) {
        std::ostringstream message;
        message << operation << ": " << argument << " is an empty Variable";
        throw std::logic_error(message.str());
    }
    return variable.node();
}

namespace {

Variable make_result_from(std::string_view operation, Tensor value,
                          std::span<const Variable* const> inputs, BackwardRule rule) {
    bool any_requires = false;
    for (const Variable* input : inputs) {
        const auto& node = require_defined(*input, operation, "input");
        any_requires = any_requires || node->requires_gradient;
    }
    any_requires = any_requires && !recording_disabled;
    auto node = std::make_shared<Node>();
    node->value = std::move(value);
    node->serial = next_node_serial();
    node->operation = operation;
    if (!any_requires) {
        return Variable(std::move(node));  // a detached constant: no parents, no rule
    }
    node->requires_gradient = true;
    node->leaf = false;
    node->parents.reserve(inputs.size());
    for (const Variable* input : inputs) {
        const auto& parent = input->node();
        if (parent->requires_gradient) {
            node->parents.push_back({parent, parent->version});
        } else {
            node->parents.push_back({nullptr, 0});
        }
    }
    node->backward = std::move(rule);
    counter_cells().nodes_created.fetch_add(1, std::memory_order_relaxed);
    return Variable(std::move(node));
}

[[noreturn]] void throw_stale(const Node& child, const Node& parent) {
    std::ostringstream message;
    message << "backward: an input of '" << child.operation
            << "' changed after the forward pass (its version is " << parent.version
            << "); rebuild the graph from the current values";
    throw std::logic_error(message.str());
}

[[noreturn]] void throw_consumed(const Node& node) {
    std::ostringstream message;
    message << "backward: the graph through '" << node.operation
            << "' was already consumed by a backward pass; build a new graph (or pass "
               "BackwardOptions{.retain_graph = true} to the earlier pass)";
    throw std::logic_error(message.str());
}

// Nodes that can receive a gradient from `root`, children before parents (reverse postorder
// of an iterative DFS), after checking every edge's version and every node's rule. The
// returned handles keep each node alive until the pass has processed it.
std::vector<std::shared_ptr<Node>> backward_order(const std::shared_ptr<Node>& root) {
    std::vector<std::shared_ptr<Node>> postorder;
    std::unordered_set<const Node*> visited;
    // (node, index of the next parent to visit)
    std::vector<std::pair<std::shared_ptr<Node>, std::size_t>> stack;
    stack.emplace_back(root, 0);
    visited.insert(root.get());
    while (!stack.empty()) {
        Node& node = *stack.back().first;
        std::size_t& next = stack.back().second;
        if (next == 0 && !node.leaf && node.consumed) {
            throw_consumed(node);
        }
        if (next < node.parents.size()) {
            const Edge& edge = node.parents[next++];
            if (edge.node == nullptr || !edge.node->requires_gradient) {
                continue;
            }
            if (edge.node->version != edge.version) {
                throw_stale(node, *edge.node);
            }
            if (visited.insert(edge.node.get()).second) {
                stack.emplace_back(edge.node, 0);
            }
            continue;
        }
        postorder.push_back(std::move(stack.back().first));
        stack.pop_back();
    }
    return {std::make_move_iterator(postorder.rbegin()), std::make_move_iterator(postorder.rend())};
}

void validate_contribution(const Node& child, std::size_t index, const Node& parent,
                           const Tensor& gradient) {
    if (gradient.is_singular() || gradient.shape() != parent.value.shape() ||
        gradient.backend() != parent.value.backend()) {
        std::ostringstream message;
        message << "backward: the rule of '" << child.operation << "' returned for input " << index
                << " a gradient of "
                << (gradient.is_singular() ? std::string("no value")
                                           : "shape " + shape_to_string(gradient.shape()))
                << ", but the input has shape " << shape_to_string(parent.value.shape());
        if (!gradient.is_singular() && gradient.backend() != parent.value.backend()) {
            message << " (and lives on another backend)";
        }
        throw std::invalid_argument(message.str());
    }
}

}  // namespace

Variable make_result(std::string_view operation, Tensor value,
                     std::initializer_list<const Variable*> inputs, BackwardRule rule) {
    return make_result_from(operation, std::move(value),
                            std::span<const Variable* const>(inputs.begin(), inputs.size()),
                            std::move(rule));
}

Variable make_result(std::string_view operation, Tensor value, std::span<const Variable> inputs,
                     BackwardRule rule) {
    std::vector<const Variable*> pointers;
    pointers.reserve(inputs.size());
    for (const Variable& input : inputs)
        pointers.push_back(&input);
    return make_result_from(operation, std::move(value), pointers, std::move(rule));
}

namespace {
thread_local bool unit_seed_upstream = false;

// Sets unit_seed_upstream for the duration of one rule call.
class UnitSeedScope {
  public:
    explicit UnitSeedScope(bool active) noexcept : previous_(unit_seed_upstream) {
        unit_seed_upstream = active;
    }
    ~UnitSeedScope() { unit_seed_upstream = previous_; }
    UnitSeedScope(const UnitSeedScope&) = delete;
    UnitSeedScope& operator=(const UnitSeedScope&) = delete;

  private:
    bool previous_;
};
}  // namespace

bool upstream_is_implicit_unit_seed() noexcept {
    return unit_seed_upstream;
}

std::unordered_map<const Node*, LeafGradient> compute_leaf_gradients(
    const std::shared_ptr<Node>& root, const Tensor& seed, bool retain_graph, bool accumulate,
    const GradientReadyHook& ready, bool implicit_unit_seed) {
    std::vector<std::shared_ptr<Node>> order = backward_order(root);
    std::unordered_map<const Node*, Tensor> pending;  // the private context
    std::unordered_map<const Node*, LeafGradient> leaf_gradients;
    pending.emplace(root.get(), seed);
    for (std::shared_ptr<Node>& entry : order) {
        // Taking the handle out of `order` lets a consumed node die right after this step.
        const std::shared_ptr<Node> node = std::move(entry);
        auto found = pending.find(node.get());
        if (found == pending.end()) {
            continue;  // nothing flowed here (cannot happen for a reachable node; defensive)
        }
        Tensor upstream = std::move(found->second);
        pending.erase(found);
        if (node->leaf) {
            // Every node that feeds this leaf came before it in `order`: its gradient is final.
            if (accumulate && !node->gradient.is_singular())
                upstream = tensor_ops::add(node->gradient, upstream);
            if (ready) {
                ready(Variable(node), upstream);
                if (upstream.is_singular() || upstream.shape() != node->value.shape() ||
                    upstream.backend() != node->value.backend()) {
                    throw std::invalid_argument(
                        "backward: the gradient-ready hook left a leaf gradient that is not of "
                        "the leaf's shape " +
                        shape_to_string(node->value.shape()) + " on its backend");
                }
            }
            leaf_gradients.emplace(node.get(), LeafGradient{node, std::move(upstream)});
            continue;
        }
        const std::size_t count = node->parents.size();
        auto needed = std::make_unique<bool[]>(count);
        for (std::size_t i = 0; i < count; ++i) {
            const Node* parent = node->parents[i].node.get();
            needed[i] = parent != nullptr && parent->requires_gradient;
        }
        std::vector<Tensor> gradients;
        {
            const UnitSeedScope scope(implicit_unit_seed && node == root);
            gradients = node->backward(upstream, std::span<const bool>(needed.get(), count));
        }
        if (gradients.size() != count) {
            std::ostringstream message;
            message << "backward: the rule of '" << node->operation << "' returned "
                    << gradients.size() << " gradients for " << count << " inputs";
            throw std::invalid_argument(message.str());
        }
        for (std::size_t i = 0; i < count; ++i) {
            if (needed[i])
                validate_contribution(*node, i, *node->parents[i].node, gradients[i]);
        }
        for (std::size_t i = 0; i < count; ++i) {
            if (!needed[i])
                continue;
            const Node* parent = node->parents[i].node.get();
            auto [slot, inserted] = pending.try_emplace(parent, std::move(gradients[i]));
            if (!inserted) {
                slot->second = tensor_ops::add(slot->second, gradients[i]);
            }
        }
        if (!retain_graph) {
            // Consume: the saved tensors and the edges go now (parents still to be processed
            // are held by `order`), so the node can no longer be differentiated.
            node->backward = nullptr;
            node->parents.clear();
            node->consumed = true;
        }
    }
    counter_cells().backward_passes.fetch_add(1, std::memory_order_relaxed);
    return leaf_gradients;
}

}  // namespace riftco_transformer::detail

namespace riftco_transformer {

NoGradientGuard::NoGradientGuard() noexcept : previous_(detail::recording_disabled) {
    detail::recording_disabled = true;
}

NoGradientGuard::~NoGradientGuard() {
    detail::recording_disabled = previous_;
}

bool gradient_recording_disabled() noexcept {
    return detail::recording_disabled;
}

}  // namespace riftco_transformer
