#pragma once
// The GGUF block formats (q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k; core/quantized_weight.hpp
// gives the layouts): the layout and payload rules, ggml's reference quantizer and the host
// dequantizer that every kernel's result is checked against. The per-block formulas live in
// block_decode.hpp.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "core/backend/quantized_storage.hpp"
#include "core/quantized/block_decode.hpp"
#include "riftco_transformer/core/binary16.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::detail {

// binary16 conversion has one home: riftco_transformer/core/binary16.hpp.
using riftco_transformer::float_to_half_bits;
using riftco_transformer::half_bits_to_float;

// Read-only pointers into a block-format weight held in host memory.
struct BlockView {
    PackedLayout layout;
    const std::uint8_t* blocks = nullptr;  // layout.block_payload_bytes() bytes
    std::size_t row_bytes = 0;             // layout.row_block_bytes()
    std::size_t block_bytes = 0;           // gguf_block_bytes(layout.format)
    std::size_t block_elements = 0;        // gguf_format_block_elements(layout.format)

    // The block holding element (o, c), and the 32-element chunk of it that c starts (c a
    // multiple of 32).
    [[nodiscard]] const std::uint8_t* block(std::size_t o, std::size_t c) const noexcept {
        return blocks + o * row_bytes + (c / block_elements) * block_bytes;
    }
    [[nodiscard]] std::size_t chunk(std::size_t c) const noexcept {
        return (c % block_elements) / gguf_block_elements;
    }
};

[[nodiscard]] BlockView view_of(const PackedBlockPayload& payload) noexcept;

// The layout of a weight of this format and shape: invalid_argument naming the format (nf4
// or an unknown id), a zero dimension or an in_features that is not a multiple of the block;
// overflow_error when the byte count overflows. `operation` prefixes the messages.
[[nodiscard]] PackedLayout checked_block_layout(std::string_view operation, WeightFormat format,
                                                std::size_t out_features, std::size_t in_features);

// Every from_packed_blocks rule: the layout's, then the byte count (names both counts).
[[nodiscard]] PackedLayout validate_block_payload(const PackedBlockPayload& payload);

// ggml's reference quantizer of a host float32 matrix [out, in] (row-major), for q8_0, q4_0,
// q4_1 and q5_0, and the nearest f16 or bf16 values (overflow_error: a value beyond the
// format's range, naming its flat index). invalid_argument: a K format (names it), a non-finite
// value (names its flat index).
[[nodiscard]] PackedBlockPayload encode_blocks(std::span<const float> values,
                                               const PackedLayout& layout);

// w_i for flat indices [begin, begin + out.size()) (any begin and length).
void dequantize_block_range(const BlockView& view, std::size_t begin,
                            std::span<float> out) noexcept;

}  // namespace riftco_transformer::detail
