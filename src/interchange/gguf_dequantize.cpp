// GGUF tensor types -> float32. The formulas (and the float32 evaluation order, so results
// are bit-identical to the `gguf` package's quants.dequantize, which mirrors ggml) are given
// above each kernel; f16(b) is the binary16 at byte b, u8/i8 a byte read unsigned/signed.
//
// Every product and sum below is a separate statement on purpose: with ISO C++ (no GNU
// extensions) GCC never contracts a*b+c into a fused multiply-add, and Clang contracts only
// within one expression, so each operation is rounded to float32 exactly as numpy does.

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "riftco_transformer/core/binary16.hpp"
#include "riftco_transformer/interchange/gguf.hpp"

namespace riftco_transformer {
namespace {

constexpr std::size_t k_block_elements = 256;  // QK_K

std::uint16_t load_u16(const std::uint8_t* bytes) noexcept {
    std::uint16_t value;
    std::memcpy(&value, bytes, sizeof(value));
    return value;  // the host is little-endian (checked in gguf_reader.cpp)
}

// binary16 -> float32 has one home: riftco_transformer/core/binary16.hpp.
float half_to_float(std::uint16_t bits) noexcept {
    return half_bits_to_float(bits);
}

float half_at(const std::uint8_t* bytes) noexcept {
    return half_to_float(load_u16(bytes));
}

// Kernels: `count` consecutive blocks from `blocks` into `out`.
using BlockKernel = void (*)(const std::uint8_t* blocks, std::size_t count, float* out);

// F32: 4 bytes per element, copied bit for bit.
void dequantize_f32(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    std::memcpy(out, blocks, count * sizeof(float));
}

// F16: x = f16.
void dequantize_f16(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t i = 0; i < count; ++i) {
        out[i] = half_at(blocks + 2 * i);
    }
}

// BF16: x = the bits << 16.
void dequantize_bf16(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t i = 0; i < count; ++i) {
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_u16(blocks + 2 * i)) << 16U);
    }
}

// Q4_0, 18 bytes -> 32: d = f16(0), qs = bytes 2..17;
// x[j] = d·((qs[j] & 15) − 8), x[j+16] = d·((qs[j] >> 4) − 8), j < 16.
void dequantize_q4_0(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t b = 0; b < count; ++b, blocks += 18, out += 32) {
        const float d = half_at(blocks);
        const std::uint8_t* qs = blocks + 2;
        for (std::size_t j = 0; j < 16; ++j) {
            out[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
            out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
    }
}

// Q4_1, 20 bytes -> 32: d = f16(0), m = f16(2), qs = bytes 4..19;
// x[j] = (d·(qs[j] & 15)) + m, x[j+16] = (d·(qs[j] >> 4)) + m, j < 16.
void dequantize_q4_1(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t b = 0; b < count; ++b, blocks += 20, out += 32) {
        const float d = half_at(blocks);
        const float m = half_at(blocks + 2);
        const std::uint8_t* qs = blocks + 4;
        for (std::size_t j = 0; j < 16; ++j) {
            const float low = d * static_cast<float>(qs[j] & 0x0F);
            const float high = d * static_cast<float>(qs[j] >> 4);
            out[j] = low + m;
            out[j + 16] = high + m;
        }
    }
}

// Q8_0, 34 bytes -> 32: d = f16(0); x[j] = d·i8(2 + j).
void dequantize_q8_0(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t b = 0; b < count; ++b, blocks += 34, out += 32) {
        const float d = half_at(blocks);
        for (std::size_t j = 0; j < 32; ++j) {
            out[j] = d * static_cast<float>(static_cast<std::int8_t>(blocks[2 + j]));
        }
    }
}

// The 8 six-bit (scale, min) pairs of Q4_K/Q5_K, packed in 12 bytes s:
// j < 4: sc = s[j] & 63, m = s[j+4] & 63;
// j ≥ 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
struct KScales {
    std::array<float, 8> scale;   // d·sc_j
    std::array<float, 8> offset;  // dmin·m_j
};

KScales k_scales(float d, float dmin, const std::uint8_t* s) noexcept {
    KScales result{};
    for (std::size_t j = 0; j < 8; ++j) {
        unsigned sc = 0;
        unsigned m = 0;
        if (j < 4) {
            sc = s[j] & 63U;
            m = s[j + 4] & 63U;
        } else {
            sc = (s[j + 4] & 0x0FU) | ((s[j - 4] >> 6U) << 4U);
            m = (s[j + 4] >> 4U) | ((s[j] >> 6U) << 4U);
        }
        result.scale[j] = d * static_cast<float>(sc);
        result.offset[j] = dmin * static_cast<float>(m);
    }
    return result;
}

// Q4_K, 144 bytes -> 256: d = f16(0), dmin = f16(2), scales = bytes 4..15, qs = bytes 16..143.
// Sub-block j (32 elements): q = qs[32·⌊j/2⌋ + l] & 15 (j even) or >> 4 (j odd), l < 32;
// x[32j + l] = (d·sc_j)·q − dmin·m_j.
void dequantize_q4_k(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t b = 0; b < count; ++b, blocks += 144, out += k_block_elements) {
        const KScales scales = k_scales(half_at(blocks), half_at(blocks + 2), blocks + 4);
        const std::uint8_t* qs = blocks + 16;
        for (std::size_t j = 0; j < 8; ++j) {
            const std::uint8_t* bytes = qs + 32 * (j / 2);
            const unsigned shift = (j % 2) * 4U;
            for (std::size_t l = 0; l < 32; ++l) {
                const auto q = static_cast<float>((bytes[l] >> shift) & 0x0FU);
                const float product = scales.scale[j] * q;
                out[32 * j + l] = product - scales.offset[j];
            }
        }
    }
}

// Q5_K, 176 bytes -> 256: d = f16(0), dmin = f16(2), scales = bytes 4..15, qh = bytes 16..47,
// qs = bytes 48..175. Sub-block j: q = (qs nibble as in Q4_K) | ((qh[l] >> j) & 1) << 4;
// x[32j + l] = (d·sc_j)·q − dmin·m_j.
void dequantize_q5_k(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t b = 0; b < count; ++b, blocks += 176, out += k_block_elements) {
        const KScales scales = k_scales(half_at(blocks), half_at(blocks + 2), blocks + 4);
        const std::uint8_t* qh = blocks + 16;
        const std::uint8_t* qs = blocks + 48;
        for (std::size_t j = 0; j < 8; ++j) {
            const std::uint8_t* bytes = qs + 32 * (j / 2);
            const unsigned shift = (j % 2) * 4U;
            for (std::size_t l = 0; l < 32; ++l) {
                const unsigned low = (bytes[l] >> shift) & 0x0FU;
                const unsigned high = (qh[l] >> j) & 1U;
                const auto q = static_cast<float>(low | (high << 4U));
                const float product = scales.scale[j] * q;
                out[32 * j + l] = product - scales.offset[j];
            }
        }
    }
}

// Q6_K, 210 bytes -> 256: ql = bytes 0..127, qh = bytes 128..191, sc = i8 bytes 192..207,
// d = f16(208). Element e = 128h + 32t + l (h < 2, t < 4, l < 32):
// low = (ql[64h + 32·(t % 2) + l] >> 4·⌊t/2⌋) & 15, high = (qh[32h + l] >> 2t) & 3,
// x[e] = (d·sc[⌊e/16⌋])·((low | high << 4) − 32).
void dequantize_q6_k(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    for (std::size_t b = 0; b < count; ++b, blocks += 210, out += k_block_elements) {
        const std::uint8_t* ql = blocks;
        const std::uint8_t* qh = blocks + 128;
        const std::uint8_t* sc = blocks + 192;
        const float d = half_at(blocks + 208);
        std::array<float, 16> scale{};
        for (std::size_t i = 0; i < 16; ++i) {
            scale[i] = d * static_cast<float>(static_cast<std::int8_t>(sc[i]));
        }
        for (std::size_t h = 0; h < 2; ++h) {
            for (std::size_t t = 0; t < 4; ++t) {
                const std::uint8_t* low_bytes = ql + 64 * h + 32 * (t % 2);
                const unsigned low_shift = 4U * static_cast<unsigned>(t / 2);
                const unsigned high_shift = 2U * static_cast<unsigned>(t);
                for (std::size_t l = 0; l < 32; ++l) {
                    const std::size_t e = 128 * h + 32 * t + l;
                    const unsigned low = (low_bytes[l] >> low_shift) & 0x0FU;
                    const unsigned high = (qh[32 * h + l] >> high_shift) & 0x03U;
                    const int q = static_cast<int>(low | (high << 4U)) - 32;
                    out[e] = scale[e / 16] * static_cast<float>(q);
                }
            }
        }
    }
}

BlockKernel kernel_for(GgmlType type) noexcept {
    switch (type) {
        case GgmlType::F32:
            return dequantize_f32;
        case GgmlType::F16:
            return dequantize_f16;
        case GgmlType::BF16:
            return dequantize_bf16;
        case GgmlType::Q4_0:
            return dequantize_q4_0;
        case GgmlType::Q4_1:
            return dequantize_q4_1;
        case GgmlType::Q8_0:
            return dequantize_q8_0;
        case GgmlType::Q4_K:
            return dequantize_q4_k;
        case GgmlType::Q5_K:
            return dequantize_q5_k;
        case GgmlType::Q6_K:
            return dequantize_q6_k;
        default:
            return nullptr;
    }
}

constexpr std::string_view supported_list = "F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K";

std::string type_text(GgmlType type) {
    return std::string(ggml_type_name(type)) + " (" +
           std::to_string(static_cast<std::uint32_t>(type)) + ")";
}

// The kernel of `tensor`'s type; a type without one: GgufFormatError naming the tensor.
BlockKernel tensor_kernel(const std::string& source, const GgufTensorInfo& tensor) {
    const BlockKernel kernel = kernel_for(tensor.type);
    if (kernel == nullptr) {
        throw GgufFormatError("gguf: " + source + ": tensor '" + tensor.name + "' has type " +
                              type_text(tensor.type) + ", which dequantize does not support " +
                              "(supported: " + std::string(supported_list) + ")");
    }
    return kernel;
}

}  // namespace

float gguf_half_to_float(std::uint16_t bits) noexcept {
    return half_to_float(bits);
}

float gguf_bfloat16_to_float(std::uint16_t bits) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16U);
}

bool gguf_can_dequantize(GgmlType type) noexcept {
    return kernel_for(type) != nullptr;
}

void dequantize_gguf_blocks(GgmlType type, std::span<const std::uint8_t> blocks,
                            std::span<float> out) {
    constexpr std::string_view op = "dequantize_gguf_blocks";
    const BlockKernel kernel = kernel_for(type);
    if (kernel == nullptr) {
        throw std::invalid_argument(std::string(op) + ": type " + type_text(type) +
                                    " is not supported (supported: " + std::string(supported_list) +
                                    ")");
    }
    const GgmlTypeLayout layout = *ggml_type_layout(type);
    if (blocks.size() % layout.block_bytes != 0) {
        throw std::invalid_argument(std::string(op) + ": blocks has " +
                                    std::to_string(blocks.size()) + " bytes, not a multiple of " +
                                    type_text(type) + "'s " + std::to_string(layout.block_bytes) +
                                    "-byte block");
    }
    const std::size_t count = blocks.size() / layout.block_bytes;
    if (out.size() != count * layout.block_elements) {
        throw std::invalid_argument(
            std::string(op) + ": out has " + std::to_string(out.size()) + " floats, expected " +
            std::to_string(count * layout.block_elements) + " (" + std::to_string(count) +
            " blocks of " + std::to_string(layout.block_elements) + ")");
    }
    kernel(blocks.data(), count, out.data());
}

void GgufFile::dequantize_into(const GgufTensorInfo& tensor, std::span<float> out) const {
    const std::span<const std::uint8_t> bytes = tensor_bytes(tensor);  // checks membership
    const BlockKernel kernel = tensor_kernel(source_, tensor);
    if (out.size() != tensor.element_count) {
        throw std::invalid_argument("gguf: " + source_ + ": tensor '" + tensor.name + "' has " +
                                    std::to_string(tensor.element_count) +
                                    " elements but out has " + std::to_string(out.size()));
    }
    // open() checked that dims[0] is a multiple of the block size, so blocks never straddle
    // rows and the flat block order is the row-major element order.
    const GgmlTypeLayout layout = *ggml_type_layout(tensor.type);
    const std::size_t block_count = bytes.size() / layout.block_bytes;
    constexpr std::size_t elements_per_chunk = std::size_t{1} << 16U;
    const std::size_t blocks_per_chunk =
        std::max<std::size_t>(1, elements_per_chunk / layout.block_elements);
    const auto chunk_count =
        static_cast<std::int64_t>((block_count + blocks_per_chunk - 1) / blocks_per_chunk);
    if (descriptor_ < 0) {
#pragma omp parallel for schedule(static) if (chunk_count > 1)
        for (std::int64_t chunk = 0; chunk < chunk_count; ++chunk) {
            const std::size_t first = static_cast<std::size_t>(chunk) * blocks_per_chunk;
            const std::size_t count = std::min(blocks_per_chunk, block_count - first);
            kernel(bytes.data() + first * layout.block_bytes, count,
                   out.data() + first * layout.block_elements);
        }
        return;
    }
    // An opened file: each chunk is read with pread (read_data), so a file that has shrunk
    // since open() is an error here rather than a SIGBUS in the mapping. The first error is
    // kept and thrown after the parallel loop (exceptions must not leave it).
    std::exception_ptr failure;
#pragma omp parallel if (chunk_count > 1)
    {
        std::vector<std::uint8_t> staged(blocks_per_chunk * layout.block_bytes);
#pragma omp for schedule(static)
        for (std::int64_t chunk = 0; chunk < chunk_count; ++chunk) {
            const std::size_t first = static_cast<std::size_t>(chunk) * blocks_per_chunk;
            const std::size_t count = std::min(blocks_per_chunk, block_count - first);
            const std::span<std::uint8_t> blocks(staged.data(), count * layout.block_bytes);
            try {
                read_data(tensor.offset + first * layout.block_bytes, blocks);
            } catch (...) {
#pragma omp critical(riftco_gguf_read_failure)
                if (!failure)
                    failure = std::current_exception();
                continue;
            }
            kernel(blocks.data(), count, out.data() + first * layout.block_elements);
        }
    }
    if (failure)
        std::rethrow_exception(failure);
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& tensor) const {
    // Both checks before allocating.
    static_cast<void>(tensor_index_of(tensor));
    static_cast<void>(tensor_kernel(source_, tensor));
    std::vector<float> values(static_cast<std::size_t>(tensor.element_count));
    dequantize_into(tensor, values);
    return values;
}

}  // namespace riftco_transformer
