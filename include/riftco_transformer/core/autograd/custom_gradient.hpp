#pragma once
// Extension seams of the autograd layer: a result with a caller-supplied VJP, and activation
// checkpointing (recompute a sub-graph during backward instead of keeping its activations).

#include <functional>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"

namespace riftco_transformer {

// The VJP receives the upstream gradient (the output's shape) and returns exactly one tensor
// per input, in order, each with that input's shape and backend — including inputs that do
// not need a gradient. It is called only when some input requires a gradient, and the whole
// result is validated (std::invalid_argument) before anything is accumulated. It may capture
// forward tensors and metadata only; it must not change inputs.
using VectorJacobianProduct = std::function<std::vector<Tensor>(const Tensor& upstream)>;

// `output` computed from `inputs` by code autograd cannot see. Empty vjp, empty inputs:
// std::invalid_argument; an input or the output on another backend: std::invalid_argument;
// an empty input handle: std::logic_error.
[[nodiscard]] Variable custom_gradient(Tensor output, std::span<const Variable> inputs,
                                       VectorJacobianProduct vjp);

using Recompute = std::function<Variable(const Variable& input)>;

// Runs recompute(input) once and keeps only its output value and the edges to `input` and
// `dependencies`; backward replays recompute on a fresh leaf holding the saved input value and
// differentiates the replay in a nested, isolated pass, adding exactly its contributions to
// the input and every dependency.
//
// Construction (std::invalid_argument): empty callable; nothing differentiable (input does not
// require gradients and no dependencies); a dependency that is not a leaf requiring gradients,
// is repeated, or is on another backend than the input.
// First run and replay (std::logic_error): the output does not require gradients or is on
// another backend; recompute reads a graph node created outside it that it was not given,
// creates a differentiable leaf of its own, or does not use the input (when it requires
// gradients) or a declared dependency; the replay's output shape or backend differs.
// recompute must be deterministic. Under a NoGradientGuard, checkpoint just returns
// recompute(input).
[[nodiscard]] Variable checkpoint(const Variable& input, std::span<const Variable> dependencies,
                                  Recompute recompute);

}  // namespace riftco_transformer
