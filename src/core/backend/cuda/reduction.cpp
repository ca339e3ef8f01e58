// Reduction capability: sums in double on the device (reduction.cu), like the CPU reference.

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

class CudaReduction final : public ReductionCapability {
  public:
    void sum_all(const Tensor& x, double multiplier, Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        const std::size_t count = x.numel();
        const std::size_t blocks = (count + sum_block - 1) / sum_block;
        // Scratch from the pool, freed in stream order after the kernels that use it.
        const DeviceBuffer partials(blocks * sizeof(double), stream);
        cuda::sum_all(device_input(x, stream), count, multiplier,
                      static_cast<double*>(partials.data()), device_output(out, stream), stream);
    }

    void sum_axis(const Tensor& x, std::size_t axis, double multiplier,
                  Tensor& out) const override {
        std::size_t outer = 1;
        std::size_t inner = 1;
        for (std::size_t d = 0; d < axis; ++d) {
            outer *= x.shape()[d];
        }
        for (std::size_t d = axis + 1; d < x.rank(); ++d) {
            inner *= x.shape()[d];
        }
        const cudaStream_t stream = current_stream();
        cuda::sum_axis(device_input(x, stream), outer, x.shape()[axis], inner, multiplier,
                       device_output(out, stream), stream);
    }
};

}  // namespace

std::unique_ptr<ReductionCapability> make_reduction(const Runtime& /*runtime*/) {
    return std::make_unique<CudaReduction>();
}

}  // namespace riftco_transformer::detail::cuda
