#include "riftco_transformer/core/tensor_ops/attention.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

// Q, K, V rank 4; identical shapes, or (grouped) K and V identical [B,Hkv,T,d_h] and Q
// [B,Hq,T,d_h] with Hq % Hkv == 0. Returns the scale 1/√d_h (in float).
float require_attention_inputs(std::string_view op, const Tensor& query, const Tensor& key,
                               const Tensor& value, bool grouped) {
    detail::require_rank(op, {"query", &query}, 4);
    if (!grouped) {
        detail::require_same_shape(op, {"query", &query}, {"key", &key});
        detail::require_same_shape(op, {"query", &query}, {"value", &value});
        return 1.0F / std::sqrt(static_cast<float>(query.shape()[3]));
    }
    detail::require_rank(op, {"key", &key}, 4);
    detail::require_same_shape(op, {"key", &key}, {"value", &value});
    const Shape& q = query.shape();
    const Shape& k = key.shape();
    const bool heads_fit = k[1] != 0 && q[1] % k[1] == 0;
    if (q[0] != k[0] || q[2] != k[2] || q[3] != k[3] || !heads_fit) {
        std::ostringstream message;
        message << op << ": query " << shape_to_string(q) << " and key/value " << shape_to_string(k)
                << " must share B, T and d_h, with query heads a multiple of key/value heads";
        throw std::invalid_argument(message.str());
    }
    return 1.0F / std::sqrt(static_cast<float>(q[3]));
}

}  // namespace

float attention_scale(std::string_view op, const Tensor& query, const Tensor& key,
                      const Tensor& value) {
    static_cast<void>(
        detail::input_adapter(op, {{"query", &query}, {"key", &key}, {"value", &value}}));
    return require_attention_inputs(op, query, key, value, false);
}

float grouped_attention_scale(std::string_view op, const Tensor& query, const Tensor& key,
                              const Tensor& value) {
    static_cast<void>(
        detail::input_adapter(op, {{"query", &query}, {"key", &key}, {"value", &value}}));
    return require_attention_inputs(op, query, key, value, true);
}

namespace {

const detail::AttentionCapability& attention_of(const detail::BackendAdapter& adapter,
                                                std::string_view op) {
    return detail::require_capability(adapter.attention(), adapter, op, "attention");
}

}  // namespace

FlashAttentionResult flash_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                     FlashAttentionOptions options) {
    constexpr std::string_view op = "flash_attention";
    const auto& adapter =
        detail::input_adapter(op, {{"query", &query}, {"key", &key}, {"value", &value}});
    const float scale = require_attention_inputs(op, query, key, value, true);
    detail::require_softcap(op, "options.softcap", options.softcap);
    const Shape statistics_shape(query.shape().begin(), query.shape().end() - 1);
    FlashAttentionResult result{detail::allocate_uninitialized(query.shape(), query.backend()),
                                detail::allocate_uninitialized(statistics_shape, query.backend()),
                                detail::allocate_uninitialized(statistics_shape, query.backend()),
                                options};
    attention_of(adapter, op)
        .flash_forward(query, key, value, scale, options, result.context, result.row_max,
                       result.row_sum);
    return result;
}

FlashAttentionGradients flash_attention_backward(const Tensor& query, const Tensor& key,
                                                 const Tensor& value,
                                                 const FlashAttentionResult& forward,
                                                 const Tensor& upstream) {
    constexpr std::string_view op = "flash_attention_backward";
    const auto& adapter = detail::input_adapter(op, {{"query", &query},
                                                     {"key", &key},
                                                     {"value", &value},
                                                     {"context", &forward.context},
                                                     {"row_max", &forward.row_max},
                                                     {"row_sum", &forward.row_sum},
                                                     {"upstream", &upstream}});
    const float scale = require_attention_inputs(op, query, key, value, true);
    detail::require_softcap(op, "forward.options.softcap", forward.options.softcap);
    detail::require_same_shape(op, {"query", &query}, {"context", &forward.context});
    detail::require_same_shape(op, {"query", &query}, {"upstream", &upstream});
    const Shape statistics_shape(query.shape().begin(), query.shape().end() - 1);
    if (forward.row_max.shape() != statistics_shape ||
        forward.row_sum.shape() != statistics_shape) {
        throw std::invalid_argument(std::string(op) + ": row statistics must be " +
                                    shape_to_string(statistics_shape));
    }
    FlashAttentionGradients gradients{
        detail::allocate_uninitialized(query.shape(), query.backend()),
        detail::allocate_uninitialized(key.shape(), key.backend()),
        detail::allocate_uninitialized(value.shape(), value.backend())};
    attention_of(adapter, op)
        .flash_backward(query, key, value, forward.context, forward.row_max, forward.row_sum,
                        upstream, scale, forward.options, gradients.query, gradients.key,
                        gradients.value);
    return gradients;
}

}  // namespace riftco_transformer::tensor_ops
