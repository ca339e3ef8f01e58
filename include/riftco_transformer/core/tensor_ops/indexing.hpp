#pragma once
// Row gather (embedding lookup) and its adjoint.

#include <cstddef>
#include <span>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// table [R, W], indices (prod(index_shape) of them) -> index_shape + [W].
// table rank != 2, count mismatch: invalid_argument; an index >= R: out_of_range; an index
// above the uint32 range: overflow_error.
[[nodiscard]] Tensor gather_rows(const Tensor& table, std::span<const std::size_t> indices,
                                 const Shape& index_shape);

// upstream [..., W] with one row per index -> [row_count, W], repeated indices accumulate.
// row_count == 0 or an upstream/indices mismatch: invalid_argument; an index >= row_count:
// out_of_range; an index above the uint32 range: overflow_error.
[[nodiscard]] Tensor scatter_add_rows(const Tensor& upstream, std::span<const std::size_t> indices,
                                      std::size_t row_count);

}  // namespace riftco_transformer::tensor_ops
