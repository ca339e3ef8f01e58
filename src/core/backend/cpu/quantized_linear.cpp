// CPU quantized-linear capability: packed weights in host memory, products through the NF4
// kernels (nf4_kernels.hpp) or the GGUF block kernels (block_kernels.hpp).

#include "core/backend/cpu/block_kernels.hpp"
#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_quantized_storage.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/nf4_kernels.hpp"
#include "core/backend/cpu/parallel_for.hpp"

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

CpuQuantizedStorage::CpuQuantizedStorage(ExecutionBackend backend, const PackedLayout& layout,
                                         PackedNf4Payload payload)
    : QuantizedStorage(backend, layout), payload_(std::move(payload)) {
    shrink_exactly(payload_.codes);
    shrink_exactly(payload_.scales);
    shrink_exactly(payload_.scale_codes);
    shrink_exactly(payload_.scale_ranges);
}

CpuQuantizedStorage::CpuQuantizedStorage(ExecutionBackend backend, const PackedLayout& layout,
                                         PackedBlockPayload blocks)
    : QuantizedStorage(backend, layout), blocks_(std::move(blocks)) {
    shrink_exactly(blocks_.blocks);
}

std::size_t CpuQuantizedStorage::resident_bytes() const noexcept {
    return blocks_.blocks.capacity() + payload_.codes.capacity() +
           payload_.scales.capacity() * sizeof(float) + payload_.scale_codes.capacity() +
           payload_.scale_ranges.capacity() * sizeof(float) +
           (payload_.double_quantized ? sizeof(float) : 0);
}

std::shared_ptr<const QuantizedStorage> CpuQuantizedLinear::upload(PackedNf4Payload payload) const {
    const PackedLayout layout{payload.out_features, payload.in_features, payload.block_size,
                              payload.double_quantized, payload.scale_block_size};
    return std::make_shared<CpuQuantizedStorage>(backend_, layout, std::move(payload));
}

PackedNf4Payload CpuQuantizedLinear::download(const QuantizedStorage& weight) const {
    return weight.copy_payload_to_host();
}

std::shared_ptr<const QuantizedStorage> CpuQuantizedLinear::upload_blocks(
    PackedBlockPayload payload) const {
    const PackedLayout layout = view_of(payload).layout;
    return std::make_shared<CpuQuantizedStorage>(backend_, layout, std::move(payload));
}

PackedBlockPayload CpuQuantizedLinear::download_blocks(const QuantizedStorage& weight) const {
    return host_weight(weight).blocks();
}

void CpuQuantizedLinear::forward(const Tensor& x, const QuantizedStorage& weight,
                                 Tensor& out) const {
    if (is_block_weight_format(weight.layout().format)) {
        const BlockView view = host_weight(weight).block_view();
        block_linear_forward(view, cpu_data(x), x.numel() / view.layout.in_features,
                             cpu_output(out));
        return;
    }
    const Nf4View view = host_weight(weight).view();
    const std::size_t rows = x.numel() / view.layout.in_features;
    nf4_linear_forward(view, cpu_data(x), rows, cpu_output(out));
}

void CpuQuantizedLinear::input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                                        Tensor& out) const {
    if (is_block_weight_format(weight.layout().format)) {
        const BlockView view = host_weight(weight).block_view();
        block_linear_input_backward(view, cpu_data(upstream),
                                    upstream.numel() / view.layout.out_features, cpu_output(out));
        return;
    }
    const Nf4View view = host_weight(weight).view();
    const std::size_t rows = upstream.numel() / view.layout.out_features;
    nf4_linear_input_backward(view, cpu_data(upstream), rows, cpu_output(out));
}

void CpuQuantizedLinear::gather_rows(const QuantizedStorage& weight, const IndexTensor& indices,
                                     Tensor& out) const {
    const std::size_t width = weight.layout().in_features;
    const std::uint32_t* ids = cpu_indices(indices);
    float* rows = cpu_output(out);
    const CpuQuantizedStorage& host = host_weight(weight);
    const bool blocks = is_block_weight_format(weight.layout().format);
    const BlockView block_view = blocks ? host.block_view() : BlockView{};
    const Nf4View nf4_view = blocks ? Nf4View{} : host.view();
    const BlockKernelSet& block_set = active_block_kernels();
    const Nf4KernelSet& nf4_set = active_nf4_kernels();
    parallel_for(indices.numel(), items_per_thread_for(width),
                 [&](std::size_t begin, std::size_t end) {
                     for (std::size_t i = begin; i < end; ++i) {
                         const std::size_t first = std::size_t{ids[i]} * width;
                         if (blocks) {
                             block_set.decode_range(block_view, first, width, rows + i * width);
                         } else {
                             nf4_set.decode_range(nf4_view, first, width, rows + i * width);
                         }
                     }
                 });
}

}  // namespace riftco_transformer::detail
