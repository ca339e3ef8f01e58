#pragma once
// The canonical byte form of a model's packed weights (QLoRA checkpoints, bundles, the C ABI's
// packed-state calls, Python's packed_quantized_state()). All integers little-endian:
//
//   "RTNF4ST1"                                     8-byte magic
//   u64 weight_count
//   per weight, in the model's projection order:
//     u64 out_features, u64 in_features, u64 block_size
//     u32 double_quantized (0 or 1), u32 format (WeightFormat: 0 nf4, 1 q8_0, 2 q4_0, 3 q4_1;
//       the word was reserved as 0 before the block formats, so older states read as nf4),
//     u64 scale_block_size (0 for legacy scales and the block formats)
//     nf4:
//       u64 code_byte_count, code bytes                         ceil(N/2)
//       legacy: u64 scale_count, f32 scales                     M
//       double: f32 scale_offset, u32 reserved (0),
//               u64 scale_code_count, u8 scale codes            M
//               u64 scale_range_count, f32 ranges               ceil(M/C)
//     a block format (block_size 32, double_quantized 0):
//       u64 block_byte_count, the GGUF blocks                   out·in/32·block bytes
//
// Decoding checks the framing (magic, counts against the bytes left, reserved words, known
// formats, no trailing bytes); every payload rule is QuantizedWeight::from_packed_nf4's or
// from_packed_blocks'.

#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer {

inline constexpr char packed_nf4_state_magic[8] = {'R', 'T', 'N', 'F', '4', 'S', 'T', '1'};

using PackedWeightPayload = std::variant<PackedNf4Payload, PackedBlockPayload>;

// The byte count of the encoding, from the weights' metadata alone (no device read).
[[nodiscard]] std::size_t packed_state_size(std::span<const QuantizedWeight> weights);
// The encoding (one host read of each payload). A singular weight: std::invalid_argument.
[[nodiscard]] std::vector<std::uint8_t> encode_packed_state(
    std::span<const QuantizedWeight> weights);
// The payloads of an encoding. Malformed framing: std::invalid_argument naming the weight
// index and the field.
[[nodiscard]] std::vector<PackedWeightPayload> decode_packed_state(
    std::span<const std::uint8_t> bytes);
// The weight of a decoded payload on `backend` (from_packed_nf4 or from_packed_blocks).
[[nodiscard]] QuantizedWeight upload_packed_payload(PackedWeightPayload payload,
                                                    ExecutionBackend backend);

}  // namespace riftco_transformer
