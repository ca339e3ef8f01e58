#pragma once
// Reductions. Accumulation is in double, in an order that does not depend on thread count.

#include <cstddef>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// Sum of every element: a scalar tensor (shape []).
[[nodiscard]] Tensor sum(const Tensor& x);
// Sum over `axis` (out_of_range if axis >= rank); keep_dims leaves a 1 in its place.
// Reducing the only axis of a rank-1 tensor without keep_dims gives a scalar.
[[nodiscard]] Tensor sum(const Tensor& x, std::size_t axis, bool keep_dims = false);
[[nodiscard]] Tensor mean(const Tensor& x);
[[nodiscard]] Tensor mean(const Tensor& x, std::size_t axis, bool keep_dims = false);

}  // namespace riftco_transformer::tensor_ops
