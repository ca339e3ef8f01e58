#pragma once
// Backend-owned state of one packed weight (QuantizedWeight): NF4 codes and the scale
// metadata of exactly one encoding, or the blocks of a GGUF format, in whatever memory the owning
// adapter chose. Only the owning adapter's QuantizedLinearCapability reads behind it; everyone else
// sees the layout (shape, block sizes), the resident byte count and a host copy of the exact
// payload.

#include <cstddef>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::detail {

// The metadata of a payload that passed validation (quantized/nf4_format.hpp for nf4,
// quantized/block_format.hpp for the GGUF block formats, whose block_size is 32 and whose
// scale fields are unused).
struct PackedLayout {
    std::size_t out_features = 0;
    std::size_t in_features = 0;
    std::size_t block_size = 0;  // B
    bool double_quantized = false;
    std::size_t scale_block_size = 0;  // C; 0 for legacy scales
    WeightFormat format = WeightFormat::nf4;

    [[nodiscard]] std::size_t element_count() const noexcept { return out_features * in_features; }
    [[nodiscard]] std::size_t block_count() const noexcept {
        return (element_count() + block_size - 1) / block_size;
    }
    // The code bytes: a nibble per element for nf4; a block format's bytes but its scales.
    [[nodiscard]] std::size_t packed_byte_count() const noexcept {
        if (format == WeightFormat::nf4) {
            return (element_count() + 1) / 2;
        }
        return block_count() * (gguf_block_bytes(format) - gguf_block_scale_bytes(format));
    }
    // Block formats: the bytes of one row, and of the whole matrix.
    [[nodiscard]] std::size_t row_block_bytes() const noexcept {
        return in_features / gguf_format_block_elements(format) * gguf_block_bytes(format);
    }
    [[nodiscard]] std::size_t block_payload_bytes() const noexcept {
        return out_features * row_block_bytes();
    }
    [[nodiscard]] std::size_t scale_group_count() const noexcept {
        return double_quantized ? (block_count() + scale_block_size - 1) / scale_block_size : 0;
    }
};

class QuantizedStorage {
  public:
    QuantizedStorage(ExecutionBackend backend, const PackedLayout& layout) noexcept
        : backend_(backend), layout_(layout) {}
    virtual ~QuantizedStorage() = default;
    QuantizedStorage(const QuantizedStorage&) = delete;
    QuantizedStorage& operator=(const QuantizedStorage&) = delete;

    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] const PackedLayout& layout() const noexcept { return layout_; }

    // Every byte the backend holds for this weight (allocations and mirrors alike).
    [[nodiscard]] virtual std::size_t resident_bytes() const noexcept = 0;
    // The exact payload, in host memory (nf4 storage only; the owning capability never asks
    // a block-format storage for it).
    [[nodiscard]] virtual PackedNf4Payload copy_payload_to_host() const = 0;

  private:
    ExecutionBackend backend_;
    PackedLayout layout_;
};

}  // namespace riftco_transformer::detail
