#pragma once
// Batched matrix multiplication: [..., M, K] x [..., K, N] -> [..., M, N].
// Ranks must be >= 2 and equal, leading (batch) dimensions identical (no batch broadcast),
// inner dimensions equal, backends equal; each violation is invalid_argument.

#include <span>
#include <vector>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

[[nodiscard]] Tensor matmul(const Tensor& left, const Tensor& right);

// Runs on `execution_backend` (staging copies when it differs from the inputs' backend) but
// returns storage on the inputs' backend; never changes the thread's selection. An
// unavailable execution backend is runtime_error.
[[nodiscard]] Tensor matmul(const Tensor& left, const Tensor& right,
                            ExecutionBackend execution_backend);

// op(left) x op(right) where op transposes the last two axes when asked, without
// materialising the transpose. Used by VJPs: dA = G·Bᵀ, dB = Aᵀ·G.
[[nodiscard]] Tensor matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                            bool transpose_right);

// x [R,K] times each weight [N_i,K] transposed: {x·W_0ᵀ, x·W_1ᵀ, ...}, the values of
// matmul(x, W_i, false, true) each, in one pass where the backend fuses them (the q, k and v
// projections of a decode step). No weights, a rank other than 2, a width other than K or
// another backend: std::invalid_argument naming the weight.
[[nodiscard]] std::vector<Tensor> project_many(const Tensor& x, std::span<const Tensor> weights);

}  // namespace riftco_transformer::tensor_ops
