#include "riftco_transformer/model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {
namespace {

std::string describe(const DecoderConfig& c, const std::string& what) {
    std::ostringstream message;
    message << "Decoder: " << what << " (V=" << c.vocabulary_size << ", C=" << c.maximum_context
            << ", D=" << c.model_width << ", Hq=" << c.query_head_count
            << ", Hkv=" << c.key_value_head_count << ", N=" << c.block_count
            << ", F=" << c.feed_forward_width << ", d=" << c.resolved_head_width() << ")";
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

void require_parameter_bytes_fit(const DecoderConfig& c) {
    const std::size_t V = c.vocabulary_size;
    const std::size_t D = c.model_width;
    const std::size_t F = c.feed_forward_width;
    const std::size_t d = c.resolved_head_width();
    const auto overflow = [&](const char* fields) {
        throw std::overflow_error(
            describe(c, std::string(fields) + " too large: the parameters pass the limit of " +
                            std::to_string(max_transformer_parameter_bytes) + " bytes (2^47)"));
    };
    const bool learned = c.positions == PositionEncoding::Learned;
    const std::size_t norm_values = c.norm == NormKind::Layer ? 2 : 1;  // scale (and bias)
    std::size_t outside = 0;
    if (!add_bytes(outside, V, D))
        overflow("vocabulary_size/model_width");
    if (learned && !add_bytes(outside, c.maximum_context, D))
        overflow("maximum_context/model_width");
    if (!c.tie_embeddings && !add_bytes(outside, V, D))
        overflow("vocabulary_size/model_width");
    if (!c.tie_embeddings && c.head_bias && !add_bytes(outside, 1, V))
        overflow("vocabulary_size");
    if (!add_bytes(outside, norm_values, D))
        overflow("model_width");
    // One block: q and o D·Hq·d each, k and v D·Hkv·d each, 3·D·F, the norms, the biases.
    std::size_t block = 0;
    if (c.query_head_count > std::numeric_limits<std::size_t>::max() / d ||
        c.key_value_head_count > std::numeric_limits<std::size_t>::max() / d) {
        overflow("query_head_count/head_width");
    }
    const std::size_t query_width = c.query_head_count * d;
    const std::size_t kv_width = c.key_value_head_count * d;
    if (!add_bytes(block, 2 * D, query_width))
        overflow("model_width/query_head_count/head_width");
    if (!add_bytes(block, 2 * D, kv_width))
        overflow("model_width/key_value_head_count/head_width");
    const bool gated = c.feed_forward == FeedForwardKind::Gated;
    if (!add_bytes(block, gated ? 3 * D : 2 * D, F))
        overflow("model_width/feed_forward_width");
    if (!add_bytes(block, (c.post_block_norms ? 4 : 2) * norm_values, D))
        overflow("model_width");
    if (c.query_key_value_bias && !add_bytes(block, 1, query_width + 2 * kv_width))
        overflow("query_head_count/key_value_head_count/head_width");
    if (c.output_bias && !add_bytes(block, 1, D))
        overflow("model_width");
    if (c.feed_forward_bias && (!add_bytes(block, gated ? 2 : 1, F) || !add_bytes(block, 1, D)))
        overflow("model_width/feed_forward_width");
    if (c.query_key_norm && !add_bytes(block, 2, d))
        overflow("head_width");
    if (c.block_count > (max_transformer_parameter_bytes - outside) / block)
        overflow("block_count");
}

GroupedQueryAttentionShape attention_shape(const DecoderConfig& c, std::size_t layer) {
    GroupedQueryAttentionShape shape;
    shape.width = c.model_width;
    shape.query_head_count = c.query_head_count;
    shape.key_value_head_count = c.key_value_head_count;
    shape.head_width = c.head_width;
    shape.sliding_window = c.layer_window(layer);
    shape.rope_theta = c.rope_theta;
    shape.rope_scaling = c.rope_scaling;
    if (shape.sliding_window && c.rope_local_theta > 0.0) {
        // Gemma 3: the windowed layers rotate with their own base and no scaling.
        shape.rope_theta = c.rope_local_theta;
        shape.rope_scaling = RopeScaling{};
    }
    shape.query_key_value_bias = c.query_key_value_bias;
    shape.query_key_norm = c.query_key_norm;
    shape.query_key_norm_epsilon = c.rms_norm_epsilon;
    shape.norm_weight_offset = c.norm_weight_offset;
    shape.attention_scale = c.attention_scale;
    shape.attention_softcap = c.attention_logit_softcap;
    shape.rotary = c.positions == PositionEncoding::Rotary;
    shape.output_bias = c.output_bias;
    return shape;
}

}  // namespace

std::string_view decoder_architecture_name(DecoderArchitecture value) {
    switch (value) {
        case DecoderArchitecture::Llama:
            return "llama";
        case DecoderArchitecture::Mistral:
            return "mistral";
        case DecoderArchitecture::Qwen2:
            return "qwen2";
        case DecoderArchitecture::Qwen3:
            return "qwen3";
        case DecoderArchitecture::Gemma2:
            return "gemma2";
        case DecoderArchitecture::Gemma3:
            return "gemma3";
        case DecoderArchitecture::Phi3:
            return "phi3";
        case DecoderArchitecture::Gpt2:
            return "gpt2";
    }
    throw std::invalid_argument("Decoder: unknown architecture value " +
                                std::to_string(static_cast<std::uint32_t>(value)));
}

std::optional<std::size_t> DecoderConfig::layer_window(std::size_t layer) const noexcept {
    if (!sliding_window)
        return std::nullopt;
    if (sliding_window_period != 0 && (layer + 1) % sliding_window_period == 0)
        return std::nullopt;
    return sliding_window;
}

DecoderConfig architecture_preset(DecoderArchitecture architecture,
                                  const DecoderConfig& dimensions) {
    (void)decoder_architecture_name(architecture);
    DecoderConfig c = dimensions;
    c.architecture = architecture;
    switch (architecture) {
        case DecoderArchitecture::Llama:
        case DecoderArchitecture::Mistral:
        case DecoderArchitecture::Phi3:
            break;
        case DecoderArchitecture::Qwen2:
            c.query_key_value_bias = true;
            break;
        case DecoderArchitecture::Qwen3:
            c.query_key_norm = true;
            break;
        case DecoderArchitecture::Gemma2:
            c.norm_weight_offset = true;
            c.post_block_norms = true;
            c.feed_forward_activation = GatedActivation::GeluTanh;
            c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.model_width)));
            if (c.sliding_window && c.sliding_window_period == 0)
                c.sliding_window_period = 2;  // local, global, local, ...
            if (c.attention_logit_softcap == 0.0F)
                c.attention_logit_softcap = 50.0F;
            if (c.final_logit_softcap == 0.0F)
                c.final_logit_softcap = 30.0F;
            break;
        case DecoderArchitecture::Gemma3:
            c.query_key_norm = true;
            c.norm_weight_offset = true;
            c.post_block_norms = true;
            c.feed_forward_activation = GatedActivation::GeluTanh;
            c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.model_width)));
            if (c.sliding_window && c.sliding_window_period == 0)
                c.sliding_window_period = 6;  // without a window every layer is dense
            if (c.rope_local_theta == 0.0)
                c.rope_local_theta = 10000.0;
            break;
        case DecoderArchitecture::Gpt2:
            c.positions = PositionEncoding::Learned;
            c.norm = NormKind::Layer;
            c.feed_forward = FeedForwardKind::Plain;
            c.plain_activation = Activation::GeluTanh;
            c.query_key_value_bias = true;
            c.output_bias = true;
            c.feed_forward_bias = true;
            c.head_bias = true;
            break;
    }
    return c;
}

void validate_decoder_config(const DecoderConfig& c) {
    const auto fail = [&](const std::string& what) {
        throw std::invalid_argument(describe(c, what));
    };
    (void)decoder_architecture_name(c.architecture);
    const std::pair<const char*, std::size_t> dimensions[] = {
        {"vocabulary_size", c.vocabulary_size},
        {"maximum_context", c.maximum_context},
        {"model_width", c.model_width},
        {"query_head_count", c.query_head_count},
        {"key_value_head_count", c.key_value_head_count},
        {"block_count", c.block_count},
        {"feed_forward_width", c.feed_forward_width}};
    for (const auto& [name, value] : dimensions) {
        if (value == 0)
            fail(std::string("every dimension must be positive (") + name + " is 0)");
    }
    if (c.head_width == 0 && c.model_width % c.query_head_count != 0)
        fail("model_width must be a multiple of query_head_count when head_width is not given");
    if (c.query_head_count % c.key_value_head_count != 0)
        fail("query_head_count must be a multiple of key_value_head_count");
    const auto known = [&](const char* field, auto value,
                           std::initializer_list<decltype(value)> known_values) {
        if (std::find(known_values.begin(), known_values.end(), value) == known_values.end())
            fail(std::string("unknown ") + field + " value " +
                 std::to_string(static_cast<std::uint32_t>(value)));
    };
    known("positions", c.positions, {PositionEncoding::Rotary, PositionEncoding::Learned});
    known("norm", c.norm, {NormKind::Rms, NormKind::Layer});
    known("feed_forward", c.feed_forward, {FeedForwardKind::Gated, FeedForwardKind::Plain});
    known("feed_forward_activation", c.feed_forward_activation,
          {GatedActivation::Silu, GatedActivation::GeluTanh});
    known("plain_activation", c.plain_activation,
          {Activation::Gelu, Activation::GeluTanh, Activation::Relu});
    const bool rotary = c.positions == PositionEncoding::Rotary;
    if (rotary && c.resolved_head_width() % 2 != 0) {
        fail("RoPE needs an even head width (got " + std::to_string(c.resolved_head_width()) + ")");
    }
    if (!rotary && c.rope_scaling.kind != RopeScalingKind::None) {
        fail(std::string("rope_scaling ") + rope_scaling_name(c.rope_scaling.kind) +
             " needs rotary positions (positions is learned)");
    }
    if (!rotary && c.rope_local_theta != 0.0)
        fail("rope_local_theta needs rotary positions (positions is learned)");
    if (c.norm == NormKind::Layer && c.norm_weight_offset)
        fail("norm_weight_offset (Gemma's (1 + w) form) needs norm rms, not layer");
    constexpr std::size_t id_limit = std::numeric_limits<std::uint32_t>::max();
    if (c.vocabulary_size - 1 > id_limit)
        fail("vocabulary ids must fit in uint32");
    if (c.maximum_context - 1 > id_limit)
        fail("positions must fit in uint32");
    tensor_ops::require_normalization_epsilon("Decoder", "rms_norm_epsilon", c.rms_norm_epsilon);
    const auto require_real = [&](const char* field, double value, bool zero_allowed) {
        if (!std::isfinite(value) || value < 0.0 || (!zero_allowed && value == 0.0)) {
            std::ostringstream what;
            what << field << " must be finite and " << (zero_allowed ? ">= 0" : "> 0") << " (got "
                 << value << ")";
            fail(what.str());
        }
    };
    require_real("rope_theta", c.rope_theta, false);
    require_real("rope_local_theta", c.rope_local_theta, true);
    require_real("embedding_scale", c.embedding_scale, true);
    require_real("attention_scale", c.attention_scale, true);
    require_real("attention_logit_softcap", c.attention_logit_softcap, true);
    require_real("final_logit_softcap", c.final_logit_softcap, true);
    if (c.sliding_window && *c.sliding_window == 0)
        fail("sliding_window must be positive when set (got 0)");
    if (c.sliding_window_period != 0 && !c.sliding_window) {
        fail("sliding_window_period " + std::to_string(c.sliding_window_period) +
             " needs a sliding_window");
    }
    if (rotary)
        require_rope_scaling("Decoder", c.resolved_head_width(), c.rope_scaling);
    require_parameter_bytes_fit(c);
}

namespace {

// A norm of `config`'s kind over width `width`: LayerNorm (scale, bias) or RMSNorm (scale, in
// Gemma's (1 + w) form when configured).
std::unique_ptr<Module> make_norm(const DecoderConfig& c, std::size_t width) {
    if (c.norm == NormKind::Layer)
        return std::make_unique<LayerNorm>(width, c.rms_norm_epsilon);
    return std::make_unique<RMSNorm>(width, c.rms_norm_epsilon, c.norm_weight_offset);
}

// `norm` (built by make_norm for a config whose norm is LayerNorm when `layer`) applied to x.
Variable normalize(bool layer, const Module* norm, const Variable& x) {
    return layer ? static_cast<const LayerNorm*>(norm)->forward(x)
                 : static_cast<const RMSNorm*>(norm)->forward(x);
}

}  // namespace

DecoderBlock::DecoderBlock(const DecoderConfig& c, std::size_t layer, std::mt19937& generator,
                           AttentionKind attention)
    : layer_norm_(c.norm == NormKind::Layer) {
    attention_norm_ = &register_module("attention_norm", make_norm(c, c.model_width));
    attention_ = &register_module(
        "attention",
        std::make_unique<GroupedQueryAttention>(attention_shape(c, layer), generator, attention));
    if (c.post_block_norms)
        post_attention_norm_ = &register_module("post_attention_norm", make_norm(c, c.model_width));
    feed_forward_norm_ = &register_module("feed_forward_norm", make_norm(c, c.model_width));
    if (c.feed_forward == FeedForwardKind::Gated) {
        gated_ = &register_module(
            "feed_forward",
            std::make_unique<SwiGLU>(c.model_width, c.feed_forward_width, generator,
                                     c.feed_forward_activation, c.feed_forward_bias));
    } else {
        plain_ = &register_module(
            "feed_forward",
            std::make_unique<FeedForward>(c.model_width, c.feed_forward_width, generator,
                                          c.plain_activation, c.feed_forward_bias));
    }
    if (c.post_block_norms) {
        post_feed_forward_norm_ =
            &register_module("post_feed_forward_norm", make_norm(c, c.model_width));
    }
}

Variable DecoderBlock::forward(
    const Variable& x, const RotaryTables& tables,
    const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const {
    return finish(
        x, attention_->forward(normalize(layer_norm_, attention_norm_, x), tables, documents));
}

Variable DecoderBlock::forward_incremental(const Variable& x, const RotaryTables& tables,
                                           std::size_t layer,
                                           IncrementalAttentionCache& cache) const {
    return finish(x, attention_->forward_incremental(normalize(layer_norm_, attention_norm_, x),
                                                     tables, layer, cache));
}

Variable DecoderBlock::feed_forward(const Variable& x) const {
    return gated_ != nullptr ? gated_->forward(x) : plain_->forward(x);
}

Variable DecoderBlock::finish(const Variable& x, Variable attention) const {
    if (post_attention_norm_ != nullptr)
        attention = normalize(layer_norm_, post_attention_norm_, attention);
    const Variable attended = x + attention;
    Variable mixed = feed_forward(normalize(layer_norm_, feed_forward_norm_, attended));
    if (post_feed_forward_norm_ != nullptr)
        mixed = normalize(layer_norm_, post_feed_forward_norm_, mixed);
    return attended + mixed;
}

Decoder::Decoder(const DecoderConfig& config, std::mt19937& generator, AttentionKind attention,
                 ActivationCheckpointing checkpointing)
    : Decoder("Decoder", config, generator, attention, checkpointing) {}

Decoder::Decoder(const char* model_name, const DecoderConfig& config, std::mt19937& generator,
                 AttentionKind attention, ActivationCheckpointing checkpointing)
    : CausalLanguageModel(model_name, checkpointing),
      name_(model_name),
      incremental_operation_(std::string(model_name) + "::forward_incremental"),
      config_(config),
      attention_(attention) {
    validate_decoder_config(config);
    require_attention_kind(model_name, attention);
    const DecoderConfig& c = config;
    token_embedding_ = &register_module(
        "token_embedding",
        std::make_unique<Embedding>(c.vocabulary_size, c.model_width, generator,
                                    DeferredWeightsScope::token_embedding_deferred()));
    if (c.positions == PositionEncoding::Learned) {
        position_embedding_ = &register_module(
            "position_embedding",
            std::make_unique<Embedding>(c.maximum_context, c.model_width, generator));
    }
    auto& blocks = register_module("blocks", std::make_unique<ModuleList>());
    for (std::size_t i = 0; i < c.block_count; ++i) {
        blocks_.push_back(
            &blocks.append(std::make_unique<DecoderBlock>(c, i, generator, attention)));
    }
    final_norm_ = &register_module("final_norm", make_norm(c, c.model_width));
    if (!c.tie_embeddings) {
        language_model_head_ = &register_module(
            "language_model_head",
            std::make_unique<Linear>(c.model_width, c.vocabulary_size, generator, c.head_bias));
    }
    const bool gated = c.feed_forward == FeedForwardKind::Gated;
    const std::initializer_list<LoraTarget> gated_targets = {
        LoraTarget::Query,           LoraTarget::Key,
        LoraTarget::Value,           LoraTarget::Output,
        LoraTarget::FeedForwardGate, LoraTarget::FeedForwardUp,
        LoraTarget::FeedForwardDown};
    const std::initializer_list<LoraTarget> plain_targets = {LoraTarget::Query,
                                                             LoraTarget::Key,
                                                             LoraTarget::Value,
                                                             LoraTarget::Output,
                                                             LoraTarget::FeedForwardExpand,
                                                             LoraTarget::FeedForwardProject};
    std::vector<AdaptableProjection> projections;
    for (std::size_t i = 0; i < c.block_count; ++i) {
        for (LoraTarget target : gated ? gated_targets : plain_targets) {
            std::string path =
                "blocks." + std::to_string(i) + "." + std::string(lora_target_name(target));
            auto* layer = dynamic_cast<Linear*>(find_module(path));
            if (layer == nullptr)
                throw std::logic_error(std::string(model_name) + ": no projection at " + path);
            projections.push_back({target, std::move(path), layer});
        }
    }
    if (language_model_head_ != nullptr) {
        projections.push_back(
            {LoraTarget::LanguageModelHead, "language_model_head", language_model_head_});
    }
    set_projections(std::move(projections));
    if (c.positions != PositionEncoding::Rotary)
        return;
    // The distinct RoPE frequency sets (Gemma 3: a dense and a windowed one), so a forward
    // computes each table once for all its blocks.
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
        const GroupedQueryAttention& layer = blocks_[i]->attention();
        std::size_t set = 0;
        while (set < rope_set_representative_.size()) {
            const GroupedQueryAttention& other =
                blocks_[rope_set_representative_[set]]->attention();
            if (other.rotary_frequencies() == layer.rotary_frequencies() &&
                other.rotary_magnitude() == layer.rotary_magnitude())
                break;
            ++set;
        }
        if (set == rope_set_representative_.size())
            rope_set_representative_.push_back(i);
        rope_set_of_.push_back(set);
    }
}

Variable Decoder::embed(const IndexTensor& ids, const IndexTensor* positions) const {
    Variable embedded = token_embedding_->forward(ids);
    if (config_.embedding_scale != 0.0F)
        embedded = embedded * config_.embedding_scale;
    if (position_embedding_ == nullptr)
        return embedded;
    if (positions != nullptr)  // [R,D] + [R,D], or packed rows [B,T,D] + [B,T,D]
        return embedded + position_embedding_->forward(*positions);
    // [B,T,D]: positions 0..T-1 restart in every batch row, so their embeddings are the first T
    // rows of the table, broadcast over B.
    const std::size_t time = ids.shape()[1];
    return embedded +
           broadcast_to(slice(position_embedding_->weight(), 0, 0, time), embedded.shape());
}

std::vector<RotaryTables> Decoder::tables_for(std::span<const std::size_t> positions,
                                              ExecutionBackend backend) const {
    if (config_.positions != PositionEncoding::Rotary)
        return std::vector<RotaryTables>(blocks_.size());
    std::vector<RotaryTables> sets;
    sets.reserve(rope_set_representative_.size());
    for (const std::size_t block : rope_set_representative_)
        sets.push_back(blocks_[block]->attention().rotary_tables_for(positions, backend));
    std::vector<RotaryTables> tables;
    tables.reserve(blocks_.size());
    for (const std::size_t set : rope_set_of_)
        tables.push_back(sets[set]);
    return tables;
}

void Decoder::set_attention(AttentionKind kind) {
    require_attention_kind(name_, kind);
    for (DecoderBlock* block : blocks_)
        block->set_attention(kind);
    attention_ = kind;
}

AdaptableProjection Decoder::attach_untied_head() {
    // The constructor registers the head (weight, then its bias when configured) last, so
    // appending it here gives the parameter order of a model built untied.
    // Everything that can throw happens before the head is registered.
    AdaptableProjection projection{LoraTarget::LanguageModelHead, "language_model_head", nullptr};
    const Tensor& table = token_embedding_->weight().value();
    std::optional<Tensor> bias;
    if (config_.head_bias)
        bias = Tensor::zeros({config_.vocabulary_size}, table.backend());
    auto head = std::make_unique<Linear>(table, std::move(bias));
    language_model_head_ = &register_module("language_model_head", std::move(head));
    projection.linear = language_model_head_;
    config_.tie_embeddings = false;
    return projection;
}

IncrementalCacheShape Decoder::incremental_cache_shape() const noexcept {
    const DecoderConfig& c = config_;
    return {c.block_count, c.key_value_head_count, c.resolved_head_width(), c.maximum_context};
}

Variable Decoder::forward_checked(
    const IndexTensor& tokens,
    const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const {
    Variable hidden;  // [B,T,D]
    std::vector<std::size_t> positions;
    if (documents == nullptr) {
        hidden = embed(tokens, nullptr);
        // The RoPE tables (positions 0..T-1), computed once per frequency set for every block.
        positions.resize(tokens.shape()[1]);
        std::iota(positions.begin(), positions.end(), std::size_t{0});
    } else {
        // Packed rows: every token at its position inside its document ([B,T] learned-position
        // ids; B·T RoPE table rows).
        if (position_embedding_ != nullptr) {
            const IndexTensor position_ids(tokens.shape(), documents->positions, backend());
            hidden = embed(tokens, &position_ids);
        } else {
            hidden = embed(tokens, nullptr);
        }
        positions.assign(documents->positions.begin(), documents->positions.end());
    }
    const std::vector<RotaryTables> tables = tables_for(positions, backend());
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
        const DecoderBlock* block = blocks_[index];
        hidden = run_block(*block, index, hidden,
                           [block, layer_tables = tables[index], documents](const Variable& input) {
                               return block->forward(input, layer_tables, documents);
                           });
    }
    // [B,T,D] -> [B,T,V], soft-capped when the family caps its logits (Gemma 2)
    const bool layer_norm = config_.norm == NormKind::Layer;
    const Variable logits = language_model_logits(normalize(layer_norm, final_norm_, hidden),
                                                  language_model_head_, *token_embedding_);
    return config_.final_logit_softcap != 0.0F ? soft_cap(logits, config_.final_logit_softcap)
                                               : logits;
}

Tensor Decoder::forward_incremental(std::span<const std::uint32_t> tokens,
                                    std::span<const std::size_t> positions,
                                    IncrementalAttentionCache& cache,
                                    std::span<const std::size_t> output_rows) const {
    const std::string& op = incremental_operation_;
    require_incremental_rows(op.c_str(), tokens, positions, output_rows);
    const std::size_t rows = tokens.size();
    const NoGradientGuard no_graph;
    const ExecutionBackend device = backend();
    Variable hidden;  // [R,D]
    if (position_embedding_ != nullptr) {
        const std::vector<std::uint32_t> position_ids(positions.begin(), positions.end());
        const IndexTensor position_rows({rows}, position_ids, device);
        hidden = embed(IndexTensor({rows}, tokens, device), &position_rows);
    } else {
        hidden = embed(IndexTensor({rows}, tokens, device), nullptr);
    }
    // The RoPE tables (row r at positions[r]), once per frequency set for every block.
    const std::vector<RotaryTables> tables = tables_for(positions, device);
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
        try {
            hidden = blocks_[index]->forward_incremental(hidden, tables[index], index, cache);
        } catch (const std::domain_error& error) {
            throw std::domain_error(op + ": non-finite activations in block " +
                                    std::to_string(index) + ": " + error.what());
        }
    }
    hidden = select_rows(hidden, output_rows);
    const bool layer_norm = config_.norm == NormKind::Layer;
    const Tensor logits = language_model_logits(normalize(layer_norm, final_norm_, hidden),
                                                language_model_head_, *token_embedding_)
                              .value();
    return config_.final_logit_softcap != 0.0F
               ? tensor_ops::soft_cap(logits, config_.final_logit_softcap)
               : logits;
}

}  // namespace riftco_transformer
