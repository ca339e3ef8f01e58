#pragma once
// Branch-free float functions that the compiler vectorises inside plain loops (no libm calls
// in the hot loops). Accuracy, measured against double-precision libm in tests:
//   fast_exp   relative error < 2e-7 on [-87, 88]; exactly 0 below -87.34 (so exp(-inf) = 0)
//   fast_erfc  relative error < 1.3e-7 for all finite x (Chebyshev-fitted form of erfc)

#include <bit>
#include <cstdint>

namespace riftco_transformer::detail {

// e^x by Cody–Waite range reduction x = n·ln2 + r, |r| <= ln2/2, then a degree-7 Taylor
// polynomial for e^r (truncation error < 6e-9 there) and 2^n assembled in the exponent bits.
[[nodiscard]] inline float fast_exp(float x) {
    constexpr float log2e = 1.44269504088896341F;
    constexpr float ln2_high = 0.693359375F;  // exact in 9 bits, so n·ln2_high is exact
    constexpr float ln2_low = -2.12194440e-4F;
    constexpr float round_bias = 12582912.0F;  // 1.5·2^23: adding it rounds to an integer
    // NaN lands on -87 here (no undefined float->int conversion) and is restored below.
    const float clamped = x >= -87.0F ? (x <= 88.0F ? x : 88.0F) : -87.0F;
    const float n = (clamped * log2e + round_bias) - round_bias;
    const float r = (clamped - n * ln2_high) - n * ln2_low;
    float p = 1.0F / 5040.0F;
    p = p * r + 1.0F / 720.0F;
    p = p * r + 1.0F / 120.0F;
    p = p * r + 1.0F / 24.0F;
    p = p * r + 1.0F / 6.0F;
    p = p * r + 0.5F;
    p = p * r + 1.0F;
    p = p * r + 1.0F;
    const auto exponent = static_cast<std::int32_t>(n);
    const float two_to_n = std::bit_cast<float>(static_cast<std::uint32_t>(exponent + 127) << 23U);
    const float result = p * two_to_n;
    // Below -87 the true value is near or under FLT_MIN: flush to 0 (keeps exp(-inf) = 0).
    // Above 88.7 it overflows: +inf. NaN stays NaN.
    return x < -87.33654F ? 0.0F : (x > 88.72284F ? __builtin_inff() : (x != x ? x : result));
}

// erfc(x) = t·exp(−x² − 1.26551223 + t·P(t)), t = 1/(1 + |x|/2), with the published
// Chebyshev coefficients (fractional error < 1.2e-7); erfc(−x) = 2 − erfc(x).
[[nodiscard]] inline float fast_erfc(float x) {
    const float z = x < 0.0F ? -x : x;
    const float t = 1.0F / (1.0F + 0.5F * z);
    float p = 0.17087277F;
    p = p * t - 0.82215223F;
    p = p * t + 1.48851587F;
    p = p * t - 1.13520398F;
    p = p * t + 0.27886807F;
    p = p * t - 0.18628806F;
    p = p * t + 0.09678418F;
    p = p * t + 0.37409196F;
    p = p * t + 1.00002368F;
    p = p * t - 1.26551223F;
    const float positive = t * fast_exp(-z * z + p);
    return x < 0.0F ? 2.0F - positive : positive;
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
// deterministic). Double accumulators where the spec wants oracle-grade row statistics.
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
    for (; i < n; ++i) result = result < x[i] ? x[i] : result;
    for (const float lane : lanes) result = result < lane ? lane : result;
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
        for (std::size_t l = 0; l < reduction_lanes; ++l) lanes[l] += x[i + l];
    }
    double result = 0.0;
    for (; i < n; ++i) result += x[i];
    for (const double lane : lanes) result += lane;
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
    for (; i < n; ++i) result += static_cast<double>(x[i]) * y[i];
    for (const double lane : lanes) result += lane;
    return result;
}

// Σ (x_i − centre)² in double.
[[nodiscard]] inline double row_centered_square_sum(const float* x, std::size_t n,
                                                    double centre) {
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
    for (const double lane : lanes) result += lane;
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
