// Differentiable arithmetic and matmul. Each rule's shapes: all operands share the output's
// shape, except matmul ([.., M, K] × [.., K, N] -> [.., M, N]).

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;
using detail::make_result;
using detail::require_defined;

Variable operator+(const Variable& left, const Variable& right) {
    require_defined(left, "add", "left");
    require_defined(right, "add", "right");
    return make_result("add", ops::add(left.value(), right.value()), {&left, &right},
                       [](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{g, g};
                       });
}

Variable operator-(const Variable& left, const Variable& right) {
    require_defined(left, "subtract", "left");
    require_defined(right, "subtract", "right");
    return make_result("subtract", ops::subtract(left.value(), right.value()), {&left, &right},
                       [](const Tensor& g, std::span<const bool> needed) {
                           return std::vector<Tensor>{g, needed[1] ? ops::negate(g) : Tensor()};
                       });
}

Variable operator*(const Variable& left, const Variable& right) {
    require_defined(left, "multiply", "left");
    require_defined(right, "multiply", "right");
    // d left = G ⊙ right, d right = G ⊙ left: keep only the factor each side needs.
    const Tensor right_value = left.requires_gradient() ? right.value() : Tensor();
    const Tensor left_value = right.requires_gradient() ? left.value() : Tensor();
    return make_result("multiply", ops::multiply(left.value(), right.value()), {&left, &right},
                       [left_value, right_value](const Tensor& g, std::span<const bool> needed) {
                           return std::vector<Tensor>{
                               needed[0] ? ops::multiply(g, right_value) : Tensor(),
                               needed[1] ? ops::multiply(g, left_value) : Tensor()};
                       });
}

Variable operator/(const Variable& left, const Variable& right) {
    require_defined(left, "divide", "left");
    require_defined(right, "divide", "right");
    Tensor quotient = ops::divide(left.value(), right.value());
    // d left = G ⊘ B; d right = −G⊙A⊘B² = −(G ⊘ B) ⊙ (A ⊘ B)
    const Tensor denominator = right.value();
    const Tensor saved_quotient = right.requires_gradient() ? quotient : Tensor();
    return make_result(
        "divide", std::move(quotient), {&left, &right},
        [denominator, saved_quotient](const Tensor& g, std::span<const bool> needed) {
            const Tensor scaled = ops::divide(g, denominator);
            return std::vector<Tensor>{
                needed[0] ? scaled : Tensor(),
                needed[1] ? ops::negate(ops::multiply(scaled, saved_quotient)) : Tensor()};
        });
}

Variable operator-(const Variable& x) {
    require_defined(x, "negate", "x");
    return make_result(
        "negate", ops::negate(x.value()), {&x},
        [](const Tensor& g, std::span<const bool>) { return std::vector<Tensor>{ops::negate(g)}; });
}

Variable operator+(const Variable& x, float scalar) {
    require_defined(x, "add_scalar", "x");
    return make_result(
        "add_scalar", ops::add_scalar(x.value(), scalar), {&x},
        [](const Tensor& g, std::span<const bool>) { return std::vector<Tensor>{g}; });
}
Variable operator+(float scalar, const Variable& x) {
    return x + scalar;
}
Variable operator-(const Variable& x, float scalar) {
    if (!std::isfinite(scalar)) {
        throw std::invalid_argument("subtract: the scalar must be finite");
    }
    return x + (-scalar);
}

Variable operator-(float scalar, const Variable& x) {
    require_defined(x, "subtract", "x");
    return make_result(
        "scalar_subtract", ops::add_scalar(ops::negate(x.value()), scalar), {&x},
        [](const Tensor& g, std::span<const bool>) { return std::vector<Tensor>{ops::negate(g)}; });
}

Variable operator*(const Variable& x, float scalar) {
    require_defined(x, "scale", "x");
    return make_result("scale", ops::scale(x.value(), scalar), {&x},
                       [scalar](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::scale(g, scalar)};
                       });
}
Variable operator*(float scalar, const Variable& x) {
    return x * scalar;
}

Variable operator/(const Variable& x, float scalar) {
    require_defined(x, "divide", "x");
    if (!std::isfinite(scalar)) {
        throw std::invalid_argument("divide: the scalar denominator must be finite");
    }
    // A true elementwise division (x·(1/c) would round differently and overflow for tiny c);
    // the zero check is the raw divide's domain rule. d x = G ⊘ c.
    const Tensor denominator = Tensor::full(x.shape(), scalar, x.backend());
    return make_result("divide_scalar", ops::divide(x.value(), denominator), {&x},
                       [denominator](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::divide(g, denominator)};
                       });
}

Variable operator/(float scalar, const Variable& x) {
    require_defined(x, "divide", "x");
    if (!std::isfinite(scalar)) {
        throw std::invalid_argument("divide: the scalar numerator must be finite");
    }
    const Tensor denominator = x.value();
    Tensor quotient =
        ops::divide(Tensor::full(denominator.shape(), scalar, denominator.backend()), denominator);
    const Tensor saved_quotient = quotient;
    // d x = −G ⊙ (c/x) ⊘ x
    return make_result("scalar_divide", std::move(quotient), {&x},
                       [denominator, saved_quotient](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::negate(
                               ops::divide(ops::multiply(g, saved_quotient), denominator))};
                       });
}

Variable matmul(const Variable& left, const Variable& right, bool transpose_left,
                bool transpose_right) {
    require_defined(left, "matmul", "left");
    require_defined(right, "matmul", "right");
    // C = op(A)·op(B): d op(A) = G·op(B)ᵀ and d op(B) = op(A)ᵀ·G, written back through the
    // transposes with the raw kernel's flags. Everything runs on the inputs' backend (tensors
    // carry it), so a later change of the thread default cannot redirect backward.
    const Tensor left_value = right.requires_gradient() ? left.value() : Tensor();
    const Tensor right_value = left.requires_gradient() ? right.value() : Tensor();
    const bool ta = transpose_left;
    const bool tb = transpose_right;
    return make_result(
        "matmul", ops::matmul(left.value(), right.value(), ta, tb), {&left, &right},
        [left_value, right_value, ta, tb](const Tensor& g, std::span<const bool> needed) {
            std::vector<Tensor> gradients(2);
            auto& counters = detail::counter_cells();
            if (needed[0]) {
                gradients[0] = ta ? ops::matmul(right_value, g, tb, true)     // op(B)·Gᵀ
                                  : ops::matmul(g, right_value, false, !tb);  // G·op(B)ᵀ
                counters.matmul_left_gradients.fetch_add(1, std::memory_order_relaxed);
            }
            if (needed[1]) {
                gradients[1] = tb ? ops::matmul(g, left_value, true, ta)     // Gᵀ·op(A)
                                  : ops::matmul(left_value, g, !ta, false);  // op(A)ᵀ·G
                counters.matmul_right_gradients.fetch_add(1, std::memory_order_relaxed);
            }
            return gradients;
        });
}

Variable matmul(const Variable& left, const Variable& right) {
    return matmul(left, right, false, false);
}

}  // namespace riftco_transformer
