#include "optim/adam_backend.hpp"

#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/synchronization.hpp"

#include "core/autograd/node.hpp"
#include "optim/number_text.hpp"

namespace riftco_transformer::detail {

const AdamCapability& adam_capability(ExecutionBackend backend, std::string_view operation) {
    const BackendAdapter& adapter = require_available_adapter(backend, operation);
    return require_capability(adapter.adam(), adapter, operation, "Adam");
}

double gradient_norm(const AdamCapability& capability, std::span<const NamedParameter> parameters,
                     std::string_view operation) {
    // One batched request over every gradient, one host read of its small result.
    std::vector<const Tensor*> gradients;
    gradients.reserve(parameters.size());
    ExecutionBackend backend = ExecutionBackend::Cpu;
    for (const NamedParameter& entry : parameters) {
        const Tensor& gradient = entry.parameter.node()->gradient;
        gradients.push_back(gradient.is_singular() ? nullptr : &gradient);
        backend = entry.parameter.node()->value.backend();
    }
    const GradientStatistics statistics = capability.gradient_statistics(gradients);
    synchronize(backend);
    const FirstNonFinite& bad = statistics.first_non_finite;
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
