#pragma once
// Packed NF4 weights (docs/ARCHITECTURE.md, 'NF4'): a frozen [out, in] matrix stored as 4-bit codes
// into the 16-value NF4 codebook, with one scale per block of B consecutive elements in the flat
// row-major order (a block may span rows; the last one may be partial).
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
// A QuantizedWeight is immutable (copies share its state), is never a Parameter and never
// has optimizer state. It lives on an execution backend; the quantized-linear kernels decode
// the nibbles themselves and never hold a full float32 copy of the matrix.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
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

// Byte accounting per weight (summed per model). The field names are those of
// the C ABI's rt_quantized_memory_stats.
struct QuantizedMemoryUsage {
    std::size_t weight_count = 0;
    std::size_t packed_code_bytes = 0;      // ceil(N/2)
    std::size_t scale_bytes = 0;            // every scale-metadata byte of either encoding
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
    // Validates a payload strictly (every from_packed_nf4 rule of docs/ARCHITECTURE.md, 'NF4'; the
    // message names the field) and uploads it to `backend`. A zero dimension:
    // std::invalid_argument; an element count whose byte counts overflow: std::overflow_error.
    [[nodiscard]] static QuantizedWeight from_packed_nf4(PackedNf4Payload payload,
                                                         ExecutionBackend backend);

    [[nodiscard]] bool is_singular() const noexcept { return state_ == nullptr; }
    [[nodiscard]] ExecutionBackend backend() const;
    [[nodiscard]] Shape shape() const;  // {out, in}
    [[nodiscard]] std::size_t out_features() const;
    [[nodiscard]] std::size_t in_features() const;
    [[nodiscard]] std::size_t element_count() const;  // N
    [[nodiscard]] std::size_t block_size() const;
    [[nodiscard]] std::size_t block_count() const;        // M
    [[nodiscard]] std::size_t packed_byte_count() const;  // ceil(N/2)
    [[nodiscard]] bool uses_double_quantized_scales() const;
    [[nodiscard]] std::size_t scale_quantization_block_size() const;  // C; 0 for legacy
    [[nodiscard]] QuantizedMemoryUsage memory_usage() const;

    // The same weight on another backend (shares the state when it is already there).
    [[nodiscard]] QuantizedWeight to(ExecutionBackend backend) const;
    // For export and diagnostics only: the float32 matrix [out, in] on the weight's backend.
    [[nodiscard]] Tensor dequantize() const;
    // The exact payload (a host read).
    [[nodiscard]] PackedNf4Payload copy_payload_to_host() const;

    // Backend-private state, for the quantized-linear capability.
    [[nodiscard]] const detail::QuantizedStorage& storage() const;

  private:
    explicit QuantizedWeight(std::shared_ptr<const detail::QuantizedStorage> state) noexcept
        : state_(std::move(state)) {}
    void require_state(const char* operation) const;
    std::shared_ptr<const detail::QuantizedStorage> state_;
};

}  // namespace riftco_transformer
