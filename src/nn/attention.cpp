#include "riftco_transformer/nn/attention.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"

namespace riftco_transformer {
namespace {

void require_attention_inputs(const Variable& query, const Variable& key, const Variable& value) {
    constexpr const char* op = "causal attention";
    if (!query.defined() || !key.defined() || !value.defined()) {
        throw std::logic_error(std::string(op) + ": an input is an empty Variable");
    }
    if (query.value().rank() != 4 || key.shape() != query.shape() ||
        value.shape() != query.shape()) {
        std::ostringstream message;
        message << op << ": query, key and value must be identical [B,H,T,d_h] shapes (got "
                << shape_to_string(query.shape()) << ", " << shape_to_string(key.shape()) << ", "
                << shape_to_string(value.shape()) << ")";
        throw std::invalid_argument(message.str());
    }
    if (key.backend() != query.backend() || value.backend() != query.backend()) {
        throw std::invalid_argument(std::string(op) +
                                    ": query, key and value are on different backends");
    }
}

void require_kind(AttentionKind kind) {
    if (kind != AttentionKind::Materialized && kind != AttentionKind::Flash) {
        throw std::invalid_argument("attention: unknown attention kind value " +
                                    std::to_string(static_cast<std::uint32_t>(kind)));
    }
}

}  // namespace

AttentionOutputs causal_scaled_dot_product_attention(const Variable& query, const Variable& key,
                                                     const Variable& value) {
    require_attention_inputs(query, key, value);
    const std::size_t head_width = query.shape()[3];
    const float scale = 1.0F / std::sqrt(static_cast<float>(head_width));
    // [B,H,T,d] x [B,H,T,d]ᵀ -> scores [B,H,T,T] (freed once the softmax has run)
    const Variable scores = matmul(query, key, false, true);
    Variable probabilities = causal_softmax(scores, scale);
    Variable context = matmul(probabilities, value);  // [B,H,T,T] x [B,H,T,d] -> [B,H,T,d]
    return {std::move(context), std::move(probabilities)};
}

Variable flash_causal_attention(const Variable& query, const Variable& key, const Variable& value) {
    require_attention_inputs(query, key, value);
    tensor_ops::FlashAttentionResult forward =
        tensor_ops::flash_attention(query.value(), key.value(), value.value());
    Tensor context = forward.context;
    // Saved: Q, K, V, the context and two [B,H,T] statistics — linear in T.
    return detail::make_result(
        "flash_attention", std::move(context), {&query, &key, &value},
        [q = query.value(), k = key.value(), v = value.value(), forward = std::move(forward)](
            const Tensor& g, std::span<const bool>) {
            tensor_ops::FlashAttentionGradients d =
                tensor_ops::flash_attention_backward(q, k, v, forward, g);
            return std::vector<Tensor>{std::move(d.query), std::move(d.key), std::move(d.value)};
        });
}

Variable causal_attention(const Variable& query, const Variable& key, const Variable& value,
                          AttentionKind kind) {
    require_kind(kind);
    if (kind == AttentionKind::Flash) {
        return flash_causal_attention(query, key, value);
    }
    return causal_scaled_dot_product_attention(query, key, value).context;
}

CausalSelfAttention::CausalSelfAttention(std::size_t width, std::size_t head_count,
                                         std::mt19937& generator, AttentionKind kind)
    : width_(width), head_count_(head_count), kind_(kind) {
    if (width == 0 || head_count == 0 || width % head_count != 0) {
        std::ostringstream message;
        message << "CausalSelfAttention: width " << width << " must be a positive multiple of "
                << "head_count " << head_count;
        throw std::invalid_argument(message.str());
    }
    require_kind(kind);
    // Registration (and draw) order: query, key, value, output.
    query_ = &register_module("query", std::make_unique<Linear>(width, width, generator));
    key_ = &register_module("key", std::make_unique<Linear>(width, width, generator));
    value_ = &register_module("value", std::make_unique<Linear>(width, width, generator));
    output_ = &register_module("output", std::make_unique<Linear>(width, width, generator));
}

void CausalSelfAttention::set_kind(AttentionKind kind) {
    require_kind(kind);
    kind_ = kind;
}

Variable CausalSelfAttention::forward(const Variable& x) const {
    if (!x.defined() || x.value().rank() != 3 || x.shape()[2] != width_) {
        throw std::invalid_argument("CausalSelfAttention: x must be [B,T," +
                                    std::to_string(width_) + "] (got " +
                                    (x.defined() ? shape_to_string(x.shape()) : "empty") + ")");
    }
    const std::size_t batch = x.shape()[0];
    const std::size_t time = x.shape()[1];
    const std::size_t head_width = width_ / head_count_;
    // [B,T,D] -> [B,T,H,d] -> [B,H,T,d]
    const auto split_heads = [&](const Variable& projected) {
        return permute(reshape(projected, {batch, time, head_count_, head_width}), {0, 2, 1, 3});
    };
    const Variable context =
        causal_attention(split_heads(query_->forward(x)), split_heads(key_->forward(x)),
                         split_heads(value_->forward(x)), kind_);
    // [B,H,T,d] -> [B,T,H,d] -> [B,T,D]
    return output_->forward(reshape(permute(context, {0, 2, 1, 3}), {batch, time, width_}));
}

}  // namespace riftco_transformer
