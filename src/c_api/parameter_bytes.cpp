// Loading one parameter from the raw little-endian bytes of an F32, F16 or BF16 tensor (a
// checkpoint's data, e.g. a memory-mapped safetensors span), converted to float32 here so no
// client loop touches the values. The conversion kernels are the GGUF dequantizer's (one
// element per block for these three types): F32 bit for bit, F16 exact (subnormals become
// normal floats, ±inf stays, a NaN keeps its sign and payload), BF16 the bits << 16.
//
// Unlike rt_parameter_list_load_from_host_f32 non-finite results are loaded as they are:
// checkpoints are the caller's to judge (see c_api.h).

#include <string>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/interchange/gguf.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

struct ByteDtype {
    GgmlType type;
    std::size_t element_bytes;
    const char* name;
};

ByteDtype byte_dtype_from_value(int32_t dtype) {
    switch (dtype) {
        case RT_DTYPE_F32:
            return {GgmlType::F32, 4, "F32"};
        case RT_DTYPE_F16:
            return {GgmlType::F16, 2, "F16"};
        case RT_DTYPE_BF16:
            return {GgmlType::BF16, 2, "BF16"};
        default:
            throw std::invalid_argument("dtype: unknown value " + std::to_string(dtype) +
                                        " (RT_DTYPE_F32 0, RT_DTYPE_F16 1, RT_DTYPE_BF16 2)");
    }
}

}  // namespace

extern "C" {

rt_status rt_parameter_list_load_from_bytes(rt_parameter_list* list, uint64_t index, int32_t dtype,
                                            const uint8_t* bytes, uint64_t byte_count) {
    return guarded(__func__, [&] {
        rt_parameter_list& native = require_handle(list, "list");
        if (index >= native.parameters.size()) {
            throw std::out_of_range("index " + std::to_string(index) + " is past the " +
                                    std::to_string(native.parameters.size()) + " parameters");
        }
        const ByteDtype element = byte_dtype_from_value(dtype);
        const auto given = input_array(bytes, byte_count, "bytes");
        const NamedParameter& entry = native.parameters[static_cast<std::size_t>(index)];
        const Tensor& current = entry.parameter.value();
        // numel·element_bytes fits: the float32 value of the same numel already exists.
        const std::size_t expected = current.numel() * element.element_bytes;
        if (given.size() != expected) {
            throw std::invalid_argument(
                "parameter " + std::to_string(index) + " (" + entry.name + ", shape " +
                shape_to_string(current.shape()) + "): byte_count " + std::to_string(byte_count) +
                " differs from the " + std::to_string(expected) + " bytes of " +
                std::to_string(current.numel()) + " " + element.name + " values");
        }
        native.state->require_unpinned();
        // The new value is complete before it is installed: a failed allocation changes nothing.
        std::vector<float> values(current.numel());
        dequantize_gguf_blocks(element.type, given, values);
        Tensor replacement(current.shape(), values, current.backend());
        Variable parameter = entry.parameter;
        parameter.set_value(std::move(replacement));
        ++native.state->parameter_epoch;
    });
}

}  // extern "C"
