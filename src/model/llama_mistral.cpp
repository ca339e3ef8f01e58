#include "riftco_transformer/model/llama_mistral.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {
namespace {

std::string describe(const LlamaMistralConfig& c, const std::string& what) {
    std::ostringstream message;
    message << "LlamaMistralTransformer: " << what << " (V=" << c.vocabulary_size
            << ", C=" << c.maximum_context << ", D=" << c.model_width
            << ", Hq=" << c.query_head_count << ", Hkv=" << c.key_value_head_count
            << ", N=" << c.block_count << ", F=" << c.feed_forward_width << ")";
    return message.str();
}

// float32 bytes of rows·columns values added to `total`, or false when that passes the limit.
bool add_bytes(std::size_t& total, std::size_t rows, std::size_t columns) {
    constexpr std::size_t limit = max_transformer_parameter_bytes;
    if (rows > limit / sizeof(float) / columns)
        return false;
    const std::size_t bytes = rows * columns * sizeof(float);
    if (bytes > limit - total)
        return false;
    total += bytes;
    return true;
}

void require_parameter_bytes_fit(const LlamaMistralConfig& c) {
    const std::size_t V = c.vocabulary_size;
    const std::size_t D = c.model_width;
    const std::size_t F = c.feed_forward_width;
    const std::size_t kv_width = c.key_value_head_count * (D / c.query_head_count);
    const auto overflow = [&](const char* fields) {
        throw std::overflow_error(describe(
            c, std::string(fields) + " too large: the parameters pass the limit of " +
                   std::to_string(max_transformer_parameter_bytes) + " bytes (2^47)"));
    };
    std::size_t outside = 0;
    if (!add_bytes(outside, V, D))
        overflow("vocabulary_size/model_width");
    if (!c.tie_embeddings && !add_bytes(outside, V, D))
        overflow("vocabulary_size/model_width");
    if (!add_bytes(outside, 1, D))
        overflow("model_width");
    std::size_t block = 0;  // 2D² + 2·D·kv + 3·D·F + 2D
    if (!add_bytes(block, 2 * D, D) || !add_bytes(block, 2 * kv_width, D))
        overflow("model_width");
    if (!add_bytes(block, 3 * D, F))
        overflow("model_width/feed_forward_width");
    if (!add_bytes(block, 2, D))
        overflow("model_width");
    if (c.block_count > (max_transformer_parameter_bytes - outside) / block)
        overflow("block_count");
}

GroupedQueryAttentionShape attention_shape(const LlamaMistralConfig& c) {
    return {c.model_width, c.query_head_count, c.key_value_head_count, c.rope_theta,
            c.sliding_window};
}

}  // namespace

std::string_view llama_mistral_architecture_name(LlamaMistralArchitecture value) {
    switch (value) {
    case LlamaMistralArchitecture::Llama:
        return "llama";
    case LlamaMistralArchitecture::Mistral:
        return "mistral";
    }
    throw std::invalid_argument("LlamaMistralTransformer: unknown architecture value " +
                                std::to_string(static_cast<std::uint32_t>(value)));
}

void validate_llama_mistral_config(const LlamaMistralConfig& c) {
    const auto fail = [&](const std::string& what) {
        throw std::invalid_argument(describe(c, what));
    };
    (void)llama_mistral_architecture_name(c.architecture);
    if (c.vocabulary_size == 0 || c.maximum_context == 0 || c.model_width == 0 ||
        c.query_head_count == 0 || c.key_value_head_count == 0 || c.block_count == 0 ||
        c.feed_forward_width == 0) {
        fail("every dimension must be positive");
    }
    if (c.model_width % c.query_head_count != 0)
        fail("model_width must be a multiple of query_head_count");
    if (c.query_head_count % c.key_value_head_count != 0)
        fail("query_head_count must be a multiple of key_value_head_count");
    if ((c.model_width / c.query_head_count) % 2 != 0) {
        fail("RoPE needs an even head width (model_width / query_head_count = " +
             std::to_string(c.model_width / c.query_head_count) + ")");
    }
    constexpr std::size_t id_limit = std::numeric_limits<std::uint32_t>::max();
    if (c.vocabulary_size - 1 > id_limit)
        fail("vocabulary ids must fit in uint32");
    if (c.maximum_context - 1 > id_limit)
        fail("positions must fit in uint32");
    tensor_ops::require_normalization_epsilon("LlamaMistralTransformer", "rms_norm_epsilon",
                                              c.rms_norm_epsilon);
    if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0.0) {
        std::ostringstream what;
        what << "rope_theta must be finite and > 0 (got " << c.rope_theta << ")";
        fail(what.str());
    }
    if (c.sliding_window && *c.sliding_window == 0)
        fail("sliding_window must be positive when set (got 0)");
    require_parameter_bytes_fit(c);
}

LlamaMistralBlock::LlamaMistralBlock(const LlamaMistralConfig& c, std::mt19937& generator,
                                     AttentionKind attention) {
    attention_norm_ = &register_module(
        "attention_norm", std::make_unique<RMSNorm>(c.model_width, c.rms_norm_epsilon));
    attention_ = &register_module(
        "attention",
        std::make_unique<GroupedQueryAttention>(attention_shape(c), generator, attention));
    feed_forward_norm_ = &register_module(
        "feed_forward_norm", std::make_unique<RMSNorm>(c.model_width, c.rms_norm_epsilon));
    feed_forward_ = &register_module(
        "feed_forward", std::make_unique<SwiGLU>(c.model_width, c.feed_forward_width, generator));
}

Variable LlamaMistralBlock::forward(const Variable& x, const RotaryTables& tables) const {
    const Variable attended = x + attention_->forward(attention_norm_->forward(x), tables);
    return attended + feed_forward_->forward(feed_forward_norm_->forward(attended));
}

Variable LlamaMistralBlock::forward_incremental(const Variable& x, const RotaryTables& tables,
                                                std::size_t layer,
                                                IncrementalAttentionCache& cache) const {
    const Variable attended =
        x + attention_->forward_incremental(attention_norm_->forward(x), tables, layer, cache);
    return attended + feed_forward_->forward(feed_forward_norm_->forward(attended));
}

LlamaMistralTransformer::LlamaMistralTransformer(const LlamaMistralConfig& config,
                                                 std::mt19937& generator, AttentionKind attention,
                                                 ActivationCheckpointing checkpointing)
    : CausalLanguageModel("LlamaMistralTransformer", checkpointing),
      config_(config),
      attention_(attention) {
    validate_llama_mistral_config(config);
    require_attention_kind("LlamaMistralTransformer", attention);
    const LlamaMistralConfig& c = config;
    token_embedding_ = &register_module(
        "token_embedding", std::make_unique<Embedding>(c.vocabulary_size, c.model_width, generator));
    auto& blocks = register_module("blocks", std::make_unique<ModuleList>());
    for (std::size_t i = 0; i < c.block_count; ++i) {
        blocks_.push_back(
            &blocks.append(std::make_unique<LlamaMistralBlock>(c, generator, attention)));
    }
    final_norm_ = &register_module("final_norm",
                                   std::make_unique<RMSNorm>(c.model_width, c.rms_norm_epsilon));
    if (!c.tie_embeddings) {
        language_model_head_ = &register_module(
            "language_model_head",
            std::make_unique<Linear>(c.model_width, c.vocabulary_size, generator, false));
    }
    std::vector<AdaptableProjection> projections;
    for (std::size_t i = 0; i < c.block_count; ++i) {
        for (LoraTarget target :
             {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value, LoraTarget::Output,
              LoraTarget::FeedForwardGate, LoraTarget::FeedForwardUp,
              LoraTarget::FeedForwardDown}) {
            std::string path =
                "blocks." + std::to_string(i) + "." + std::string(lora_target_name(target));
            auto* layer = dynamic_cast<Linear*>(find_module(path));
            if (layer == nullptr)
                throw std::logic_error("LlamaMistralTransformer: no projection at " + path);
            projections.push_back({target, std::move(path), layer});
        }
    }
    if (language_model_head_ != nullptr) {
        projections.push_back(
            {LoraTarget::LanguageModelHead, "language_model_head", language_model_head_});
    }
    set_projections(std::move(projections));
}

void LlamaMistralTransformer::set_attention(AttentionKind kind) {
    require_attention_kind("LlamaMistralTransformer", kind);
    for (LlamaMistralBlock* block : blocks_)
        block->set_attention(kind);
    attention_ = kind;
}

AdaptableProjection LlamaMistralTransformer::attach_untied_head() {
    // The constructor registers the head last, so appending it here gives the parameter order
    // of a model built untied.
    // Everything that can throw happens before the head is registered.
    AdaptableProjection projection{LoraTarget::LanguageModelHead, "language_model_head", nullptr};
    auto head = std::make_unique<Linear>(token_embedding_->weight().value(), std::nullopt);
    language_model_head_ = &register_module("language_model_head", std::move(head));
    projection.linear = language_model_head_;
    config_.tie_embeddings = false;
    return projection;
}

IncrementalCacheShape LlamaMistralTransformer::incremental_cache_shape() const noexcept {
    const LlamaMistralConfig& c = config_;
    return {c.block_count, c.key_value_head_count, c.model_width / c.query_head_count,
            c.maximum_context};
}


Variable LlamaMistralTransformer::forward_checked(const IndexTensor& tokens) const {
    Variable hidden = token_embedding_->forward(tokens);  // [B,T,D]
    // One set of RoPE tables (positions 0..T-1) for every block.
    std::vector<std::size_t> positions(tokens.shape()[1]);
    std::iota(positions.begin(), positions.end(), std::size_t{0});
    const RotaryTables tables = blocks_.front()->attention().rotary_tables_for(positions, backend());
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
        const LlamaMistralBlock* block = blocks_[index];
        hidden = run_block(*block, index, hidden, [block, tables](const Variable& input) {
            return block->forward(input, tables);
        });
    }
    // [B,T,D] -> [B,T,V]
    return language_model_logits(final_norm_->forward(hidden), language_model_head_,
                                 *token_embedding_);
}

Tensor LlamaMistralTransformer::forward_incremental(std::span<const std::uint32_t> tokens,
                                                    std::span<const std::size_t> positions,
                                                    IncrementalAttentionCache& cache,
                                                    std::span<const std::size_t> output_rows) const {
    constexpr const char* op = "LlamaMistralTransformer::forward_incremental";
    require_incremental_rows(op, tokens, positions, output_rows);
    const std::size_t rows = tokens.size();
    const NoGradientGuard no_graph;
    const ExecutionBackend device = backend();
    Variable hidden = token_embedding_->forward(IndexTensor({rows}, tokens, device));  // [R,D]
    // One set of RoPE tables (row r at positions[r]) for every block.
    const RotaryTables tables = blocks_.front()->attention().rotary_tables_for(positions, device);
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
        try {
            hidden = blocks_[index]->forward_incremental(hidden, tables, index, cache);
        } catch (const std::domain_error& error) {
            throw std::domain_error(std::string(op) + ": non-finite activations in block " +
                                    std::to_string(index) + ": " + error.what());
        }
    }
    hidden = select_rows(hidden, output_rows);
    return language_model_logits(final_norm_->forward(hidden), language_model_head_,
                                 *token_embedding_)
        .value();
}

}  // namespace riftco_transformer
