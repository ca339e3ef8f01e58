// Normalization capability: LayerNorm and RMSNorm over the last axis on the device
// (normalization.cu). Epsilon and shapes were checked by tensor_ops; like the CPU reference
// these operations have no value-domain errors of their own.

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/row_capabilities.hpp"
#include "core/backend/cuda/row_kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

std::size_t partial_blocks(std::size_t rows) {
    return (rows + gradient_row_block - 1) / gradient_row_block;
}

class CudaNormalization final : public NormalizationCapability {
  public:
    void layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, float epsilon,
                    Tensor& out, Tensor& mean, Tensor& inverse_deviation) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const cudaStream_t stream = current_stream();
        layer_norm_rows(device_input(x, stream), device_input(scale, stream),
                        device_input(bias, stream), rows, width, epsilon,
                        device_output(out, stream), device_output(mean, stream),
                        device_output(inverse_deviation, stream), stream);
    }

    void layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean,
                             const Tensor& inverse_deviation, const Tensor& upstream,
                             Tensor& input_gradient, Tensor& scale_gradient,
                             Tensor& bias_gradient) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const cudaStream_t stream = current_stream();
        // Scratch from the pool, freed in stream order after the kernels that use it.
        const DeviceBuffer partials(2 * partial_blocks(rows) * width * sizeof(double), stream);
        layer_norm_backward_rows(
            device_input(x, stream), device_input(scale, stream), device_input(mean, stream),
            device_input(inverse_deviation, stream), device_input(upstream, stream), rows, width,
            device_output(input_gradient, stream), device_output(scale_gradient, stream),
            device_output(bias_gradient, stream), static_cast<double*>(partials.data()), stream);
    }

    void rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& out,
                  Tensor& inverse_rms) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const cudaStream_t stream = current_stream();
        rms_norm_rows(device_input(x, stream), device_input(scale, stream), rows, width, epsilon,
                      device_output(out, stream), device_output(inverse_rms, stream), stream);
    }

    void rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inverse_rms,
                           const Tensor& upstream, Tensor& input_gradient,
                           Tensor& scale_gradient) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const cudaStream_t stream = current_stream();
        const DeviceBuffer partials(partial_blocks(rows) * width * sizeof(double), stream);
        rms_norm_backward_rows(
            device_input(x, stream), device_input(scale, stream), device_input(inverse_rms, stream),
            device_input(upstream, stream), rows, width, device_output(input_gradient, stream),
            device_output(scale_gradient, stream), static_cast<double*>(partials.data()), stream);
    }
};

}  // namespace

const NormalizationCapability* normalization_capability(const Runtime& /*runtime*/) {
    static const auto* capability = new CudaNormalization;
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
