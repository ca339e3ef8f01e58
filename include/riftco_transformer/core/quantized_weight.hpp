#pragma once
// Packed weights: NF4 (docs/ARCHITECTURE.md, 'NF4') and the GGUF block formats below. NF4 stores a
// frozen [out, in] matrix as 4-bit codes into the 16-value NF4 codebook, with one scale per block
// of B consecutive elements in the flat row-major order (a block may span rows; the last one may be
// partial).
//
// - Encoding: every value finite; s_b = max|w| over the block; code = nearest codebook entry
//   to w/s_b, an exact tie going to the LOWER index; an all-zero block has s_b = 0, codes 7.
// - Packing: element 2k in the LOW nibble of byte k, 2k+1 in the HIGH nibble; ceil(N/2)
//   bytes; for odd N the last byte's high nibble is 0.
// - Scales, one of two encodings:
//   - legacy: one float32 per block; payload ceil(N/2) + 4·M bytes (M = ceil(N/B));
//   - double-quantized (the default): offset μ = mean of the M scales (summed in double,
//     stored as float32), per group g of C consecutive scales a range t_g = max|s_b − μ|, and
//     one u8 code per block q_b = 128 + clamp(round_half_away(127·(s_b − μ)/t_g), −127, 127)
//     (128 for every block of a group whose t_g is 0). Decoded in float as
//     ŝ_b = clamp(μ + t_g·(q_b − 128)/127, 0, FLT_MAX). The resolved scales are never stored.
//     Payload ceil(N/2) + M + 4·ceil(M/C) + 4 bytes.
// - Dequantize: w_i = ŝ_{⌊i/B⌋}·codebook[code_i].
//
// GGUF block formats (ggml's layouts, bit for bit): each row of the [out, in] matrix is in/E
// blocks of E consecutive elements (in must be a multiple of E: 32, or 256 for the K formats),
// f16(b) the binary16 at b, u8/i8 a byte read unsigned/signed:
// - q8_0, 34 bytes: d = f16(0), q_j = i8(2 + j);                   w_j = d·q_j
// - q4_0, 18 bytes: d = f16(0), qs = bytes 2..17;                 w_j = d·(n_j − 8)
// - q4_1, 20 bytes: d = f16(0), m = f16(2), qs = bytes 4..19;     w_j = d·n_j + m
// - q5_0, 22 bytes: d = f16(0), qh = u32 at 2, qs = bytes 6..21;  w_j = d·((n_j | h_j·16) − 16)
//   where n_j = qs[j] & 15 and n_{j+16} = qs[j] >> 4 for j < 16, h_j = bit j of qh.
// - q4_k, 144 bytes per 256: d = f16(0), dmin = f16(2), s = bytes 4..15 (eight 6-bit scale and
//   min pairs: for j < 4 sc_j = s[j] & 63, m_j = s[j+4] & 63; for j >= 4
//   sc_j = (s[j+4] & 15) | (s[j−4] >> 6) << 4, m_j = (s[j+4] >> 4) | (s[j] >> 6) << 4),
//   qs = bytes 16..143. Sub-block j (elements 32j..32j+31): q = qs[32·⌊j/2⌋ + l] & 15 for even
//   j, >> 4 for odd j; w = (d·sc_j)·q − dmin·m_j.
// - q5_k, 176 bytes per 256: d, dmin, s as q4_k, qh = bytes 16..47, qs = bytes 48..175;
//   q = (the q4_k nibble) | ((qh[l] >> j) & 1) << 4; w = (d·sc_j)·q − dmin·m_j.
// - q6_k, 210 bytes per 256: ql = bytes 0..127, qh = bytes 128..191, sc = i8 bytes 192..207,
//   d = f16(208). Element e = 128h + 32t + l (h < 2, t < 4, l < 32):
//   low = (ql[64h + 32·(t % 2) + l] >> 4·⌊t/2⌋) & 15, high = (qh[32h + l] >> 2t) & 3,
//   w = (d·sc[⌊e/16⌋])·((low | high << 4) − 32).
// - f16, bf16, 64 bytes per 32: dense half-precision weights, w_j = the binary16 (bf16: the
//   bfloat16, its bits << 16 as a float32) at 2j; no scales. Blocks only so that they share
//   every packed-weight path.
// A weight keeps the format it was made in; converting is explicit (quantize_blocks).
//
// A QuantizedWeight is immutable (copies share its state), is never a Parameter and never
// has optimizer state. It lives on an execution backend; the quantized-linear kernels decode
// the nibbles themselves and never hold a full float32 copy of the matrix.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

namespace detail {
class QuantizedStorage;
}

// The serialized order: never reorder. Strictly increasing; code 7 is exactly 0.
inline constexpr std::array<float, 16> nf4_codebook = {
    -1.0F,
    -0.6961928009986877F,
    -0.5250730514526367F,
    -0.39491748809814453F,
    -0.28444138169288635F,
    -0.18477343022823334F,
    -0.09105003625154495F,
    0.0F,
    0.07958029955625534F,
    0.16093020141124725F,
    0.24611230194568634F,
    0.33791524171829224F,
    0.44070982933044434F,
    0.5626170039176941F,
    0.7229568362236023F,
    1.0F,
};
inline constexpr std::uint8_t nf4_zero_code = 7;

// How a packed weight is stored (the serialized ids: never renumber).
enum class WeightFormat : std::uint8_t {
    nf4 = 0,
    q8_0 = 1,
    q4_0 = 2,
    q4_1 = 3,
    q5_0 = 4,
    q4_k = 5,
    q5_k = 6,
    q6_k = 7,
    f16 = 8,
    bf16 = 9,
};
// "nf4", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k", "f16", "bf16"; "unknown" for
// an id outside the enum.
[[nodiscard]] std::string_view weight_format_name(WeightFormat format) noexcept;
// The format named `name` (as weight_format_name spells it); nullopt for any other name.
[[nodiscard]] std::optional<WeightFormat> weight_format_from_name(std::string_view name) noexcept;
[[nodiscard]] constexpr bool is_block_weight_format(WeightFormat format) noexcept {
    const auto id = static_cast<unsigned>(format);
    return id >= 1 && id <= 9;
}
// The kernels' unit: every block format decodes in 32-element chunks (a K-format block holds 8).
inline constexpr std::size_t gguf_block_elements = 32;
// Elements per block of a block format: 256 for the K formats (q4_k, q5_k, q6_k), else 32.
[[nodiscard]] constexpr std::size_t gguf_format_block_elements(WeightFormat format) noexcept {
    return format == WeightFormat::q4_k || format == WeightFormat::q5_k ||
                   format == WeightFormat::q6_k
               ? 256
               : gguf_block_elements;
}
// Bytes per block of a block format (34, 18, 20, 22, 144, 176, 210, 64, 64); 0 for nf4.
[[nodiscard]] constexpr std::size_t gguf_block_bytes(WeightFormat format) noexcept {
    switch (format) {
        case WeightFormat::q8_0:
            return 34;
        case WeightFormat::q4_0:
            return 18;
        case WeightFormat::q4_1:
            return 20;
        case WeightFormat::q5_0:
            return 22;
        case WeightFormat::q4_k:
            return 144;
        case WeightFormat::q5_k:
            return 176;
        case WeightFormat::q6_k:
            return 210;
        case WeightFormat::f16:
        case WeightFormat::bf16:
            return 64;
        case WeightFormat::nf4:
            break;
    }
    return 0;
}
// The scale bytes of one block (its binary16 d, m or dmin and the K formats' sub-block
// scales); the rest of the block is codes.
[[nodiscard]] constexpr std::size_t gguf_block_scale_bytes(WeightFormat format) noexcept {
    switch (format) {
        case WeightFormat::q8_0:
        case WeightFormat::q4_0:
        case WeightFormat::q5_0:
            return 2;
        case WeightFormat::q4_1:
            return 4;
        case WeightFormat::q4_k:
        case WeightFormat::q5_k:
            return 16;
        case WeightFormat::q6_k:
            return 18;
        case WeightFormat::f16:
        case WeightFormat::bf16:
        case WeightFormat::nf4:
            break;
    }
    return 0;
}

inline constexpr std::size_t nf4_default_block_size = 64;
inline constexpr std::size_t nf4_default_scale_block_size = 256;
// Both levels allow exactly the powers of two 32, 64, ..., 4096.
[[nodiscard]] constexpr bool is_supported_nf4_block_size(std::size_t size) noexcept {
    return size >= 32 && size <= 4096 && (size & (size - 1)) == 0;
}

struct Nf4Options {
    std::size_t block_size = nf4_default_block_size;  // B
    bool double_quantization = true;
    std::size_t scale_block_size = nf4_default_scale_block_size;  // C (double quantization only)
};

// The exact payload of one packed weight, in host memory. Exactly one scale encoding is
// present: `scales` (legacy) or `scale_codes` + `scale_ranges` + `scale_offset` (double).
struct PackedNf4Payload {
    std::size_t out_features = 0;  // rows
    std::size_t in_features = 0;   // columns
    std::size_t block_size = nf4_default_block_size;
    bool double_quantized = false;
    std::size_t scale_block_size = 0;       // C; 0 for legacy scales
    std::vector<std::uint8_t> codes;        // ceil(N/2) bytes
    std::vector<float> scales;              // legacy: M
    std::vector<std::uint8_t> scale_codes;  // double: M
    std::vector<float> scale_ranges;        // double: ceil(M/C), the t_g
    float scale_offset = 0.0F;              // double: μ
};

// The exact bytes of one weight in a GGUF block format, in host memory: out·in/E blocks in
// row-major order (row o is blocks [o·in/E, (o+1)·in/E); E = gguf_format_block_elements).
struct PackedBlockPayload {
    WeightFormat format = WeightFormat::q8_0;
    std::size_t out_features = 0;  // rows
    std::size_t in_features = 0;   // columns, a multiple of E
    std::vector<std::uint8_t> blocks;
};

// Byte accounting per weight (summed per model). The field names are those of
// the C ABI's rt_quantized_memory_stats.
struct QuantizedMemoryUsage {
    std::size_t weight_count = 0;
    std::size_t packed_code_bytes = 0;      // nf4: ceil(N/2); block formats: all but scales
    std::size_t scale_bytes = 0;            // every scale-metadata byte of any encoding
    std::size_t logical_payload_bytes = 0;  // packed_code_bytes + scale_bytes
    // Every byte the backend holds for the weight: allocations and mirrors alike, so a hidden
    // float32 copy would show up here.
    std::size_t resident_payload_bytes = 0;
    std::size_t fp32_equivalent_bytes = 0;     // 4N
    std::size_t fp32_scale_bytes = 0;          // legacy: 4M
    std::size_t scale_code_bytes = 0;          // double: M
    std::size_t second_level_scale_bytes = 0;  // double: 4·ceil(M/C)
    std::size_t scale_offset_bytes = 0;        // double: 4
    std::size_t double_quantized_weight_count = 0;
    std::size_t half_scale_bytes = 0;  // block formats: every block's scale bytes (d, m, dmin, sc)
    std::size_t block_format_weight_count = 0;

    QuantizedMemoryUsage& operator+=(const QuantizedMemoryUsage& other) noexcept;
};

class QuantizedWeight {
  public:
    // Singular (no state): every accessor but is_singular() throws std::logic_error.
    QuantizedWeight() noexcept = default;

    // Packs a rank-2 float32 weight [out, in] (on any backend: it is read to the host once)
    // and places the result on the weight's backend. std::invalid_argument: rank != 2, an
    // unsupported block size (the message names block_size or scale_block_size and the
    // value), a non-finite value (names its flat index); std::overflow_error: the double-
    // quantized offset μ is not finite.
    [[nodiscard]] static QuantizedWeight quantize(const Tensor& weight,
                                                  const Nf4Options& options = {});
    // Packs a rank-2 float32 weight [out, in] into a GGUF block format with ggml's reference
    // rounding (quantize_row_q8_0/q4_0/q4_1/q5_0_ref: the scale from the block's float32
    // extremes, stored as binary16, codes rounded against the float32 scale); f16 and bf16
    // round each value to the nearest (ties to even), std::overflow_error naming the flat index
    // of one beyond the format's range.
    // std::invalid_argument: rank != 2, nf4 (use quantize), a K format (those weights come
    // from GGUF files), in not a multiple of 32, a non-finite value (names its flat index).
    [[nodiscard]] static QuantizedWeight quantize_blocks(const Tensor& weight, WeightFormat format);
    // Validates a block payload (a block format, nonzero dimensions, in a multiple of E, the
    // byte count out·in/E·block bytes, finite binary16 scales; the message names the field and the
    // value) and uploads it to `backend`. std::runtime_error, naming both, when that backend lacks
    // the format.
    [[nodiscard]] static QuantizedWeight from_packed_blocks(PackedBlockPayload payload,
                                                            ExecutionBackend backend);
    // Validates a payload strictly (every from_packed_nf4 rule of docs/ARCHITECTURE.md, 'NF4'; the
    // message names the field) and uploads it to `backend`. A zero dimension:
    // std::invalid_argument; an element count whose byte counts overflow: std::overflow_error.
    [[nodiscard]] static QuantizedWeight from_packed_nf4(PackedNf4Payload payload,
                                                         ExecutionBackend backend);

    [[nodiscard]] bool is_singular() const noexcept { return state_ == nullptr; }
    [[nodiscard]] WeightFormat format() const;
    [[nodiscard]] ExecutionBackend backend() const;
    [[nodiscard]] Shape shape() const;  // {out, in}
    [[nodiscard]] std::size_t out_features() const;
    [[nodiscard]] std::size_t in_features() const;
    [[nodiscard]] std::size_t element_count() const;      // N
    [[nodiscard]] std::size_t block_size() const;         // B; E for the block formats
    [[nodiscard]] std::size_t block_count() const;        // M
    [[nodiscard]] std::size_t packed_byte_count() const;  // the code bytes (see memory_usage)
    [[nodiscard]] bool uses_double_quantized_scales() const;
    [[nodiscard]] std::size_t scale_quantization_block_size() const;  // C; 0 for legacy
    [[nodiscard]] QuantizedMemoryUsage memory_usage() const;

    // The same weight on another backend (shares the state when it is already there);
    // std::runtime_error when that backend lacks the weight's format.
    [[nodiscard]] QuantizedWeight to(ExecutionBackend backend) const;
    // For export and diagnostics only: the float32 matrix [out, in] on the weight's backend.
    [[nodiscard]] Tensor dequantize() const;
    // The exact payload (a host read). std::logic_error for a weight of another format.
    [[nodiscard]] PackedNf4Payload copy_payload_to_host() const;
    // The exact blocks (a host read). std::logic_error for an nf4 weight.
    [[nodiscard]] PackedBlockPayload copy_blocks_to_host() const;

    // Backend-private state, for the quantized-linear capability.
    [[nodiscard]] const detail::QuantizedStorage& storage() const;

  private:
    explicit QuantizedWeight(std::shared_ptr<const detail::QuantizedStorage> state) noexcept
        : state_(std::move(state)) {}
    void require_state(const char* operation) const;
    std::shared_ptr<const detail::QuantizedStorage> state_;
};

}  // namespace riftco_transformer
