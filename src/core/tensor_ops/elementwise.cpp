#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

using detail::BinaryOperation;
using detail::UnaryDerivative;
using detail::UnaryOperation;

const detail::ElementwiseCapability& elementwise_of(const detail::BackendAdapter& adapter,
                                                    std::string_view operation) {
    return detail::require_capability(adapter.elementwise(), adapter, operation, "elementwise");
}

Tensor binary(std::string_view op, BinaryOperation operation, const Tensor& left,
              const Tensor& right) {
    const auto& adapter = detail::input_adapter(op, {{"left", &left}, {"right", &right}});
    detail::require_same_shape(op, {"left", &left}, {"right", &right});
    Tensor out = detail::allocate_uninitialized(left.shape(), left.backend());
    elementwise_of(adapter, op).binary(operation, left, right, out);
    return out;
}

Tensor unary(std::string_view op, UnaryOperation operation, const Tensor& x) {
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    Tensor out = detail::allocate_uninitialized(x.shape(), x.backend());
    elementwise_of(adapter, op).unary(operation, x, out);
    return out;
}

Tensor unary_backward(std::string_view op, UnaryDerivative derivative, const Tensor& x,
                      const Tensor& upstream) {
    const auto& adapter = detail::input_adapter(op, {{"x", &x}, {"upstream", &upstream}});
    detail::require_same_shape(op, {"x", &x}, {"upstream", &upstream});
    Tensor out = detail::allocate_uninitialized(x.shape(), x.backend());
    elementwise_of(adapter, op).unary_backward(derivative, x, upstream, out);
    return out;
}

Tensor affine(std::string_view op, const Tensor& x, float multiplier, float addend) {
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    Tensor out = detail::allocate_uninitialized(x.shape(), x.backend());
    elementwise_of(adapter, op).affine(x, multiplier, addend, out);
    return out;
}

}  // namespace

Tensor add(const Tensor& left, const Tensor& right) {
    return binary("add", BinaryOperation::Add, left, right);
}
Tensor subtract(const Tensor& left, const Tensor& right) {
    return binary("subtract", BinaryOperation::Subtract, left, right);
}
Tensor multiply(const Tensor& left, const Tensor& right) {
    return binary("multiply", BinaryOperation::Multiply, left, right);
}
Tensor divide(const Tensor& numerator, const Tensor& denominator) {
    return binary("divide", BinaryOperation::Divide, numerator, denominator);
}

Tensor negate(const Tensor& x) {
    return unary("negate", UnaryOperation::Negate, x);
}

Tensor scale(const Tensor& x, float factor) {
    detail::require_finite("scale", "factor", factor);
    return affine("scale", x, factor, 0.0F);
}

Tensor add_scalar(const Tensor& x, float addend) {
    detail::require_finite("add_scalar", "addend", addend);
    return affine("add_scalar", x, 1.0F, addend);
}

Tensor exp(const Tensor& x) {
    return unary("exp", UnaryOperation::Exp, x);
}
Tensor log(const Tensor& x) {
    return unary("log", UnaryOperation::Log, x);
}
Tensor sqrt(const Tensor& x) {
    return unary("sqrt", UnaryOperation::Sqrt, x);
}
Tensor erf(const Tensor& x) {
    return unary("erf", UnaryOperation::Erf, x);
}
Tensor gelu(const Tensor& x) {
    return unary("gelu", UnaryOperation::Gelu, x);
}
Tensor gelu_tanh(const Tensor& x) {
    return unary("gelu_tanh", UnaryOperation::GeluTanh, x);
}
Tensor relu(const Tensor& x) {
    return unary("relu", UnaryOperation::Relu, x);
}
Tensor silu(const Tensor& x) {
    return unary("silu", UnaryOperation::Silu, x);
}

Tensor gelu_backward(const Tensor& x, const Tensor& upstream) {
    return unary_backward("gelu_backward", UnaryDerivative::Gelu, x, upstream);
}
Tensor gelu_tanh_backward(const Tensor& x, const Tensor& upstream) {
    return unary_backward("gelu_tanh_backward", UnaryDerivative::GeluTanh, x, upstream);
}
Tensor relu_backward(const Tensor& x, const Tensor& upstream) {
    return unary_backward("relu_backward", UnaryDerivative::Relu, x, upstream);
}
Tensor silu_backward(const Tensor& x, const Tensor& upstream) {
    return unary_backward("silu_backward", UnaryDerivative::Silu, x, upstream);
}

}  // namespace riftco_transformer::tensor_ops
