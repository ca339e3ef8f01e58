#include "riftco_transformer/core/tensor_ops/loss.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

// [..., V] -> V, with the rank rule.
std::size_t vocabulary_of(std::string_view op, const Tensor& logits) {
    if (logits.rank() == 0) {
        throw std::invalid_argument(std::string(op) +
                                    ": logits must have rank >= 1 [..., V] (got a scalar)");
    }
    return logits.shape().back();
}

void require_target_count(std::string_view op, const Tensor& logits, std::size_t count) {
    const std::size_t positions = logits.numel() / logits.shape().back();
    if (count != positions) {
        std::ostringstream message;
        message << op << ": " << count << " targets given for logits "
                << shape_to_string(logits.shape()) << " (" << positions << " positions)";
        throw std::invalid_argument(message.str());
    }
}

// logits [B,T,V] and the slice [offset, offset+count) of T -> the kernel's window.
detail::LossWindow time_window(std::string_view op, const Tensor& logits, std::size_t offset,
                               std::size_t count) {
    detail::require_rank(op, {"logits", &logits}, 3);
    if (count == 0) {
        throw std::invalid_argument(std::string(op) + ": count must be > 0 (got 0)");
    }
    const std::size_t time = logits.shape()[1];
    if (offset > time || count > time - offset) {  // offset + count > T, without overflow
        std::ostringstream message;
        message << op << ": time range offset " << offset << " + count " << count
                << " exceeds T = " << time << " of logits " << shape_to_string(logits.shape());
        throw std::out_of_range(message.str());
    }
    return {time, offset, count};
}

// One upload of host targets, which records the largest; only when that one is out of range
// are the host targets scanned again, to name the first offending position.
IndexTensor upload_targets(std::string_view op, const Tensor& logits,
                           std::span<const std::uint32_t> targets, std::size_t vocabulary) {
    IndexTensor uploaded({targets.size()}, targets, logits.backend());
    if (uploaded.max_id() >= vocabulary) {
        const auto n = static_cast<std::size_t>(
            std::find_if(targets.begin(), targets.end(),
                         [vocabulary](std::uint32_t id) { return id >= vocabulary; }) -
            targets.begin());
        std::ostringstream message;
        message << op << ": targets[" << n << "] = " << targets[n]
                << " is out of range for vocabulary size " << vocabulary;
        throw std::out_of_range(message.str());
    }
    return uploaded;
}

// The shared tail: backend and id rules of the uploaded targets, then the one capability call.
CrossEntropyResult fused_cross_entropy(std::string_view op, const Tensor& logits,
                                       const IndexTensor& targets, detail::LossWindow window) {
    const auto& adapter = detail::input_adapter(op, {{"logits", &logits}});
    const std::size_t vocabulary = logits.shape().back();
    detail::require_indices(op, "targets", targets, logits.backend(), vocabulary,
                            "vocabulary entries");
    require_target_count(op, logits, targets.numel());
    const auto& loss = detail::require_capability(adapter.loss(), adapter, op, "loss");
    CrossEntropyResult result{detail::allocate_uninitialized(Shape{}, logits.backend()),
                              detail::allocate_uninitialized(logits.shape(), logits.backend())};
    loss.cross_entropy(logits, targets, window, result.loss, result.gradient);
    return result;
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const IndexTensor& targets) {
    constexpr std::string_view op = "cross_entropy";
    detail::require_tensor(op, "logits", logits);
    static_cast<void>(vocabulary_of(op, logits));
    return fused_cross_entropy(op, logits, targets, detail::LossWindow{});
}

CrossEntropyResult cross_entropy(const Tensor& logits, std::span<const std::uint32_t> targets) {
    constexpr std::string_view op = "cross_entropy";
    detail::require_tensor(op, "logits", logits);
    const std::size_t vocabulary = vocabulary_of(op, logits);
    require_target_count(op, logits, targets.size());
    return fused_cross_entropy(op, logits, upload_targets(op, logits, targets, vocabulary),
                               detail::LossWindow{});
}

CrossEntropyResult cross_entropy_time_range(const Tensor& logits, const IndexTensor& targets,
                                            std::size_t offset, std::size_t count) {
    constexpr std::string_view op = "cross_entropy_time_range";
    detail::require_tensor(op, "logits", logits);
    return fused_cross_entropy(op, logits, targets, time_window(op, logits, offset, count));
}

CrossEntropyResult cross_entropy_time_range(const Tensor& logits,
                                            std::span<const std::uint32_t> targets,
                                            std::size_t offset, std::size_t count) {
    constexpr std::string_view op = "cross_entropy_time_range";
    detail::require_tensor(op, "logits", logits);
    const detail::LossWindow window = time_window(op, logits, offset, count);
    require_target_count(op, logits, targets.size());
    return fused_cross_entropy(op, logits,
                               upload_targets(op, logits, targets, logits.shape().back()), window);
}

CrossEntropyResult cross_entropy_masked(const Tensor& logits,
                                        std::span<const std::uint32_t> targets,
                                        std::span<const std::uint8_t> mask) {
    constexpr std::string_view op = "cross_entropy_masked";
    detail::require_tensor(op, "logits", logits);
    const std::size_t vocabulary = vocabulary_of(op, logits);
    require_target_count(op, logits, targets.size());
    if (mask.size() != targets.size()) {
        std::ostringstream message;
        message << op << ": " << mask.size() << " mask flags given for " << targets.size()
                << " positions";
        throw std::invalid_argument(message.str());
    }
    std::vector<std::uint32_t> flags(mask.size());
    std::size_t selected = 0;
    for (std::size_t n = 0; n < mask.size(); ++n) {
        if (mask[n] > 1) {
            std::ostringstream message;
            message << op << ": mask[" << n << "] = " << static_cast<unsigned>(mask[n])
                    << " must be 0 or 1";
            throw std::invalid_argument(message.str());
        }
        flags[n] = mask[n];
        selected += mask[n];
    }
    if (selected == 0) {
        throw std::invalid_argument(std::string(op) + ": the mask selects no position");
    }
    const IndexTensor uploaded_mask({flags.size()}, flags, logits.backend());
    detail::LossWindow window;
    window.selected = &uploaded_mask;
    window.selected_count = selected;
    return fused_cross_entropy(op, logits, upload_targets(op, logits, targets, vocabulary), window);
}

}  // namespace riftco_transformer::tensor_ops
