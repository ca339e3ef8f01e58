#include "riftco_transformer/core/tensor_ops/quantized_linear.hpp"

#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

// The checks both directions share; returns the capability of the common backend.
// `width` is the last dimension the input must have (in forward, out backward).
const detail::QuantizedLinearCapability& checked_capability(std::string_view op,
                                                            std::string_view argument,
                                                            const Tensor& input,
                                                            const QuantizedWeight& weight,
                                                            bool forward) {
    detail::require_tensor(op, argument, input);
    if (weight.is_singular()) {
        throw std::invalid_argument(std::string(op) + ": weight is a singular QuantizedWeight");
    }
    if (input.backend() != weight.backend()) {
        std::ostringstream message;
        message << op << ": inputs are on different backends (" << argument << " on "
                << execution_backend_name(input.backend()) << ", weight on "
                << execution_backend_name(weight.backend()) << ")";
        throw std::invalid_argument(message.str());
    }
    const std::size_t width = forward ? weight.in_features() : weight.out_features();
    if (input.rank() == 0 || input.shape().back() != width) {
        std::ostringstream message;
        message << op << ": " << argument << " " << shape_to_string(input.shape())
                << " must end in the weight's " << (forward ? "in_features " : "out_features ")
                << width << " (weight " << shape_to_string(weight.shape()) << ")";
        throw std::invalid_argument(message.str());
    }
    const auto& adapter = detail::require_available_adapter(input.backend(), op);
    return detail::require_capability(adapter.quantized_linear(), adapter, op, "quantized linear");
}

}  // namespace

Tensor quantized_linear(const Tensor& x, const QuantizedWeight& weight) {
    constexpr std::string_view op = "quantized_linear";
    const auto& capability = checked_capability(op, "x", x, weight, true);
    Shape shape = x.shape();
    shape.back() = weight.out_features();
    Tensor out = detail::allocate_uninitialized(std::move(shape), x.backend());
    capability.forward(x, weight.storage(), out);
    return out;
}

Tensor quantized_linear_input_backward(const Tensor& upstream, const QuantizedWeight& weight) {
    constexpr std::string_view op = "quantized_linear_input_backward";
    const auto& capability = checked_capability(op, "upstream", upstream, weight, false);
    Shape shape = upstream.shape();
    shape.back() = weight.in_features();
    Tensor out = detail::allocate_uninitialized(std::move(shape), upstream.backend());
    capability.input_backward(upstream, weight.storage(), out);
    return out;
}

Tensor quantized_gather_rows(const QuantizedWeight& weight, const IndexTensor& indices) {
    constexpr std::string_view op = "quantized_gather_rows";
    if (weight.is_singular()) {
        throw std::invalid_argument(std::string(op) + ": weight is a singular QuantizedWeight");
    }
    detail::require_indices(op, "indices", indices, weight.backend(), weight.out_features(),
                            "rows");
    const auto& adapter = detail::require_available_adapter(weight.backend(), op);
    const auto& capability =
        detail::require_capability(adapter.quantized_linear(), adapter, op, "quantized linear");
    if (!capability.gathers_rows()) {
        throw std::runtime_error(std::string(op) + ": backend '" +
                                 std::string(execution_backend_name(weight.backend())) +
                                 "' cannot look up rows of a packed weight");
    }
    Shape shape = indices.shape();
    shape.push_back(weight.in_features());
    Tensor out = detail::allocate_uninitialized(std::move(shape), weight.backend());
    capability.gather_rows(weight.storage(), indices, out);
    return out;
}

}  // namespace riftco_transformer::tensor_ops
