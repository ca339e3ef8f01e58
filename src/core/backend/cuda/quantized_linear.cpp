// CUDA quantized linear: packed NF4 weights (docs/ARCHITECTURE.md, 'NF4') in device memory,
// exactly the payload's arrays (packed codes, and either the float32 block scales or the scale
// codes and second-level ranges; the double-quantized offset μ is a host float passed to every
// launch), and the two products as kernels that decode the nibbles themselves
// (quantized_linear.cu). Nothing decoded is kept; the CPU reference is
// cpu/quantized_linear.cpp.

#include <bit>
#include <memory>
#include <utility>
#include <vector>

#include "core/backend/cuda/attention_nf4_adam.hpp"
#include "core/backend/cuda/attention_nf4_adam_kernels.hpp"
#include "core/backend/cuda/cuda_device.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// One host array onto a fresh device buffer (a sync point for the stream: the payload may be
// freed on return).
template <typename Value>
std::unique_ptr<DeviceBuffer> upload_array(const std::vector<Value>& values, cudaStream_t stream) {
    auto buffer = std::make_unique<DeviceBuffer>(values.size() * sizeof(Value), stream);
    if (!values.empty()) {
        check(cudaMemcpyAsync(buffer->data(), values.data(), values.size() * sizeof(Value),
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (NF4 payload to device)");
    }
    return buffer;
}

template <typename Value>
void download_array(const DeviceBuffer& buffer, std::vector<Value>& values, cudaStream_t stream) {
    values.resize(buffer.bytes() / sizeof(Value));
    if (!values.empty()) {
        buffer.use_on(stream);
        check(cudaMemcpyAsync(values.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost,
                              stream),
              "cudaMemcpyAsync (NF4 payload to host)");
    }
}

class CudaQuantizedStorage final : public QuantizedStorage {
  public:
    CudaQuantizedStorage(const PackedLayout& layout, const PackedNf4Payload& payload)
        : QuantizedStorage(ExecutionBackend::Cuda, layout), scale_offset_(payload.scale_offset) {
        const cudaStream_t stream = current_stream();
        codes_ = upload_array(payload.codes, stream);
        if (layout.double_quantized) {
            scale_codes_ = upload_array(payload.scale_codes, stream);
            scale_ranges_ = upload_array(payload.scale_ranges, stream);
        } else {
            scales_ = upload_array(payload.scales, stream);
        }
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (NF4 upload)");
    }

    [[nodiscard]] std::size_t resident_bytes() const noexcept override {
        std::size_t bytes = layout().double_quantized ? sizeof(float) : 0;  // μ
        for (const auto* buffer : {&codes_, &scales_, &scale_codes_, &scale_ranges_}) {
            if (*buffer != nullptr) {
                bytes += (*buffer)->bytes();
            }
        }
        return bytes;
    }

    [[nodiscard]] PackedNf4Payload copy_payload_to_host() const override {
        const PackedLayout& shape = layout();
        PackedNf4Payload payload;
        payload.out_features = shape.out_features;
        payload.in_features = shape.in_features;
        payload.block_size = shape.block_size;
        payload.double_quantized = shape.double_quantized;
        payload.scale_block_size = shape.scale_block_size;
        const cudaStream_t stream = current_stream();
        download_array(*codes_, payload.codes, stream);
        if (shape.double_quantized) {
            download_array(*scale_codes_, payload.scale_codes, stream);
            download_array(*scale_ranges_, payload.scale_ranges, stream);
            payload.scale_offset = scale_offset_;
        } else {
            download_array(*scales_, payload.scales, stream);
        }
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (NF4 download)");
        return payload;
    }

    // The kernels' view, with every buffer ordered on `stream`.
    [[nodiscard]] Nf4DeviceWeight on(cudaStream_t stream) const {
        const PackedLayout& shape = layout();
        Nf4DeviceWeight weight;
        codes_->use_on(stream);
        weight.codes = static_cast<const std::uint8_t*>(codes_->data());
        if (shape.double_quantized) {
            scale_codes_->use_on(stream);
            scale_ranges_->use_on(stream);
            weight.scale_codes = static_cast<const std::uint8_t*>(scale_codes_->data());
            weight.scale_ranges = static_cast<const float*>(scale_ranges_->data());
            weight.scale_offset = scale_offset_;
            weight.double_quantized = true;
            weight.group_shift = static_cast<unsigned>(std::countr_zero(shape.scale_block_size));
        } else {
            scales_->use_on(stream);
            weight.scales = static_cast<const float*>(scales_->data());
        }
        weight.out_features = shape.out_features;
        weight.in_features = shape.in_features;
        weight.block_shift = static_cast<unsigned>(std::countr_zero(shape.block_size));
        for (std::size_t i = 0; i < nf4_codebook.size(); ++i) {
            weight.codebook[i] = nf4_codebook[i];
        }
        return weight;
    }

  private:
    std::unique_ptr<DeviceBuffer> codes_;         // u8 [ceil(N/2)]
    std::unique_ptr<DeviceBuffer> scales_;        // legacy: f32 [M]
    std::unique_ptr<DeviceBuffer> scale_codes_;   // double: u8 [M]
    std::unique_ptr<DeviceBuffer> scale_ranges_;  // double: f32 [G]
    float scale_offset_ = 0.0F;                   // double: μ
};

const CudaQuantizedStorage& device_weight(const QuantizedStorage& weight) {
    return static_cast<const CudaQuantizedStorage&>(weight);
}

class CudaQuantizedLinear final : public QuantizedLinearCapability {
  public:
    [[nodiscard]] std::shared_ptr<const QuantizedStorage> upload(
        PackedNf4Payload payload) const override {
        const PackedLayout layout{payload.out_features, payload.in_features, payload.block_size,
                                  payload.double_quantized, payload.scale_block_size};
        return std::make_shared<CudaQuantizedStorage>(layout, payload);
    }

    [[nodiscard]] PackedNf4Payload download(const QuantizedStorage& weight) const override {
        return weight.copy_payload_to_host();
    }

    void forward(const Tensor& x, const QuantizedStorage& weight, Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        const Nf4DeviceWeight view = device_weight(weight).on(stream);
        const std::size_t rows = x.numel() / weight.layout().in_features;
        nf4_forward(view, device_input(x, stream), rows, device_output(out, stream), stream);
    }

    void input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                        Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        const Nf4DeviceWeight view = device_weight(weight).on(stream);
        const std::size_t rows = upstream.numel() / weight.layout().out_features;
        nf4_input_backward(view, device_input(upstream, stream), rows, device_output(out, stream),
                           stream);
    }
};

}  // namespace

const QuantizedLinearCapability* quantized_linear_capability(const Runtime& /*runtime*/) {
    static const auto* capability = new CudaQuantizedLinear;
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
