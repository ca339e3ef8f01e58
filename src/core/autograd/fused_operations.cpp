// Differentiable fused operations with hand-written VJPs: linear (y = x·Wᵀ + b), linear on a
// packed NF4 weight, and memory-linear causal attention. nn/ composes layers from these.

#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;

Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
    constexpr std::string_view op = "linear";
    detail::require_defined(x, op, "x");
    detail::require_defined(weight, op, "weight");
    if (weight.value().rank() != 2) {
        throw std::invalid_argument("linear: weight must be [out, in] (got " +
                                    shape_to_string(weight.shape()) + ")");
    }
    const std::size_t out_features = weight.shape()[0];
    const std::size_t in_features = weight.shape()[1];
    if (x.value().rank() == 0 || x.shape().back() != in_features) {
        std::ostringstream message;
        message << "linear: x " << shape_to_string(x.shape())
                << " must end in the weight's input width " << in_features;
        throw std::invalid_argument(message.str());
    }
    if (bias.defined() && bias.shape() != Shape{out_features}) {
        throw std::invalid_argument("linear: bias must be [" + std::to_string(out_features) +
                                    "] (got " + shape_to_string(bias.shape()) + ")");
    }
    const Shape input_shape = x.shape();
    const std::size_t rows = x.value().numel() / in_features;
    // [R, in] x [out, in]ᵀ -> [R, out]
    const Tensor rows_in = x.value().reshape({rows, in_features});
    Tensor rows_out = ops::matmul(rows_in, weight.value(), false, true);
    if (bias.defined()) {
        rows_out = ops::add(rows_out, ops::broadcast_to(bias.value(), rows_out.shape()));
    }
    Shape output_shape = input_shape;
    output_shape.back() = out_features;
    // Save only what the needed products read: W for dx, x for dW.
    const Tensor saved_weight = x.requires_gradient() ? weight.value() : Tensor();
    const Tensor saved_input = weight.requires_gradient() ? rows_in : Tensor();
    // Inputs: x, weight and, when there is one, the bias (the rule sees 2 or 3 of them).
    auto rule = [saved_weight, saved_input, input_shape, rows, out_features](
                    const Tensor& g, std::span<const bool> needed) {
        const Tensor rows_g = g.reshape({rows, out_features});
        std::vector<Tensor> gradients(needed.size());
        auto& counters = detail::counter_cells();
        if (needed[0]) {
            gradients[0] = ops::matmul(rows_g, saved_weight).reshape(input_shape);  // G·W
            counters.matmul_left_gradients.fetch_add(1, std::memory_order_relaxed);
        }
        if (needed[1]) {
            gradients[1] = ops::matmul(rows_g, saved_input, true, false);  // Gᵀ·x
            counters.matmul_right_gradients.fetch_add(1, std::memory_order_relaxed);
        }
        if (needed.size() == 3 && needed[2]) {
            gradients[2] = ops::sum(rows_g, 0);  // Σ_rows G
        }
        return gradients;
    };
    Tensor output = rows_out.reshape(output_shape);
    if (bias.defined()) {
        return detail::make_result(op, std::move(output), {&x, &weight, &bias}, std::move(rule));
    }
    return detail::make_result(op, std::move(output), {&x, &weight}, std::move(rule));
}

Variable quantized_linear(const Variable& x, const QuantizedWeight& weight) {
    constexpr std::string_view op = "quantized_linear";
    detail::require_defined(x, op, "x");
    // x [.., in] -> y [.., out] = x·deq(W)ᵀ (tensor_ops checks the shapes and backends).
    Tensor output = ops::quantized_linear(x.value(), weight);
    // One parent, x: the packed weight is frozen state, shared by the rule, never a leaf.
    return detail::make_result(
        op, std::move(output), {&x}, [weight](const Tensor& g, std::span<const bool>) {
            // g [.., out] -> dx [.., in] = g·deq(W)
            return std::vector<Tensor>{ops::quantized_linear_input_backward(g, weight)};
        });
}

Variable flash_attention(const Variable& query, const Variable& key, const Variable& value) {
    detail::require_defined(query, "flash_attention", "query");
    detail::require_defined(key, "flash_attention", "key");
    detail::require_defined(value, "flash_attention", "value");
    ops::FlashAttentionResult forward =
        ops::flash_attention(query.value(), key.value(), value.value());
    Tensor context = forward.context;
    // Saved: Q, K, V, the context and two [B,H,T] statistics — linear in T.
    return detail::make_result(
        "flash_attention", std::move(context), {&query, &key, &value},
        [q = query.value(), k = key.value(), v = value.value(), forward = std::move(forward)](
            const Tensor& g, std::span<const bool>) {
            ops::FlashAttentionGradients d = ops::flash_attention_backward(q, k, v, forward, g);
            return std::vector<Tensor>{std::move(d.query), std::move(d.key), std::move(d.value)};
        });
}

}  // namespace riftco_transformer
