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

// options.documents, when set, fits Q [B,Hq,T,d] and the backend has packed rows (CPU only).
void require_documents(std::string_view op, const FlashAttentionOptions& options,
                       const Tensor& query) {
    if (options.documents == nullptr)
        return;
    const PackedDocuments& documents = *options.documents;
    const Shape& q = query.shape();
    if (documents.batch != q[0] || documents.time != q[2] ||
        documents.positions.size() != q[0] * q[2]) {
        std::ostringstream message;
        message << op << ": packed documents of " << documents.batch << " rows of "
                << documents.time << " tokens do not fit query " << shape_to_string(q);
        throw std::invalid_argument(message.str());
    }
    require_packed_attention(op, query.backend());
}

}  // namespace

void require_packed_attention(std::string_view operation, ExecutionBackend backend) {
    if (backend != ExecutionBackend::Cpu && backend != ExecutionBackend::Tpu &&
        backend != ExecutionBackend::Pjrt) {
        throw std::invalid_argument(std::string(operation) +
                                    ": packed rows (attention within document boundaries) are "
                                    "not available on the " +
                                    std::string(execution_backend_name(backend)) +
                                    " backend yet; train unpacked (padded) rows there");
    }
}

std::shared_ptr<const PackedDocuments> packed_documents(std::string_view operation,
                                                        std::span<const std::uint32_t> positions,
                                                        std::size_t batch, std::size_t time) {
    if (batch == 0 || time == 0 || positions.size() / time != batch ||
        positions.size() % time != 0) {
        std::ostringstream message;
        message << operation << ": " << positions.size() << " positions given for " << batch
                << " rows of " << time << " tokens";
        throw std::invalid_argument(message.str());
    }
    for (std::size_t b = 0; b < batch; ++b) {
        const std::uint32_t* row = positions.data() + b * time;
        for (std::size_t t = 0; t < time; ++t) {
            const bool starts = row[t] == 0;
            const bool continues = t > 0 && row[t] == row[t - 1] + 1;
            if (!starts && !continues) {
                std::ostringstream message;
                message << operation << ": positions of row " << b << " at token " << t << " is "
                        << row[t] << "; each row starts at 0 and every next position is 0 (a "
                        << "new document) or the previous + 1"
                        << (t > 0 ? " (" + std::to_string(row[t - 1]) + ")" : std::string());
                throw std::invalid_argument(message.str());
            }
        }
    }
    auto documents = std::make_shared<PackedDocuments>();
    documents->batch = batch;
    documents->time = time;
    documents->positions.assign(positions.begin(), positions.end());
    return documents;
}

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
                                     const FlashAttentionOptions& options) {
    constexpr std::string_view op = "flash_attention";
    const auto& adapter =
        detail::input_adapter(op, {{"query", &query}, {"key", &key}, {"value", &value}});
    const float scale = require_attention_inputs(op, query, key, value, true);
    detail::require_softcap(op, "options.softcap", options.softcap);
    require_documents(op, options, query);
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
    require_documents(op, forward.options, query);
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
