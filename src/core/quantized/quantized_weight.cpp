// QuantizedWeight: validation and encoding on the host (nf4_format.hpp, block_format.hpp),
// state in the backend's QuantizedStorage (its QuantizedLinearCapability).

#include "riftco_transformer/core/quantized_weight.hpp"

#include <stdexcept>
#include <string>

#include "core/backend/adapter.hpp"
#include "core/backend/synchronization.hpp"
#include "core/quantized/block_format.hpp"
#include "core/quantized/nf4_format.hpp"
#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer {
namespace {

const detail::QuantizedLinearCapability& capability_of(ExecutionBackend backend,
                                                       std::string_view operation) {
    const auto& adapter = detail::require_available_adapter(backend, operation);
    return detail::require_capability(adapter.quantized_linear(), adapter, operation,
                                      "quantized linear");
}

// The capability of `backend`, which must store `format` (std::runtime_error naming both).
const detail::QuantizedLinearCapability& format_capability(ExecutionBackend backend,
                                                           WeightFormat format,
                                                           std::string_view operation) {
    const auto& capability = capability_of(backend, operation);
    if (!capability.supports_format(format)) {
        throw std::runtime_error(std::string(operation) + ": backend '" +
                                 std::string(execution_backend_name(backend)) + "' lacks the " +
                                 std::string(weight_format_name(format)) +
                                 " weight format (its quantized linear stores nf4 only)");
    }
    return capability;
}

}  // namespace

std::string_view weight_format_name(WeightFormat format) noexcept {
    switch (format) {
        case WeightFormat::nf4:
            return "nf4";
        case WeightFormat::q8_0:
            return "q8_0";
        case WeightFormat::q4_0:
            return "q4_0";
        case WeightFormat::q4_1:
            return "q4_1";
        case WeightFormat::q5_0:
            return "q5_0";
        case WeightFormat::q4_k:
            return "q4_k";
        case WeightFormat::q5_k:
            return "q5_k";
        case WeightFormat::q6_k:
            return "q6_k";
        case WeightFormat::f16:
            return "f16";
        case WeightFormat::bf16:
            return "bf16";
    }
    return "unknown";
}

std::optional<WeightFormat> weight_format_from_name(std::string_view name) noexcept {
    for (const WeightFormat format :
         {WeightFormat::nf4, WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::q4_1,
          WeightFormat::q5_0, WeightFormat::q4_k, WeightFormat::q5_k, WeightFormat::q6_k,
          WeightFormat::f16, WeightFormat::bf16}) {
        if (name == weight_format_name(format)) {
            return format;
        }
    }
    return std::nullopt;
}

QuantizedMemoryUsage& QuantizedMemoryUsage::operator+=(const QuantizedMemoryUsage& other) noexcept {
    weight_count += other.weight_count;
    packed_code_bytes += other.packed_code_bytes;
    scale_bytes += other.scale_bytes;
    logical_payload_bytes += other.logical_payload_bytes;
    resident_payload_bytes += other.resident_payload_bytes;
    fp32_equivalent_bytes += other.fp32_equivalent_bytes;
    fp32_scale_bytes += other.fp32_scale_bytes;
    scale_code_bytes += other.scale_code_bytes;
    second_level_scale_bytes += other.second_level_scale_bytes;
    scale_offset_bytes += other.scale_offset_bytes;
    double_quantized_weight_count += other.double_quantized_weight_count;
    half_scale_bytes += other.half_scale_bytes;
    block_format_weight_count += other.block_format_weight_count;
    return *this;
}

QuantizedWeight QuantizedWeight::quantize(const Tensor& weight, const Nf4Options& options) {
    constexpr std::string_view op = "QuantizedWeight::quantize";
    detail::require_tensor(op, "weight", weight);
    if (weight.rank() != 2) {
        throw std::invalid_argument(std::string(op) + ": weight must be rank 2 [out, in] (got " +
                                    shape_to_string(weight.shape()) + ")");
    }
    const detail::PackedLayout layout =
        detail::checked_nf4_layout(op, weight.shape()[0], weight.shape()[1], options.block_size,
                                   options.double_quantization, options.scale_block_size);
    const auto& capability = capability_of(weight.backend(), op);
    const std::vector<float> values = weight.to_host();
    return QuantizedWeight(capability.upload(detail::encode_nf4(values, layout)));
}

QuantizedWeight QuantizedWeight::quantize_blocks(const Tensor& weight, WeightFormat format) {
    constexpr std::string_view op = "QuantizedWeight::quantize_blocks";
    detail::require_tensor(op, "weight", weight);
    if (weight.rank() != 2) {
        throw std::invalid_argument(std::string(op) + ": weight must be rank 2 [out, in] (got " +
                                    shape_to_string(weight.shape()) + ")");
    }
    if (is_block_weight_format(format) &&
        gguf_format_block_elements(format) != gguf_block_elements) {
        throw std::invalid_argument(std::string(op) + ": format " +
                                    std::string(weight_format_name(format)) +
                                    " cannot be produced here: K-format weights come from GGUF "
                                    "files (quantize into q8_0, q5_0, q4_1, q4_0, f16 or bf16)");
    }
    const detail::PackedLayout layout =
        detail::checked_block_layout(op, format, weight.shape()[0], weight.shape()[1]);
    const auto& capability = format_capability(weight.backend(), format, op);
    const std::vector<float> values = weight.to_host();
    return QuantizedWeight(capability.upload_blocks(detail::encode_blocks(values, layout)));
}

QuantizedWeight QuantizedWeight::from_packed_blocks(PackedBlockPayload payload,
                                                    ExecutionBackend backend) {
    constexpr std::string_view op = "QuantizedWeight::from_packed_blocks";
    static_cast<void>(detail::validate_block_payload(payload));
    const auto& capability = format_capability(backend, payload.format, op);
    return QuantizedWeight(capability.upload_blocks(std::move(payload)));
}

QuantizedWeight QuantizedWeight::from_packed_nf4(PackedNf4Payload payload,
                                                 ExecutionBackend backend) {
    constexpr std::string_view op = "QuantizedWeight::from_packed_nf4";
    static_cast<void>(detail::validate_nf4_payload(payload));
    return QuantizedWeight(capability_of(backend, op).upload(std::move(payload)));
}

void QuantizedWeight::require_state(const char* operation) const {
    if (state_ == nullptr) {
        throw std::logic_error(std::string("QuantizedWeight::") + operation +
                               ": the weight is singular (default-constructed)");
    }
}

WeightFormat QuantizedWeight::format() const {
    require_state("format");
    return state_->layout().format;
}

ExecutionBackend QuantizedWeight::backend() const {
    require_state("backend");
    return state_->backend();
}
Shape QuantizedWeight::shape() const {
    require_state("shape");
    return {state_->layout().out_features, state_->layout().in_features};
}
std::size_t QuantizedWeight::out_features() const {
    require_state("out_features");
    return state_->layout().out_features;
}
std::size_t QuantizedWeight::in_features() const {
    require_state("in_features");
    return state_->layout().in_features;
}
std::size_t QuantizedWeight::element_count() const {
    require_state("element_count");
    return state_->layout().element_count();
}
std::size_t QuantizedWeight::block_size() const {
    require_state("block_size");
    return state_->layout().block_size;
}
std::size_t QuantizedWeight::block_count() const {
    require_state("block_count");
    return state_->layout().block_count();
}
std::size_t QuantizedWeight::packed_byte_count() const {
    require_state("packed_byte_count");
    return state_->layout().packed_byte_count();
}
bool QuantizedWeight::uses_double_quantized_scales() const {
    require_state("uses_double_quantized_scales");
    return state_->layout().double_quantized;
}
std::size_t QuantizedWeight::scale_quantization_block_size() const {
    require_state("scale_quantization_block_size");
    return state_->layout().scale_block_size;
}

QuantizedMemoryUsage QuantizedWeight::memory_usage() const {
    require_state("memory_usage");
    const detail::PackedLayout& layout = state_->layout();
    QuantizedMemoryUsage usage;
    usage.weight_count = 1;
    usage.packed_code_bytes = layout.packed_byte_count();
    if (is_block_weight_format(layout.format)) {
        usage.half_scale_bytes = layout.block_payload_bytes() - layout.packed_byte_count();
        usage.scale_bytes = usage.half_scale_bytes;
        usage.block_format_weight_count = 1;
    } else if (layout.double_quantized) {
        usage.scale_code_bytes = layout.block_count();
        usage.second_level_scale_bytes = sizeof(float) * layout.scale_group_count();
        usage.scale_offset_bytes = sizeof(float);
        usage.scale_bytes =
            usage.scale_code_bytes + usage.second_level_scale_bytes + usage.scale_offset_bytes;
        usage.double_quantized_weight_count = 1;
    } else {
        usage.fp32_scale_bytes = sizeof(float) * layout.block_count();
        usage.scale_bytes = usage.fp32_scale_bytes;
    }
    usage.logical_payload_bytes = usage.packed_code_bytes + usage.scale_bytes;
    usage.resident_payload_bytes = state_->resident_bytes();
    usage.fp32_equivalent_bytes = sizeof(float) * layout.element_count();
    return usage;
}

QuantizedWeight QuantizedWeight::to(ExecutionBackend backend) const {
    constexpr std::string_view op = "QuantizedWeight::to";
    require_state("to");
    if (backend == state_->backend()) {
        return *this;
    }
    const WeightFormat format = state_->layout().format;
    const auto& target = format_capability(backend, format, op);
    if (is_block_weight_format(format)) {
        return QuantizedWeight(target.upload_blocks(copy_blocks_to_host()));
    }
    return QuantizedWeight(target.upload(copy_payload_to_host()));
}

Tensor QuantizedWeight::dequantize() const {
    require_state("dequantize");
    std::vector<float> values(state_->layout().element_count());
    if (is_block_weight_format(state_->layout().format)) {
        const PackedBlockPayload blocks = copy_blocks_to_host();
        detail::dequantize_block_range(detail::view_of(blocks), 0, values);
    } else {
        const PackedNf4Payload payload = copy_payload_to_host();
        detail::dequantize_nf4_range(detail::view_of(payload), 0, values);
    }
    return Tensor(shape(), values, state_->backend());
}

PackedNf4Payload QuantizedWeight::copy_payload_to_host() const {
    constexpr std::string_view op = "QuantizedWeight::copy_payload_to_host";
    require_state("copy_payload_to_host");
    if (state_->layout().format != WeightFormat::nf4) {
        throw std::logic_error(std::string(op) + ": the weight is " +
                               std::string(weight_format_name(state_->layout().format)) +
                               ", not nf4 (copy_blocks_to_host reads its blocks)");
    }
    PackedNf4Payload payload = capability_of(state_->backend(), op).download(*state_);
    detail::synchronize(state_->backend());
    return payload;
}

PackedBlockPayload QuantizedWeight::copy_blocks_to_host() const {
    constexpr std::string_view op = "QuantizedWeight::copy_blocks_to_host";
    require_state("copy_blocks_to_host");
    if (!is_block_weight_format(state_->layout().format)) {
        throw std::logic_error(std::string(op) +
                               ": the weight is nf4, not a block format (copy_payload_to_host "
                               "reads its payload)");
    }
    PackedBlockPayload blocks = capability_of(state_->backend(), op).download_blocks(*state_);
    detail::synchronize(state_->backend());
    return blocks;
}

const detail::QuantizedStorage& QuantizedWeight::storage() const {
    require_state("storage");
    return *state_;
}

}  // namespace riftco_transformer
