#pragma once
// Independent NF4 oracles for the tests (docs/ARCHITECTURE.md, 'NF4'), written from the format
// rules rather than from the library: decoding a payload, and products on the decoded matrix in
// double.

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::testing {

inline std::uint8_t reference_code(const PackedNf4Payload& payload, std::size_t i) {
    const std::uint8_t byte = payload.codes[i / 2];
    return i % 2 == 0 ? static_cast<std::uint8_t>(byte & 15U)
                      : static_cast<std::uint8_t>(byte >> 4U);
}

// ŝ_b: legacy scales directly; double-quantized clamp(μ + t_g·(q_b − 128)/127, 0, FLT_MAX) in
// float.
inline float reference_scale(const PackedNf4Payload& payload, std::size_t block) {
    if (!payload.double_quantized) {
        return payload.scales[block];
    }
    const float range = payload.scale_ranges[block / payload.scale_block_size];
    const float steps = static_cast<float>(static_cast<int>(payload.scale_codes[block]) - 128);
    float scale = payload.scale_offset + range * steps / 127.0F;
    if (std::isnan(scale) || scale < 0.0F) {
        scale = 0.0F;
    }
    return std::fmin(scale, FLT_MAX);
}

// deq(W) [out, in] row-major, in double (each element is the float product ŝ·codebook).
inline std::vector<double> reference_dequantize(const PackedNf4Payload& payload) {
    const std::size_t count = payload.out_features * payload.in_features;
    std::vector<double> values(count);
    for (std::size_t i = 0; i < count; ++i) {
        const float scale = reference_scale(payload, i / payload.block_size);
        values[i] = static_cast<double>(scale * nf4_codebook[reference_code(payload, i)]);
    }
    return values;
}

// x [rows, in] -> x·Wᵀ [rows, out], accumulated in double.
inline std::vector<double> reference_forward(const std::vector<double>& w, std::size_t out,
                                             std::size_t in, const std::vector<float>& x) {
    const std::size_t rows = x.size() / in;
    std::vector<double> y(rows * out, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < out; ++o) {
            double total = 0.0;
            for (std::size_t i = 0; i < in; ++i) {
                total += static_cast<double>(x[r * in + i]) * w[o * in + i];
            }
            y[r * out + o] = total;
        }
    }
    return y;
}

// g [rows, out] -> g·W [rows, in], accumulated in double.
inline std::vector<double> reference_input_backward(const std::vector<double>& w, std::size_t out,
                                                    std::size_t in, const std::vector<float>& g) {
    const std::size_t rows = g.size() / out;
    std::vector<double> dx(rows * in, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < out; ++o) {
            const double upstream = g[r * out + o];
            for (std::size_t i = 0; i < in; ++i) {
                dx[r * in + i] += upstream * w[o * in + i];
            }
        }
    }
    return dx;
}

// Form B (docs/ARCHITECTURE.md, 'Numeric parity'): |a − e| <= tol·max(1, |a|, |e|).
inline ::testing::AssertionResult close_form_b(const std::vector<float>& actual,
                                               const std::vector<double>& expected, double tol) {
    if (actual.size() != expected.size()) {
        return ::testing::AssertionFailure()
               << "size " << actual.size() << " != expected " << expected.size();
    }
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double a = actual[i];
        const double e = expected[i];
        const double bound = tol * std::fmax(1.0, std::fmax(std::fabs(a), std::fabs(e)));
        if (!(std::fabs(a - e) <= bound)) {
            return ::testing::AssertionFailure() << "element " << i << ": " << a << " vs expected "
                                                 << e << " (|diff| " << std::fabs(a - e) << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

}  // namespace riftco_transformer::testing
