// custom_gradient: a result whose VJP the caller supplies.

#include "riftco_transformer/core/autograd/custom_gradient.hpp"

#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"

namespace riftco_transformer {
using detail::Node;

Variable custom_gradient(Tensor output, std::span<const Variable> inputs,
                         VectorJacobianProduct vjp) {
    constexpr std::string_view op = "custom_gradient";
    if (!vjp) {
        throw std::invalid_argument("custom_gradient: the vjp callable is empty");
    }
    if (inputs.empty()) {
        throw std::invalid_argument("custom_gradient: there are no inputs");
    }
    if (output.is_singular()) {
        throw std::invalid_argument("custom_gradient: the output is a singular tensor");
    }
    std::vector<Shape> shapes;
    std::vector<ExecutionBackend> backends;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const auto& node = detail::require_defined(inputs[i], op, "input");
        if (node->value.backend() != output.backend()) {
            std::ostringstream message;
            message << op << ": input " << i << " is on "
                    << execution_backend_name(node->value.backend()) << ", the output on "
                    << execution_backend_name(output.backend());
            throw std::invalid_argument(message.str());
        }
        shapes.push_back(node->value.shape());
        backends.push_back(node->value.backend());
    }
    return detail::make_result(
        op, std::move(output), inputs,
        [vjp = std::move(vjp), shapes, backends](const Tensor& g, std::span<const bool>) {
            std::vector<Tensor> gradients = vjp(g);
            // Validate the whole result before the engine accumulates any of it.
            if (gradients.size() != shapes.size()) {
                std::ostringstream message;
                message << "custom_gradient: the vjp returned " << gradients.size()
                        << " tensors for " << shapes.size() << " inputs";
                throw std::invalid_argument(message.str());
            }
            for (std::size_t i = 0; i < gradients.size(); ++i) {
                if (gradients[i].is_singular() || gradients[i].shape() != shapes[i] ||
                    gradients[i].backend() != backends[i]) {
                    std::ostringstream message;
                    message << "custom_gradient: the vjp's tensor " << i << " ("
                            << (gradients[i].is_singular()
                                    ? std::string("singular")
                                    : shape_to_string(gradients[i].shape()) + " on " +
                                          std::string(
                                              execution_backend_name(gradients[i].backend())))
                            << ") does not match input " << i << " (" << shape_to_string(shapes[i])
                            << " on " << execution_backend_name(backends[i]) << ")";
                    throw std::invalid_argument(message.str());
                }
            }
            return gradients;
        });
}

}  // namespace riftco_transformer
