#pragma once
// The GGUF block formats (q8_0, q4_0, q4_1; core/quantized_weight.hpp gives the layouts) in
// one place: binary16 conversion, the layout and payload rules, ggml's reference quantizer
// and the host dequantizer that every kernel's result is checked against.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "core/backend/quantized_storage.hpp"
#include "riftco_transformer/core/binary16.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::detail {

// binary16 conversion has one home: riftco_transformer/core/binary16.hpp.
using riftco_transformer::float_to_half_bits;
using riftco_transformer::half_bits_to_float;

[[nodiscard]] inline float half_at(const std::uint8_t* bytes) noexcept {
    std::uint16_t bits;
    std::memcpy(&bits, bytes, sizeof(bits));  // the host is little-endian, as GGUF is
    return half_bits_to_float(bits);
}

// Read-only pointers into a block-format weight held in host memory.
struct BlockView {
    PackedLayout layout;
    const std::uint8_t* blocks = nullptr;  // layout.block_payload_bytes() bytes
    std::size_t row_bytes = 0;             // layout.row_block_bytes()
    std::size_t block_bytes = 0;           // gguf_block_bytes(layout.format)

    // The block holding element (o, c), c a multiple of 32.
    [[nodiscard]] const std::uint8_t* block(std::size_t o, std::size_t c) const noexcept {
        return blocks + o * row_bytes + (c / gguf_block_elements) * block_bytes;
    }
};

[[nodiscard]] BlockView view_of(const PackedBlockPayload& payload) noexcept;

// The layout of a weight of this format and shape: invalid_argument naming the format (nf4
// or an unknown id), a zero dimension or an in_features that is not a multiple of 32;
// overflow_error when the byte count overflows. `operation` prefixes the messages.
[[nodiscard]] PackedLayout checked_block_layout(std::string_view operation, WeightFormat format,
                                                std::size_t out_features, std::size_t in_features);

// Every from_packed_blocks rule: the layout's, then the byte count (names both counts).
[[nodiscard]] PackedLayout validate_block_payload(const PackedBlockPayload& payload);

// ggml's reference quantizer of a host float32 matrix [out, in] (row-major).
// invalid_argument: a non-finite value (names its flat index).
[[nodiscard]] PackedBlockPayload encode_blocks(std::span<const float> values,
                                               const PackedLayout& layout);

// The 32 values of one block, each rounded once as the gguf package's dequantize rounds it
// (q8_0, q4_0: d·q; q4_1: d·n then + m, two roundings).
void decode_block(WeightFormat format, const std::uint8_t* block, float* out) noexcept;

// w_i for flat indices [begin, begin + out.size()) (any begin and length).
void dequantize_block_range(const BlockView& view, std::size_t begin,
                            std::span<float> out) noexcept;

}  // namespace riftco_transformer::detail
