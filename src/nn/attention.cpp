#include "riftco_transformer/nn/attention.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"

namespace riftco_transformer {
namespace {

// Defined handles here; the shape and backend rules are tensor_ops's (attention_scale).
float checked_scale(const Variable& query, const Variable& key, const Variable& value) {
    if (!query.defined() || !key.defined() || !value.defined()) {
        throw std::logic_error("causal attention: an input is an empty Variable");
    }
    return tensor_ops::attention_scale("causal attention", query.value(), key.value(),
                                       value.value());
}

}  // namespace

void require_attention_kind(std::string_view operation, AttentionKind kind) {
    if (kind != AttentionKind::Materialized && kind != AttentionKind::Flash) {
        throw std::invalid_argument(std::string(operation) + ": unknown attention kind value " +
                                    std::to_string(static_cast<std::uint32_t>(kind)));
    }
}

AttentionOutputs causal_scaled_dot_product_attention(const Variable& query, const Variable& key,
                                                     const Variable& value) {
    const float scale = checked_scale(query, key, value);
    // [B,H,T,d] x [B,H,T,d]ᵀ -> scores [B,H,T,T] (freed once the softmax has run)
    const Variable scores = matmul(query, key, false, true);
    Variable probabilities = causal_softmax(scores, scale);
    Variable context = matmul(probabilities, value);  // [B,H,T,T] x [B,H,T,d] -> [B,H,T,d]
    return {std::move(context), std::move(probabilities)};
}

Variable flash_causal_attention(const Variable& query, const Variable& key, const Variable& value) {
    return flash_attention(query, key, value);
}

Variable causal_attention(const Variable& query, const Variable& key, const Variable& value,
                          AttentionKind kind) {
    require_attention_kind("attention", kind);
    // Both kinds take identical [B,H,T,d_h] shapes (docs/ARCHITECTURE.md, 'Attention': one
    // validation for every algorithm); grouped-query attention calls flash_attention itself.
    (void)checked_scale(query, key, value);
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
    require_attention_kind("attention", kind);
    // Registration (and draw) order: query, key, value, output.
    query_ = &register_module("query", std::make_unique<Linear>(width, width, generator));
    key_ = &register_module("key", std::make_unique<Linear>(width, width, generator));
    value_ = &register_module("value", std::make_unique<Linear>(width, width, generator));
    output_ = &register_module("output", std::make_unique<Linear>(width, width, generator));
}

void CausalSelfAttention::set_kind(AttentionKind kind) {
    require_attention_kind("attention", kind);
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

Variable CausalSelfAttention::forward_incremental(const Variable& x, std::size_t layer,
                                                  IncrementalAttentionCache& cache) const {
    if (!x.defined() || x.value().rank() != 2 || x.shape()[1] != width_) {
        throw std::invalid_argument("CausalSelfAttention::forward_incremental: x must be [R," +
                                    std::to_string(width_) + "] (got " +
                                    (x.defined() ? shape_to_string(x.shape()) : "empty") + ")");
    }
    const std::size_t rows = x.shape()[0];
    const std::size_t head_width = width_ / head_count_;
    // [R,D] -> [R,H,1,d]: the same row-major values, so a reshape (no copy).
    const auto split_heads = [&](const Variable& projected) {
        return tensor_ops::reshape(projected.value(), {rows, head_count_, 1, head_width});
    };
    const Tensor context =
        cache.append_and_attend(layer, split_heads(query_->forward(x)),
                                split_heads(key_->forward(x)), split_heads(value_->forward(x)));
    return output_->forward(Variable(tensor_ops::reshape(context, {rows, width_}), false));
}

}  // namespace riftco_transformer
