// Differentiable gather, softmax, normalisation and cross-entropy (whole or over a time
// range), each wrapping the fused raw forward and backward kernels.

#include <vector>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/loss.hpp"
#include "riftco_transformer/core/tensor_ops/softmax.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;
using detail::make_result;
using detail::require_defined;

Variable gather_rows(const Variable& table, const IndexTensor& indices) {
    require_defined(table, "gather_rows", "table");
    Tensor out = ops::gather_rows(table.value(), indices);
    // table [R, W], out indices.shape + [W]: d table = scatter-add of the upstream rows. The
    // backward keeps the index tensor itself (shared storage on the backend), no host copy.
    const std::size_t rows = table.shape()[0];
    const std::size_t width = table.shape()[1];
    const IndexTensor flat_indices = indices.reshape({indices.numel()});
    return make_result("gather_rows", std::move(out), {&table},
                       [flat_indices, rows, width](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::scatter_add_rows(
                               g.reshape({flat_indices.numel(), width}), flat_indices, rows)};
                       });
}

Variable gather_rows(const Variable& table, std::span<const std::size_t> indices,
                     const Shape& index_shape) {
    require_defined(table, "gather_rows", "table");
    // tensor_ops's host-id checks (naming the first offending position), then one upload.
    return gather_rows(table, ops::row_indices(table.value(), indices, index_shape));
}

Variable softmax(const Variable& x, std::size_t axis) {
    require_defined(x, "softmax", "x");
    Tensor out = ops::softmax(x.value(), axis);
    const Tensor probabilities = out;
    return make_result(
        "softmax", std::move(out), {&x},
        [probabilities, axis](const Tensor& g, std::span<const bool>) {
            return std::vector<Tensor>{ops::softmax_backward(probabilities, g, axis)};
        });
}

Variable causal_softmax(const Variable& scores, float scale) {
    require_defined(scores, "causal_softmax", "scores");
    Tensor out = ops::causal_softmax(scores.value(), scale);
    const Tensor probabilities = out;
    return make_result(
        "causal_softmax", std::move(out), {&scores},
        [probabilities, scale](const Tensor& g, std::span<const bool>) {
            return std::vector<Tensor>{ops::causal_softmax_backward(probabilities, g, scale)};
        });
}

Variable layer_norm(const Variable& x, const Variable& scale, const Variable& bias, float epsilon) {
    require_defined(x, "layer_norm", "x");
    require_defined(scale, "layer_norm", "scale");
    require_defined(bias, "layer_norm", "bias");
    ops::LayerNormResult result = ops::layer_norm(x.value(), scale.value(), bias.value(), epsilon);
    const Tensor input = x.value();
    const Tensor gamma = scale.value();
    const Tensor row_mean = result.mean;
    const Tensor inverse = result.inverse_deviation;
    return make_result(
        "layer_norm", std::move(result.output), {&x, &scale, &bias},
        [input, gamma, row_mean, inverse](const Tensor& g, std::span<const bool>) {
            ops::LayerNormGradients d =
                ops::layer_norm_backward(input, gamma, row_mean, inverse, g);
            return std::vector<Tensor>{std::move(d.input), std::move(d.scale), std::move(d.bias)};
        });
}

Variable rms_norm(const Variable& x, const Variable& scale, float epsilon) {
    require_defined(x, "rms_norm", "x");
    require_defined(scale, "rms_norm", "scale");
    ops::RmsNormResult result = ops::rms_norm(x.value(), scale.value(), epsilon);
    const Tensor input = x.value();
    const Tensor gamma = scale.value();
    const Tensor inverse = result.inverse_rms;
    return make_result("rms_norm", std::move(result.output), {&x, &scale},
                       [input, gamma, inverse](const Tensor& g, std::span<const bool>) {
                           ops::RmsNormGradients d =
                               ops::rms_norm_backward(input, gamma, inverse, g);
                           return std::vector<Tensor>{std::move(d.input), std::move(d.scale)};
                       });
}

Variable cross_entropy(const Variable& logits, std::span<const std::uint32_t> targets) {
    require_defined(logits, "cross_entropy", "logits");
    return detail::cross_entropy_result("cross_entropy", logits,
                                        ops::cross_entropy(logits.value(), targets));
}

Variable cross_entropy(const Variable& logits, const IndexTensor& targets) {
    require_defined(logits, "cross_entropy", "logits");
    return detail::cross_entropy_result("cross_entropy", logits,
                                        ops::cross_entropy(logits.value(), targets));
}

Variable cross_entropy_time_range(const Variable& logits, std::span<const std::uint32_t> targets,
                                  std::size_t offset, std::size_t count) {
    constexpr std::string_view op = "cross_entropy_time_range";
    require_defined(logits, op, "logits");
    return detail::cross_entropy_result(
        op, logits, ops::cross_entropy_time_range(logits.value(), targets, offset, count));
}

Variable cross_entropy_time_range(const Variable& logits, const IndexTensor& targets,
                                  std::size_t offset, std::size_t count) {
    constexpr std::string_view op = "cross_entropy_time_range";
    require_defined(logits, op, "logits");
    return detail::cross_entropy_result(
        op, logits, ops::cross_entropy_time_range(logits.value(), targets, offset, count));
}

Variable cross_entropy_masked(const Variable& logits, std::span<const std::uint32_t> targets,
                              std::span<const std::uint8_t> mask) {
    constexpr std::string_view op = "cross_entropy_masked";
    require_defined(logits, op, "logits");
    return detail::cross_entropy_result(op, logits,
                                        ops::cross_entropy_masked(logits.value(), targets, mask));
}

namespace detail {
Variable cross_entropy_result(std::string_view operation, const Variable& logits,
                              tensor_ops::CrossEntropyResult result) {
    const Tensor base_gradient = logits.requires_gradient() ? result.gradient : Tensor();
    // d logits = upstream (a scalar) · (softmax − onehot)/N, kept on the backend (zero rows
    // outside a time range stay zero). When the loss is the root of a backward() with the
    // implicit seed, the upstream is exactly 1 (known without reading it): the gradient goes on
    // as computed, without the two logits-sized copies (the broadcast scalar, the product).
    return make_result(operation, std::move(result.loss), {&logits},
                       [base_gradient](const Tensor& g, std::span<const bool>) {
                           if (upstream_is_implicit_unit_seed()) {
                               return std::vector<Tensor>{base_gradient};
                           }
                           return std::vector<Tensor>{ops::multiply(
                               base_gradient, ops::broadcast_to(g, base_gradient.shape()))};
                       });
}
}  // namespace detail

}  // namespace riftco_transformer
