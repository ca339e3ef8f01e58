#pragma once
// Linear algebra on packed NF4 weights (core/quantized_weight.hpp), decoded inside the
// kernels: no float32 copy of the whole matrix is ever made.
//   quantized_linear:                 x [.., in] -> x·deq(W)ᵀ [.., out]
//   quantized_linear_input_backward:  g [.., out] -> g·deq(W) [.., in]
// std::invalid_argument: a singular weight, x of rank 0, a last dimension that differs from
// the weight's (names both), tensors on different backends. std::logic_error: a singular
// tensor. std::runtime_error: the backend lacks the quantized-linear capability.

#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

[[nodiscard]] Tensor quantized_linear(const Tensor& x, const QuantizedWeight& weight);
[[nodiscard]] Tensor quantized_linear_input_backward(const Tensor& upstream,
                                                     const QuantizedWeight& weight);
// A packed embedding lookup: indices on the weight's backend -> indices.shape() + [in], row
// i the decoded row deq(W)[indices[i]] (an id >= out_features: out_of_range; another backend
// or a singular argument: invalid_argument; a backend whose capability does not gather
// packed rows: runtime_error naming it).
[[nodiscard]] Tensor quantized_gather_rows(const QuantizedWeight& weight,
                                           const IndexTensor& indices);

}  // namespace riftco_transformer::tensor_ops
