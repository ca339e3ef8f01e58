#include "core/quantized/nf4_format.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/quantized/format_text.hpp"

namespace riftco_transformer::detail {
namespace {

// midpoint_i = (codebook[i] + codebook[i+1]) / 2, exact in double.
constexpr std::array<double, 15> nf4_midpoints = [] {
    std::array<double, 15> midpoints{};
    for (std::size_t i = 0; i < midpoints.size(); ++i) {
        midpoints[i] =
            (static_cast<double>(nf4_codebook[i]) + static_cast<double>(nf4_codebook[i + 1])) / 2.0;
    }
    return midpoints;
}();

}  // namespace

std::uint8_t nearest_nf4_code(float r) noexcept {
    const double value = r;
    std::uint8_t code = 0;
    while (code < nf4_midpoints.size() && value > nf4_midpoints[code]) {
        ++code;
    }
    return code;
}

Nf4View view_of(const PackedNf4Payload& payload) noexcept {
    Nf4View view;
    view.layout = {payload.out_features, payload.in_features, payload.block_size,
                   payload.double_quantized, payload.scale_block_size};
    view.codes = payload.codes.data();
    view.scales = payload.scales.data();
    view.scale_codes = payload.scale_codes.data();
    view.scale_ranges = payload.scale_ranges.data();
    view.scale_offset = payload.scale_offset;
    view.block_shift = static_cast<unsigned>(std::countr_zero(payload.block_size));
    view.group_shift = payload.double_quantized
                           ? static_cast<unsigned>(std::countr_zero(payload.scale_block_size))
                           : 0U;
    return view;
}

PackedLayout checked_nf4_layout(std::string_view operation, std::size_t out_features,
                                std::size_t in_features, std::size_t block_size,
                                bool double_quantized, std::size_t scale_block_size) {
    if (out_features == 0 || in_features == 0) {
        invalid_format(operation, "the weight shape [" + std::to_string(out_features) + "," +
                                      std::to_string(in_features) + "] has a zero dimension");
    }
    if (in_features > std::numeric_limits<std::size_t>::max() / out_features) {
        throw std::overflow_error(std::string(operation) + ": element count out_features (" +
                                  std::to_string(out_features) + ") x in_features (" +
                                  std::to_string(in_features) + ") overflows");
    }
    if (!is_supported_nf4_block_size(block_size)) {
        invalid_format(operation, "block_size " + std::to_string(block_size) +
                                      " is unsupported (a power of two from 32 to 4096)");
    }
    if (double_quantized && !is_supported_nf4_block_size(scale_block_size)) {
        invalid_format(operation, "scale_block_size " + std::to_string(scale_block_size) +
                                      " is unsupported (a power of two from 32 to 4096)");
    }
    return {out_features, in_features, block_size, double_quantized,
            double_quantized ? scale_block_size : 0};
}

PackedNf4Payload encode_nf4(std::span<const float> values, const PackedLayout& layout) {
    constexpr std::string_view op = "QuantizedWeight::quantize";
    const std::size_t count = layout.element_count();
    for (std::size_t i = 0; i < count; ++i) {
        if (!std::isfinite(values[i])) {
            invalid_format(op, "weight value at flat index " + std::to_string(i) +
                                   " is not finite (" + format_float_text(values[i]) + ")");
        }
    }
    const std::size_t blocks = layout.block_count();
    PackedNf4Payload payload;
    payload.out_features = layout.out_features;
    payload.in_features = layout.in_features;
    payload.block_size = layout.block_size;
    payload.double_quantized = layout.double_quantized;
    payload.scale_block_size = layout.scale_block_size;
    payload.codes.assign(layout.packed_byte_count(), 0);

    // s_b = max|w| over the block; codes of w/s_b (all 7 when s_b = 0).
    std::vector<float> block_scales(blocks);
    for (std::size_t block = 0; block < blocks; ++block) {
        const std::size_t begin = block * layout.block_size;
        const std::size_t end = std::min(count, begin + layout.block_size);
        float scale = 0.0F;
        for (std::size_t i = begin; i < end; ++i) {
            scale = std::max(scale, std::fabs(values[i]));
        }
        block_scales[block] = scale;
        for (std::size_t i = begin; i < end; ++i) {
            const std::uint8_t code =
                scale == 0.0F ? nf4_zero_code : nearest_nf4_code(values[i] / scale);
            payload.codes[i / 2] |= static_cast<std::uint8_t>(code << ((i % 2) * 4U));
        }
    }
    if (!layout.double_quantized) {
        payload.scales = std::move(block_scales);
        return payload;
    }

    // μ: mean summed in double, stored as float.
    double sum = 0.0;
    for (const float scale : block_scales) {
        sum += scale;
    }
    const auto offset = static_cast<float>(sum / static_cast<double>(blocks));
    if (!std::isfinite(offset)) {
        throw std::overflow_error(std::string(op) + ": the double-quantized scale offset (mean " +
                                  "of the block scales) is not finite");
    }
    payload.scale_offset = offset;
    const std::size_t groups = layout.scale_group_count();
    payload.scale_ranges.assign(groups, 0.0F);
    payload.scale_codes.assign(blocks, 128);
    for (std::size_t group = 0; group < groups; ++group) {
        const std::size_t begin = group * layout.scale_block_size;
        const std::size_t end = std::min(blocks, begin + layout.scale_block_size);
        // t_g = max|s_b − μ| (the difference in float).
        float range = 0.0F;
        for (std::size_t b = begin; b < end; ++b) {
            range = std::max(range, std::fabs(block_scales[b] - offset));
        }
        payload.scale_ranges[group] = range;
        if (range == 0.0F) {
            continue;  // every code of the group stays 128
        }
        // q_b = 128 + clamp(round_half_away(127·(s_b − μ)/t_g), −127, 127), the quotient in
        // double (std::round rounds halves away from zero).
        for (std::size_t b = begin; b < end; ++b) {
            const double difference = static_cast<double>(block_scales[b] - offset);
            const double steps = std::clamp(
                std::round(127.0 * difference / static_cast<double>(range)), -127.0, 127.0);
            payload.scale_codes[b] = static_cast<std::uint8_t>(128 + static_cast<int>(steps));
        }
    }
    return payload;
}

PackedLayout validate_nf4_payload(const PackedNf4Payload& payload) {
    constexpr std::string_view op = "QuantizedWeight::from_packed_nf4";
    const PackedLayout layout =
        checked_nf4_layout(op, payload.out_features, payload.in_features, payload.block_size,
                           payload.double_quantized, payload.scale_block_size);
    const std::size_t count = layout.element_count();
    const std::size_t blocks = layout.block_count();
    if (payload.codes.size() != layout.packed_byte_count()) {
        invalid_format(op, "codes has " + std::to_string(payload.codes.size()) +
                               " bytes, expected " + std::to_string(layout.packed_byte_count()) +
                               " (ceil(N/2), N=" + std::to_string(count) + ")");
    }
    if (count % 2 == 1 && (payload.codes.back() >> 4U) != 0) {
        invalid_format(op, "codes: the unused high nibble of the last byte is " +
                               std::to_string(payload.codes.back() >> 4U) +
                               " (must be 0 for odd N=" + std::to_string(count) + ")");
    }
    const auto check_scale_value = [&](std::string_view field, std::size_t index, float value) {
        if (!std::isfinite(value) || value < 0.0F) {
            invalid_format(op, std::string(field) + "[" + std::to_string(index) +
                                   "] = " + format_float_text(value) +
                                   " is not a finite non-negative number");
        }
    };
    if (!payload.double_quantized) {
        if (payload.scale_block_size != 0) {
            invalid_format(op, "scale_block_size " + std::to_string(payload.scale_block_size) +
                                   " must be 0 for legacy scales");
        }
        if (!payload.scale_codes.empty() || !payload.scale_ranges.empty() ||
            payload.scale_offset != 0.0F) {
            invalid_format(
                op, "legacy scales: scale_codes (" + std::to_string(payload.scale_codes.size()) +
                        "), scale_ranges (" + std::to_string(payload.scale_ranges.size()) +
                        ") and scale_offset (" + format_float_text(payload.scale_offset) +
                        ") must be empty / 0");
        }
        if (payload.scales.size() != blocks) {
            invalid_format(op, "scales has " + std::to_string(payload.scales.size()) +
                                   " entries, expected " + std::to_string(blocks) +
                                   " (M = ceil(N/B))");
        }
        for (std::size_t block = 0; block < blocks; ++block) {
            check_scale_value("scales", block, payload.scales[block]);
        }
        const Nf4View view = view_of(payload);
        for (std::size_t block = 0; block < blocks; ++block) {
            if (payload.scales[block] != 0.0F) {
                continue;
            }
            const std::size_t begin = block * layout.block_size;
            const std::size_t end = std::min(count, begin + layout.block_size);
            for (std::size_t i = begin; i < end; ++i) {
                if (view.code(i) != nf4_zero_code) {
                    invalid_format(op, "codes: element " + std::to_string(i) +
                                           " of zero-scale block " + std::to_string(block) +
                                           " has code " + std::to_string(view.code(i)) +
                                           " (must be 7)");
                }
            }
        }
        return layout;
    }
    if (!payload.scales.empty()) {
        invalid_format(op,
                       "scales has " + std::to_string(payload.scales.size()) +
                           " legacy entries but the payload is double-quantized (must be empty)");
    }
    if (payload.scale_codes.size() != blocks) {
        invalid_format(op, "scale_codes has " + std::to_string(payload.scale_codes.size()) +
                               " entries, expected " + std::to_string(blocks) + " (M = ceil(N/B))");
    }
    if (payload.scale_ranges.size() != layout.scale_group_count()) {
        invalid_format(op, "scale_ranges has " + std::to_string(payload.scale_ranges.size()) +
                               " entries, expected " + std::to_string(layout.scale_group_count()) +
                               " (ceil(M/C))");
    }
    if (!std::isfinite(payload.scale_offset) || payload.scale_offset < 0.0F) {
        invalid_format(op, "scale_offset = " + format_float_text(payload.scale_offset) +
                               " is not a finite non-negative number");
    }
    for (std::size_t group = 0; group < payload.scale_ranges.size(); ++group) {
        check_scale_value("scale_ranges", group, payload.scale_ranges[group]);
    }
    return layout;
}

void dequantize_nf4_range(const Nf4View& view, std::size_t begin, std::span<float> out) noexcept {
    const std::size_t block_size = view.layout.block_size;
    std::size_t i = begin;
    const std::size_t end = begin + out.size();
    float* target = out.data() - begin;  // target[i] is element i
    while (i < end) {
        const std::size_t block = i >> view.block_shift;
        const std::size_t block_end = std::min(end, (block + 1) * block_size);
        const float scale = view.block_scale(block);
        std::array<float, 16> table;  // ŝ·codebook
        for (std::size_t k = 0; k < 16; ++k) {
            table[k] = scale * nf4_codebook[k];
        }
        if (i % 2 == 1) {
            target[i] = table[view.code(i)];
            ++i;
        }
        for (; i + 2 <= block_end; i += 2) {  // one byte: elements i (low) and i + 1 (high)
            const std::uint8_t byte = view.codes[i / 2];
            target[i] = table[byte & 0x0FU];
            target[i + 1] = table[byte >> 4U];
        }
        if (i < block_end) {
            target[i] = table[view.code(i)];
            ++i;
        }
    }
}

}  // namespace riftco_transformer::detail
