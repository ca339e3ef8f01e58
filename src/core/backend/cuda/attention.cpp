// CUDA flash attention (the CPU reference is cpu/attention.cpp; the kernels and their tiling
// are described in attention.cu). The forward is one kernel; a visible score that is NaN or
// +inf, or a query row without a finite visible score, is the CPU's domain_error with the
// CPU's message, raised at the next sync point (the first failing (batch·head) item, NaN/+inf
// before rows without a finite score, as the reference reports them). The backward is three
// kernels (row dot products D, then dK/dV, then dQ) with one scratch buffer of B·Hq·T floats;
// no host read happens in either direction.

#include <memory>
#include <sstream>
#include <stdexcept>

#include "core/backend/cuda/attention.hpp"
#include "core/backend/cuda/attention_kernels.hpp"
#include "core/backend/cuda/cuda_device.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// cpu/attention.cpp's message.
std::exception_ptr bad_scores(std::size_t item, bool no_finite) {
    std::ostringstream message;
    message << "flash attention: (batch·head) " << item
            << (no_finite ? " has a query row with no finite visible score"
                          : " has a visible score that is NaN or +inf");
    return std::make_exception_ptr(std::domain_error(message.str()));
}

FlashGeometry geometry_of(const Tensor& query, const Tensor& key, float scale,
                          const tensor_ops::FlashAttentionOptions& options) {
    FlashGeometry geometry;
    geometry.time = query.shape()[2];
    geometry.width = query.shape()[3];
    geometry.query_items = query.numel() / (geometry.time * geometry.width);
    geometry.group = query.shape()[1] / key.shape()[1];
    geometry.window = options.window;
    geometry.scale = scale;
    geometry.softcap = options.softcap;
    return geometry;
}

class CudaAttention final : public AttentionCapability {
  public:
    explicit CudaAttention(const Runtime& runtime) : runtime_(runtime) {}

    void flash_forward(const Tensor& query, const Tensor& key, const Tensor& value, float scale,
                       const tensor_ops::FlashAttentionOptions& options, Tensor& context,
                       Tensor& row_max, Tensor& row_sum) const override {
        const FlashGeometry geometry = geometry_of(query, key, scale, options);
        const cudaStream_t stream = current_stream();
        const float* q = device_input(query, stream);
        const float* k = device_input(key, stream);
        const float* v = device_input(value, stream);
        float* o = device_output(context, stream);
        float* m = device_output(row_max, stream);
        float* l = device_output(row_sum, stream);
        const std::size_t items = geometry.query_items;
        runtime_.checked_launch(
            stream,
            [items](std::size_t code) {
                return code < items ? bad_scores(code, false) : bad_scores(code - items, true);
            },
            [&](unsigned long long* slot) {
                flash_attention_forward(geometry, q, k, v, o, m, l, slot, stream);
            });
    }

    void flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& context, const Tensor& row_max, const Tensor& row_sum,
                        const Tensor& upstream, float scale,
                        const tensor_ops::FlashAttentionOptions& options, Tensor& query_gradient,
                        Tensor& key_gradient, Tensor& value_gradient) const override {
        const FlashGeometry geometry = geometry_of(query, key, scale, options);
        const cudaStream_t stream = current_stream();
        const DeviceBuffer row_dots(geometry.query_items * geometry.time * sizeof(float), stream);
        flash_attention_backward(
            geometry, device_input(query, stream), device_input(key, stream),
            device_input(value, stream), device_input(context, stream),
            device_input(row_max, stream), device_input(row_sum, stream),
            device_input(upstream, stream), static_cast<float*>(row_dots.data()),
            device_output(query_gradient, stream), device_output(key_gradient, stream),
            device_output(value_gradient, stream), stream);
    }

  private:
    const Runtime& runtime_;
};

}  // namespace

const AttentionCapability* attention_capability(const Runtime& runtime) {
    static const auto* capability = new CudaAttention(runtime);
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
