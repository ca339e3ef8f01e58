#pragma once
// IEEE binary16 <-> float32, dependency-free (the block formats' scales, the GGUF reader, the
// F16 safetensors and GGUF writers' rounding rule).

#include <bit>
#include <cmath>
#include <cstdint>

namespace riftco_transformer {

// binary16 -> float32, exact: ±0, subnormals (which become normal floats), ±inf, and a NaN
// with its sign and payload (mantissa << 13), as numpy's float16 -> float32 does.
[[nodiscard]] inline float half_bits_to_float(std::uint16_t bits) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000U) << 16U;
    const std::uint32_t exponent = (bits >> 10U) & 0x1FU;
    const std::uint32_t mantissa = bits & 0x3FFU;
    std::uint32_t result = 0;
    if (exponent == 0x1FU) {
        result = sign | 0x7F800000U | (mantissa << 13U);  // ±inf, NaN with its payload
    } else if (exponent != 0) {
        result = sign | ((exponent + (127U - 15U)) << 23U) | (mantissa << 13U);
    } else if (mantissa == 0) {
        result = sign;  // ±0
    } else {
        // Subnormal: mantissa·2^-24 = 1.f·2^(p-24) with p the top set bit of the mantissa.
        const auto top_bit = static_cast<std::uint32_t>(std::bit_width(mantissa) - 1);
        const std::uint32_t fraction = (mantissa << (23U - top_bit)) & 0x7FFFFFU;
        result = sign | ((top_bit + 127U - 24U) << 23U) | fraction;
    }
    return std::bit_cast<float>(result);
}

// float32 -> binary16, rounded to nearest even; overflow gives ±inf, NaN stays a quiet NaN.
[[nodiscard]] inline std::uint16_t float_to_half_bits(float value) noexcept {
    const auto bits = std::bit_cast<std::uint32_t>(value);
    const auto sign = static_cast<std::uint16_t>((bits >> 16U) & 0x8000U);
    const std::uint32_t magnitude = bits & 0x7FFFFFFFU;
    if (magnitude > 0x7F800000U) {  // NaN: quiet, with the top of its payload
        return static_cast<std::uint16_t>(sign | 0x7E00U | ((magnitude >> 13U) & 0x3FFU));
    }
    if (magnitude >= 0x477FF000U) {  // >= 65520 (halfway above 65504) rounds to infinity
        return static_cast<std::uint16_t>(sign | 0x7C00U);
    }
    if (magnitude >= 0x38800000U) {  // a normal binary16: rebias, round to nearest even
        const std::uint32_t rebiased = magnitude - 0x38000000U;
        const std::uint32_t rounded = (rebiased + 0x0FFFU + ((rebiased >> 13U) & 1U)) >> 13U;
        return static_cast<std::uint16_t>(sign | rounded);
    }
    // Subnormal or zero: |value|·2^24 is exact in float; round it to the nearest even integer
    // (1024 is the smallest normal's encoding, so a carry lands on it correctly).
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0F;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
}

}  // namespace riftco_transformer
