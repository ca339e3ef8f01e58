#include "optim/adam_backend.hpp"

#include <sstream>
#include <stdexcept>
#include <vector>

#include "optim/number_text.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"

namespace riftco_transformer::detail {

std::vector<const Tensor*> gradients_of(std::span<const NamedParameter> parameters) {
    std::vector<const Tensor*> gradients;
    gradients.reserve(parameters.size());
    for (const NamedParameter& entry : parameters) {
        const Tensor& gradient = leaf_view(entry.parameter, "gradient_norm").gradient;
        gradients.push_back(gradient.is_singular() ? nullptr : &gradient);
    }
    return gradients;
}

void throw_non_finite_gradient(std::string_view operation,
                               std::span<const NamedParameter> parameters,
                               const tensor_ops::FirstNonFinite& bad) {
    std::ostringstream message;
    message << operation << ": the gradient of parameter '" << parameters[bad.tensor].name
            << "' has element " << bad.element << " = " << number_text(bad.value)
            << " (gradients must be finite)";
    throw std::domain_error(message.str());
}

double gradient_norm(ExecutionBackend backend, std::span<const NamedParameter> parameters,
                     std::string_view operation) {
    const std::vector<const Tensor*> gradients = gradients_of(parameters);
    const tensor_ops::GradientStatistics statistics =
        tensor_ops::gradient_statistics(backend, gradients);
    if (statistics.first_non_finite.tensor != gradients.size()) {
        throw_non_finite_gradient(operation, parameters, statistics.first_non_finite);
    }
    return statistics.squares.norm();
}

}  // namespace riftco_transformer::detail
