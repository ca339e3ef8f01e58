#pragma once
// The GPT-2-style decoder (docs/ARCHITECTURE.md, 'The decoder'; schema "riftco_decoder_v1"), a
// view of the one Decoder with the gpt2 preset (model/decoder.hpp):
//   h0 = E_tok[id] + E_pos[t]          learned absolute positions 0..T-1 in every row
//   a  = x + Attn(LN1(x))              pre-norm blocks
//   y  = a + FFN(LN2(a))               FFN: expand, exact-erf GELU, project
//   logits = LMHead(LN_final(h_N))     biased head, no weight tying
// Parameters, in order: token_embedding.weight, position_embedding.weight, then per block
// blocks.{i}.attention_norm.{scale,bias}, attention.{query,key,value,output}.{weight,bias},
// feed_forward_norm.{scale,bias}, feed_forward.{expand,project}.{weight,bias}; then
// final_norm.{scale,bias}, language_model_head.{weight,bias}.
// Count: 2VD + CD + N(4D² + 2DF + 9D + F) + 2D + V (19,419 for V=27, C=16, D=32, N=2, F=64).
// Random draws, in order: token embedding, position embedding, per block query, key, value,
// output, expand, project; LM head.
// DecoderOptions (additions for GPT-2 checkpoints): the FFN activation may be GELU in
// its tanh form (or ReLU), and the head may be tied to the token embedding (logits = h·Eᵀ,
// no language_model_head parameters and so no head bias; count VD + CD + N(...) + 2D,
// and the head's draw is skipped). The defaults are exactly the decoder above.
// These are the Decoder's own parameters, draws and forward: gpt_decoder_config gives the
// DecoderConfig, and a Decoder built from it is the same model.

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "riftco_transformer/model/causal_language_model.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

struct TransformerDimensions {
    std::size_t vocabulary_size = 0;     // V
    std::size_t maximum_context = 0;     // C
    std::size_t model_width = 0;         // D
    std::size_t head_count = 0;          // H
    std::size_t block_count = 0;         // N
    std::size_t feed_forward_width = 0;  // F
};

struct DecoderOptions {
    Activation feed_forward_activation = Activation::Gelu;  // Gelu (exact erf), GeluTanh, Relu
    bool tie_embeddings = false;  // the head reads token_embedding.weight; no head parameters
};

// The Decoder configuration of this GPT decoder: architecture gpt2 (learned positions,
// LayerNorm, the plain biased feed-forward, biased projections and head) with H key/value heads
// of D/H, ε = layer_norm_epsilon, and the options' activation and tying. The rules of the
// constructor below (its messages), checked first.
[[nodiscard]] DecoderConfig gpt_decoder_config(const TransformerDimensions& dimensions,
                                               float layer_norm_epsilon,
                                               const DecoderOptions& options = {});

class DecoderOnlyTransformer final : public Decoder {
  public:
    // Any zero dimension, D % H != 0, V−1 or C−1 not representable as uint32, eps not finite
    // or not > 0, an unknown policy or activation value: std::invalid_argument. Parameters that
    // need more than max_transformer_parameter_bytes (overflow-checked; the message names the
    // field, e.g. block_count): std::overflow_error, thrown before anything is allocated or drawn.
    DecoderOnlyTransformer(
        const TransformerDimensions& dimensions, std::mt19937& generator,
        float layer_norm_epsilon = 1e-5F, AttentionKind attention = AttentionKind::Materialized,
        ActivationCheckpointing checkpointing = ActivationCheckpointing::Disabled,
        const DecoderOptions& options = {});

    // Everything else is the Decoder's: forward, forward_incremental (the KV-cached inference
    // path), incremental_cache_shape (N layers of H heads of D/H, capacity C), attention kinds,
    // checkpointing, untie_embeddings (the new head gets a zero bias), LoRA and NF4. LoRA
    // targets: attention.{query,key,value,output}, feed_forward.{expand,project}, and
    // language_model_head unless tied; quantize_nf4 packs all 6N projections (block order q,
    // k, v, o, expand, project) and the untied head. Messages name "DecoderOnlyTransformer".

    // Read from the Decoder's config (H is its query head count); the options follow
    // untie_embeddings.
    [[nodiscard]] TransformerDimensions dimensions() const noexcept {
        const DecoderConfig& c = config();
        return {c.vocabulary_size,  c.maximum_context, c.model_width,
                c.query_head_count, c.block_count,     c.feed_forward_width};
    }
    [[nodiscard]] DecoderOptions options() const noexcept {
        return {config().plain_activation, config().tie_embeddings};
    }
};

}  // namespace riftco_transformer
