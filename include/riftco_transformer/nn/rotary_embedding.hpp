#pragma once
// Rotary position embedding (RoPE), split-half ("rotate_half") form
// (docs/ARCHITECTURE.md, 'The decoder').
//
// For a head vector x of even width d and position p, with i < d/2:
//   angle_i = p · θ^(−2i/d)                       computed in double, cos/sin rounded to float
//   y_i       = x_i·cos_i − x_{i+d/2}·sin_i
//   y_{i+d/2} = x_{i+d/2}·cos_i + x_i·sin_i
// The VJP is the transposed rotation (dx_i = g_i·cos + g_{i+d/2}·sin, dx_{i+d/2} =
// g_{i+d/2}·cos − g_i·sin); here it falls out of the composition below, which is built from
// slice, multiply, subtract/add and concatenate, so every backend that runs those runs RoPE.
//
// GGUF stores llama-family query/key weights permuted for the interleaved (adjacent-pair)
// form; interchange/llama_import undoes that permutation so this one form serves every model.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

// cos and sin of every (row, frequency) pair: [rows, d/2] each, row r at positions[r].
struct RotaryTables {
    Tensor cosine;
    Tensor sine;
};

// The one home of RoPE's argument rules: head_width even and > 0, theta finite and > 0
// (std::invalid_argument naming `operation` and the value).
void require_rotary_arguments(const char* operation, std::size_t head_width, double theta);

// Tables for the given positions (one row each, in order) on `backend`. An empty position
// list: std::invalid_argument.
[[nodiscard]] RotaryTables rotary_tables(std::span<const std::size_t> positions,
                                         std::size_t head_width, double theta,
                                         ExecutionBackend backend);

// RoPE frequency scaling, for checkpoints trained past their original context. Stable ABI
// values (C ABI 2.10): never renumber.
//   None:   ω_i = θ^(−2i/d)
//   Linear: ω_i = θ^(−2i/d) / factor                 (positions divided by factor)
//   Llama3: Llama 3.1's piecewise rule on the wavelength λ_i = 2π/ω_i, with L the original
//           context: λ_i < L/high_frequency_factor keeps ω_i; λ_i > L/low_frequency_factor
//           gives ω_i/factor; between, with s = (L/λ_i − low)/(high − low),
//           ω_i·((1−s)/factor + s).
//   FrequencyFactors: ω_i = θ^(−2i/d) / frequency_factors[i] (d/2 given divisors: GGUF's
//           rope_freqs.weight, which llama.cpp's converter fills from the Llama 3 rule).
//   Yarn (C ABI 2.11): YaRN (arXiv 2309.00071, Qwen 2.5 and Qwen 3 past 32K). With
//           f(r) = d·ln(L/(2π·r)) / (2·ln θ) the dimension at which a frequency turns r times
//           over the original context L, lo = max(⌊f(beta_fast)⌋, 0) and
//           hi = min(⌈f(beta_slow)⌉, d − 1) (hi = lo + 0.001 when equal), the ramp
//           γ_i = clamp((i − lo)/(hi − lo), 0, 1) blends ω_i = θ^(−2i/d)·(1 − γ_i) (kept, fast
//           dimensions) with θ^(−2i/d)/factor·γ_i (interpolated, slow ones); every cos and sin is
//           then multiplied by the attention factor m (given, or 0.1·ln(factor) + 1 for a
//           factor > 1, else 1), so every score carries m².
enum class RopeScalingKind : std::uint32_t {
    None = 0,
    Linear = 1,
    Llama3 = 2,
    FrequencyFactors = 3,
    Yarn = 4
};

struct RopeScaling {
    RopeScalingKind kind = RopeScalingKind::None;
    double factor = 1.0;                   // Linear, Llama3: > 0
    double low_frequency_factor = 1.0;     // Llama3: > 0
    double high_frequency_factor = 4.0;    // Llama3: > low_frequency_factor
    std::size_t original_context = 8192;   // Llama3: L > 0
    std::vector<float> frequency_factors;  // FrequencyFactors: d/2 finite values > 0
    double beta_fast = 32.0;               // Yarn: > beta_slow
    double beta_slow = 1.0;                // Yarn: > 0
    double attention_factor = 0.0;         // Yarn: m, 0 = 0.1·ln(factor) + 1 (1 for factor <= 1)
};

// "none", "linear", "llama3", "frequency_factors", "yarn"; an unknown value:
// std::invalid_argument.
[[nodiscard]] const char* rope_scaling_name(RopeScalingKind kind);

// The one home of the scaling rules (std::invalid_argument naming `operation`, the field and
// the value): the kind known, factor finite and > 0, Llama3's frequency factors finite, > 0
// and high > low, its original context > 0, FrequencyFactors of exactly head_width/2 finite
// positive values, Yarn's factor and original context as Llama3's, beta_slow finite and > 0,
// beta_fast finite and > beta_slow, attention_factor finite and >= 0.
void require_rope_scaling(const char* operation, std::size_t head_width,
                          const RopeScaling& scaling);

// ω_0..ω_{d/2−1} in double for head width d, base θ and `scaling` (the rules above).
[[nodiscard]] std::vector<double> rotary_frequencies(std::size_t head_width, double theta,
                                                     const RopeScaling& scaling);

// The factor m every cos and sin is multiplied by: YaRN's attention factor, 1 for every other
// kind (`scaling` must pass require_rope_scaling).
[[nodiscard]] double rotary_magnitude(const RopeScaling& scaling);

// Tables for the given positions from the frequencies ω (d/2 of them): angle = p·ω_i in
// double, m·cos and m·sin rounded to float (m = magnitude, rotary_magnitude's; 1 leaves the
// rotation unscaled). No positions or no frequencies, or a magnitude not finite or <= 0:
// std::invalid_argument.
[[nodiscard]] RotaryTables rotary_tables(std::span<const std::size_t> positions,
                                         std::span<const double> frequencies,
                                         ExecutionBackend backend, double magnitude = 1.0);

// x [B,H,T,d] with tables of T rows: every batch row and head uses position row t.
// x [R,H,1,d] with tables of R rows: row r uses table row r (the decode form).
// x [B,H,T,d] with tables of B·T rows: batch row b, token t uses table row b·T + t (packed
// rows, each at its own positions).
// Any other shape pairing: std::invalid_argument.
[[nodiscard]] Variable apply_rotary_embedding(const Variable& x, const RotaryTables& tables);

}  // namespace riftco_transformer
