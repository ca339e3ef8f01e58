#pragma once
// Backend-owned element storage: element_count 4-byte elements, float32 for a Tensor and
// uint32 for an IndexTensor. Only the owning adapter knows what is behind it; everyone else
// moves host data through the copy calls, and writes to an existing tensor go through the
// adapter's StorageCapability::write_range (which may give the tensor a new storage).

#include <cstddef>
#include <cstdint>
#include <span>

#include "riftco_transformer/core/backend.hpp"

namespace riftco_transformer::detail {

class Storage {
  public:
    Storage(ExecutionBackend backend, std::size_t element_count) noexcept
        : backend_(backend), element_count_(element_count) {}
    virtual ~Storage() = default;
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] std::size_t element_count() const noexcept { return element_count_; }

    // Elements [offset, offset + destination.size()) to host memory; the caller checks bounds.
    virtual void copy_to_host(std::size_t offset, std::span<float> destination) const = 0;
    virtual void copy_from_host(std::size_t offset, std::span<const float> source) = 0;
    // The same for index storage (uint32 elements).
    virtual void copy_indices_to_host(std::size_t offset,
                                      std::span<std::uint32_t> destination) const = 0;
    virtual void copy_indices_from_host(std::size_t offset,
                                        std::span<const std::uint32_t> source) = 0;

  private:
    ExecutionBackend backend_;
    std::size_t element_count_;
};

}  // namespace riftco_transformer::detail
