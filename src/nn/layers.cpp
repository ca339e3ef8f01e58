#include "riftco_transformer/nn/layers.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/nn/initialization.hpp"

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

Linear::Linear(std::size_t in_features, std::size_t out_features, std::mt19937& generator,
               bool use_bias)
    : in_features_(in_features), out_features_(out_features) {
    if (in_features == 0 || out_features == 0) {
        std::ostringstream message;
        message << "Linear: widths must be positive (in " << in_features << ", out " << out_features
                << ")";
        throw std::invalid_argument(message.str());
    }
    const ExecutionBackend backend = current_execution_backend();
    weight_ = register_parameter("weight", xavier_uniform({out_features, in_features}, in_features,
                                                          out_features, generator, backend));
    if (use_bias) {
        bias_ = register_parameter("bias", Tensor::zeros({out_features}, backend));
    }
}

Variable Linear::forward(const Variable& x) const {
    return linear(x, weight_, bias_);
}

Embedding::Embedding(std::size_t vocabulary_size, std::size_t width, std::mt19937& generator) {
    if (vocabulary_size == 0 || width == 0) {
        std::ostringstream message;
        message << "Embedding: sizes must be positive (vocabulary " << vocabulary_size << ", width "
                << width << ")";
        throw std::invalid_argument(message.str());
    }
    const auto limit = static_cast<float>(1.0 / std::sqrt(static_cast<double>(width)));
    weight_ = register_parameter("weight", uniform_tensor({vocabulary_size, width}, -limit, limit,
                                                          generator, current_execution_backend()));
}

Variable Embedding::forward(std::span<const std::size_t> ids, const Shape& index_shape) const {
    return gather_rows(weight_, ids, index_shape);
}

Variable Embedding::forward(const IndexTensor& ids) const {
    return gather_rows(weight_, ids);
}

namespace {
void require_width(const char* layer, std::size_t width) {
    if (width == 0) {
        throw std::invalid_argument(std::string(layer) + ": width must be positive");
    }
}
void require_epsilon(const char* layer, float epsilon) {
    if (!std::isfinite(epsilon) || !(epsilon > 0.0F)) {
        std::ostringstream message;
        message << layer << ": epsilon must be finite and > 0 (got " << epsilon << ")";
        throw std::invalid_argument(message.str());
    }
}
}  // namespace

LayerNorm::LayerNorm(std::size_t width, float epsilon) : epsilon_(epsilon) {
    require_width("LayerNorm", width);
    require_epsilon("LayerNorm", epsilon);
    const ExecutionBackend backend = current_execution_backend();
    scale_ = register_parameter("scale", Tensor::full({width}, 1.0F, backend));
    bias_ = register_parameter("bias", Tensor::zeros({width}, backend));
}

Variable LayerNorm::forward(const Variable& x) const {
    return layer_norm(x, scale_, bias_, epsilon_);
}

RMSNorm::RMSNorm(std::size_t width, float epsilon) : epsilon_(epsilon) {
    require_width("RMSNorm", width);
    require_epsilon("RMSNorm", epsilon);
    scale_ = register_parameter("scale", Tensor::full({width}, 1.0F, current_execution_backend()));
}

Variable RMSNorm::forward(const Variable& x) const {
    return rms_norm(x, scale_, epsilon_);
}

FeedForward::FeedForward(std::size_t width, std::size_t hidden_width, std::mt19937& generator,
                         Activation activation)
    : activation_(activation) {
    if (activation != Activation::Gelu && activation != Activation::Relu) {
        throw std::invalid_argument("FeedForward: unknown activation value " +
                                    std::to_string(static_cast<std::uint32_t>(activation)));
    }
    expand_ = &register_module("expand", std::make_unique<Linear>(width, hidden_width, generator));
    project_ =
        &register_module("project", std::make_unique<Linear>(hidden_width, width, generator));
}

Variable FeedForward::forward(const Variable& x) const {
    const Variable hidden = expand_->forward(x);
    return project_->forward(activation_ == Activation::Gelu ? gelu(hidden) : relu(hidden));
}

SwiGLU::SwiGLU(std::size_t width, std::size_t hidden_width, std::mt19937& generator) {
    gate_ =
        &register_module("gate", std::make_unique<Linear>(width, hidden_width, generator, false));
    up_ = &register_module("up", std::make_unique<Linear>(width, hidden_width, generator, false));
    down_ =
        &register_module("down", std::make_unique<Linear>(hidden_width, width, generator, false));
}

Variable SwiGLU::forward(const Variable& x) const {
    return down_->forward(silu(gate_->forward(x)) * up_->forward(x));
}

}  // namespace riftco_transformer
