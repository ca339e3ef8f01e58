// Differentiable elementwise functions.

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"
#include "core/tensor_ops/validation.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;
using detail::make_result;
using detail::require_defined;

Variable exp(const Variable& x) {
    require_defined(x, "exp", "x");
    Tensor out = ops::exp(x.value());
    const Tensor saved = out;  // d x = G ⊙ eˣ
    return make_result("exp", std::move(out), {&x},
                       [saved](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::multiply(g, saved)};
                       });
}

Variable log(const Variable& x) {
    require_defined(x, "log", "x");
    const Tensor input = x.value();  // d x = G ⊘ x
    return make_result("log", ops::log(input), {&x},
                       [input](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::divide(g, input)};
                       });
}

Variable sqrt(const Variable& x) {
    require_defined(x, "sqrt", "x");
    // The derivative 1/(2√x) is infinite at 0, so the differentiable form needs x > 0.
    // Checked on the host: this is the reference rule every backend shares.
    const std::vector<float> values = x.value().to_host();
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (!(values[i] > 0.0F)) {
            std::ostringstream message;
            message << "sqrt: x element " << i << " is " << values[i]
                    << " (the differentiable sqrt needs x > 0)";
            throw std::domain_error(message.str());
        }
    }
    Tensor out = ops::sqrt(x.value());
    const Tensor saved = out;  // d x = G ⊘ (2√x)
    return make_result("sqrt", std::move(out), {&x},
                       [saved](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::scale(ops::divide(g, saved), 0.5F)};
                       });
}

Variable erf(const Variable& x) {
    require_defined(x, "erf", "x");
    const Tensor input = x.value();  // d x = G · (2/√π)·e^{−x²}
    return make_result(
        "erf", ops::erf(input), {&x}, [input](const Tensor& g, std::span<const bool>) {
            constexpr float two_over_sqrt_pi = 1.12837916709551257F;
            const Tensor density = ops::exp(ops::negate(ops::multiply(input, input)));
            return std::vector<Tensor>{ops::scale(ops::multiply(g, density), two_over_sqrt_pi)};
        });
}

Variable tanh(const Variable& x) {
    require_defined(x, "tanh", "x");
    Tensor out = ops::tanh(x.value());
    const Tensor saved = out;  // d x = G ⊙ (1 − y²)
    return make_result(
        "tanh", std::move(out), {&x}, [saved](const Tensor& g, std::span<const bool>) {
            const Tensor slope = ops::add_scalar(ops::negate(ops::multiply(saved, saved)), 1.0F);
            return std::vector<Tensor>{ops::multiply(g, slope)};
        });
}

Variable soft_cap(const Variable& x, float cap) {
    require_defined(x, "soft_cap", "x");
    detail::require_finite_positive("soft_cap", "cap", cap);
    return tanh(x * (1.0F / cap)) * cap;
}

Variable gelu(const Variable& x) {
    require_defined(x, "gelu", "x");
    const Tensor input = x.value();
    return make_result("gelu", ops::gelu(input), {&x},
                       [input](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::gelu_backward(input, g)};
                       });
}

Variable gelu_tanh(const Variable& x) {
    require_defined(x, "gelu_tanh", "x");
    const Tensor input = x.value();
    return make_result("gelu_tanh", ops::gelu_tanh(input), {&x},
                       [input](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::gelu_tanh_backward(input, g)};
                       });
}

Variable relu(const Variable& x) {
    require_defined(x, "relu", "x");
    const Tensor input = x.value();
    return make_result("relu", ops::relu(input), {&x},
                       [input](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::relu_backward(input, g)};
                       });
}

Variable silu(const Variable& x) {
    require_defined(x, "silu", "x");
    const Tensor input = x.value();
    return make_result("silu", ops::silu(input), {&x},
                       [input](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::silu_backward(input, g)};
                       });
}

}  // namespace riftco_transformer
