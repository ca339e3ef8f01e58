#pragma once
// The NF4 format rules (docs/ARCHITECTURE.md, 'NF4') in one place: encoding (nearest code,
// scales of either encoding), strict payload validation, and the decoded-scale formula every
// kernel and the host dequantizer share.

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/backend/quantized_storage.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::detail {

// The code of r (|r| <= 1): the nearest codebook entry, an exact tie going to the LOWER
// index. Distances are compared exactly: the midpoints between neighbouring entries are
// computed in double, where the sum of two such floats and its half are exact, and r is
// compared with them (r <= midpoint_i keeps index i). Midpoints computed in float would be
// rounded, so values between the rounded and the true midpoint would get the farther code.
[[nodiscard]] std::uint8_t nearest_nf4_code(float r) noexcept;

// ŝ = clamp(μ + t·(q − 128)/127, 0, FLT_MAX), evaluated in float left to right:
// ((t·(q − 128))/127) then + μ. Overflow saturates; negative values (and −inf) become 0.
[[nodiscard]] inline float decode_nf4_scale(float offset, float range, std::uint8_t code) noexcept {
    const float delta = range * static_cast<float>(static_cast<int>(code) - 128) / 127.0F;
    const float scale = offset + delta;
    if (!(scale > 0.0F)) {
        return 0.0F;
    }
    return scale > FLT_MAX ? FLT_MAX : scale;
}

// Read-only pointers into a packed weight held in host memory (CPU kernels, host decode).
struct Nf4View {
    PackedLayout layout;
    const std::uint8_t* codes = nullptr;        // ceil(N/2) bytes
    const float* scales = nullptr;              // legacy: M
    const std::uint8_t* scale_codes = nullptr;  // double: M
    const float* scale_ranges = nullptr;        // double: ceil(M/C)
    float scale_offset = 0.0F;
    // log2 B and log2 C (both are powers of two): kernels shift instead of dividing.
    unsigned block_shift = 0;
    unsigned group_shift = 0;

    // ŝ_b of block b.
    [[nodiscard]] float block_scale(std::size_t block) const noexcept {
        if (!layout.double_quantized) {
            return scales[block];
        }
        return decode_nf4_scale(scale_offset, scale_ranges[block >> group_shift],
                                scale_codes[block]);
    }
    [[nodiscard]] std::uint8_t code(std::size_t flat_index) const noexcept {
        const std::uint8_t byte = codes[flat_index / 2];
        return (flat_index % 2 == 0) ? static_cast<std::uint8_t>(byte & 0x0FU)
                                     : static_cast<std::uint8_t>(byte >> 4U);
    }
};

[[nodiscard]] Nf4View view_of(const PackedNf4Payload& payload) noexcept;

// The layout of a weight of this shape and options, after the shape and block-size rules
// (invalid_argument naming block_size / scale_block_size or the zero dimension;
// overflow_error when out·in overflows). `operation` prefixes the messages.
[[nodiscard]] PackedLayout checked_nf4_layout(std::string_view operation, std::size_t out_features,
                                              std::size_t in_features, std::size_t block_size,
                                              bool double_quantized, std::size_t scale_block_size);

// Packs a host float32 matrix [out, in] (row-major). invalid_argument: a non-finite value
// (names its flat index); overflow_error: the double-quantized offset is not finite.
[[nodiscard]] PackedNf4Payload encode_nf4(std::span<const float> values,
                                          const PackedLayout& layout);

// Every from_packed_nf4 rule (docs/ARCHITECTURE.md, 'NF4'); the message names the field and the
// value.
[[nodiscard]] PackedLayout validate_nf4_payload(const PackedNf4Payload& payload);

// w_i = ŝ_{⌊i/B⌋}·codebook[code_i] for flat indices [begin, begin + out.size()).
void dequantize_nf4_range(const Nf4View& view, std::size_t begin, std::span<float> out) noexcept;

}  // namespace riftco_transformer::detail
