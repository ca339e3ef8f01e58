#pragma once
// Elementwise operations. Binary operations need identical shapes (no implicit broadcast:
// use broadcast_to) and one backend.

#include <cstdint>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

[[nodiscard]] Tensor add(const Tensor& left, const Tensor& right);
[[nodiscard]] Tensor subtract(const Tensor& left, const Tensor& right);
[[nodiscard]] Tensor multiply(const Tensor& left, const Tensor& right);
// domain_error when any denominator element is exactly zero.
[[nodiscard]] Tensor divide(const Tensor& numerator, const Tensor& denominator);

[[nodiscard]] Tensor negate(const Tensor& x);
// RoPE in its split-half form over x's last axis (d = 2h), with tables cosine and sine
// [rows, h] indexed by x's position along `table_axis` (< rank − 1, extent rows):
// out[.., i] = x_i·c − x_{i+h}·s, out[.., i+h] = x_{i+h}·c + x_i·s. One pass where the
// backend has the fused kernel; otherwise composed from slices, products and a concatenation,
// with the same values. A shape that does not fit: std::invalid_argument naming it.
[[nodiscard]] Tensor rotary_embedding(const Tensor& x, const Tensor& cosine, const Tensor& sine,
                                      std::size_t table_axis);
// Inverted-dropout masks from a counter-based generator (docs/ARCHITECTURE.md, 'LoRA'): no
// state, so a mask is a pure function of (seed, key, stream, element index) and any element
// can be drawn alone. splitmix64's finaliser:
[[nodiscard]] constexpr std::uint64_t splitmix64_mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31U);
}
inline constexpr std::uint64_t dropout_golden_gamma = 0x9E3779B97F4A7C15ULL;
// The stream of one mask: mix(mix(mix(seed ^ γ) + key) + stream_index).
[[nodiscard]] constexpr std::uint64_t dropout_stream(std::uint64_t seed, std::uint64_t key,
                                                     std::uint64_t stream_index) noexcept {
    return splitmix64_mix(splitmix64_mix(splitmix64_mix(seed ^ dropout_golden_gamma) + key) +
                          stream_index);
}
// The drop threshold of probability p in [0, 1): ⌊p·2³²⌋ (computed in double, exact).
[[nodiscard]] constexpr std::uint64_t dropout_threshold(float probability) noexcept {
    return static_cast<std::uint64_t>(static_cast<double>(probability) * 4294967296.0);
}
// Element i is kept when the high 32 bits of mix(stream + (i + 1)·γ) are >= the threshold:
// probability 1 − ⌊p·2³²⌋/2³², independently per element.
[[nodiscard]] constexpr bool dropout_keeps(std::uint64_t stream, std::uint64_t index,
                                           std::uint64_t threshold) noexcept {
    return (splitmix64_mix(stream + (index + 1) * dropout_golden_gamma) >> 32U) >= threshold;
}
// The mask of `shape` on `backend`: keep(i) ? 1/(1−p) (in float) : 0, with
// stream = dropout_stream(seed, key, stream_index). p must be finite and in [0, 1)
// (std::invalid_argument naming `probability`); a backend without the dropout kernel: the
// capability error (std::runtime_error naming dropout).
[[nodiscard]] Tensor dropout_mask(const Shape& shape, ExecutionBackend backend, float probability,
                                  std::uint64_t seed, std::uint64_t key,
                                  std::uint64_t stream_index);
// Whether `backend` can draw dropout masks; refuses like dropout_mask otherwise, naming
// `operation`.
void require_dropout(std::string_view operation, ExecutionBackend backend);

// x * factor; factor must be finite (invalid_argument).
[[nodiscard]] Tensor scale(const Tensor& x, float factor);
// x + addend; addend must be finite (invalid_argument).
[[nodiscard]] Tensor add_scalar(const Tensor& x, float addend);

[[nodiscard]] Tensor exp(const Tensor& x);
// domain_error when any element is <= 0 (or NaN).
[[nodiscard]] Tensor log(const Tensor& x);
// domain_error when any element is < 0 (or NaN); sqrt(0) is 0.
[[nodiscard]] Tensor sqrt(const Tensor& x);
[[nodiscard]] Tensor erf(const Tensor& x);
// tanh(±inf) = ±1; NaN propagates.
[[nodiscard]] Tensor tanh(const Tensor& x);
// c·tanh(x/c) (Gemma 2's soft cap: smooth, odd, |y| < c, slope 1 at 0); c finite and > 0
// (std::invalid_argument naming `cap` otherwise).
[[nodiscard]] Tensor soft_cap(const Tensor& x, float cap);

// Exact-erf GELU: 0.5·x·(1 + erf(x/√2)) (not the tanh approximation); gelu(+inf) = +inf,
// gelu(-inf) = -0, NaN propagates.
[[nodiscard]] Tensor gelu(const Tensor& x);
// upstream · [0.5·(1 + erf(x/√2)) + x·φ(x)], φ the standard normal density; the factor is 1 at
// +inf and 0 at -inf.
[[nodiscard]] Tensor gelu_backward(const Tensor& x, const Tensor& upstream);

// GELU in its tanh form (GPT-2): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), computed as
// x·σ(2u) so nothing overflows; gelu_tanh(+inf) = +inf, gelu_tanh(-inf) = -0, NaN propagates.
[[nodiscard]] Tensor gelu_tanh(const Tensor& x);
// upstream · d/dx gelu_tanh(x); the factor is 1 at +inf and 0 at -inf.
[[nodiscard]] Tensor gelu_tanh_backward(const Tensor& x, const Tensor& upstream);

// max(0, x); NaN propagates.
[[nodiscard]] Tensor relu(const Tensor& x);
// upstream where x > 0, 0 where x <= 0 (including exactly 0), NaN where x is NaN.
[[nodiscard]] Tensor relu_backward(const Tensor& x, const Tensor& upstream);

// x·σ(x) with a stable sigmoid: silu(-inf) = -0, silu(+inf) = +inf.
[[nodiscard]] Tensor silu(const Tensor& x);
// upstream · σ(x)·(1 + x·(1 − σ(x))): 0 at x = -inf, upstream at x = +inf.
[[nodiscard]] Tensor silu_backward(const Tensor& x, const Tensor& upstream);

}  // namespace riftco_transformer::tensor_ops
