#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"

#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

namespace riftco_transformer {

using detail::Node;

Variable::Variable(Tensor value, bool requires_gradient) {
    if (value.is_singular()) {
        throw std::logic_error("Variable: the value is a singular (moved-from) tensor");
    }
    node_ = std::make_shared<Node>();
    node_->value = std::move(value);
    node_->requires_gradient = requires_gradient;
    node_->serial = detail::next_node_serial();
    node_->operation = "leaf";
}

Variable Variable::scalar(float value, bool requires_gradient) {
    return Variable(Tensor::scalar(value), requires_gradient);
}

Node& Variable::checked_node(const char* operation) const {
    if (node_ == nullptr) {
        throw std::logic_error(std::string(operation) + ": the Variable is empty");
    }
    return *node_;
}

const Tensor& Variable::value() const {
    return checked_node("Variable::value").value;
}
const Shape& Variable::shape() const {
    return checked_node("Variable::shape").value.shape();
}
ExecutionBackend Variable::backend() const {
    return checked_node("Variable::backend").value.backend();
}
bool Variable::requires_gradient() const {
    return checked_node("Variable::requires_gradient").requires_gradient;
}
bool Variable::holds_graph() const noexcept {
    return node_ != nullptr && !node_->leaf && !node_->consumed;
}

bool Variable::is_leaf() const {
    return checked_node("Variable::is_leaf").leaf;
}
std::uint64_t Variable::version() const {
    return checked_node("Variable::version").version;
}

namespace {

Node& require_leaf(Node& node, const char* operation) {
    if (!node.leaf) {
        throw std::logic_error(std::string(operation) +
                               ": only leaves can do this (this is the "
                               "result of '" +
                               std::string(node.operation) + "')");
    }
    return node;
}

Node& require_gradient_leaf(Node& node, const char* operation) {
    require_leaf(node, operation);
    if (!node.requires_gradient) {
        throw std::logic_error(std::string(operation) +
                               ": the leaf does not require gradients (it has none)");
    }
    return node;
}

}  // namespace

void Variable::set_requires_gradient(bool requires_gradient) {
    Node& node = require_leaf(checked_node("Variable::set_requires_gradient"),
                              "Variable::set_requires_gradient");
    node.requires_gradient = requires_gradient;
    if (!requires_gradient) {
        node.gradient = Tensor();
    }
}

bool Variable::has_gradient() const {
    Node& node =
        require_gradient_leaf(checked_node("Variable::has_gradient"), "Variable::has_gradient");
    return !node.gradient.is_singular();
}

Tensor Variable::gradient() const {
    Node& node = require_gradient_leaf(checked_node("Variable::gradient"), "Variable::gradient");
    if (node.gradient.is_singular()) {
        return Tensor::zeros(node.value.shape(), node.value.backend());
    }
    return node.gradient;
}

void Variable::set_gradient(Tensor gradient) {
    Node& node =
        require_gradient_leaf(checked_node("Variable::set_gradient"), "Variable::set_gradient");
    if (gradient.is_singular()) {
        throw std::invalid_argument("Variable::set_gradient: the gradient is a singular tensor");
    }
    if (gradient.shape() != node.value.shape() || gradient.backend() != node.value.backend()) {
        std::ostringstream message;
        message << "Variable::set_gradient: the gradient has shape "
                << shape_to_string(gradient.shape()) << " on "
                << execution_backend_name(gradient.backend()) << ", the leaf has shape "
                << shape_to_string(node.value.shape()) << " on "
                << execution_backend_name(node.value.backend());
        throw std::invalid_argument(message.str());
    }
    node.gradient = std::move(gradient);
}

void Variable::zero_gradient() {
    Node& node =
        require_gradient_leaf(checked_node("Variable::zero_gradient"), "Variable::zero_gradient");
    node.gradient = Tensor();
}

namespace {

// The one place a leaf's value is replaced: new value, new version, no gradient.
void commit_leaf_value(Node& node, Tensor value) {
    node.value = std::move(value);
    detail::mark_leaf_value_replaced(node);
}

}  // namespace

void Variable::replace_value(Tensor value) {
    Node& node = require_leaf(checked_node("Variable::replace_value"), "Variable::replace_value");
    if (value.is_singular()) {
        throw std::logic_error("Variable::replace_value: the new value is a singular tensor");
    }
    if (value.shape() != node.value.shape()) {
        throw std::invalid_argument("Variable::replace_value: the new value has shape " +
                                    shape_to_string(value.shape()) + ", the leaf has shape " +
                                    shape_to_string(node.value.shape()));
    }
    commit_leaf_value(node, std::move(value));
}

void Variable::set_value(Tensor value) {
    Node& node = require_leaf(checked_node("Variable::set_value"), "Variable::set_value");
    if (value.is_singular()) {
        throw std::logic_error("Variable::set_value: the new value is a singular tensor");
    }
    if (value.shape() != node.value.shape() || value.backend() != node.value.backend()) {
        std::ostringstream message;
        message << "Variable::set_value: the new value has shape " << shape_to_string(value.shape())
                << " on " << execution_backend_name(value.backend()) << ", the leaf has shape "
                << shape_to_string(node.value.shape()) << " on "
                << execution_backend_name(node.value.backend());
        throw std::invalid_argument(message.str());
    }
    commit_leaf_value(node, std::move(value));
}

void Variable::backward(const BackwardOptions& options) {
    const Node& node = checked_node("Variable::backward");
    if (node.value.numel() != 1) {
        throw std::invalid_argument(
            "Variable::backward: an implicit seed needs a one-element output (got shape " +
            shape_to_string(node.value.shape()) + "); pass a seed");
    }
    backward_from(Tensor::full(node.value.shape(), 1.0F, node.value.backend()), options, true);
}

void Variable::backward(const Tensor& seed, const BackwardOptions& options) {
    backward_from(seed, options, false);
}

void Variable::backward_from(const Tensor& seed, const BackwardOptions& options,
                             bool implicit_unit_seed) {
    Node& node = checked_node("Variable::backward");
    if (!node.requires_gradient) {
        throw std::logic_error(
            "Variable::backward: the variable does not require gradients (no input did)");
    }
    if (seed.is_singular()) {
        throw std::invalid_argument("Variable::backward: the seed is a singular tensor");
    }
    if (seed.shape() != node.value.shape() || seed.backend() != node.value.backend()) {
        std::ostringstream message;
        message << "Variable::backward: the seed has shape " << shape_to_string(seed.shape())
                << " on " << execution_backend_name(seed.backend()) << ", the output has shape "
                << shape_to_string(node.value.shape()) << " on "
                << execution_backend_name(node.value.backend());
        throw std::invalid_argument(message.str());
    }
    // Every published value (sums under accumulate included) is prepared first, then committed.
    auto gradients =
        detail::compute_leaf_gradients(node_, seed, options.retain_graph, options.accumulate,
                                       options.gradient_ready, implicit_unit_seed);
    for (auto& [key, result] : gradients) {
        result.leaf->gradient = std::move(result.gradient);
    }
}

GraphStatistics Variable::graph_statistics() const {
    const Node& root = checked_node("Variable::graph_statistics");
    GraphStatistics statistics;
    std::unordered_set<const Node*> visited{&root};
    std::vector<const Node*> stack{&root};
    while (!stack.empty()) {
        const Node* node = stack.back();
        stack.pop_back();
        ++statistics.node_count;
        statistics.node_tensor_elements += node->value.numel();
        if (!node->gradient.is_singular()) {
            statistics.node_tensor_elements += node->gradient.numel();
        }
        for (const detail::Edge& edge : node->parents) {
            if (edge.node && visited.insert(edge.node.get()).second) {
                stack.push_back(edge.node.get());
            }
        }
    }
    return statistics;
}

AutogradCounters autograd_counters() noexcept {
    const auto& cells = detail::counter_cells();
    AutogradCounters counters;
    counters.nodes_created = cells.nodes_created.load();
    counters.backward_passes = cells.backward_passes.load();
    counters.matmul_left_gradients = cells.matmul_left_gradients.load();
    counters.matmul_right_gradients = cells.matmul_right_gradients.load();
    return counters;
}

void reset_autograd_counters() noexcept {
    auto& cells = detail::counter_cells();
    cells.nodes_created = 0;
    cells.backward_passes = 0;
    cells.matmul_left_gradients = 0;
    cells.matmul_right_gradients = 0;
}

}  // namespace riftco_transformer

namespace riftco_transformer {

LeafView leaf_view(const Variable& variable, std::string_view operation) {
    detail::Node& node = *detail::require_defined(variable, operation, "parameter");
    return {node.value, node.gradient, node.leaf, node.requires_gradient, node.operation, &node};
}

void mark_leaf_updated(const Variable& leaf) {
    detail::Node& node = *detail::require_defined(leaf, "mark_leaf_updated", "leaf");
    if (!node.leaf) {
        throw std::logic_error(
            "mark_leaf_updated: the variable is not a leaf (it is the result "
            "of '" +
            std::string(node.operation) + "')");
    }
    detail::mark_leaf_value_replaced(node);
}

}  // namespace riftco_transformer
