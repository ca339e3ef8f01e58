#pragma once
// Backend-owned state of one packed NF4 weight (QuantizedWeight): the codes and the scale
// metadata of exactly one encoding, in whatever memory the owning adapter chose. Only the
// owning adapter's QuantizedLinearCapability reads behind it; everyone else sees the layout
// (shape, block sizes), the resident byte count and a host copy of the exact payload.

#include <cstddef>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"

namespace riftco_transformer::detail {

// The metadata of a payload that passed validation (quantized/nf4_format.hpp).
struct Nf4Layout {
    std::size_t out_features = 0;
    std::size_t in_features = 0;
    std::size_t block_size = 0;  // B
    bool double_quantized = false;
    std::size_t scale_block_size = 0;  // C; 0 for legacy scales

    [[nodiscard]] std::size_t element_count() const noexcept { return out_features * in_features; }
    [[nodiscard]] std::size_t block_count() const noexcept {
        return (element_count() + block_size - 1) / block_size;
    }
    [[nodiscard]] std::size_t packed_byte_count() const noexcept {
        return (element_count() + 1) / 2;
    }
    [[nodiscard]] std::size_t scale_group_count() const noexcept {
        return double_quantized ? (block_count() + scale_block_size - 1) / scale_block_size : 0;
    }
};

class QuantizedStorage {
  public:
    QuantizedStorage(ExecutionBackend backend, const Nf4Layout& layout) noexcept
        : backend_(backend), layout_(layout) {}
    virtual ~QuantizedStorage() = default;
    QuantizedStorage(const QuantizedStorage&) = delete;
    QuantizedStorage& operator=(const QuantizedStorage&) = delete;

    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] const Nf4Layout& layout() const noexcept { return layout_; }

    // Every byte the backend holds for this weight (allocations and mirrors alike).
    [[nodiscard]] virtual std::size_t resident_bytes() const noexcept = 0;
    // The exact payload, in host memory.
    [[nodiscard]] virtual PackedNf4Payload copy_payload_to_host() const = 0;

  private:
    ExecutionBackend backend_;
    Nf4Layout layout_;
};

}  // namespace riftco_transformer::detail
