#pragma once
// Memory-linear ("flash") causal attention, the raw form. Q, K, V [B,H,T,d_h] with identical
// shapes and one backend (std::invalid_argument otherwise); scale = 1/√d_h computed in float.
// A visible score that is NaN or +inf, or a query row without a finite visible score:
// std::domain_error.

#include <string_view>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

struct FlashAttentionResult {
    Tensor context;  // [B,H,T,d_h]
    Tensor row_max;  // [B,H,T]: m_i = max_{j<=i} S_ij
    Tensor row_sum;  // [B,H,T]: l_i = Σ_{j<=i} exp(S_ij − m_i)
};

struct FlashAttentionGradients {
    Tensor query;
    Tensor key;
    Tensor value;
};

// The one home of the attention input rules, for every attention algorithm: Q, K, V
// non-singular, on one backend, rank 4 [B,H,T,d_h] with identical shapes
// (std::invalid_argument naming `operation` otherwise). Returns scale = 1/√d_h in float.
[[nodiscard]] float attention_scale(std::string_view operation, const Tensor& query,
                                    const Tensor& key, const Tensor& value);

[[nodiscard]] FlashAttentionResult flash_attention(const Tensor& query, const Tensor& key,
                                                   const Tensor& value);

// The VJP from the forward's outputs and the upstream gradient of the context; recomputes
// the probabilities tile by tile.
[[nodiscard]] FlashAttentionGradients flash_attention_backward(
    const Tensor& query, const Tensor& key, const Tensor& value, const FlashAttentionResult& forward,
    const Tensor& upstream);

}  // namespace riftco_transformer::tensor_ops
