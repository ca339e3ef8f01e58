#pragma once
// The one home of the GGUF block formulas (the layouts: riftco_transformer/core/
// quantized_weight.hpp): 32 elements at a time, each value rounded as ggml and the `gguf`
// package's numpy dequantize round it. The host dequantizer, every kernel's reference and the
// GGUF reader (interchange/gguf_dequantize.cpp) all decode through these.
//
// Every product and sum is its own statement on purpose: with ISO C++ (no GNU extensions) GCC
// never contracts a*b+c into a fused multiply-add, and Clang contracts only within one
// expression, so each operation is rounded to float32 exactly as numpy does.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "riftco_transformer/core/binary16.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::detail {

[[nodiscard]] inline float block_half_at(const std::uint8_t* bytes) noexcept {
    std::uint16_t bits;
    std::memcpy(&bits, bytes, sizeof(bits));  // the host is little-endian, as GGUF is
    return half_bits_to_float(bits);
}

// The 6-bit scale and min of sub-block j (< 8) of a q4_k/q5_k block, from its 12 bytes s.
struct KScalePair {
    unsigned scale;
    unsigned min;
};
[[nodiscard]] inline KScalePair k_scale_pair(const std::uint8_t* s, std::size_t j) noexcept {
    const unsigned a = s[j];
    const unsigned b = s[j + 4];
    if (j < 4) {
        return {a & 63U, b & 63U};
    }
    const unsigned c = s[j - 4];
    return {(b & 0x0FU) | ((c >> 6U) << 4U), (b >> 4U) | ((a >> 6U) << 4U)};
}

// Where chunk `sub` (< 4) of half h of a q6_k block keeps its codes: element
// e = 128h + 32t + l has low bits (ql[64h + 32·(t % 2) + l] >> 4·⌊t/2⌋) & 15 and high bits
// (qh[32h + l] >> 2t) & 3.
struct Q6Chunk {
    const std::uint8_t* low;  // 32 bytes
    unsigned low_shift;
    const std::uint8_t* high;  // 32 bytes
    unsigned high_shift;
    const std::int8_t* scales;  // the chunk's two scales (elements 0..15, 16..31)
};
[[nodiscard]] inline Q6Chunk q6_chunk(const std::uint8_t* block, std::size_t sub) noexcept {
    const std::size_t h = sub / 4;
    const std::size_t t = sub % 4;
    return {block + 64 * h + 32 * (t % 2), 4U * static_cast<unsigned>(t / 2), block + 128 + 32 * h,
            2U * static_cast<unsigned>(t),
            reinterpret_cast<const std::int8_t*>(block + 192 + 2 * sub)};
}

// out[0..32) = the elements 32·sub .. 32·sub + 31 of `block` (sub = 0 for the 32-element
// formats, < 8 for the K formats). nf4 (not a block format) writes nothing.
inline void decode_block_chunk(WeightFormat format, const std::uint8_t* block, std::size_t sub,
                               float* out) noexcept {
    switch (format) {
        case WeightFormat::q8_0: {
            const float d = block_half_at(block);
            for (std::size_t j = 0; j < 32; ++j) {
                out[j] = d * static_cast<float>(static_cast<std::int8_t>(block[2 + j]));
            }
            return;
        }
        case WeightFormat::q4_0: {
            const float d = block_half_at(block);
            for (std::size_t j = 0; j < 16; ++j) {
                out[j] = d * static_cast<float>(static_cast<int>(block[2 + j] & 0x0FU) - 8);
                out[16 + j] = d * static_cast<float>(static_cast<int>(block[2 + j] >> 4U) - 8);
            }
            return;
        }
        case WeightFormat::q4_1: {
            const float d = block_half_at(block);
            const float m = block_half_at(block + 2);
            for (std::size_t j = 0; j < 16; ++j) {
                const float first = d * static_cast<float>(block[4 + j] & 0x0FU);
                const float second = d * static_cast<float>(block[4 + j] >> 4U);
                out[j] = first + m;
                out[16 + j] = second + m;
            }
            return;
        }
        case WeightFormat::q5_0: {
            const float d = block_half_at(block);
            std::uint32_t qh;
            std::memcpy(&qh, block + 2, sizeof(qh));
            for (std::size_t j = 0; j < 16; ++j) {
                const unsigned byte = block[6 + j];
                const unsigned low = (byte & 0x0FU) | (((qh >> j) & 1U) << 4U);
                const unsigned high = (byte >> 4U) | (((qh >> (j + 16)) & 1U) << 4U);
                out[j] = d * static_cast<float>(static_cast<int>(low) - 16);
                out[16 + j] = d * static_cast<float>(static_cast<int>(high) - 16);
            }
            return;
        }
        case WeightFormat::q4_k:
        case WeightFormat::q5_k: {
            const KScalePair pair = k_scale_pair(block + 4, sub);
            const float scale = block_half_at(block) * static_cast<float>(pair.scale);
            const float offset = block_half_at(block + 2) * static_cast<float>(pair.min);
            const bool five = format == WeightFormat::q5_k;
            const std::uint8_t* qs = block + (five ? 48 : 16) + 32 * (sub / 2);
            const unsigned shift = (sub % 2) * 4U;
            for (std::size_t l = 0; l < 32; ++l) {
                const unsigned byte = qs[l];
                unsigned q = (byte >> shift) & 0x0FU;
                if (five) {
                    const unsigned high = block[16 + l];
                    q |= ((high >> sub) & 1U) << 4U;
                }
                const float product = scale * static_cast<float>(q);
                out[l] = product - offset;
            }
            return;
        }
        case WeightFormat::q6_k: {
            const float d = block_half_at(block + 208);
            const Q6Chunk chunk = q6_chunk(block, sub);
            for (std::size_t half = 0; half < 2; ++half) {
                const float scale = d * static_cast<float>(chunk.scales[half]);
                for (std::size_t l = 16 * half; l < 16 * half + 16; ++l) {
                    const unsigned low = (unsigned{chunk.low[l]} >> chunk.low_shift) & 0x0FU;
                    const unsigned high = (unsigned{chunk.high[l]} >> chunk.high_shift) & 0x03U;
                    out[l] = scale * static_cast<float>(static_cast<int>(low | (high << 4U)) - 32);
                }
            }
            return;
        }
        case WeightFormat::f16:
            for (std::size_t j = 0; j < 32; ++j) {
                out[j] = block_half_at(block + 2 * j);
            }
            return;
        case WeightFormat::bf16:
            for (std::size_t j = 0; j < 32; ++j) {
                std::uint16_t bits;
                std::memcpy(&bits, block + 2 * j, sizeof(bits));
                out[j] = std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16U);
            }
            return;
        case WeightFormat::nf4:
            return;
    }
}

// Decodes `count` whole blocks of `format` from `blocks` into out (count·E values).
inline void decode_whole_blocks(WeightFormat format, const std::uint8_t* blocks, std::size_t count,
                                float* out) noexcept {
    const std::size_t chunks = gguf_format_block_elements(format) / gguf_block_elements;
    const std::size_t bytes = gguf_block_bytes(format);
    for (std::size_t b = 0; b < count; ++b, blocks += bytes) {
        for (std::size_t sub = 0; sub < chunks; ++sub, out += gguf_block_elements) {
            decode_block_chunk(format, blocks, sub, out);
        }
    }
}

}  // namespace riftco_transformer::detail
