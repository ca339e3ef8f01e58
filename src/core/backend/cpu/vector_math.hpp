#pragma once
// Branch-free float functions that the compiler vectorises inside plain loops (no libm calls
// in the hot loops). Accuracy, measured against double-precision libm in tests:
//   fast_exp   relative error < 2e-7 on [ln FLT_MIN, ln FLT_MAX] = [-87.34, 88.72]; exactly 0
//              below (so exp(-inf) = 0), +inf above
//   fast_erfc  relative error < 2.5e-7 for all finite x (the Chebyshev fit's 1.2e-7 plus the
//              float rounding of exp and of the result); absolute error < 2.6e-7
//   fast_tanh  relative error < 2e-7 for all finite x (1.8e-7 worst, near |x| = 0.55);
//              ±1 at ±inf, NaN stays NaN

#include <bit>
#include <cmath>
#include <cstdint>

namespace riftco_transformer::detail {

namespace exp_detail {

constexpr float log2e = 1.44269504088896341F;
constexpr float ln2_high = 0.693359375F;  // exact in 9 bits, so n·ln2_high is exact
constexpr float ln2_low = -2.12194440e-4F;
constexpr float round_bias = 12582912.0F;  // 1.5·2^23: adding it rounds to an integer
constexpr float lowest = -87.3365479F;     // ln(FLT_MIN)
constexpr float overflowing = 89.0F;       // > ln(FLT_MAX): clamping here still overflows

// n = round(x / ln2) as a float.
[[nodiscard]] inline float reduction_count(float x) {
    return (x * log2e + round_bias) - round_bias;
}

// p·2^n for n in [-126, 128] (the integer in float n): 2^n is applied as two normal factors,
// so n = 128 near FLT_MAX overflows to +inf only when the true value does.
[[nodiscard]] inline float exp_from_reduced(float r, float n) {
    // e^r on |r| <= ln2/2: degree-7 Taylor polynomial, truncation error < 6e-9.
    float p = 1.0F / 5040.0F;
    p = p * r + 1.0F / 720.0F;
    p = p * r + 1.0F / 120.0F;
    p = p * r + 1.0F / 24.0F;
    p = p * r + 1.0F / 6.0F;
    p = p * r + 0.5F;
    p = p * r + 1.0F;
    p = p * r + 1.0F;
    const auto exponent = static_cast<std::int32_t>(n);
    const std::int32_t half = exponent >> 1U;
    const float high =
        std::bit_cast<float>(static_cast<std::uint32_t>(exponent - half + 127) << 23U);
    const float low = std::bit_cast<float>(static_cast<std::uint32_t>(half + 127) << 23U);
    return (p * high) * low;
}

}  // namespace exp_detail

// e^x by Cody–Waite range reduction x = n·ln2 + r, |r| <= ln2/2 (x − n·ln2_high is exact).
// Below ln(FLT_MIN) the result is flushed to 0 (so exp(-inf) = 0, and no subnormal
// arithmetic happens); above ln(FLT_MAX) it overflows to +inf; NaN stays NaN.
[[nodiscard]] inline float fast_exp(float x) {
    using namespace exp_detail;
    // NaN lands on `lowest` here (no undefined float->int conversion) and is restored below.
    const float clamped = x >= lowest ? (x <= overflowing ? x : overflowing) : lowest;
    const float n = reduction_count(clamped);
    const float r = (clamped - n * ln2_high) - n * ln2_low;
    const float result = exp_from_reduced(r, n);
    return x < lowest ? 0.0F : (x != x ? x : result);
}

// e^(a + b) where b is small next to the rounding of a + b: b joins the reduced argument
// after the exact a − n·ln2_high step instead of being rounded into a first.
[[nodiscard]] inline float fast_exp_sum(float a, float b) {
    using namespace exp_detail;
    const float x = a + b;
    const bool in_range = x >= lowest && x <= overflowing;
    const float clamped = in_range ? x : (x > overflowing ? overflowing : lowest);
    const float n = reduction_count(clamped);
    const float r =
        in_range ? ((a - n * ln2_high) + b) - n * ln2_low : (clamped - n * ln2_high) - n * ln2_low;
    const float result = exp_from_reduced(r, n);
    return x < lowest ? 0.0F : (x != x ? x : result);
}

// erfc(x) = t·exp(−x² − 1.26551223 + t·P(t)), t = 1/(1 + |x|/2), with the published
// Chebyshev coefficients (fractional error < 1.2e-7 in exact arithmetic); erfc(−x) =
// 2 − erfc(x). t, P(t) and the exponent are evaluated in double (z² of a float is exact
// there), and the exponent reaches fast_exp_sum as a float hi + lo pair, so float rounding
// adds little to the fit error.
[[nodiscard]] inline float fast_erfc(float x) {
    const double z = x < 0.0F ? -static_cast<double>(x) : static_cast<double>(x);
    const double t = 1.0 / (1.0 + 0.5 * z);
    double p = 0.17087277;
    p = p * t - 0.82215223;
    p = p * t + 1.48851587;
    p = p * t - 1.13520398;
    p = p * t + 0.27886807;
    p = p * t - 0.18628806;
    p = p * t + 0.09678418;
    p = p * t + 0.37409196;
    p = p * t + 1.00002368;
    p = p * t - 1.26551223;
    const double exponent = p - z * z;
    // Past the float range the pair would be ±inf/NaN: clamp (erfc is 0 there anyway).
    const double bounded = exponent < -104.0 ? -104.0 : exponent;
    const auto high = static_cast<float>(bounded);
    const auto low = static_cast<float>(bounded - static_cast<double>(high));
    const auto positive = static_cast<float>(t * static_cast<double>(fast_exp_sum(high, low)));
    return x < 0.0F ? 2.0F - positive : positive;
}

// tanh(x): the odd Taylor series through x^15 below |x| = 0.55 (truncation < 5e-8 relative
// there, no cancellation), 1 − 2/(e^{2|x|} + 1) with the sign of x above (e^{2|x|} >= 3, so
// the subtraction loses under 2 bits; +inf past the exp range gives exactly 1). Both are
// computed and one is selected, so loops over it vectorise.
[[nodiscard]] inline float fast_tanh(float x) {
    const float a = std::fabs(x);
    const float z = x * x;
    float series = -929569.0F / 638512875.0F;  // x^15
    series = series * z + 21844.0F / 6081075.0F;
    series = series * z - 1382.0F / 155925.0F;
    series = series * z + 62.0F / 2835.0F;
    series = series * z - 17.0F / 315.0F;
    series = series * z + 2.0F / 15.0F;
    series = series * z - 1.0F / 3.0F;
    const float small = x + x * (z * series);
    const float large = std::copysign(1.0F - 2.0F / (fast_exp(2.0F * a) + 1.0F), x);
    return a < 0.55F ? small : large;
}

// Standard normal density φ(x) = e^{−x²/2}/√(2π).
[[nodiscard]] inline float normal_density(float x) {
    constexpr float inverse_sqrt_two_pi = 0.398942280401432678F;
    return inverse_sqrt_two_pi * fast_exp(-0.5F * x * x);
}

}  // namespace riftco_transformer::detail

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <limits>

namespace riftco_transformer::detail {

// Reductions written with independent lanes so the compiler vectorises them without
// reassociating floating-point sums on its own (the lane order is fixed, so results are
// deterministic). Double accumulators where the reference needs oracle-grade row statistics
// (docs/ARCHITECTURE.md, 'Tensor operations').
inline constexpr std::size_t reduction_lanes = 16;

[[nodiscard]] inline float row_max(const float* x, std::size_t n) {
    float lanes[reduction_lanes];
    std::fill_n(lanes, reduction_lanes, -std::numeric_limits<float>::infinity());
    std::size_t i = 0;
    for (; i + reduction_lanes <= n; i += reduction_lanes) {
        for (std::size_t l = 0; l < reduction_lanes; ++l) {
            lanes[l] = lanes[l] < x[i + l] ? x[i + l] : lanes[l];
        }
    }
    float result = -std::numeric_limits<float>::infinity();
    for (; i < n; ++i)
        result = result < x[i] ? x[i] : result;
    for (const float lane : lanes)
        result = result < lane ? lane : result;
    return result;
}

// True when any element is NaN or +inf (the values softmax-like operations reject).
[[nodiscard]] inline bool row_has_nan_or_positive_infinity(const float* x, std::size_t n) {
    int flags = 0;
    for (std::size_t i = 0; i < n; ++i) {
        flags |= static_cast<int>(x[i] != x[i]) |
                 static_cast<int>(x[i] == std::numeric_limits<float>::infinity());
    }
    return flags != 0;
}

[[nodiscard]] inline double row_sum(const float* x, std::size_t n) {
    double lanes[reduction_lanes] = {};
    std::size_t i = 0;
    for (; i + reduction_lanes <= n; i += reduction_lanes) {
        for (std::size_t l = 0; l < reduction_lanes; ++l)
            lanes[l] += x[i + l];
    }
    double result = 0.0;
    for (; i < n; ++i)
        result += x[i];
    for (const double lane : lanes)
        result += lane;
    return result;
}

[[nodiscard]] inline double row_dot(const float* x, const float* y, std::size_t n) {
    double lanes[reduction_lanes] = {};
    std::size_t i = 0;
    for (; i + reduction_lanes <= n; i += reduction_lanes) {
        for (std::size_t l = 0; l < reduction_lanes; ++l) {
            lanes[l] += static_cast<double>(x[i + l]) * y[i + l];
        }
    }
    double result = 0.0;
    for (; i < n; ++i)
        result += static_cast<double>(x[i]) * y[i];
    for (const double lane : lanes)
        result += lane;
    return result;
}

// Σ (x_i − centre)² in double.
[[nodiscard]] inline double row_centered_square_sum(const float* x, std::size_t n, double centre) {
    double lanes[reduction_lanes] = {};
    std::size_t i = 0;
    for (; i + reduction_lanes <= n; i += reduction_lanes) {
        for (std::size_t l = 0; l < reduction_lanes; ++l) {
            const double d = x[i + l] - centre;
            lanes[l] += d * d;
        }
    }
    double result = 0.0;
    for (; i < n; ++i) {
        const double d = x[i] - centre;
        result += d * d;
    }
    for (const double lane : lanes)
        result += lane;
    return result;
}

// The lowest failing row across threads, so error messages do not depend on scheduling.
class FirstFailingRow {
  public:
    void record(std::size_t row) noexcept {
        std::size_t current = row_.load(std::memory_order_relaxed);
        while (row < current && !row_.compare_exchange_weak(current, row)) {
        }
    }
    [[nodiscard]] bool any() const noexcept { return row_.load() != none; }
    [[nodiscard]] std::size_t row() const noexcept { return row_.load(); }

  private:
    static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    std::atomic<std::size_t> row_{none};
};

}  // namespace riftco_transformer::detail
