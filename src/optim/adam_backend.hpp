#pragma once
// The global gradient norm over a parameter list (shared by Adam::step and
// global_gradient_norm), computed by one batched tensor_ops request.

#include <span>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"
#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer::detail {

// √(Σ g²) over the gradients of `parameters` (the caller checked that each is a leaf with a
// gradient of its value's shape on `backend`): one tensor_ops::gradient_statistics request
// and one host read, whatever the parameter count; the partials merge in list order, so the
// result does not depend on the thread count. Parameters without a gradient contribute
// zeros. A NaN or ±inf element: std::domain_error "<operation>: the gradient of parameter
// '<name>' has element <i> = <v>".
// The gradient tensor of each parameter (null for a parameter backward never reached).
[[nodiscard]] std::vector<const Tensor*> gradients_of(std::span<const NamedParameter> parameters);

// std::domain_error "<operation>: the gradient of parameter '<name>' has element <i> = <v>
// (gradients must be finite)" for the element `bad` found.
[[noreturn]] void throw_non_finite_gradient(std::string_view operation,
                                            std::span<const NamedParameter> parameters,
                                            const tensor_ops::FirstNonFinite& bad);

[[nodiscard]] double gradient_norm(ExecutionBackend backend,
                                   std::span<const NamedParameter> parameters,
                                   std::string_view operation);

}  // namespace riftco_transformer::detail
