// CPU quantized-linear capability: packed NF4 weights in host memory, products through the
// NF4 kernels (nf4_kernels.hpp).

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_quantized_storage.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/nf4_kernels.hpp"

namespace riftco_transformer::detail {
namespace {

template <typename Value>
void shrink_exactly(std::vector<Value>& values) {
    if (values.capacity() != values.size()) {
        std::vector<Value>(values.begin(), values.end()).swap(values);
    }
}

const CpuQuantizedStorage& host_weight(const QuantizedStorage& weight) {
    return static_cast<const CpuQuantizedStorage&>(weight);
}

}  // namespace

CpuQuantizedStorage::CpuQuantizedStorage(ExecutionBackend backend, const Nf4Layout& layout,
                                         PackedNf4Payload payload)
    : QuantizedStorage(backend, layout), payload_(std::move(payload)) {
    shrink_exactly(payload_.codes);
    shrink_exactly(payload_.scales);
    shrink_exactly(payload_.scale_codes);
    shrink_exactly(payload_.scale_ranges);
}

std::size_t CpuQuantizedStorage::resident_bytes() const noexcept {
    return payload_.codes.capacity() + payload_.scales.capacity() * sizeof(float) +
           payload_.scale_codes.capacity() + payload_.scale_ranges.capacity() * sizeof(float) +
           (payload_.double_quantized ? sizeof(float) : 0);
}

std::shared_ptr<const QuantizedStorage> CpuQuantizedLinear::upload(PackedNf4Payload payload) const {
    const Nf4Layout layout{payload.out_features, payload.in_features, payload.block_size,
                           payload.double_quantized, payload.scale_block_size};
    return std::make_shared<CpuQuantizedStorage>(backend_, layout, std::move(payload));
}

PackedNf4Payload CpuQuantizedLinear::download(const QuantizedStorage& weight) const {
    return weight.copy_payload_to_host();
}

void CpuQuantizedLinear::forward(const Tensor& x, const QuantizedStorage& weight,
                                 Tensor& out) const {
    const Nf4View view = host_weight(weight).view();
    const std::size_t rows = x.numel() / view.layout.in_features;
    nf4_linear_forward(view, cpu_data(x), rows, cpu_output(out));
}

void CpuQuantizedLinear::input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                                        Tensor& out) const {
    const Nf4View view = host_weight(weight).view();
    const std::size_t rows = upstream.numel() / view.layout.out_features;
    nf4_linear_input_backward(view, cpu_data(upstream), rows, cpu_output(out));
}

}  // namespace riftco_transformer::detail
