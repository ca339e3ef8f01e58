// The GGUF block formats (block_format.hpp). The quantizer transcribes ggml's reference
// rounding (quantize_row_q8_0_ref, _q4_0_ref, _q4_1_ref, _q5_0_ref) from its documented
// formulas; the dequantizer decodes through block_decode.hpp.

#include "core/quantized/block_format.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/quantized/format_text.hpp"

namespace riftco_transformer::detail {
namespace {

void store_half(std::uint8_t* bytes, float value) noexcept {
    const std::uint16_t bits = float_to_half_bits(value);
    std::memcpy(bytes, &bits, sizeof(bits));
}

// ggml's (int8_t) conversion of a small non-negative float, then MIN(15, ·).
std::uint8_t nibble_of(float shifted) noexcept {
    return static_cast<std::uint8_t>(std::min(15, static_cast<int>(shifted)));
}

void encode_q8_0(const float* x, std::uint8_t* block) noexcept {
    float amax = 0.0F;
    for (std::size_t j = 0; j < gguf_block_elements; ++j) {
        amax = std::max(amax, std::fabs(x[j]));
    }
    const float d = amax / 127.0F;
    const float id = d != 0.0F ? 1.0F / d : 0.0F;
    store_half(block, d);
    for (std::size_t j = 0; j < gguf_block_elements; ++j) {
        const float scaled = x[j] * id;
        block[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(scaled)));
    }
}

// The value of largest magnitude of a block, with its sign (the first such one; 0 for an
// all-zero block), from which q4_0 and q5_0 take their scale.
float signed_absolute_max(const float* x) noexcept {
    float amax = 0.0F;
    float max = 0.0F;
    for (std::size_t j = 0; j < gguf_block_elements; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

void encode_q4_0(const float* x, std::uint8_t* block) noexcept {
    const float max = signed_absolute_max(x);
    const float d = max / -8.0F;  // an all-zero block gives -0.0, as in ggml
    const float id = d != 0.0F ? 1.0F / d : 0.0F;
    store_half(block, d);
    for (std::size_t j = 0; j < 16; ++j) {
        const float first = x[j] * id;
        const float second = x[16 + j] * id;
        block[2 + j] =
            static_cast<std::uint8_t>(nibble_of(first + 8.5F) | (nibble_of(second + 8.5F) << 4U));
    }
}

void encode_q4_1(const float* x, std::uint8_t* block) noexcept {
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (std::size_t j = 0; j < gguf_block_elements; ++j) {
        min = std::min(min, x[j]);
        max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15.0F;
    const float id = d != 0.0F ? 1.0F / d : 0.0F;
    store_half(block, d);
    store_half(block + 2, min);
    for (std::size_t j = 0; j < 16; ++j) {
        const float first = (x[j] - min) * id;
        const float second = (x[16 + j] - min) * id;
        block[4 + j] =
            static_cast<std::uint8_t>(nibble_of(first + 0.5F) | (nibble_of(second + 0.5F) << 4U));
    }
}

void encode_q5_0(const float* x, std::uint8_t* block) noexcept {
    const float max = signed_absolute_max(x);
    const float d = max / -16.0F;
    const float id = d != 0.0F ? 1.0F / d : 0.0F;
    store_half(block, d);
    std::uint32_t qh = 0;
    for (std::size_t j = 0; j < 16; ++j) {
        const float first = x[j] * id;
        const float second = x[16 + j] * id;
        // ggml's (int8_t) conversion, then MIN(31, ·)
        const auto low = static_cast<unsigned>(std::min(31, static_cast<int>(first + 16.5F)));
        const auto high = static_cast<unsigned>(std::min(31, static_cast<int>(second + 16.5F)));
        block[6 + j] = static_cast<std::uint8_t>((low & 0x0FU) | ((high & 0x0FU) << 4U));
        qh |= ((low >> 4U) & 1U) << j;
        qh |= ((high >> 4U) & 1U) << (j + 16);
    }
    std::memcpy(block + 2, &qh, sizeof(qh));
}

// f16: binary16 rounding (ties to even); bf16: the float32 bits rounded to their top 16
// (ties to even). A value beyond the format's range: std::overflow_error naming its index.
void encode_half(WeightFormat format, const float* x, std::size_t first, std::uint8_t* block) {
    for (std::size_t j = 0; j < gguf_block_elements; ++j) {
        std::uint16_t bits = 0;
        if (format == WeightFormat::f16) {
            bits = float_to_half_bits(x[j]);
        } else {
            const auto word = std::bit_cast<std::uint32_t>(x[j]);
            bits = static_cast<std::uint16_t>((word + 0x7FFFU + ((word >> 16U) & 1U)) >> 16U);
        }
        const float back = format == WeightFormat::f16
                               ? half_bits_to_float(bits)
                               : std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16U);
        if (!std::isfinite(back)) {
            throw std::overflow_error(
                "QuantizedWeight::quantize_blocks: weight value at flat index " +
                std::to_string(first + j) + " (" + format_float_text(x[j]) + ") is beyond " +
                std::string(weight_format_name(format)) + "'s range");
        }
        std::memcpy(block + 2 * j, &bits, sizeof(bits));
    }
}

// The byte offsets of a block's binary16 scales (d, and m or dmin where the format has one).
struct HalfScales {
    std::size_t count;
    std::size_t offsets[2];
};
HalfScales half_scales_of(WeightFormat format) noexcept {
    switch (format) {
        case WeightFormat::q4_1:
        case WeightFormat::q4_k:
        case WeightFormat::q5_k:
            return {2, {0, 2}};
        case WeightFormat::q6_k:
            return {1, {208, 0}};
        case WeightFormat::f16:
        case WeightFormat::bf16:
            return {0, {0, 0}};  // dense values: no scale
        default:
            return {1, {0, 0}};
    }
}

const char* half_scale_name(WeightFormat format, std::size_t h) noexcept {
    if (h == 0) {
        return "the scale d";
    }
    return format == WeightFormat::q4_1 ? "the minimum m" : "the minimum scale dmin";
}

}  // namespace

BlockView view_of(const PackedBlockPayload& payload) noexcept {
    BlockView view;
    view.layout.out_features = payload.out_features;
    view.layout.in_features = payload.in_features;
    view.layout.block_size = gguf_format_block_elements(payload.format);
    view.layout.format = payload.format;
    view.blocks = payload.blocks.data();
    view.row_bytes = view.layout.row_block_bytes();
    view.block_bytes = gguf_block_bytes(payload.format);
    view.block_elements = gguf_format_block_elements(payload.format);
    return view;
}

PackedLayout checked_block_layout(std::string_view operation, WeightFormat format,
                                  std::size_t out_features, std::size_t in_features) {
    if (!is_block_weight_format(format)) {
        invalid_format(operation,
                       "format " + std::string(weight_format_name(format)) + " (id " +
                           std::to_string(static_cast<unsigned>(format)) +
                           ") is not a GGUF block format (q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, "
                           "q6_k, f16 or bf16)");
    }
    if (out_features == 0 || in_features == 0) {
        invalid_format(operation, "the weight shape [" + std::to_string(out_features) + "," +
                                      std::to_string(in_features) + "] has a zero dimension");
    }
    const std::size_t elements = gguf_format_block_elements(format);
    if (in_features % elements != 0) {
        invalid_format(operation, "in_features " + std::to_string(in_features) + " of a " +
                                      std::string(weight_format_name(format)) +
                                      " weight is not a multiple of its " +
                                      std::to_string(elements) + "-element block");
    }
    const std::size_t row_bytes = in_features / elements * gguf_block_bytes(format);
    if (row_bytes > std::numeric_limits<std::size_t>::max() / out_features ||
        in_features > std::numeric_limits<std::size_t>::max() / out_features) {
        throw std::overflow_error(std::string(operation) + ": out_features (" +
                                  std::to_string(out_features) + ") x in_features (" +
                                  std::to_string(in_features) + ") overflows");
    }
    PackedLayout layout;
    layout.out_features = out_features;
    layout.in_features = in_features;
    layout.block_size = elements;
    layout.format = format;
    return layout;
}

PackedLayout validate_block_payload(const PackedBlockPayload& payload) {
    constexpr std::string_view op = "QuantizedWeight::from_packed_blocks";
    const PackedLayout layout =
        checked_block_layout(op, payload.format, payload.out_features, payload.in_features);
    if (payload.blocks.size() != layout.block_payload_bytes()) {
        invalid_format(op, "blocks has " + std::to_string(payload.blocks.size()) +
                               " bytes, expected " + std::to_string(layout.block_payload_bytes()) +
                               " (" + std::to_string(layout.block_count()) + " " +
                               std::string(weight_format_name(payload.format)) + " blocks of " +
                               std::to_string(gguf_block_bytes(payload.format)) + " bytes for [" +
                               std::to_string(payload.out_features) + "," +
                               std::to_string(payload.in_features) + "])");
    }
    // Scales must be finite (a NaN or infinite d, m or dmin would poison every product).
    const std::size_t block_bytes = gguf_block_bytes(payload.format);
    const HalfScales halves = half_scales_of(payload.format);
    for (std::size_t b = 0; b < layout.block_count(); ++b) {
        for (std::size_t h = 0; h < halves.count; ++h) {
            const float value =
                block_half_at(payload.blocks.data() + b * block_bytes + halves.offsets[h]);
            if (!std::isfinite(value)) {
                const std::size_t row_blocks = payload.in_features / layout.block_size;
                invalid_format(op, std::string(half_scale_name(payload.format, h)) + " of block " +
                                       std::to_string(b % row_blocks) + " of row " +
                                       std::to_string(b / row_blocks) + " is " +
                                       format_float_text(value) + " (must be finite)");
            }
        }
    }
    return layout;
}

PackedBlockPayload encode_blocks(std::span<const float> values, const PackedLayout& layout) {
    constexpr std::string_view op = "QuantizedWeight::quantize_blocks";
    if (layout.block_size != gguf_block_elements) {
        invalid_format(op, "format " + std::string(weight_format_name(layout.format)) +
                               " cannot be produced here: K-format weights come from GGUF files "
                               "(quantize into q8_0, q5_0, q4_1, q4_0, f16 or bf16)");
    }
    const std::size_t count = layout.element_count();
    for (std::size_t i = 0; i < count; ++i) {
        if (!std::isfinite(values[i])) {
            invalid_format(op, "weight value at flat index " + std::to_string(i) +
                                   " is not finite (" + format_float_text(values[i]) + ")");
        }
    }
    PackedBlockPayload payload;
    payload.format = layout.format;
    payload.out_features = layout.out_features;
    payload.in_features = layout.in_features;
    payload.blocks.assign(layout.block_payload_bytes(), 0);
    const std::size_t block_bytes = gguf_block_bytes(layout.format);
    for (std::size_t b = 0; b < layout.block_count(); ++b) {
        const float* x = values.data() + b * gguf_block_elements;
        std::uint8_t* block = payload.blocks.data() + b * block_bytes;
        switch (layout.format) {
            case WeightFormat::q8_0:
                encode_q8_0(x, block);
                break;
            case WeightFormat::q4_0:
                encode_q4_0(x, block);
                break;
            case WeightFormat::q4_1:
                encode_q4_1(x, block);
                break;
            case WeightFormat::q5_0:
                encode_q5_0(x, block);
                break;
            case WeightFormat::f16:
            case WeightFormat::bf16:
                encode_half(layout.format, x, b * gguf_block_elements, block);
                break;
            default:
                break;  // nf4 and the K formats are refused above
        }
        // A scale beyond binary16's range would be stored as infinity: refuse it.
        const HalfScales halves = half_scales_of(layout.format);
        for (std::size_t h = 0; h < halves.count; ++h) {
            if (!std::isfinite(block_half_at(block + halves.offsets[h]))) {
                throw std::overflow_error(
                    std::string(op) + ": block " + std::to_string(b) + " (flat indices from " +
                    std::to_string(b * gguf_block_elements) + ") needs a " +
                    (h == 0 ? "scale" : "minimum") + " beyond binary16's range (|value| > 65504)");
            }
        }
    }
    return payload;
}

void dequantize_block_range(const BlockView& view, std::size_t begin,
                            std::span<float> out) noexcept {
    // Whole 32-element chunks decode straight into out; a partial one goes through `values`.
    std::size_t done = 0;
    float values[gguf_block_elements];
    while (done < out.size()) {
        const std::size_t index = begin + done;
        const std::size_t block = index / view.block_elements;
        const std::size_t chunk = (index % view.block_elements) / gguf_block_elements;
        const std::size_t offset = index % gguf_block_elements;
        const std::size_t take = std::min(gguf_block_elements - offset, out.size() - done);
        const std::uint8_t* bytes = view.blocks + block * view.block_bytes;
        if (offset == 0 && take == gguf_block_elements) {
            decode_block_chunk(view.layout.format, bytes, chunk, out.data() + done);
        } else {
            decode_block_chunk(view.layout.format, bytes, chunk, values);
            std::copy_n(values + offset, take, out.data() + done);
        }
        done += take;
    }
}

}  // namespace riftco_transformer::detail
