#include "riftco_transformer/core/tensor_ops/loss.hpp"

#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {

CrossEntropyResult cross_entropy(const Tensor& logits, std::span<const std::uint32_t> targets) {
    constexpr std::string_view op = "cross_entropy";
    const auto& adapter = detail::input_adapter(op, {{"logits", &logits}});
    if (logits.rank() == 0) {
        throw std::invalid_argument(std::string(op) +
                                    ": logits must have rank >= 1 [..., V] (got a scalar)");
    }
    const std::size_t vocabulary = logits.shape().back();
    const std::size_t positions = logits.numel() / vocabulary;
    if (targets.size() != positions) {
        std::ostringstream message;
        message << op << ": " << targets.size() << " targets given for logits "
                << shape_to_string(logits.shape()) << " (" << positions << " positions)";
        throw std::invalid_argument(message.str());
    }
    for (std::size_t n = 0; n < targets.size(); ++n) {
        if (targets[n] >= vocabulary) {
            std::ostringstream message;
            message << op << ": targets[" << n << "] = " << targets[n]
                    << " is out of range for vocabulary size " << vocabulary;
            throw std::out_of_range(message.str());
        }
    }
    const auto& loss = detail::require_capability(adapter.loss(), adapter, op, "loss");
    CrossEntropyResult result{detail::allocate_uninitialized(Shape{}, logits.backend()),
                              detail::allocate_uninitialized(logits.shape(), logits.backend())};
    loss.cross_entropy(logits, targets, result.loss, result.gradient);
    return result;
}

}  // namespace riftco_transformer::tensor_ops
