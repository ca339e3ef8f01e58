#pragma once
// Graph nodes. A child owns its parents through edges; parents never own children, and
// backward rules never capture their own node, so graphs have no cycles and are freed when
// the last handle drops (iteratively: see ~Node).

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/loss.hpp"

namespace riftco_transformer::detail {

// Computes the gradient for each parent from the upstream gradient. needed[i] says whether
// parent i wants one; entries for parents that do not may be left singular (Tensor()).
using BackwardRule =
    std::function<std::vector<Tensor>(const Tensor& upstream, std::span<const bool> needed)>;

struct Edge {
    std::shared_ptr<Node> node;  // null for an input that did not require gradients
    std::uint64_t version = 0;   // the parent's version when the forward pass read it
};

struct Node {
    Tensor value;
    bool requires_gradient = false;
    bool leaf = true;
    std::uint64_t version = 0;   // leaves: bumped whenever the value is replaced
    std::uint64_t serial = 0;    // creation order (checkpoint's capture check)
    std::string_view operation;  // producing operation, for messages
    std::vector<Edge> parents;   // interior nodes only
    BackwardRule backward;       // interior nodes; released when consumed
    bool consumed = false;       // interior: a backward pass used and released the rule
    Tensor gradient;             // leaves: singular until a pass publishes one

    Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
    ~Node();
};

// The effects of replacing a leaf's value, whoever writes it (Variable::set_value, or an
// optimizer updating the storage in place): a new version, so graphs that read the old value
// fail at backward with std::logic_error, and no gradient.
inline void mark_leaf_value_replaced(Node& leaf) noexcept {
    ++leaf.version;
    leaf.gradient = Tensor();
}

// A new serial number (monotonic, process-wide).
[[nodiscard]] std::uint64_t next_node_serial() noexcept;

// The node of a defined variable; std::logic_error naming `operation` and `argument` otherwise.
const std::shared_ptr<Node>& require_defined(const Variable& variable, std::string_view operation,
                                             std::string_view argument);

// The result of a differentiable operation: a detached constant when no input requires
// gradients, otherwise an interior node with an edge per input (in order) and `rule`.
[[nodiscard]] Variable make_result(std::string_view operation, Tensor value,
                                   std::initializer_list<const Variable*> inputs,
                                   BackwardRule rule);
[[nodiscard]] Variable make_result(std::string_view operation, Tensor value,
                                   std::span<const Variable> inputs, BackwardRule rule);

struct LeafGradient {
    std::shared_ptr<Node> leaf;  // kept alive until the caller publishes (or drops) the result
    Tensor gradient;
};

// Runs a backward pass from `root` seeded with `seed` in a private context and returns the
// gradient of every leaf reached (nothing is published). Checks every stale input and
// consumed node first. Without retain_graph, each interior node is consumed right after use:
// its rule (with the tensors it saved) and its edges are released, so activations that only
// the graph kept alive are freed while the pass proceeds, even if the caller still holds the
// output. A pass that fails midway leaves the nodes it already processed consumed.
// With `accumulate`, a leaf's result is the sum with the gradient it already holds; `ready`
// (may be empty) is called with each leaf's result as soon as it is final.
// `implicit_unit_seed`: the seed is backward()'s own ones (no caller gave one), which the
// root's rule may learn through upstream_is_implicit_unit_seed() without reading it.
[[nodiscard]] std::unordered_map<const Node*, LeafGradient> compute_leaf_gradients(
    const std::shared_ptr<Node>& root, const Tensor& seed, bool retain_graph,
    bool accumulate = false, const GradientReadyHook& ready = {}, bool implicit_unit_seed = false);

// True only inside the rule of the root of a backward pass whose seed is backward()'s implicit
// ones: the upstream is then exactly 1, known without a host read (a rule may skip scaling
// by it).
[[nodiscard]] bool upstream_is_implicit_unit_seed() noexcept;

// Counters (AutogradCounters), updated by the operations.
struct CounterCells {
    std::atomic<std::uint64_t> nodes_created{0};
    std::atomic<std::uint64_t> backward_passes{0};
    std::atomic<std::uint64_t> matmul_left_gradients{0};
    std::atomic<std::uint64_t> matmul_right_gradients{0};
};
[[nodiscard]] CounterCells& counter_cells() noexcept;

// A fused cross-entropy's differentiable result from a raw one (shared by cross_entropy and
// cross_entropy_time_range, each in two forms): d logits = upstream · base gradient.
[[nodiscard]] Variable cross_entropy_result(std::string_view operation, const Variable& logits,
                                            tensor_ops::CrossEntropyResult result);

}  // namespace riftco_transformer::detail
