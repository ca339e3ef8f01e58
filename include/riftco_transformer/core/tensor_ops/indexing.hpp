#pragma once
// Row gather (embedding lookup) and its adjoint.

#include <cstddef>
#include <span>

#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// table [R, W], indices on the table's backend -> indices.shape() + [W]. table rank != 2,
// another backend or a singular index tensor: invalid_argument; an id >= R: out_of_range
// (checked in O(1) from the maximum the upload recorded; no device read).
[[nodiscard]] Tensor gather_rows(const Tensor& table, const IndexTensor& indices);
// upstream [..., W] with one row per id -> [row_count, W], repeated ids accumulate.
// row_count == 0, an upstream/indices mismatch or another backend: invalid_argument; an id
// >= row_count: out_of_range.
[[nodiscard]] Tensor scatter_add_rows(const Tensor& upstream, const IndexTensor& indices,
                                      std::size_t row_count);

// Host-id forms: the ids are checked here (naming the first offending position), uploaded
// once, and the call goes to the IndexTensor form.
// The upload of gather ids for `table`, with gather_rows's checks and errors below.
[[nodiscard]] IndexTensor row_indices(const Tensor& table, std::span<const std::size_t> indices,
                                      const Shape& index_shape);
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
