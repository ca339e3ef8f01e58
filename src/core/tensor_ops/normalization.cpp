#include "riftco_transformer/core/tensor_ops/normalization.hpp"

#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {

void require_normalization_epsilon(std::string_view operation, std::string_view argument,
                                   float epsilon) {
    detail::require_finite_positive(operation, argument, epsilon);
}
namespace {

const detail::NormalizationCapability& normalization_of(const detail::BackendAdapter& adapter,
                                                        std::string_view operation) {
    return detail::require_capability(adapter.normalization(), adapter, operation, "normalization");
}

// x has rank >= 1; returns its row count (numel / W).
std::size_t require_rows(std::string_view op, const Tensor& x) {
    if (x.rank() == 0) {
        throw std::invalid_argument(std::string(op) + ": x must have rank >= 1 (got a scalar)");
    }
    return x.numel() / x.shape().back();
}

void require_width_vector(std::string_view op, detail::NamedTensor parameter, std::size_t width) {
    if (parameter.second->shape() != Shape{width}) {
        std::ostringstream message;
        message << op << ": " << parameter.first << " must have shape [" << width << "] (got "
                << shape_to_string(parameter.second->shape()) << ")";
        throw std::invalid_argument(message.str());
    }
}

void require_row_statistic(std::string_view op, detail::NamedTensor statistic, std::size_t rows) {
    if (statistic.second->shape() != Shape{rows}) {
        std::ostringstream message;
        message << op << ": " << statistic.first << " must have shape [" << rows << "] (got "
                << shape_to_string(statistic.second->shape()) << ")";
        throw std::invalid_argument(message.str());
    }
}

}  // namespace

LayerNormResult layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias,
                           float epsilon) {
    constexpr std::string_view op = "layer_norm";
    const auto& adapter =
        detail::input_adapter(op, {{"x", &x}, {"scale", &scale}, {"bias", &bias}});
    const std::size_t rows = require_rows(op, x);
    require_width_vector(op, {"scale", &scale}, x.shape().back());
    require_width_vector(op, {"bias", &bias}, x.shape().back());
    require_normalization_epsilon(op, "epsilon", epsilon);
    LayerNormResult result{detail::allocate_uninitialized(x.shape(), x.backend()),
                           detail::allocate_uninitialized(Shape{rows}, x.backend()),
                           detail::allocate_uninitialized(Shape{rows}, x.backend())};
    normalization_of(adapter, op)
        .layer_norm(x, scale, bias, epsilon, result.output, result.mean, result.inverse_deviation);
    return result;
}

LayerNormGradients layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean,
                                       const Tensor& inverse_deviation, const Tensor& upstream) {
    constexpr std::string_view op = "layer_norm_backward";
    const auto& adapter = detail::input_adapter(op, {{"x", &x},
                                                     {"scale", &scale},
                                                     {"mean", &mean},
                                                     {"inverse_deviation", &inverse_deviation},
                                                     {"upstream", &upstream}});
    const std::size_t rows = require_rows(op, x);
    const std::size_t width = x.shape().back();
    require_width_vector(op, {"scale", &scale}, width);
    require_row_statistic(op, {"mean", &mean}, rows);
    require_row_statistic(op, {"inverse_deviation", &inverse_deviation}, rows);
    detail::require_same_shape(op, {"x", &x}, {"upstream", &upstream});
    LayerNormGradients gradients{detail::allocate_uninitialized(x.shape(), x.backend()),
                                 detail::allocate_uninitialized(Shape{width}, x.backend()),
                                 detail::allocate_uninitialized(Shape{width}, x.backend())};
    normalization_of(adapter, op)
        .layer_norm_backward(x, scale, mean, inverse_deviation, upstream, gradients.input,
                             gradients.scale, gradients.bias);
    return gradients;
}

RmsNormResult rms_norm(const Tensor& x, const Tensor& scale, float epsilon) {
    constexpr std::string_view op = "rms_norm";
    const auto& adapter = detail::input_adapter(op, {{"x", &x}, {"scale", &scale}});
    const std::size_t rows = require_rows(op, x);
    require_width_vector(op, {"scale", &scale}, x.shape().back());
    require_normalization_epsilon(op, "epsilon", epsilon);
    RmsNormResult result{detail::allocate_uninitialized(x.shape(), x.backend()),
                         detail::allocate_uninitialized(Shape{rows}, x.backend())};
    normalization_of(adapter, op).rms_norm(x, scale, epsilon, result.output, result.inverse_rms);
    return result;
}

RmsNormGradients rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inverse_rms,
                                   const Tensor& upstream) {
    constexpr std::string_view op = "rms_norm_backward";
    const auto& adapter = detail::input_adapter(
        op, {{"x", &x}, {"scale", &scale}, {"inverse_rms", &inverse_rms}, {"upstream", &upstream}});
    const std::size_t rows = require_rows(op, x);
    const std::size_t width = x.shape().back();
    require_width_vector(op, {"scale", &scale}, width);
    require_row_statistic(op, {"inverse_rms", &inverse_rms}, rows);
    detail::require_same_shape(op, {"x", &x}, {"upstream", &upstream});
    RmsNormGradients gradients{detail::allocate_uninitialized(x.shape(), x.backend()),
                               detail::allocate_uninitialized(Shape{width}, x.backend())};
    normalization_of(adapter, op)
        .rms_norm_backward(x, scale, inverse_rms, upstream, gradients.input, gradients.scale);
    return gradients;
}

}  // namespace riftco_transformer::tensor_ops
