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

DecoderConfig gpt_decoder_config(const TransformerDimensions& dimensions, float layer_norm_epsilon,
                                 const DecoderOptions& options) {
    validate(dimensions, layer_norm_epsilon, options);
    DecoderConfig c;
    c.vocabulary_size = dimensions.vocabulary_size;
    c.maximum_context = dimensions.maximum_context;
    c.model_width = dimensions.model_width;
    c.query_head_count = dimensions.head_count;
    c.key_value_head_count = dimensions.head_count;
    c.block_count = dimensions.block_count;
    c.feed_forward_width = dimensions.feed_forward_width;
    c.rms_norm_epsilon = layer_norm_epsilon;
    c.tie_embeddings = options.tie_embeddings;
    c = architecture_preset(DecoderArchitecture::Gpt2, c);
    c.plain_activation = options.feed_forward_activation;
    return c;
}

DecoderOnlyTransformer::DecoderOnlyTransformer(const TransformerDimensions& dimensions,
                                               std::mt19937& generator, float layer_norm_epsilon,
                                               AttentionKind attention,
                                               ActivationCheckpointing checkpointing,
                                               const DecoderOptions& options)
    : Decoder("DecoderOnlyTransformer", gpt_decoder_config(dimensions, layer_norm_epsilon, options),
              generator, attention, checkpointing) {}

}  // namespace riftco_transformer
