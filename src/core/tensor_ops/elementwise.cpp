#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"

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

Tensor rotary_embedding(const Tensor& x, const Tensor& cosine, const Tensor& sine,
                        std::size_t table_axis) {
    constexpr std::string_view op = "rotary_embedding";
    const auto& adapter =
        detail::input_adapter(op, {{"x", &x}, {"cosine", &cosine}, {"sine", &sine}});
    const Shape& shape = x.shape();
    const Shape& table = cosine.shape();
    const bool fits = shape.size() >= 2 && table_axis + 1 < shape.size() && shape.back() % 2 == 0 &&
                      shape.back() > 0 && table.size() == 2 && sine.shape() == table &&
                      table[0] == shape[table_axis] && table[1] * 2 == shape.back();
    if (!fits) {
        throw std::invalid_argument(
            std::string(op) + ": x " + shape_to_string(shape) + " with table axis " +
            std::to_string(table_axis) + " does not fit tables " + shape_to_string(table) +
            " and " + shape_to_string(sine.shape()) +
            " (need an even last axis d, an axis before it of extent rows, and [rows,d/2])");
    }
    if (const detail::RotaryCapability* fused = adapter.rotary()) {
        Tensor out = detail::allocate_uninitialized(shape, x.backend());
        fused->rotate(x, cosine, sine, table_axis, out);
        return out;
    }
    const std::size_t half = shape.back() / 2;
    Shape half_shape = shape;
    half_shape.back() = half;
    Shape view(shape.size(), 1);  // the tables with x's rank: [1,..,rows,..,1,h]
    view[table_axis] = table[0];
    view.back() = half;
    const auto expand = [&](const Tensor& t) { return broadcast_to(reshape(t, view), half_shape); };
    const Tensor c = expand(cosine);
    const Tensor s = expand(sine);
    const std::size_t last = shape.size() - 1;
    const Tensor first = slice(x, last, 0, half);
    const Tensor second = slice(x, last, half, half);
    return concatenate_last_axis(subtract(multiply(first, c), multiply(second, s)),
                                 add(multiply(second, c), multiply(first, s)));
}

void require_dropout(std::string_view operation, ExecutionBackend backend) {
    const auto& adapter = detail::require_available_adapter(backend, operation);
    static_cast<void>(detail::require_capability(adapter.dropout(), adapter, operation, "dropout"));
}

Tensor dropout_mask(const Shape& shape, ExecutionBackend backend, float probability,
                    std::uint64_t seed, std::uint64_t key, std::uint64_t stream_index) {
    constexpr std::string_view op = "dropout_mask";
    if (!std::isfinite(probability) || probability < 0.0F || probability >= 1.0F) {
        std::ostringstream message;
        message << op << ": probability must be finite and in [0, 1) (got " << probability << ")";
        throw std::invalid_argument(message.str());
    }
    const auto& adapter = detail::require_available_adapter(backend, op);
    const auto& kernel = detail::require_capability(adapter.dropout(), adapter, op, "dropout");
    Tensor out = detail::allocate_uninitialized(shape, backend);
    kernel.dropout_mask(dropout_stream(seed, key, stream_index), dropout_threshold(probability),
                        1.0F / (1.0F - probability), out);
    return out;
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
Tensor tanh(const Tensor& x) {
    return unary("tanh", UnaryOperation::Tanh, x);
}
Tensor soft_cap(const Tensor& x, float cap) {
    detail::require_finite_positive("soft_cap", "cap", cap);
    return scale(tanh(scale(x, 1.0F / cap)), cap);
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
