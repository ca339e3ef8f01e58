#pragma once
// The optimizer's seam to a backend: its Adam capability, and the global gradient norm
// reduced through it (shared by Adam::step and global_gradient_norm).

#include <span>
#include <string_view>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer::detail {

// The Adam capability of `backend`: std::invalid_argument for an unknown value,
// std::runtime_error when the backend is unavailable or lacks the capability.
[[nodiscard]] const AdamCapability& adam_capability(ExecutionBackend backend,
                                                    std::string_view operation);

// √(Σ g²) over the gradients of `parameters` (the caller checked that each is a leaf with a
// gradient of its value's shape on the capability's backend). Each gradient is reduced by
// the capability and the partials merge in list order, so the result does not depend on
// the thread count. Parameters without a gradient contribute zeros. A NaN or ±inf element:
// std::domain_error "<operation>: the gradient of parameter '<name>' has element <i> = <v>".
[[nodiscard]] double gradient_norm(const AdamCapability& capability,
                                   std::span<const NamedParameter> parameters,
                                   std::string_view operation);

}  // namespace riftco_transformer::detail
