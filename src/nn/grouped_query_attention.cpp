#include "riftco_transformer/nn/grouped_query_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {
namespace {

std::size_t head_width_of(const GroupedQueryAttentionShape& s) {
    return s.head_width != 0 ? s.head_width : s.width / s.query_head_count;
}

void validate(const GroupedQueryAttentionShape& s) {
    const auto fail = [&](const std::string& what) {
        std::ostringstream message;
        message << "GroupedQueryAttention: " << what << " (D=" << s.width
                << ", Hq=" << s.query_head_count << ", Hkv=" << s.key_value_head_count
                << ", d=" << s.head_width << ")";
        throw std::invalid_argument(message.str());
    };
    if (s.width == 0 || s.query_head_count == 0 || s.key_value_head_count == 0)
        fail("width and both head counts must be positive");
    if (s.head_width == 0 && s.width % s.query_head_count != 0)
        fail("width must be a multiple of query_head_count when head_width is not given");
    if (s.query_head_count % s.key_value_head_count != 0)
        fail("query_head_count must be a multiple of key_value_head_count");
    if (s.rotary) {
        require_rotary_arguments("GroupedQueryAttention", head_width_of(s), s.rope_theta);
        require_rope_scaling("GroupedQueryAttention", head_width_of(s), s.rope_scaling);
    }
    if (s.sliding_window && *s.sliding_window == 0)
        fail("sliding_window must be positive when set (got 0)");
    if (!std::isfinite(s.attention_scale) || s.attention_scale < 0.0F) {
        std::ostringstream what;
        what << "attention_scale must be finite and >= 0 (0: 1/sqrt(d)); got " << s.attention_scale;
        fail(what.str());
    }
    if (!std::isfinite(s.attention_softcap) || s.attention_softcap < 0.0F) {
        std::ostringstream what;
        what << "attention_softcap must be finite and >= 0 (0: none); got " << s.attention_softcap;
        fail(what.str());
    }
    if (s.query_key_norm) {
        tensor_ops::require_normalization_epsilon("GroupedQueryAttention", "query_key_norm_epsilon",
                                                  s.query_key_norm_epsilon);
    }
}

// Additive mask [1,1,T,T] on `backend`: −inf on keys older than the window (future keys are
// the causal softmax's to mask); exp(−inf) is exactly 0, and so is every gradient through it.
Variable window_mask(std::size_t time, std::size_t window, ExecutionBackend backend) {
    std::vector<float> mask(time * time, 0.0F);
    for (std::size_t t = window; t < time; ++t) {
        for (std::size_t k = 0; k + window <= t; ++k)
            mask[t * time + k] = -std::numeric_limits<float>::infinity();
    }
    return Variable(Tensor({1, 1, time, time}, mask, backend), false);
}

// Packed rows: additive mask [B,1,T,T] with −inf on the keys before query t's document (t −
// its position) and, with a window W > 0, on keys older than t − W + 1; the causal softmax
// masks the future.
Variable document_mask(const tensor_ops::PackedDocuments& documents, std::size_t window,
                       ExecutionBackend backend) {
    const std::size_t batch = documents.batch;
    const std::size_t time = documents.time;
    std::vector<float> mask(batch * time * time, 0.0F);
    for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t t = 0; t < time; ++t) {
            const std::size_t document_first = t - documents.positions[b * time + t];
            const std::size_t window_first = window == 0 || t < window ? 0 : t + 1 - window;
            const std::size_t first = std::max(document_first, window_first);
            float* row = mask.data() + (b * time + t) * time;
            std::fill_n(row, first, -std::numeric_limits<float>::infinity());
        }
    }
    return Variable(Tensor({batch, 1, time, time}, mask, backend), false);
}

// Materialized causal attention with an additive mask ([B or 1,1,T,T]) on the scaled scores.
Variable masked_causal_attention(const Variable& query, const Variable& key, const Variable& value,
                                 const Variable& mask, float scale) {
    const Shape& q = query.shape();
    const Variable scores = matmul(query, key, false, true);  // [B,H,T,T]
    const Variable masked = scores + broadcast_to(mask, {q[0], q[1], q[2], q[2]});
    return matmul(causal_softmax(masked, scale), value);  // [B,H,T,T] x [B,H,T,d]
}

}  // namespace

Variable repeat_key_value_heads(const Variable& x, std::size_t repeats) {
    if (repeats == 0)
        throw std::invalid_argument("repeat_key_value_heads: repeats must be positive (got 0)");
    if (!x.defined() || x.shape().size() != 4) {
        throw std::invalid_argument("repeat_key_value_heads: x must be [B,Hkv,T,d] (got " +
                                    (x.defined() ? shape_to_string(x.shape()) : "empty") + ")");
    }
    if (repeats == 1)
        return x;
    const Shape& s = x.shape();
    // [B,Hkv,T,d] -> [B,Hkv,1,T,d] -> [B,Hkv,r,T,d] -> [B,Hkv·r,T,d]
    const Variable grouped = reshape(x, {s[0], s[1], 1, s[2], s[3]});
    return reshape(broadcast_to(grouped, {s[0], s[1], repeats, s[2], s[3]}),
                   {s[0], s[1] * repeats, s[2], s[3]});
}

Variable sliding_window_causal_attention(const Variable& query, const Variable& key,
                                         const Variable& value, std::size_t window) {
    if (window == 0) {
        throw std::invalid_argument(
            "sliding_window_causal_attention: window must be positive (got 0)");
    }
    if (!query.defined() || !key.defined() || !value.defined())
        throw std::logic_error("sliding_window_causal_attention: an input is an empty Variable");
    const float scale = tensor_ops::attention_scale("sliding_window_causal_attention",
                                                    query.value(), key.value(), value.value());
    return masked_causal_attention(
        query, key, value, window_mask(query.shape()[2], window, query.value().backend()), scale);
}

namespace {

// soft_capped_causal_attention with packed documents (null: one document per row).
Variable soft_capped_attention(const Variable& query, const Variable& key, const Variable& value,
                               std::size_t window, float cap,
                               const tensor_ops::PackedDocuments* documents);

}  // namespace

Variable soft_capped_causal_attention(const Variable& query, const Variable& key,
                                      const Variable& value, std::size_t window, float cap) {
    return soft_capped_attention(query, key, value, window, cap, nullptr);
}

namespace {

Variable soft_capped_attention(const Variable& query, const Variable& key, const Variable& value,
                               std::size_t window, float cap,
                               const tensor_ops::PackedDocuments* documents) {
    if (!query.defined() || !key.defined() || !value.defined())
        throw std::logic_error("soft_capped_causal_attention: an input is an empty Variable");
    const float scale = tensor_ops::attention_scale("soft_capped_causal_attention", query.value(),
                                                    key.value(), value.value());
    if (!std::isfinite(cap) || !(cap > 0.0F)) {
        std::ostringstream message;
        message << "soft_capped_causal_attention: cap must be finite and > 0 (got " << cap << ")";
        throw std::invalid_argument(message.str());
    }
    const Shape& q = query.shape();
    const std::size_t time = q[2];
    Variable scores = soft_cap(matmul(query, key, false, true) * scale, cap);  // [B,H,T,T]
    if (documents != nullptr) {
        scores = scores + broadcast_to(document_mask(*documents, window, query.value().backend()),
                                       {q[0], q[1], time, time});
    } else if (window != 0 && window < time) {
        scores = scores + broadcast_to(window_mask(time, window, query.value().backend()),
                                       {q[0], q[1], time, time});
    }
    return matmul(causal_softmax(scores, 1.0F), value);
}

// The reference path: K and V [B,Hkv,T,d] repeated to Hq heads (a copy), then materialized
// causal attention, masked to the window when it is shorter than the sequence, and to each
// token's document in packed rows.
Variable materialized_grouped_attention(const Variable& query, const Variable& key,
                                        const Variable& value,
                                        const GroupedQueryAttentionShape& shape, std::size_t time,
                                        const tensor_ops::PackedDocuments* documents) {
    const std::size_t repeats = shape.query_head_count / shape.key_value_head_count;
    const Variable repeated_key = repeat_key_value_heads(key, repeats);
    const Variable repeated_value = repeat_key_value_heads(value, repeats);
    if (shape.attention_softcap != 0.0F) {
        return soft_capped_attention(query, repeated_key, repeated_value,
                                     shape.sliding_window.value_or(0), shape.attention_softcap,
                                     documents);
    }
    if (documents != nullptr) {
        const float scale = tensor_ops::attention_scale(
            "GroupedQueryAttention", query.value(), repeated_key.value(), repeated_value.value());
        return masked_causal_attention(
            query, repeated_key, repeated_value,
            document_mask(*documents, shape.sliding_window.value_or(0), query.value().backend()),
            scale);
    }
    if (shape.sliding_window && *shape.sliding_window < time) {
        return sliding_window_causal_attention(query, repeated_key, repeated_value,
                                               *shape.sliding_window);
    }
    return causal_scaled_dot_product_attention(query, repeated_key, repeated_value).context;
}

}  // namespace

GroupedQueryAttention::GroupedQueryAttention(const GroupedQueryAttentionShape& shape,
                                             std::mt19937& generator, AttentionKind kind)
    : shape_(shape), kind_(kind) {
    validate(shape);
    require_attention_kind("GroupedQueryAttention", kind);
    const std::size_t D = shape.width;
    const std::size_t d = head_width();
    const std::size_t query_width = shape.query_head_count * d;
    const std::size_t kv_width = shape.key_value_head_count * d;
    if (shape.rotary) {
        frequencies_ =
            riftco_transformer::rotary_frequencies(d, shape.rope_theta, shape.rope_scaling);
        magnitude_ = riftco_transformer::rotary_magnitude(shape.rope_scaling);
    }
    if (shape.attention_scale != 0.0F) {
        // The kernels compute 1/√d·q·k; queries multiplied by scale·√d give scale·q·k.
        query_multiplier_ = static_cast<float>(static_cast<double>(shape.attention_scale) *
                                               std::sqrt(static_cast<double>(d)));
    }
    const bool bias = shape.query_key_value_bias;
    query_ = &register_module("query", std::make_unique<Linear>(D, query_width, generator, bias));
    key_ = &register_module("key", std::make_unique<Linear>(D, kv_width, generator, bias));
    value_ = &register_module("value", std::make_unique<Linear>(D, kv_width, generator, bias));
    output_ = &register_module(
        "output", std::make_unique<Linear>(query_width, D, generator, shape.output_bias));
    if (shape.query_key_norm) {
        query_norm_ = &register_module(
            "query_norm",
            std::make_unique<RMSNorm>(d, shape.query_key_norm_epsilon, shape.norm_weight_offset));
        key_norm_ = &register_module(
            "key_norm",
            std::make_unique<RMSNorm>(d, shape.query_key_norm_epsilon, shape.norm_weight_offset));
    }
}

void GroupedQueryAttention::set_kind(AttentionKind kind) {
    require_attention_kind("GroupedQueryAttention", kind);
    kind_ = kind;
}

RotaryTables GroupedQueryAttention::rotary_tables_for(std::span<const std::size_t> positions,
                                                      ExecutionBackend backend) const {
    if (!shape_.rotary)
        throw std::logic_error("GroupedQueryAttention: this attention has no RoPE tables");
    return rotary_tables(positions, frequencies_, backend, magnitude_);
}

Variable GroupedQueryAttention::forward(const Variable& x) const {
    if (!x.defined() || x.shape().size() != 3) {
        throw std::invalid_argument("GroupedQueryAttention: x must be [B,T," +
                                    std::to_string(shape_.width) + "] (got " +
                                    (x.defined() ? shape_to_string(x.shape()) : "empty") + ")");
    }
    if (!shape_.rotary)
        return forward(x, RotaryTables{});
    std::vector<std::size_t> positions(x.shape()[1]);
    std::iota(positions.begin(), positions.end(), std::size_t{0});
    return forward(x, rotary_tables_for(positions, x.value().backend()));
}

Variable GroupedQueryAttention::split_heads(const Variable& projected, std::size_t heads,
                                            const RMSNorm* norm, const RotaryTables* tables,
                                            float multiplier) const {
    const std::size_t d = head_width();
    const Shape& shape = projected.shape();
    Variable split;
    if (shape.size() == 3) {
        // [B,T,heads·d] -> [B,T,heads,d] (normed over d) -> [B,heads,T,d]
        split = reshape(projected, {shape[0], shape[1], heads, d});
        if (norm != nullptr)
            split = norm->forward(split);
        split = permute(split, {0, 2, 1, 3});
    } else {
        // [R,heads·d] -> [R,heads,1,d]: the same row-major values.
        split = reshape(projected, {shape[0], heads, 1, d});
        if (norm != nullptr)
            split = norm->forward(split);
    }
    if (tables != nullptr)
        split = apply_rotary_embedding(split, *tables);
    return multiplier != 1.0F ? split * multiplier : split;
}

Variable GroupedQueryAttention::forward(
    const Variable& x, const RotaryTables& tables,
    const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const {
    if (!x.defined() || x.shape().size() != 3 || x.shape()[2] != shape_.width) {
        throw std::invalid_argument("GroupedQueryAttention: x must be [B,T," +
                                    std::to_string(shape_.width) + "] (got " +
                                    (x.defined() ? shape_to_string(x.shape()) : "empty") + ")");
    }
    const std::size_t batch = x.shape()[0];
    const std::size_t time = x.shape()[1];
    const std::size_t query_width = shape_.query_head_count * head_width();
    const RotaryTables* rope = shape_.rotary ? &tables : nullptr;
    const Variable query = split_heads(query_->forward(x), shape_.query_head_count, query_norm_,
                                       rope, query_multiplier_);
    const Variable key =
        split_heads(key_->forward(x), shape_.key_value_head_count, key_norm_, rope, 1.0F);
    const Variable value =
        split_heads(value_->forward(x), shape_.key_value_head_count, nullptr, nullptr, 1.0F);
    if (documents != nullptr && (documents->batch != batch || documents->time != time)) {
        throw std::invalid_argument("GroupedQueryAttention: packed documents of " +
                                    std::to_string(documents->batch) + " rows of " +
                                    std::to_string(documents->time) + " tokens for x " +
                                    shape_to_string(x.shape()));
    }
    const Variable context =
        kind_ == AttentionKind::Flash
            ? flash_attention(query, key, value,
                              {.window = shape_.sliding_window.value_or(0),
                               .softcap = shape_.attention_softcap,
                               .documents = documents})
            : materialized_grouped_attention(query, key, value, shape_, time, documents.get());
    // [B,Hq,T,d] -> [B,T,Hq,d] -> [B,T,Hq·d]
    return output_->forward(reshape(permute(context, {0, 2, 1, 3}), {batch, time, query_width}));
}

Variable GroupedQueryAttention::forward_incremental(const Variable& x, const RotaryTables& tables,
                                                    std::size_t layer,
                                                    IncrementalAttentionCache& cache) const {
    constexpr const char* op = "GroupedQueryAttention::forward_incremental";
    if (!x.defined() || x.shape().size() != 2 || x.shape()[1] != shape_.width ||
        (shape_.rotary &&
         (tables.cosine.shape().empty() || tables.cosine.shape()[0] != x.shape()[0]))) {
        throw std::invalid_argument(std::string(op) + ": x must be [R," +
                                    std::to_string(shape_.width) +
                                    "] with R rows of RoPE tables (got " +
                                    (x.defined() ? shape_to_string(x.shape()) : "empty") +
                                    ", tables " + shape_to_string(tables.cosine.shape()) + ")");
    }
    const std::size_t rows = x.shape()[0];
    const RotaryTables* rope = shape_.rotary ? &tables : nullptr;
    // Decoding records no graph: q, k and v in one pass where the layers allow it.
    const std::optional<std::vector<Variable>> fused = fused_projections(x, {query_, key_, value_});
    const Variable query =
        split_heads(fused ? (*fused)[0] : query_->forward(x), shape_.query_head_count, query_norm_,
                    rope, query_multiplier_);
    const Variable key = split_heads(fused ? (*fused)[1] : key_->forward(x),
                                     shape_.key_value_head_count, key_norm_, rope, 1.0F);
    const Variable value = split_heads(fused ? (*fused)[2] : value_->forward(x),
                                       shape_.key_value_head_count, nullptr, nullptr, 1.0F);
    const Tensor context = cache.append_and_attend(
        layer, query.value(), key.value(), value.value(),
        IncrementalAttentionOptions{.window = shape_.sliding_window.value_or(0),
                                    .softcap = shape_.attention_softcap});
    const std::size_t query_width = shape_.query_head_count * head_width();
    return output_->forward(Variable(tensor_ops::reshape(context, {rows, query_width}), false));
}

}  // namespace riftco_transformer
