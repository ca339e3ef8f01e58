#pragma once
// The GPT-2-style decoder (docs/ARCHITECTURE.md, 'The GPT decoder'; schema "riftco_decoder_v1"):
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

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "riftco_transformer/model/causal_language_model.hpp"
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

class TransformerBlock final : public Module {
  public:
    TransformerBlock(const TransformerDimensions& dimensions, std::mt19937& generator,
                     float layer_norm_epsilon, AttentionKind attention,
                     Activation feed_forward_activation = Activation::Gelu);
    // x [B,T,D] -> [B,T,D]
    [[nodiscard]] Variable forward(const Variable& x) const;
    // The incremental form over R independent rows: x [R,D] -> [R,D] (no graph).
    [[nodiscard]] Variable forward_incremental(const Variable& x, std::size_t layer,
                                               IncrementalAttentionCache& cache) const;
    void set_attention(AttentionKind kind) { attention_->set_kind(kind); }

  private:
    LayerNorm* attention_norm_;
    CausalSelfAttention* attention_;
    LayerNorm* feed_forward_norm_;
    FeedForward* feed_forward_;
};

// The most float32 parameter storage a config may ask for: 2^47 bytes (128 TiB), the user
// address space of x86-64 and AArch64 with 48-bit virtual addresses, so no larger model could
// ever be allocated. Checked over every parameter before anything is allocated.
inline constexpr std::size_t max_transformer_parameter_bytes = std::size_t{1} << 47;

class DecoderOnlyTransformer final : public CausalLanguageModel {
  public:
    // Any zero dimension, D % H != 0, V−1 or C−1 not representable as uint32, eps not finite
    // or not > 0, an unknown policy or activation value: std::invalid_argument. Parameters that need more
    // than max_transformer_parameter_bytes (overflow-checked; the message names the field,
    // e.g. block_count): std::overflow_error, thrown before anything is allocated or drawn.
    DecoderOnlyTransformer(
        const TransformerDimensions& dimensions, std::mt19937& generator,
        float layer_norm_epsilon = 1e-5F, AttentionKind attention = AttentionKind::Materialized,
        ActivationCheckpointing checkpointing = ActivationCheckpointing::Disabled,
        const DecoderOptions& options = {});

    // forward(tokens, shape) and forward(IndexTensor) are CausalLanguageModel's: token ids
    // [B,T] -> logits [B,T,V] with its argument rules.

    // The inference path (docs/ARCHITECTURE.md, 'Decoding and KV caches') on the same weights: R
    // independent rows in one pass, row r being token tokens[r] at absolute position positions[r],
    // with `cache` holding every layer's keys and values (serving/decode_session.hpp drives it).
    // Records no graph. Returns the logits [n, V] of the rows listed in output_rows (detached), so
    // a prefill chunk pays for the LM head only where logits are wanted.
    // std::invalid_argument: no rows, tokens/positions of different lengths, a position >= C,
    // no output row or one >= R; std::out_of_range: a token id >= V.
    [[nodiscard]] Tensor forward_incremental(std::span<const std::uint32_t> tokens,
                                             std::span<const std::size_t> positions,
                                             IncrementalAttentionCache& cache,
                                             std::span<const std::size_t> output_rows) const override;
    // N layers of H heads of D/H, capacity C.
    [[nodiscard]] IncrementalCacheShape incremental_cache_shape() const noexcept override;
    [[nodiscard]] std::size_t vocabulary_size() const noexcept override {
        return dimensions_.vocabulary_size;
    }

    [[nodiscard]] const TransformerDimensions& dimensions() const noexcept { return dimensions_; }
    [[nodiscard]] const DecoderOptions& options() const noexcept { return options_; }
    [[nodiscard]] std::size_t maximum_context() const noexcept override {
        return dimensions_.maximum_context;
    }
    [[nodiscard]] AttentionKind attention() const noexcept override { return attention_; }
    void set_attention(AttentionKind kind) override;
    [[nodiscard]] const char* model_name() const noexcept override {
        return "DecoderOnlyTransformer";
    }
    [[nodiscard]] bool embeddings_tied() const noexcept override { return options_.tie_embeddings; }
    // LoRA and NF4 are CausalLanguageModel's. Targets available here:
    // attention.{query,key,value,output}, feed_forward.{expand,project}, and
    // language_model_head unless tied; quantize_nf4 packs all 6N projections (block order q,
    // k, v, o, expand, project) and the untied head.

  protected:
    [[nodiscard]] Variable forward_checked(const IndexTensor& tokens) const override;
    [[nodiscard]] AdaptableProjection attach_untied_head() override;

  private:
    TransformerDimensions dimensions_;
    DecoderOptions options_;
    AttentionKind attention_;
    Embedding* token_embedding_;
    Embedding* position_embedding_;
    std::vector<TransformerBlock*> blocks_;
    LayerNorm* final_norm_;
    Linear* language_model_head_ = nullptr;  // null when tied
};

}  // namespace riftco_transformer
