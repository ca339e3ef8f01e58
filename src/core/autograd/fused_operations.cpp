// Differentiable fused operations with hand-written VJPs: linear (y = x·Wᵀ + b), linear on a
// packed NF4 weight, and memory-linear causal attention. nn/ composes layers from these.

#include <cmath>
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

namespace {

// The base product of an adapted linear: a dense weight leaf or a packed NF4 weight.
struct LinearBase {
    const Variable* dense = nullptr;
    const QuantizedWeight* packed = nullptr;
};

// y = x·Ŵᵀ + b + s·(x·Aᵀ)·Bᵀ as one node, Ŵ = W or deq(W). The graph keeps only y: no
// separate base output, adapter output or broadcast bias. Edges, in order: x, W (dense only),
// the bias (when defined), A and B (with an update). The rule computes only the products the
// needed inputs use:
//   dx = G·Ŵ + (s·G·B)·A,  dW = Gᵀ·x,  db = Σ G,  dA = (s·G·B)ᵀ·x,  dB = Gᵀ·(s·x·Aᵀ)
Variable adapted_linear(std::string_view op, const Variable& x, LinearBase base,
                        const Variable& bias, const LowRankUpdate* update) {
    detail::require_defined(x, op, "x");
    const std::size_t in_features =
        base.dense ? base.dense->shape()[1] : base.packed->in_features();
    const std::size_t out_features =
        base.dense ? base.dense->shape()[0] : base.packed->out_features();
    if (x.value().rank() == 0 || x.shape().back() != in_features) {
        std::ostringstream message;
        message << op << ": x " << shape_to_string(x.shape())
                << " must end in the weight's input width " << in_features;
        throw std::invalid_argument(message.str());
    }
    if (bias.defined() && bias.shape() != Shape{out_features}) {
        throw std::invalid_argument(std::string(op) + ": bias must be [" +
                                    std::to_string(out_features) + "] (got " +
                                    shape_to_string(bias.shape()) + ")");
    }
    if (update != nullptr) {
        detail::require_defined(update->a, op, "update.a");
        detail::require_defined(update->b, op, "update.b");
        const Shape& a = update->a.shape();
        const Shape& b = update->b.shape();
        if (a.size() != 2 || b.size() != 2 || a[1] != in_features || b[0] != out_features ||
            b[1] != a[0] || a[0] == 0) {
            throw std::invalid_argument(std::string(op) + ": update factors A " +
                                        shape_to_string(a) + " and B " + shape_to_string(b) +
                                        " must be [rank, " + std::to_string(in_features) +
                                        "] and [" + std::to_string(out_features) + ", rank]");
        }
        if (!std::isfinite(update->scale)) {
            throw std::invalid_argument(std::string(op) + ": update scale must be finite");
        }
    }
    const Shape input_shape = x.shape();
    const std::size_t rows = x.value().numel() / in_features;
    const Tensor rows_in = x.value().reshape({rows, in_features});
    Tensor rows_out = base.dense ? ops::matmul(rows_in, base.dense->value(), false, true)
                                 : ops::quantized_linear(rows_in, *base.packed);
    Tensor scaled_hidden;  // s·x·Aᵀ [rows, rank]
    if (update != nullptr) {
        scaled_hidden =
            ops::scale(ops::matmul(rows_in, update->a.value(), false, true), update->scale);
        rows_out = ops::add(rows_out, ops::matmul(scaled_hidden, update->b.value(), false, true));
    }
    if (bias.defined()) {
        rows_out = ops::add(rows_out, ops::broadcast_to(bias.value(), rows_out.shape()));
    }
    Shape output_shape = input_shape;
    output_shape.back() = out_features;

    const bool x_needs = x.requires_gradient();
    const bool weight_needs = base.dense != nullptr && base.dense->requires_gradient();
    const bool a_needs = update != nullptr && update->a.requires_gradient();
    const bool b_needs = update != nullptr && update->b.requires_gradient();
    // Saved: only what the needed products read.
    struct Saved {
        Tensor weight;           // dense W, for dx
        QuantizedWeight packed;  // for dx
        Tensor input;            // x rows, for dW and dA
        Tensor a;                // for dx
        Tensor b;                // for dx and dA
        Tensor scaled_hidden;    // for dB
        float scale = 1.0F;
    } saved;
    if (x_needs) {
        if (base.dense) {
            saved.weight = base.dense->value();
        } else {
            saved.packed = *base.packed;
        }
    }
    if (weight_needs || a_needs) {
        saved.input = rows_in;
    }
    if (update != nullptr) {
        saved.scale = update->scale;
        if (x_needs) {
            saved.a = update->a.value();
        }
        if (x_needs || a_needs) {
            saved.b = update->b.value();
        }
        if (b_needs) {
            saved.scaled_hidden = scaled_hidden;
        }
    }
    std::vector<const Variable*> inputs{&x};
    std::size_t weight_edge = 0;
    std::size_t bias_edge = 0;
    std::size_t a_edge = 0;
    if (base.dense) {
        weight_edge = inputs.size();
        inputs.push_back(base.dense);
    }
    if (bias.defined()) {
        bias_edge = inputs.size();
        inputs.push_back(&bias);
    }
    if (update != nullptr) {
        a_edge = inputs.size();
        inputs.push_back(&update->a);
        inputs.push_back(&update->b);
    }
    auto rule = [saved = std::move(saved), input_shape, rows, out_features, weight_edge, bias_edge,
                 a_edge](const Tensor& g, std::span<const bool> needed) {
        const Tensor rows_g = g.reshape({rows, out_features});
        std::vector<Tensor> gradients(needed.size());
        auto& counters = detail::counter_cells();
        const bool has_update = a_edge != 0;
        Tensor scaled_g_b;  // s·G·B [rows, rank], shared by dx and dA
        if (has_update && (needed[0] || needed[a_edge])) {
            scaled_g_b = ops::scale(ops::matmul(rows_g, saved.b), saved.scale);
        }
        if (needed[0]) {
            Tensor dx = saved.packed.is_singular()
                            ? ops::matmul(rows_g, saved.weight)
                            : ops::quantized_linear_input_backward(rows_g, saved.packed);
            if (has_update) {
                dx = ops::add(dx, ops::matmul(scaled_g_b, saved.a));
            }
            gradients[0] = dx.reshape(input_shape);
            counters.matmul_left_gradients.fetch_add(1, std::memory_order_relaxed);
        }
        if (weight_edge != 0 && needed[weight_edge]) {
            gradients[weight_edge] = ops::matmul(rows_g, saved.input, true, false);  // Gᵀ·x
            counters.matmul_right_gradients.fetch_add(1, std::memory_order_relaxed);
        }
        if (bias_edge != 0 && needed[bias_edge]) {
            gradients[bias_edge] = ops::sum(rows_g, 0);
        }
        if (has_update && needed[a_edge]) {
            gradients[a_edge] = ops::matmul(scaled_g_b, saved.input, true, false);
            counters.matmul_right_gradients.fetch_add(1, std::memory_order_relaxed);
        }
        if (has_update && needed[a_edge + 1]) {
            gradients[a_edge + 1] = ops::matmul(rows_g, saved.scaled_hidden, true, false);
            counters.matmul_right_gradients.fetch_add(1, std::memory_order_relaxed);
        }
        return gradients;
    };
    std::vector<Variable> input_handles;
    input_handles.reserve(inputs.size());
    for (const Variable* input : inputs)
        input_handles.push_back(*input);
    return detail::make_result(op, rows_out.reshape(output_shape), input_handles, std::move(rule));
}

}  // namespace

Variable linear(const Variable& x, const Variable& weight, const Variable& bias,
                const LowRankUpdate& update) {
    constexpr std::string_view op = "linear";
    detail::require_defined(weight, op, "weight");
    if (weight.value().rank() != 2) {
        throw std::invalid_argument("linear: weight must be [out, in] (got " +
                                    shape_to_string(weight.shape()) + ")");
    }
    return adapted_linear(op, x, {.dense = &weight}, bias, &update);
}

Variable quantized_linear(const Variable& x, const QuantizedWeight& weight, const Variable& bias,
                          const LowRankUpdate* update) {
    constexpr std::string_view op = "quantized_linear";
    if (weight.is_singular()) {
        throw std::invalid_argument("quantized_linear: weight is a singular QuantizedWeight");
    }
    return adapted_linear(op, x, {.packed = &weight}, bias, update);
}

Variable flash_attention(const Variable& query, const Variable& key, const Variable& value,
                         const ops::FlashAttentionOptions& options) {
    detail::require_defined(query, "flash_attention", "query");
    detail::require_defined(key, "flash_attention", "key");
    detail::require_defined(value, "flash_attention", "value");
    ops::FlashAttentionResult forward =
        ops::flash_attention(query.value(), key.value(), value.value(), options);
    Tensor context = forward.context;
    // Saved: Q, K, V (Hkv heads, never repeated), the context, two [B,Hq,T] statistics and
    // the window (in `forward`) — linear in T. dK and dV come back with K's shape.
    return detail::make_result(
        "flash_attention", std::move(context), {&query, &key, &value},
        [q = query.value(), k = key.value(), v = value.value(), forward = std::move(forward)](
            const Tensor& g, std::span<const bool>) {
            ops::FlashAttentionGradients d = ops::flash_attention_backward(q, k, v, forward, g);
            return std::vector<Tensor>{std::move(d.query), std::move(d.key), std::move(d.value)};
        });
}

}  // namespace riftco_transformer
