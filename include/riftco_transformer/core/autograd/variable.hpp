#pragma once
// Reverse-mode automatic differentiation: Variable is a handle on a graph node.
//
// Graph rules (docs/ARCHITECTURE.md, 'Autograd'):
// - The result of an operation requires gradients iff any input does; otherwise it is a
//   detached constant with no parents.
// - Gradient buffers exist only on leaves that require them; intermediate gradients and the
//   tensors a node saved for its backward rule are released as soon as the pass used them.
// - backward() is transactional: it computes every leaf gradient in a private context and
//   publishes them only when the whole pass succeeded; a failed pass leaves every visible
//   gradient as it was. By default a pass consumes the graph as it goes: each node's saved
//   tensors are released as soon as its rule ran, so any later backward through it is
//   std::logic_error. This holds for a pass that fails midway too (a rule that throws, a
//   malformed custom gradient): the nodes it already processed are consumed. Checks that
//   need no computation (seed, requires-gradient, stale inputs, consumed nodes) run before
//   anything is released. Pass BackwardOptions{.retain_graph = true} to keep the graph for
//   another pass, including a retry after a failure.
// - Leaves carry version counters: a leaf whose value was replaced (set_value, an optimizer
//   step, a backend move) after a graph read it makes that graph fail at backward with
//   std::logic_error before anything is touched.
// - By default backward REPLACES the gradients of the leaves it reaches;
//   BackwardOptions{.accumulate = true} adds to them instead (micro-batching).
// - A gradient-ready hook (BackwardOptions::gradient_ready) sees each reached leaf once, as
//   soon as the pass has no further contribution to it: nodes run in a topological order, so
//   a leaf's turn comes after every node that feeds it. It gets the gradient the leaf will be
//   given (the sum with its earlier one under accumulate), while later parts of the graph are
//   still being differentiated; data parallelism starts reducing that gradient then
//   (distributed/process_group.hpp). The hook may change the gradient (in place, after
//   making its storage unique, or by assigning another of the same shape and backend): what
//   it leaves is published. Publication is unchanged: the gradients become visible when the
//   whole pass succeeded. A hook that throws fails the pass (nothing published).
// - Traversal and graph destruction are iterative: depth is limited only by memory.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

namespace detail {
struct Node;
}  // namespace detail

class Variable;

// leaf: the leaf whose gradient is final; gradient: the value it will publish (the hook may
// change it).
using GradientReadyHook = std::function<void(const Variable& leaf, Tensor& gradient)>;

struct BackwardOptions {
    bool accumulate = false;    // add into existing leaf gradients instead of replacing them
    bool retain_graph = false;  // keep saved tensors so the graph can be differentiated again
    GradientReadyHook gradient_ready{};  // optional: once per reached leaf (see the top)
};

struct GraphStatistics {
    std::size_t node_count = 0;            // nodes reachable from this variable
    std::size_t node_tensor_elements = 0;  // elements of their values and leaf gradients
};

class Variable {
  public:
    // An empty handle; every operation on it is std::logic_error.
    Variable() noexcept = default;
    // A leaf holding `value`.
    explicit Variable(Tensor value, bool requires_gradient = true);
    [[nodiscard]] static Variable scalar(float value, bool requires_gradient = true);

    [[nodiscard]] bool defined() const noexcept { return node_ != nullptr; }
    [[nodiscard]] const Tensor& value() const;
    [[nodiscard]] const Shape& shape() const;
    [[nodiscard]] ExecutionBackend backend() const;
    [[nodiscard]] bool requires_gradient() const;
    [[nodiscard]] bool is_leaf() const;
    // Leaves only (std::logic_error otherwise). Turning it off freezes the leaf: no gradient
    // is computed for it (a matmul skips its weight-gradient product) and any buffer is freed.
    void set_requires_gradient(bool requires_gradient);

    // Leaf gradients. has_gradient() is false until a backward pass reached the leaf (or after
    // zero_gradient()); gradient() then returns zeros of the value's shape. Non-leaves and
    // leaves that do not require gradients: std::logic_error.
    [[nodiscard]] bool has_gradient() const;
    [[nodiscard]] Tensor gradient() const;
    // Replaces a leaf's gradient (data-parallel reduction writes the averaged one back): the
    // value's shape and backend (std::invalid_argument otherwise, nothing changed).
    void set_gradient(Tensor gradient);
    void zero_gradient();

    // Replaces a leaf's value (same shape and backend: std::invalid_argument; non-leaf:
    // std::logic_error), bumps its version (making graphs that read it stale) and clears its
    // gradient.
    void set_value(Tensor value);
    // set_value for a backend move: the value keeps the leaf's shape (std::invalid_argument
    // otherwise) and may live on another backend; same version and gradient effects.
    void replace_value(Tensor value);
    [[nodiscard]] std::uint64_t version() const;

    // backward(): scalar (one-element) outputs only, implicit seed 1 (std::invalid_argument
    // otherwise). backward(seed): seed of the output's shape and backend
    // (std::invalid_argument). A variable that does not require gradients, a consumed graph
    // or a stale input: std::logic_error. On any failure no visible gradient changes.
    void backward(const BackwardOptions& options = {});
    void backward(const Tensor& seed, const BackwardOptions& options = {});

    [[nodiscard]] GraphStatistics graph_statistics() const;
    // True for an interior node that no backward pass has consumed: it still holds the
    // tensors its rule saved and edges to its inputs (parameters among them). A leaf, a
    // detached constant, an empty handle and a consumed node hold only their own value.
    [[nodiscard]] bool holds_graph() const noexcept;

    // Internal: the node behind the handle (for operations and tests of graph structure).
    [[nodiscard]] const std::shared_ptr<detail::Node>& node() const noexcept { return node_; }
    explicit Variable(std::shared_ptr<detail::Node> node) noexcept : node_(std::move(node)) {}

  private:
    [[nodiscard]] detail::Node& checked_node(const char* operation) const;
    // backward with `seed`; implicit_unit_seed: the seed is backward()'s own ones.
    void backward_from(const Tensor& seed, const BackwardOptions& options, bool implicit_unit_seed);
    std::shared_ptr<detail::Node> node_;
};

// While a guard is alive on a thread, operations on that thread record no graph: every result
// is a detached constant (evaluation, sampling, serving). Guards nest.
class NoGradientGuard {
  public:
    NoGradientGuard() noexcept;
    ~NoGradientGuard();
    NoGradientGuard(const NoGradientGuard&) = delete;
    NoGradientGuard& operator=(const NoGradientGuard&) = delete;

  private:
    bool previous_;
};

// True while a NoGradientGuard is alive on the calling thread.
[[nodiscard]] bool gradient_recording_disabled() noexcept;

// Process-wide counters that make the frugality guarantees observable.
struct AutogradCounters {
    std::uint64_t nodes_created = 0;           // interior (non-leaf) nodes
    std::uint64_t backward_passes = 0;         // completed passes, nested ones included
    std::uint64_t matmul_left_gradients = 0;   // dA = G·Bᵀ products computed
    std::uint64_t matmul_right_gradients = 0;  // dB = Aᵀ·G products computed
};
[[nodiscard]] AutogradCounters autograd_counters() noexcept;
void reset_autograd_counters() noexcept;

}  // namespace riftco_transformer
