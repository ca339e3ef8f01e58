#pragma once
// Numerically stable softmax and its VJP.

#include <cstddef>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// Softmax along `axis` (out_of_range if >= rank). -inf entries are allowed and give exact 0;
// a slice holding NaN or +inf, or only -inf, is domain_error.
[[nodiscard]] Tensor softmax(const Tensor& x, std::size_t axis);
// p ⊙ (g − Σ_axis g ⊙ p); p and upstream must have one shape and backend.
[[nodiscard]] Tensor softmax_backward(const Tensor& probabilities, const Tensor& upstream,
                                      std::size_t axis);

// scores [B,H,T,T] (square, rank 4) -> probabilities of softmax(scale · scores) over keys
// with keys after the query masked; masked entries are exactly 0. scale finite and > 0.
[[nodiscard]] Tensor causal_softmax(const Tensor& scores, float scale = 1.0F);
// d scores = scale · p ⊙ (g − Σ g ⊙ p); masked entries get exactly 0.
[[nodiscard]] Tensor causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream,
                                             float scale = 1.0F);

}  // namespace riftco_transformer::tensor_ops
