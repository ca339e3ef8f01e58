// GGUF tensor types -> float32, bit-identical to the `gguf` package's quants.dequantize (which
// mirrors ggml). F32, F16 and BF16 are converted here; the block formats decode through
// core/quantized/block_decode.hpp, the one home of their formulas and rounding order.

#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/quantized/block_decode.hpp"
#include "riftco_transformer/core/binary16.hpp"
#include "riftco_transformer/interchange/gguf.hpp"

namespace riftco_transformer {
namespace {

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

// The block formats: their formulas have one home, core/quantized/block_decode.hpp.
template <WeightFormat Format>
void dequantize_blocks_of(const std::uint8_t* blocks, std::size_t count, float* out) noexcept {
    detail::decode_whole_blocks(Format, blocks, count, out);
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
            return dequantize_blocks_of<WeightFormat::q4_0>;
        case GgmlType::Q4_1:
            return dequantize_blocks_of<WeightFormat::q4_1>;
        case GgmlType::Q5_0:
            return dequantize_blocks_of<WeightFormat::q5_0>;
        case GgmlType::Q8_0:
            return dequantize_blocks_of<WeightFormat::q8_0>;
        case GgmlType::Q4_K:
            return dequantize_blocks_of<WeightFormat::q4_k>;
        case GgmlType::Q5_K:
            return dequantize_blocks_of<WeightFormat::q5_k>;
        case GgmlType::Q6_K:
            return dequantize_blocks_of<WeightFormat::q6_k>;
        default:
            return nullptr;
    }
}

constexpr std::string_view supported_list =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K";

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
