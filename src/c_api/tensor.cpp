// Contexts (a backend chosen at creation) and immutable float32 tensors.

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

Shape shape_from(const uint64_t* dimensions, uint64_t rank) {
    const auto given = input_array(dimensions, rank, "shape");
    Shape shape;
    shape.reserve(given.size());
    for (std::size_t axis = 0; axis < given.size(); ++axis) {
        if (given[axis] == 0) {
            throw std::invalid_argument("shape[" + std::to_string(axis) +
                                        "] is 0 (dimensions must be positive)");
        }
        shape.push_back(to_size(given[axis], "shape dimension"));
    }
    return shape;
}

void publish(Tensor tensor, rt_tensor** out) {
    *out = new rt_tensor{std::move(tensor)};
}

const Tensor& tensor_of(const rt_tensor* handle, const char* argument) {
    return require_handle(handle, argument).tensor;
}

}  // namespace

extern "C" {

rt_status rt_context_create(int32_t backend, rt_context** out) {
    return guarded(__func__, [&] {
        const ExecutionBackend value = backend_from_value(backend, "backend");
        require_pointer(out, "out");
        if (!execution_backend_available(value)) {
            throw BackendUnavailableError(
                value, "execution backend '" + std::string(execution_backend_name(value)) +
                           "' is unavailable: " +
                           std::string(execution_backend_unavailability_reason(value)));
        }
        *out = new rt_context{value};
    });
}

void rt_context_release(rt_context* context) {
    delete context;
}

rt_status rt_context_backend(const rt_context* context, int32_t* out_backend) {
    return guarded(__func__, [&] {
        set_output(out_backend, static_cast<int32_t>(require_handle(context, "context").backend),
                   "out_backend");
    });
}

rt_status rt_tensor_create_f32(const rt_context* context, const uint64_t* shape, uint64_t rank,
                               const float* values, uint64_t count, rt_tensor** out) {
    return guarded(__func__, [&] {
        const rt_context& native = require_handle(context, "context");
        Shape dimensions = shape_from(shape, rank);
        const auto given = input_array(values, count, "values");
        require_pointer(out, "out");
        publish(Tensor(std::move(dimensions), given, native.backend), out);
    });
}

rt_status rt_tensor_zeros_f32(const rt_context* context, const uint64_t* shape, uint64_t rank,
                              rt_tensor** out) {
    return guarded(__func__, [&] {
        const rt_context& native = require_handle(context, "context");
        Shape dimensions = shape_from(shape, rank);
        require_pointer(out, "out");
        publish(Tensor::zeros(std::move(dimensions), native.backend), out);
    });
}

void rt_tensor_release(rt_tensor* tensor) {
    delete tensor;
}

rt_status rt_tensor_backend(const rt_tensor* tensor, int32_t* out_backend) {
    return guarded(__func__, [&] {
        set_output(out_backend, static_cast<int32_t>(tensor_of(tensor, "tensor").backend()),
                   "out_backend");
    });
}

rt_status rt_tensor_rank(const rt_tensor* tensor, uint64_t* out_rank) {
    return guarded(__func__, [&] {
        set_output(out_rank, tensor_of(tensor, "tensor").shape().size(), "out_rank");
    });
}

rt_status rt_tensor_shape(const rt_tensor* tensor, uint64_t* out, uint64_t capacity,
                          uint64_t* required) {
    return guarded(__func__, [&] {
        write_shape(tensor_of(tensor, "tensor").shape(), out, capacity, required);
    });
}

rt_status rt_tensor_numel(const rt_tensor* tensor, uint64_t* out_numel) {
    return guarded(
        __func__, [&] { set_output(out_numel, tensor_of(tensor, "tensor").numel(), "out_numel"); });
}

rt_status rt_tensor_copy_to_host_f32(const rt_tensor* tensor, float* out, uint64_t capacity,
                                     uint64_t* required) {
    return guarded(__func__, [&] {
        write_tensor_values(tensor_of(tensor, "tensor"), out, capacity, required);
    });
}

rt_status rt_tensor_matmul(const rt_tensor* left, const rt_tensor* right, rt_tensor** out) {
    return guarded(__func__, [&] {
        const Tensor& left_tensor = tensor_of(left, "left");
        const Tensor& right_tensor = tensor_of(right, "right");
        require_pointer(out, "out");
        publish(tensor_ops::matmul(left_tensor, right_tensor), out);
    });
}

}  // extern "C"
