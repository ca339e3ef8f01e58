#include "riftco_transformer/optim/gradient_norm.hpp"

#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "optim/adam_backend.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"

namespace riftco_transformer {

double global_gradient_norm(const ParameterList& parameters) {
    constexpr std::string_view operation = "global_gradient_norm";
    std::unordered_set<const void*> seen;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        const NamedParameter& entry = parameters[i];
        if (!entry.parameter.defined()) {
            throw std::invalid_argument("global_gradient_norm: entry " + std::to_string(i) + " ('" +
                                        entry.name + "') is an empty Variable");
        }
        const LeafView node = leaf_view(entry.parameter, operation);
        if (!node.leaf) {
            throw std::invalid_argument("global_gradient_norm: entry " + std::to_string(i) + " ('" +
                                        entry.name + "') is not a leaf");
        }
        if (!seen.insert(node.identity).second) {
            throw std::invalid_argument("global_gradient_norm: entry " + std::to_string(i) + " ('" +
                                        entry.name + "') is a parameter already listed earlier");
        }
    }
    if (parameters.empty()) {
        return 0.0;
    }
    const ExecutionBackend backend = parameters.front().parameter.backend();
    for (const NamedParameter& entry : parameters) {
        const LeafView node = leaf_view(entry.parameter, operation);
        const auto mismatch = [&](const char* what, const Tensor& tensor) {
            std::ostringstream message;
            message << operation << ": the " << what << " of parameter '" << entry.name
                    << "' is on " << execution_backend_name(tensor.backend())
                    << ", the first parameter on " << execution_backend_name(backend);
            throw std::logic_error(message.str());
        };
        if (node.value.backend() != backend) {
            mismatch("value", node.value);
        }
        if (node.gradient.is_singular()) {
            continue;
        }
        if (node.gradient.backend() != backend) {
            mismatch("gradient", node.gradient);
        }
        if (node.gradient.shape() != node.value.shape()) {
            throw std::logic_error("global_gradient_norm: the gradient of parameter '" +
                                   entry.name + "' has shape " +
                                   shape_to_string(node.gradient.shape()) + ", its value " +
                                   shape_to_string(node.value.shape()));
        }
    }
    tensor_ops::require_optimizer_backend(backend, operation);
    return detail::gradient_norm(backend, parameters, operation);
}

}  // namespace riftco_transformer
