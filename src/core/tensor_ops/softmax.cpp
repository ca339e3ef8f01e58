#include "riftco_transformer/core/tensor_ops/softmax.hpp"

#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

const detail::SoftmaxCapability& softmax_of(const detail::BackendAdapter& adapter,
                                            std::string_view operation) {
    return detail::require_capability(adapter.softmax(), adapter, operation, "softmax");
}

void require_square_scores(std::string_view op, detail::NamedTensor scores) {
    detail::require_rank(op, scores, 4);
    const Shape& shape = scores.second->shape();
    if (shape[2] != shape[3]) {
        throw std::invalid_argument(std::string(op) + ": " + std::string(scores.first) +
                                    " must be square [B,H,T,T] (got " + shape_to_string(shape) +
                                    ")");
    }
}

}  // namespace

Tensor softmax(const Tensor& x, std::size_t axis) {
    constexpr std::string_view op = "softmax";
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    detail::require_axis(op, axis, x.rank());
    Tensor out = detail::allocate_uninitialized(x.shape(), x.backend());
    softmax_of(adapter, op).softmax(x, axis, out);
    return out;
}

Tensor softmax_backward(const Tensor& probabilities, const Tensor& upstream, std::size_t axis) {
    constexpr std::string_view op = "softmax_backward";
    const auto& adapter =
        detail::input_adapter(op, {{"probabilities", &probabilities}, {"upstream", &upstream}});
    detail::require_same_shape(op, {"probabilities", &probabilities}, {"upstream", &upstream});
    detail::require_axis(op, axis, probabilities.rank());
    Tensor out = detail::allocate_uninitialized(probabilities.shape(), probabilities.backend());
    softmax_of(adapter, op).softmax_backward(probabilities, upstream, axis, out);
    return out;
}

Tensor causal_softmax(const Tensor& scores, float scale) {
    constexpr std::string_view op = "causal_softmax";
    const auto& adapter = detail::input_adapter(op, {{"scores", &scores}});
    require_square_scores(op, {"scores", &scores});
    detail::require_finite_positive(op, "scale", scale);
    Tensor out = detail::allocate_uninitialized(scores.shape(), scores.backend());
    softmax_of(adapter, op).causal_softmax(scores, scale, out);
    return out;
}

Tensor causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream, float scale) {
    constexpr std::string_view op = "causal_softmax_backward";
    const auto& adapter =
        detail::input_adapter(op, {{"probabilities", &probabilities}, {"upstream", &upstream}});
    require_square_scores(op, {"probabilities", &probabilities});
    detail::require_same_shape(op, {"probabilities", &probabilities}, {"upstream", &upstream});
    detail::require_finite_positive(op, "scale", scale);
    Tensor out = detail::allocate_uninitialized(probabilities.shape(), probabilities.backend());
    softmax_of(adapter, op).causal_softmax_backward(probabilities, upstream, scale, out);
    return out;
}

}  // namespace riftco_transformer::tensor_ops
