#pragma once
// What every CUDA capability shares: the storage of a tensor on this backend (device memory,
// never a host mirror, never managed memory), the device pointers a capability reads and
// writes on the calling thread's stream, and the capability factories (one file each).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/backend/adapter.hpp"
#include "core/backend/cuda/runtime.hpp"
#include "core/backend/storage.hpp"

namespace riftco_transformer::detail::cuda {

// A tensor's (or index tensor's) 4-byte elements in one device allocation. Host copies are
// sync points: they wait for the copy (and everything before it on the stream) to finish.
class CudaStorage final : public Storage {
  public:
    // Uninitialised device memory for `element_count` elements, allocated on `stream`.
    CudaStorage(std::size_t element_count, cudaStream_t stream);

    // The elements, after making `stream` wait for every earlier use of them.
    [[nodiscard]] float* floats_on(cudaStream_t stream) const;
    [[nodiscard]] std::uint32_t* indices_on(cudaStream_t stream) const;

    void copy_to_host(std::size_t offset, std::span<float> destination) const override;
    void copy_from_host(std::size_t offset, std::span<const float> source) override;
    void copy_indices_to_host(std::size_t offset,
                              std::span<std::uint32_t> destination) const override;
    void copy_indices_from_host(std::size_t offset, std::span<const std::uint32_t> source) override;

  private:
    void read(std::size_t offset, void* destination, std::size_t count) const;
    void write(std::size_t offset, const void* source, std::size_t count);

    DeviceBuffer buffer_;
};

// Device pointers of tensors of this backend on `stream` (tensor_ops guarantees the backend
// before any adapter call). Inputs are read-only; an output is a fresh, unshared storage.
[[nodiscard]] const float* device_input(const Tensor& tensor, cudaStream_t stream);
[[nodiscard]] float* device_output(Tensor& tensor, cudaStream_t stream);
[[nodiscard]] const std::uint32_t* device_indices(const IndexTensor& indices, cudaStream_t stream);

// The host value of element `position` of a tensor of this backend (a host read, used only
// to word an error at a sync point).
[[nodiscard]] float read_element(const Storage& storage, std::size_t position);

// The capability factories, one per file. Capabilities this adapter does not provide yet
// have no factory: the adapter reports them missing (null), and tensor_ops then refuses the
// call with "does not provide the <family> capability".
[[nodiscard]] std::unique_ptr<StorageCapability> make_storage(const Runtime& runtime);
[[nodiscard]] std::unique_ptr<LayoutCapability> make_layout(const Runtime& runtime);
[[nodiscard]] std::unique_ptr<ElementwiseCapability> make_elementwise(const Runtime& runtime);
[[nodiscard]] std::unique_ptr<ReductionCapability> make_reduction(const Runtime& runtime);
[[nodiscard]] std::unique_ptr<MatmulCapability> make_matmul(const Runtime& runtime);

// The loaded runtime (probing the device on first use); null when CUDA is unavailable.
// For tests and benchmarks.
[[nodiscard]] const Runtime* loaded_runtime() noexcept;

}  // namespace riftco_transformer::detail::cuda
