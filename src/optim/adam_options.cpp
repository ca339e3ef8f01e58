#include "riftco_transformer/optim/adam_options.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

#include "optim/number_text.hpp"

namespace riftco_transformer {
namespace {

[[noreturn]] void reject(std::string_view option, double value, std::string_view requirement) {
    throw std::invalid_argument("AdamOptions: " + std::string(option) + " (" +
                                detail::number_text(value) + ") " + std::string(requirement));
}

}  // namespace

void validate_adam_options(const AdamOptions& options) {
    if (!(std::isfinite(options.learning_rate) && options.learning_rate > 0.0)) {
        reject("learning_rate", options.learning_rate, "must be finite and > 0");
    }
    if (!(options.beta1 > 0.0 && options.beta1 < 1.0)) {
        reject("beta1", options.beta1, "must lie in the open interval (0, 1)");
    }
    if (!(options.beta2 > 0.0 && options.beta2 < 1.0)) {
        reject("beta2", options.beta2, "must lie in the open interval (0, 1)");
    }
    if (!(std::isfinite(options.epsilon) && options.epsilon > 0.0)) {
        reject("epsilon", options.epsilon, "must be finite and > 0");
    }
    if (!(options.maximum_gradient_norm > 0.0)) {
        reject("maximum_gradient_norm", options.maximum_gradient_norm,
               "must be > 0 (+infinity disables clipping)");
    }
    if (options.state_storage != AdamStateStorage::Contiguous &&
        options.state_storage != AdamStateStorage::Paged) {
        throw std::invalid_argument(
            "AdamOptions: unknown state_storage value " +
            std::to_string(static_cast<std::uint32_t>(options.state_storage)));
    }
    if (options.page_size == 0) {
        throw std::invalid_argument(
            "AdamOptions: page_size (0) must be > 0, even with Contiguous storage");
    }
    if (!(std::isfinite(options.weight_decay) && options.weight_decay >= 0.0)) {
        reject("weight_decay", options.weight_decay, "must be finite and >= 0");
    }
    validate_learning_rate_schedule(options.schedule);
}

}  // namespace riftco_transformer
