#include "riftco_transformer/core/tensor_ops/optimizer.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

#include "core/backend/synchronization.hpp"
#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

const detail::AdamCapability& adam_of(ExecutionBackend backend, std::string_view operation) {
    const detail::BackendAdapter& adapter = detail::require_available_adapter(backend, operation);
    return detail::require_capability(adapter.adam(), adapter, operation, "Adam");
}

void require_on(std::string_view operation, std::string_view what, std::size_t position,
                const Tensor& tensor, ExecutionBackend backend) {
    detail::require_tensor(operation, what, tensor);
    if (tensor.backend() != backend) {
        std::ostringstream message;
        message << operation << ": " << what << " " << position << " is on "
                << execution_backend_name(tensor.backend()) << ", not "
                << execution_backend_name(backend);
        throw std::invalid_argument(message.str());
    }
}

void require_tensors(std::string_view operation, ExecutionBackend backend,
                     std::span<const Tensor* const> tensors) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (tensors[i] != nullptr) {
            require_on(operation, "tensor", i, *tensors[i], backend);
        }
    }
}

void require_slices(std::string_view operation, ExecutionBackend backend,
                    std::span<const AdamSlice> slices) {
    for (std::size_t i = 0; i < slices.size(); ++i) {
        const AdamSlice& slice = slices[i];
        if (slice.value == nullptr || slice.first_moment == nullptr ||
            slice.second_moment == nullptr) {
            throw std::invalid_argument(std::string(operation) + ": slice " + std::to_string(i) +
                                        " lacks its value or a moment");
        }
        require_on(operation, "value of slice", i, *slice.value, backend);
        require_on(operation, "first moment of slice", i, *slice.first_moment, backend);
        require_on(operation, "second moment of slice", i, *slice.second_moment, backend);
        const std::size_t count = slice.first_moment->numel();
        if (slice.second_moment->numel() != count || slice.offset > slice.value->numel() ||
            count > slice.value->numel() - slice.offset) {
            std::ostringstream message;
            message << operation << ": slice " << i << " covers [" << slice.offset << ", "
                    << slice.offset + count << ") of a value of " << slice.value->numel()
                    << " elements with moments of " << count << " and "
                    << slice.second_moment->numel();
            throw std::invalid_argument(message.str());
        }
        if (slice.gradient != nullptr) {
            require_on(operation, "gradient of slice", i, *slice.gradient, backend);
            if (slice.gradient->shape() != slice.value->shape()) {
                throw std::invalid_argument(std::string(operation) + ": the gradient of slice " +
                                            std::to_string(i) + " has shape " +
                                            shape_to_string(slice.gradient->shape()) +
                                            ", its value " + shape_to_string(slice.value->shape()));
            }
        }
    }
}

}  // namespace

void require_optimizer_backend(ExecutionBackend backend, std::string_view operation) {
    static_cast<void>(adam_of(backend, operation));
}

namespace {
// One request to the backend's Adam capability, then its one host read.
template <typename Request>
auto read_once(ExecutionBackend backend, std::string_view op, Request&& request) {
    auto result = request(adam_of(backend, op));
    detail::synchronize(backend);
    return result;
}
}  // namespace

GradientStatistics gradient_statistics(ExecutionBackend backend,
                                       std::span<const Tensor* const> tensors) {
    constexpr std::string_view op = "gradient_statistics";
    require_tensors(op, backend, tensors);
    return read_once(backend, op, [&](const detail::AdamCapability& adam) {
        return adam.gradient_statistics(tensors);
    });
}

FirstNonFinite first_non_finite(ExecutionBackend backend, std::span<const Tensor* const> tensors) {
    constexpr std::string_view op = "first_non_finite";
    require_tensors(op, backend, tensors);
    return read_once(backend, op, [&](const detail::AdamCapability& adam) {
        return adam.first_non_finite(tensors);
    });
}

AdamStepCheck adam_step_check(ExecutionBackend backend, const AdamUpdateScalars& scalars,
                              double maximum_gradient_norm,
                              std::span<const Tensor* const> gradients,
                              std::span<const AdamSlice> slices) {
    constexpr std::string_view op = "adam_step_check";
    require_tensors(op, backend, gradients);
    require_slices(op, backend, slices);
    return read_once(backend, op, [&](const detail::AdamCapability& adam) {
        return adam.check_step(scalars, maximum_gradient_norm, gradients, slices);
    });
}

AdamCheck adam_check(ExecutionBackend backend, const AdamUpdateScalars& scalars,
                     std::span<const AdamSlice> slices) {
    constexpr std::string_view op = "adam_check";
    require_slices(op, backend, slices);
    return read_once(backend, op, [&](const detail::AdamCapability& adam) {
        return adam.check_update(scalars, slices);
    });
}

void adam_apply(ExecutionBackend backend, const AdamUpdateScalars& scalars,
                std::span<const AdamSlice> slices) {
    constexpr std::string_view op = "adam_apply";
    require_slices(op, backend, slices);
    adam_of(backend, op).apply_update(scalars, slices);
}

}  // namespace riftco_transformer::tensor_ops
