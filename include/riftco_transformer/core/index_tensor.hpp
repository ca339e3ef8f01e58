#pragma once
// IndexTensor: a dense, row-major array of uint32 ids (token ids, targets, gather rows) that
// lives on an execution backend, like a Tensor of floats.
//
// Ids enter once, by an upload from host memory, and are range-checked there: the upload
// records the largest id and its first position, so an operation checks "every id < bound"
// in O(1) without reading device memory. Values are immutable after the upload; copies
// share storage.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

class IndexTensor {
  public:
    // A singular index tensor (also what a move leaves behind): numel()==0, no storage.
    IndexTensor() noexcept;

    // Uploads `ids` (row-major, count == numel of `shape`) to `backend` (default: the calling
    // thread's construction default). Count mismatch or a zero dimension:
    // std::invalid_argument; unavailable backend: std::runtime_error.
    IndexTensor(Shape shape, std::span<const std::uint32_t> ids);
    IndexTensor(Shape shape, std::span<const std::uint32_t> ids, ExecutionBackend backend);

    [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
    [[nodiscard]] std::size_t rank() const noexcept { return shape_.size(); }
    [[nodiscard]] std::size_t numel() const noexcept { return numel_; }
    [[nodiscard]] bool is_singular() const noexcept { return storage_ == nullptr; }
    // Singular: std::logic_error.
    [[nodiscard]] ExecutionBackend backend() const;

    // The largest id, and the first flat position holding it (both recorded at the upload).
    [[nodiscard]] std::uint32_t max_id() const noexcept { return max_id_; }
    [[nodiscard]] std::size_t max_id_position() const noexcept { return max_id_position_; }

    // A sync point: one host read of every id.
    [[nodiscard]] std::vector<std::uint32_t> to_host() const;
    // Same ids under a shape of equal numel (shares storage).
    [[nodiscard]] IndexTensor reshape(Shape shape) const;
    // Transfer to another backend (shares storage when it is the same one).
    [[nodiscard]] IndexTensor to(ExecutionBackend backend) const;

  private:
    friend struct detail::TensorAccess;
    void require_not_singular(const char* operation) const;

    Shape shape_;
    std::size_t numel_ = 0;
    std::uint32_t max_id_ = 0;
    std::size_t max_id_position_ = 0;
    std::shared_ptr<detail::Storage> storage_;
};

// Synchronisation points: where host code reads what a backend computed. Device backends
// run asynchronously and report value-domain problems their kernels find (a NaN slice in a
// softmax, a non-finite Adam candidate) at the next sync point of that backend, with the
// exception category and message the CPU raises at once. The sync points are listed in
// src/core/backend/adapter.hpp.
//
// The number of host reads (sync points reached) in this process so far, for tests and
// benchmarks that check how often a workload waits for a device.
[[nodiscard]] std::uint64_t host_read_count() noexcept;

}  // namespace riftco_transformer
