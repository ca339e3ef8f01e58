#pragma once
// CPU storage: 64-byte aligned host memory, and the pointer accessors CPU kernels use.

#include <cstddef>
#include <memory>
#include <span>

#include "core/tensor/storage.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail {

class CpuStorage final : public Storage {
  public:
    // `backend` is Cpu except for the test-only emulated device, which reuses host memory.
    CpuStorage(ExecutionBackend backend, std::size_t element_count);

    void copy_to_host(std::size_t offset, std::span<float> destination) const override;
    void copy_from_host(std::size_t offset, std::span<const float> source) override;

    ~CpuStorage() override;

    [[nodiscard]] float* data() noexcept { return elements_; }
    [[nodiscard]] const float* data() const noexcept { return elements_; }

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

}  // namespace riftco_transformer::detail
