#pragma once
// Layout operations: results are materialised contiguously.

#include <cstddef>
#include <span>
#include <vector>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// out[i_axes[0], ..., i_axes[r-1]] = x[i_0, ..., i_{r-1}], i.e. out.shape[d] = x.shape[axes[d]].
// axes.size() != rank: invalid_argument; an axis >= rank: out_of_range; repeats: invalid_argument.
[[nodiscard]] Tensor permute(const Tensor& x, std::span<const std::size_t> axes);
[[nodiscard]] Tensor permute(const Tensor& x, std::initializer_list<std::size_t> axes);

// x [M,N] -> [N,M]; any other rank is invalid_argument.
[[nodiscard]] Tensor transpose_2d(const Tensor& x);

// Same elements, new shape with equal numel (invalid_argument otherwise).
[[nodiscard]] Tensor reshape(const Tensor& x, Shape shape);

// Broadcast by matching dimensions from the right: each input dimension equals the output's
// or is 1; output rank >= input rank; a scalar broadcasts anywhere. Else invalid_argument.
[[nodiscard]] Tensor broadcast_to(const Tensor& x, const Shape& shape);

// Adjoint of broadcast_to: sums x over the broadcast dimensions down to `shape`.
// `shape` must broadcast to x.shape() (invalid_argument otherwise).
[[nodiscard]] Tensor sum_to_shape(const Tensor& x, const Shape& shape);

// [..., d_0], [..., d_1], ... -> [..., Σ d_i]. Empty list, scalar input, rank or prefix
// mismatch, mixed backends: invalid_argument; total width overflow: overflow_error.
[[nodiscard]] Tensor concatenate_last_axis(std::span<const Tensor> inputs);
[[nodiscard]] Tensor concatenate_last_axis(const Tensor& left, const Tensor& right);

// Elements [start, start+length) of `axis`, all others kept. Bad axis: out_of_range; an
// empty or out-of-bounds window: out_of_range (length 0 is invalid_argument).
[[nodiscard]] Tensor slice(const Tensor& x, std::size_t axis, std::size_t start,
                           std::size_t length);

// Adjoint of slice: upstream placed at [start, start + upstream.shape[axis]) of an otherwise
// zero tensor whose `axis` has size `extent`. Bad axis, or a window past extent: out_of_range.
[[nodiscard]] Tensor slice_backward(const Tensor& upstream, std::size_t axis, std::size_t start,
                                    std::size_t extent);

}  // namespace riftco_transformer::tensor_ops
