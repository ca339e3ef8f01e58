#include "riftco_transformer/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "riftco_transformer/core/autograd/custom_gradient.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"

namespace riftco_transformer {
namespace {

std::string describe(const TransformerDimensions& d, const std::string& what) {
    std::ostringstream message;
    message << "DecoderOnlyTransformer: " << what << " (V=" << d.vocabulary_size
            << ", C=" << d.maximum_context << ", D=" << d.model_width << ", H=" << d.head_count
            << ", N=" << d.block_count << ", F=" << d.feed_forward_width << ")";
    return message.str();
}

// Running float32 byte total of a set of parameters, overflow-checked and bounded by
// max_transformer_parameter_bytes; the first parameter that passes the bound is named with
// the config fields that size it.
class ParameterBytes {
  public:
    explicit ParameterBytes(const TransformerDimensions& dimensions) : dimensions_(dimensions) {}

    // A parameter of rows·columns float32 values.
    void add(std::size_t rows, std::size_t columns, const char* parameter, const char* fields) {
        constexpr std::size_t limit = max_transformer_parameter_bytes;
        // rows, columns > 0 (validated first); rows·columns·4 <= limit cannot overflow.
        const bool fits = rows <= limit / sizeof(float) / columns &&
                          rows * columns * sizeof(float) <= limit - bytes_;
        if (!fits) {
            std::ostringstream what;
            what << fields << " too large: " << parameter << " (" << rows << " x " << columns
                 << " float32 values) takes the parameters past the limit of " << limit
                 << " bytes (2^47)";
            throw std::overflow_error(describe(dimensions_, what.str()));
        }
        bytes_ += rows * columns * sizeof(float);
    }

    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

  private:
    const TransformerDimensions& dimensions_;
    std::size_t bytes_ = 0;
};

// Every parameter of the config, in the contract order, counted before anything is allocated
// (a block_count of 2^40 must fail at once, not after minutes of allocating blocks).
void require_parameter_bytes_fit(const TransformerDimensions& d, bool tied) {
    const std::size_t V = d.vocabulary_size;
    const std::size_t C = d.maximum_context;
    const std::size_t D = d.model_width;
    const std::size_t F = d.feed_forward_width;
    ParameterBytes outside_blocks(d);
    outside_blocks.add(V, D, "token_embedding.weight", "vocabulary_size/model_width");
    outside_blocks.add(C, D, "position_embedding.weight", "maximum_context/model_width");
    outside_blocks.add(2, D, "final_norm.{scale,bias}", "model_width");
    if (!tied) {
        outside_blocks.add(D, V, "language_model_head.weight", "vocabulary_size/model_width");
        outside_blocks.add(1, V, "language_model_head.bias", "vocabulary_size");
    }

    ParameterBytes block(d);  // one block: 4D² + 2DF + 9D + F values
    block.add(2, D, "blocks.{i}.attention_norm.{scale,bias}", "model_width");
    block.add(4, D, "blocks.{i}.attention.{query,key,value,output}.bias", "model_width");
    for (const char* projection :
         {"blocks.{i}.attention.query.weight", "blocks.{i}.attention.key.weight",
          "blocks.{i}.attention.value.weight", "blocks.{i}.attention.output.weight"}) {
        block.add(D, D, projection, "model_width");
    }
    block.add(2, D, "blocks.{i}.feed_forward_norm.{scale,bias}", "model_width");
    block.add(D, F, "blocks.{i}.feed_forward.expand.weight", "model_width/feed_forward_width");
    block.add(1, F, "blocks.{i}.feed_forward.expand.bias", "feed_forward_width");
    block.add(F, D, "blocks.{i}.feed_forward.project.weight", "model_width/feed_forward_width");
    block.add(1, D, "blocks.{i}.feed_forward.project.bias", "model_width");

    const std::size_t room = max_transformer_parameter_bytes - outside_blocks.bytes();
    if (d.block_count > room / block.bytes()) {
        std::ostringstream what;
        what << "block_count " << d.block_count << " too large: blocks of " << block.bytes()
             << " bytes each, plus " << outside_blocks.bytes()
             << " bytes outside the blocks, pass the parameter limit of "
             << max_transformer_parameter_bytes << " bytes (2^47); at most " << room / block.bytes()
             << " blocks fit";
        throw std::overflow_error(describe(d, what.str()));
    }
}

void validate(const TransformerDimensions& d, float epsilon, const DecoderOptions& options) {
    const auto fail = [&](const std::string& what) {
        throw std::invalid_argument(describe(d, what));
    };
    if (d.vocabulary_size == 0 || d.maximum_context == 0 || d.model_width == 0 ||
        d.head_count == 0 || d.block_count == 0 || d.feed_forward_width == 0) {
        fail("every dimension must be positive");
    }
    if (d.model_width % d.head_count != 0)
        fail("model_width must be a multiple of head_count");
    constexpr std::size_t id_limit = std::numeric_limits<std::uint32_t>::max();
    if (d.vocabulary_size - 1 > id_limit)
        fail("vocabulary ids must fit in uint32");
    if (d.maximum_context - 1 > id_limit)
        fail("positions must fit in uint32");
    tensor_ops::require_normalization_epsilon("DecoderOnlyTransformer", "layer_norm_epsilon",
                                              epsilon);
    const Activation activation = options.feed_forward_activation;
    if (activation != Activation::Gelu && activation != Activation::GeluTanh &&
        activation != Activation::Relu) {
        fail("unknown feed_forward_activation value " +
             std::to_string(static_cast<std::uint32_t>(activation)));
    }
    require_parameter_bytes_fit(d, options.tie_embeddings);
}

}  // namespace

TransformerBlock::TransformerBlock(const TransformerDimensions& d, std::mt19937& generator,
                                   float layer_norm_epsilon, AttentionKind attention,
                                   Activation feed_forward_activation) {
    attention_norm_ = &register_module(
        "attention_norm", std::make_unique<LayerNorm>(d.model_width, layer_norm_epsilon));
    attention_ = &register_module(
        "attention",
        std::make_unique<CausalSelfAttention>(d.model_width, d.head_count, generator, attention));
    feed_forward_norm_ = &register_module(
        "feed_forward_norm", std::make_unique<LayerNorm>(d.model_width, layer_norm_epsilon));
    feed_forward_ = &register_module(
        "feed_forward", std::make_unique<FeedForward>(d.model_width, d.feed_forward_width,
                                                      generator, feed_forward_activation));
}

Variable TransformerBlock::forward(const Variable& x) const {
    const Variable attended = x + attention_->forward(attention_norm_->forward(x));
    return attended + feed_forward_->forward(feed_forward_norm_->forward(attended));
}

Variable TransformerBlock::forward_incremental(const Variable& x, std::size_t layer,
                                               IncrementalAttentionCache& cache) const {
    const Variable attended =
        x + attention_->forward_incremental(attention_norm_->forward(x), layer, cache);
    return attended + feed_forward_->forward(feed_forward_norm_->forward(attended));
}

DecoderOnlyTransformer::DecoderOnlyTransformer(const TransformerDimensions& dimensions,
                                               std::mt19937& generator, float layer_norm_epsilon,
                                               AttentionKind attention,
                                               ActivationCheckpointing checkpointing,
                                               const DecoderOptions& options)
    : CausalLanguageModel("DecoderOnlyTransformer", checkpointing),
      dimensions_(dimensions),
      options_(options),
      attention_(attention) {
    validate(dimensions, layer_norm_epsilon, options);
    require_attention_kind("DecoderOnlyTransformer", attention);
    const TransformerDimensions& d = dimensions;
    token_embedding_ =
        &register_module("token_embedding",
                         std::make_unique<Embedding>(d.vocabulary_size, d.model_width, generator));
    position_embedding_ =
        &register_module("position_embedding",
                         std::make_unique<Embedding>(d.maximum_context, d.model_width, generator));
    auto& blocks = register_module("blocks", std::make_unique<ModuleList>());
    for (std::size_t i = 0; i < d.block_count; ++i) {
        blocks_.push_back(&blocks.append(std::make_unique<TransformerBlock>(
            d, generator, layer_norm_epsilon, attention, options.feed_forward_activation)));
    }
    final_norm_ = &register_module("final_norm",
                                   std::make_unique<LayerNorm>(d.model_width, layer_norm_epsilon));
    if (!options.tie_embeddings) {
        language_model_head_ =
            &register_module("language_model_head",
                             std::make_unique<Linear>(d.model_width, d.vocabulary_size, generator));
    }
    std::vector<AdaptableProjection> projections;
    for (std::size_t i = 0; i < d.block_count; ++i) {
        for (LoraTarget target :
             {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value, LoraTarget::Output,
              LoraTarget::FeedForwardExpand, LoraTarget::FeedForwardProject}) {
            std::string path =
                "blocks." + std::to_string(i) + "." + std::string(lora_target_name(target));
            auto* layer = dynamic_cast<Linear*>(find_module(path));
            projections.push_back({target, std::move(path), layer});
        }
    }
    if (language_model_head_ != nullptr) {
        projections.push_back(
            {LoraTarget::LanguageModelHead, "language_model_head", language_model_head_});
    }
    set_projections(std::move(projections));
}

void DecoderOnlyTransformer::set_attention(AttentionKind kind) {
    require_attention_kind("DecoderOnlyTransformer", kind);
    for (TransformerBlock* block : blocks_)
        block->set_attention(kind);
    attention_ = kind;
}

Variable DecoderOnlyTransformer::forward_checked(const IndexTensor& tokens) const {
    const Shape& shape = tokens.shape();
    const std::size_t time = shape[1];
    // [B,T] -> [B,T,D]: token rows gathered on the backend; positions 0..T-1 restart in every
    // batch row, so their embeddings are the first T rows of the table, broadcast over B.
    const Variable tokens_embedded = token_embedding_->forward(tokens);
    Variable hidden =
        tokens_embedded +
        broadcast_to(slice(position_embedding_->weight(), 0, 0, time), tokens_embedded.shape());
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
        const TransformerBlock* block = blocks_[index];
        hidden = run_block(*block, index, hidden,
                           [block](const Variable& input) { return block->forward(input); });
    }
    // [B,T,D] -> [B,T,V]
    return language_model_logits(final_norm_->forward(hidden), language_model_head_,
                                 *token_embedding_);
}

AdaptableProjection DecoderOnlyTransformer::attach_untied_head() {
    // The constructor registers the head (weight, then a zero bias) last, so appending it
    // here gives the parameter order of a model built untied.
    // Everything that can throw happens before the head is registered.
    AdaptableProjection projection{LoraTarget::LanguageModelHead, "language_model_head", nullptr};
    const Tensor& table = token_embedding_->weight().value();
    auto head = std::make_unique<Linear>(
        table, Tensor::zeros({dimensions_.vocabulary_size}, table.backend()));
    language_model_head_ = &register_module("language_model_head", std::move(head));
    projection.linear = language_model_head_;
    options_.tie_embeddings = false;
    return projection;
}

IncrementalCacheShape DecoderOnlyTransformer::incremental_cache_shape() const noexcept {
    const TransformerDimensions& d = dimensions_;
    return {d.block_count, d.head_count, d.model_width / d.head_count, d.maximum_context};
}

Tensor DecoderOnlyTransformer::forward_incremental(std::span<const std::uint32_t> tokens,
                                                   std::span<const std::size_t> positions,
                                                   IncrementalAttentionCache& cache,
                                                   std::span<const std::size_t> output_rows) const {
    require_incremental_rows("DecoderOnlyTransformer::forward_incremental", tokens, positions,
                             output_rows);
    constexpr const char* op = "DecoderOnlyTransformer::forward_incremental";
    const std::size_t rows = tokens.size();
    const NoGradientGuard no_graph;
    const ExecutionBackend device = backend();
    const std::vector<std::uint32_t> position_ids(positions.begin(), positions.end());
    const IndexTensor token_ids({rows}, tokens, device);
    const IndexTensor position_rows({rows}, position_ids, device);
    // h0 = E_tok[id] + E_pos[position], [R, D]
    Variable hidden =
        token_embedding_->forward(token_ids) + position_embedding_->forward(position_rows);
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
        try {
            hidden = blocks_[index]->forward_incremental(hidden, index, cache);
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
