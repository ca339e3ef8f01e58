#include "optim/adam_backend.hpp"

#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"
#include "optim/number_text.hpp"

namespace riftco_transformer::detail {

const AdamCapability& adam_capability(ExecutionBackend backend, std::string_view operation) {
    const BackendAdapter& adapter = require_available_adapter(backend, operation);
    return require_capability(adapter.adam(), adapter, operation, "Adam");
}

double gradient_norm(const AdamCapability& capability, std::span<const NamedParameter> parameters,
                     std::string_view operation) {
    ScaledSumOfSquares total;
    for (const NamedParameter& entry : parameters) {
        const Tensor& gradient = entry.parameter.node()->gradient;
        if (gradient.is_singular()) {
            continue;
        }
        const GradientSquares squares = capability.scaled_sum_of_squares(gradient);
        if (squares.first_non_finite != gradient.numel()) {
            std::ostringstream message;
            message << operation << ": the gradient of parameter '" << entry.name
                    << "' has element " << squares.first_non_finite << " = "
                    << number_text(gradient.flat(squares.first_non_finite))
                    << " (gradients must be finite)";
            throw std::domain_error(message.str());
        }
        total.merge(squares.squares);
    }
    return total.norm();
}

}  // namespace riftco_transformer::detail
