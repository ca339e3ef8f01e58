#include "optim/adam_backend.hpp"

#include <sstream>
#include <stdexcept>
#include <vector>


#include "core/autograd/node.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"
#include "optim/number_text.hpp"

namespace riftco_transformer::detail {

double gradient_norm(ExecutionBackend backend, std::span<const NamedParameter> parameters,
                     std::string_view operation) {
    std::vector<const Tensor*> gradients;
    gradients.reserve(parameters.size());
    for (const NamedParameter& entry : parameters) {
        const Tensor& gradient = entry.parameter.node()->gradient;
        gradients.push_back(gradient.is_singular() ? nullptr : &gradient);
    }
    const tensor_ops::GradientStatistics statistics =
        tensor_ops::gradient_statistics(backend, gradients);
    const tensor_ops::FirstNonFinite& bad = statistics.first_non_finite;
    if (bad.tensor != gradients.size()) {
        std::ostringstream message;
        message << operation << ": the gradient of parameter '" << parameters[bad.tensor].name
                << "' has element " << bad.element << " = " << number_text(bad.value)
                << " (gradients must be finite)";
        throw std::domain_error(message.str());
    }
    return statistics.squares.norm();
}

}  // namespace riftco_transformer::detail
