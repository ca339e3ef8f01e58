#pragma once
// CPU storage: 64-byte aligned host memory, and the pointer accessors CPU kernels use.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/backend/storage.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail {

class CpuStorage final : public Storage {
  public:
    // `backend` is Cpu except for the test-only emulated device, which reuses host memory.
    CpuStorage(ExecutionBackend backend, std::size_t element_count);

    void copy_to_host(std::size_t offset, std::span<float> destination) const override;
    void copy_from_host(std::size_t offset, std::span<const float> source) override;
    void copy_indices_to_host(std::size_t offset,
                              std::span<std::uint32_t> destination) const override;
    void copy_indices_from_host(std::size_t offset, std::span<const std::uint32_t> source) override;

    ~CpuStorage() override;

    [[nodiscard]] float* data() noexcept { return elements_; }
    [[nodiscard]] const float* data() const noexcept { return elements_; }
    // The block as uint32 elements (index storage is only ever read and written as such).
    [[nodiscard]] std::uint32_t* indices() noexcept {
        return reinterpret_cast<std::uint32_t*>(elements_);
    }
    [[nodiscard]] const std::uint32_t* indices() const noexcept {
        return reinterpret_cast<const std::uint32_t*>(elements_);
    }

  private:
    float* elements_;  // from acquire_host_block(element_count · sizeof(float))
};

// Host pointers of CPU tensors (tensor_ops guarantees the backend before any adapter call).
[[nodiscard]] inline const float* cpu_data(const Tensor& tensor) {
    return static_cast<const CpuStorage&>(TensorAccess::storage(tensor)).data();
}
[[nodiscard]] inline float* cpu_output(Tensor& tensor) {
    return static_cast<CpuStorage&>(TensorAccess::output_storage(tensor)).data();
}
// An existing CPU tensor's values for an in-place write: storage shared with copies is
// cloned first (TensorAccess::unique_storage), so no other tensor observes the write.
[[nodiscard]] inline float* cpu_values_for_write(Tensor& tensor) {
    return static_cast<CpuStorage&>(TensorAccess::unique_storage(tensor)).data();
}
[[nodiscard]] inline const std::uint32_t* cpu_indices(const IndexTensor& indices) {
    return static_cast<const CpuStorage&>(TensorAccess::storage(indices)).indices();
}

}  // namespace riftco_transformer::detail
