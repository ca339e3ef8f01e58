#pragma once
// Normalisation over the last axis, with the statistics the backward pass needs.

#include <string_view>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// The one home of the epsilon rule of every normalisation (the ops below, the LayerNorm and
// RMSNorm layers, model configs): finite and > 0, else std::invalid_argument
// "<operation>: <argument> must be finite and > 0 (got <epsilon>)".
void require_normalization_epsilon(std::string_view operation, std::string_view argument,
                                   float epsilon);

inline constexpr float default_normalization_epsilon = 1e-5F;

struct LayerNormResult {
    Tensor output;             // x.shape()
    Tensor mean;               // [rows]
    Tensor inverse_deviation;  // [rows], 1/√(σ² + eps) with population variance σ²
};
struct LayerNormGradients {
    Tensor input;  // x.shape()
    Tensor scale;  // [W]
    Tensor bias;   // [W]
};

// y = (x − μ)/√(σ² + eps)·scale + bias over the last axis (width W). Rank 0, scale or bias not
// [W], mixed backends, eps not finite or not > 0: invalid_argument.
[[nodiscard]] LayerNormResult layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                         float epsilon = default_normalization_epsilon);
// With ĝ = g ⊙ scale and x̂ the normalised input:
// dx = inv·(ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)); dscale = Σ_rows g ⊙ x̂; dbias = Σ_rows g.
[[nodiscard]] LayerNormGradients layer_norm_backward(const Tensor& x, const Tensor& scale,
                                                     const Tensor& mean,
                                                     const Tensor& inverse_deviation,
                                                     const Tensor& upstream);

struct RmsNormResult {
    Tensor output;       // x.shape()
    Tensor inverse_rms;  // [rows], 1/√(mean(x²) + eps)
};
struct RmsNormGradients {
    Tensor input;  // x.shape()
    Tensor scale;  // [W]
};

// y = x·scale/√(mean(x²) + eps). Same rules as layer_norm, without a bias.
[[nodiscard]] RmsNormResult rms_norm(const Tensor& x, const Tensor& scale,
                                     float epsilon = default_normalization_epsilon);
// dx = r·(g ⊙ scale) − x·r³·mean(g ⊙ scale ⊙ x); dscale = Σ_rows g ⊙ x·r.
[[nodiscard]] RmsNormGradients rms_norm_backward(const Tensor& x, const Tensor& scale,
                                                 const Tensor& inverse_rms, const Tensor& upstream);

}  // namespace riftco_transformer::tensor_ops
