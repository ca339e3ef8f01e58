#pragma once
// The one decoder (docs/ARCHITECTURE.md, 'The decoder'): every supported family (GPT-2, Llama 2/3,
// Mistral, Qwen 2/2.5, Qwen 3, Gemma 2, Gemma 3, Phi-3) is a preset of orthogonal choices in
// DecoderConfig. The base is Llama:
//   h0 = E_tok[id]                               no position table: RoPE inside attention
//   a  = x + GQA(RMSNorm(x))                     pre-norm blocks, bias-free projections
//   y  = a + SwiGLU(RMSNorm(a))                  down(silu(gate(a)) ⊙ up(a))
//   logits = RMSNorm(h_N) · Wᵀ                   W = language_model_head.weight, or E_tok when
//                                                embeddings are tied (no head parameter)
// Parameters, in order: token_embedding.weight; position_embedding.weight (learned positions);
// per block blocks.{i}.attention_norm.scale (and .bias with LayerNorm),
// attention.{query,key,value,output}.weight (each followed by its .bias when configured),
// feed_forward_norm, feed_forward.{gate,up,down} (gated) or feed_forward.{expand,project}
// (plain); final_norm; language_model_head.weight (untied; then .bias with head_bias).
// Random draws, in order: token embedding; position embedding; per block q, k, v, o, then the
// feed-forward's projections in that order; head. Biases and norms start at zero/one (no draw).
//
// Beyond a minimal Llama/Mistral: tied embeddings, any RoPE θ, Mistral's sliding window below the
// context (materialized attention masks it), flash attention, block checkpointing, LoRA and
// NF4 on every projection by name, and the incremental (KV-cached) forward.
//
// The family choices (each off by default, so a config of Llama's fields is Llama exactly):
//   positions: RoPE (inside attention) or a learned table added to the token embedding (GPT-2;
//     then θ, rope_scaling and the local θ are not used, and the head width may be odd);
//   norm: RMSNorm or LayerNorm (scale and bias; GPT-2), for every norm of the model;
//   feed_forward: gated (gate/up/down with feed_forward_activation) or plain
//     (project(act(expand(x))) with plain_activation: exact-erf GELU, tanh-GELU, ReLU; GPT-2);
//   head_width d independent of D/Hq (q: D -> Hq·d, o: Hq·d -> D);
//   query_key_value_bias: biases on q, k, v (Qwen 2, GPT-2), registered after each weight;
//   output_bias, feed_forward_bias: biases on the attention output and on every feed-forward
//     projection (GPT-2); head_bias: a bias on the untied head (GPT-2; not read while tied, and
//     untie_embeddings gives the new head a zero bias);
//   query_key_norm: RMSNorm over each head's d values of q and k before RoPE (Qwen 3,
//     Gemma 3), parameters attention.{query,key}_norm.scale [d] after attention.output;
//   norm_weight_offset: every RMSNorm in Gemma's y = x̂·(1 + w) form (w stored, zeros at init);
//   post_block_norms: post_attention_norm after the attention and post_feed_forward_norm
//     after the feed-forward, before each residual add (Gemma 2/3);
//   feed_forward_activation: SiLU (SwiGLU) or tanh-GELU (GeGLU, Gemma);
//   embedding_scale: h0 = s·E_tok[id] (Gemma: float32(√D)); 0 means 1;
//   attention_scale: scores = s·q·k (Gemma: query_pre_attn_scalar^(−1/2)); 0 means 1/√d;
//   sliding_window_period p: with a window and p > 0, layer i is dense when (i+1) % p == 0
//     and windowed otherwise (Gemma 3: p = 6); p = 0 windows every layer (Mistral);
//   rope_local_theta: θ of the windowed layers, unscaled (Gemma 3: 10000); 0: rope_theta;
//   rope_scaling: linear, Llama 3's rule, or explicit per-frequency factors (nn/rotary_embedding);
//   attention_logit_softcap c: every attention score s becomes c·tanh(s/c) (Gemma 2: 50), in
//     flash, materialized and cached attention; 0: none;
//   final_logit_softcap c: logits c·tanh(z/c) (Gemma 2: 30), in the forward and in decoding;
//     0: none.
// Each choice is resolved once, when a block is built: the forward has no per-element branch.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/model/causal_language_model.hpp"
#include "riftco_transformer/nn/grouped_query_attention.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

// The most float32 parameter storage a config may ask for: 2^47 bytes (128 TiB), the user
// address space of x86-64 and AArch64 with 48-bit virtual addresses, so no larger model could
// ever be allocated. Checked over every parameter before anything is allocated.
inline constexpr std::size_t max_transformer_parameter_bytes = std::size_t{1} << 47;

// Stable ABI values (C ABI 2.8; Qwen 2 onwards 2.10; GPT-2 2.12): never renumber. The
// architecture names the family (what import, export and chat formats follow); the model's
// structure is the config's choices, which architecture_preset fills in.
enum class DecoderArchitecture : std::uint32_t {
    Llama = 0,
    Mistral = 1,
    Qwen2 = 2,
    Qwen3 = 3,
    Gemma2 = 4,  // 2.11
    Gemma3 = 5,
    Phi3 = 6,
    Gpt2 = 7,  // 2.12
};

// How positions enter, which norm, which feed-forward (stable ABI values, C ABI 2.12).
enum class PositionEncoding : std::uint32_t { Rotary = 0, Learned = 1 };
enum class NormKind : std::uint32_t { Rms = 0, Layer = 1 };
enum class FeedForwardKind : std::uint32_t { Gated = 0, Plain = 1 };

// "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2" (GGUF's
// general.architecture values); unknown value: std::invalid_argument.
[[nodiscard]] std::string_view decoder_architecture_name(DecoderArchitecture value);

struct DecoderConfig {
    DecoderArchitecture architecture = DecoderArchitecture::Llama;
    std::size_t vocabulary_size = 0;       // V
    std::size_t maximum_context = 0;       // C
    std::size_t model_width = 0;           // D
    std::size_t query_head_count = 0;      // Hq
    std::size_t key_value_head_count = 0;  // Hkv
    std::size_t block_count = 0;           // N
    std::size_t feed_forward_width = 0;    // F
    float rms_norm_epsilon = 1e-5F;        // ε of every norm, RMSNorm or LayerNorm
    double rope_theta = 10000.0;
    std::optional<std::size_t> sliding_window;  // Mistral; a window >= C is dense attention
    bool tie_embeddings = false;
    // The family choices (header comment); defaults are Llama's.
    std::size_t head_width = 0;  // 0: D/Hq
    bool query_key_value_bias = false;
    bool query_key_norm = false;
    bool norm_weight_offset = false;
    bool post_block_norms = false;
    GatedActivation feed_forward_activation = GatedActivation::Silu;
    float embedding_scale = 0.0F;
    float attention_scale = 0.0F;
    std::size_t sliding_window_period = 0;
    double rope_local_theta = 0.0;
    RopeScaling rope_scaling;
    float attention_logit_softcap = 0.0F;  // 0: none (Gemma 2: 50)
    float final_logit_softcap = 0.0F;      // 0: none (Gemma 2: 30)
    PositionEncoding positions = PositionEncoding::Rotary;
    NormKind norm = NormKind::Rms;
    FeedForwardKind feed_forward = FeedForwardKind::Gated;
    Activation plain_activation = Activation::Gelu;  // the plain feed-forward's
    bool output_bias = false;
    bool feed_forward_bias = false;
    bool head_bias = false;  // the untied head's; not read while tied

    // d: head_width, or D/Hq when it is 0.
    [[nodiscard]] std::size_t resolved_head_width() const noexcept {
        return head_width != 0 ? head_width
                               : (query_head_count != 0 ? model_width / query_head_count : 0);
    }
    // The sliding window of layer `layer` (none for a dense layer).
    [[nodiscard]] std::optional<std::size_t> layer_window(std::size_t layer) const noexcept;
};

// `dimensions` (V, C, D, Hq, Hkv, N, F, ε, θ, window, tying and head width as given) with the
// family's choices set: Llama/Mistral none; Qwen 2 q/k/v biases; Qwen 3 QK-norm; Gemma 2
// (1 + w) norms, post-block norms, GeGLU, embedding scale float32(√D), window period 2 (with a
// window: layer 0 windowed, layer 1 dense, ...), attention and final soft caps 50 and 30
// unless given; Gemma 3 QK-norm, (1 + w) norms, post-block norms, GeGLU, embedding scale
// float32(√D), attention scale 1/√d unless given, window period 6 (with a window) and local θ
// 10000 unless given; Phi-3 none; GPT-2 learned positions, LayerNorm, the plain feed-forward
// with tanh-GELU, and biases on every projection (the head's too, when untied).
// The choices already set in `dimensions` that a family does not fix are kept.
[[nodiscard]] DecoderConfig architecture_preset(DecoderArchitecture architecture,
                                                const DecoderConfig& dimensions);

// The one home of the config rules, checked before anything is allocated or drawn:
// std::invalid_argument for an unknown architecture, activation, position, norm or feed-forward
// value, a zero dimension, D % Hq != 0 without head_width, Hq % Hkv != 0, an odd head width with
// RoPE, RoPE scaling or a local θ with learned positions, Gemma's (1 + w) form with LayerNorm,
// eps or θ (or a local θ that is set) not finite or not > 0, sliding_window == 0, a window
// period without a window,
// embedding or attention scale or a soft cap not finite or < 0, rope_scaling's rules, ids or
// positions that do not fit uint32; std::overflow_error when the parameters need more than
// max_transformer_parameter_bytes (the message names the field).
void validate_decoder_config(const DecoderConfig& config);

class DecoderBlock final : public Module {
  public:
    // Block `layer` of `config` (its window and RoPE follow the layer's place).
    DecoderBlock(const DecoderConfig& config, std::size_t layer, std::mt19937& generator,
                 AttentionKind attention);
    // x [B,T,D] -> [B,T,D] with the RoPE tables of positions 0..T-1 (computed once per model
    // forward for every block; empty and not read with learned positions), or, for packed
    // rows (documents), of every token's position inside its document (B·T rows).
    [[nodiscard]] Variable forward(
        const Variable& x, const RotaryTables& tables,
        const std::shared_ptr<const tensor_ops::PackedDocuments>& documents = nullptr) const;
    // x [R,D], row r at the position of tables' row r -> [R,D] (no graph).
    [[nodiscard]] Variable forward_incremental(const Variable& x, const RotaryTables& tables,
                                               std::size_t layer,
                                               IncrementalAttentionCache& cache) const;
    [[nodiscard]] const GroupedQueryAttention& attention() const noexcept { return *attention_; }
    void set_attention(AttentionKind kind) { attention_->set_kind(kind); }

  private:
    // The rest of the block after its attention: the post-attention norm (when configured),
    // the residual add, then the feed-forward with its norms and residual.
    [[nodiscard]] Variable finish(const Variable& x, Variable attention) const;
    [[nodiscard]] Variable feed_forward(const Variable& x) const;

    bool layer_norm_;
    const Module* attention_norm_;
    GroupedQueryAttention* attention_;
    const Module* post_attention_norm_ = nullptr;
    const Module* feed_forward_norm_;
    const SwiGLU* gated_ = nullptr;       // gated feed-forward
    const FeedForward* plain_ = nullptr;  // plain feed-forward
    const Module* post_feed_forward_norm_ = nullptr;
};

class Decoder : public CausalLanguageModel {
  public:
    explicit Decoder(const DecoderConfig& config, std::mt19937& generator,
                     AttentionKind attention = AttentionKind::Materialized,
                     ActivationCheckpointing checkpointing = ActivationCheckpointing::Disabled);

    // forward(tokens, shape) and forward(IndexTensor) are CausalLanguageModel's: token ids
    // [B,T] -> logits [B,T,V] with its argument rules.

    // The inference path (docs/ARCHITECTURE.md, 'Decoding and KV caches') on the same weights:
    // R independent rows in one pass, row r being token tokens[r] at absolute position
    // positions[r], with `cache` holding every layer's (rotated) keys and values (Hkv heads, and
    // the sliding window when set; serving/decode_session.hpp drives it). Records no graph.
    // Returns the detached logits [n, V] of the rows listed in output_rows, so a prefill chunk
    // pays for the head only where logits are wanted.
    // std::invalid_argument: no rows, tokens/positions of different lengths, a position >= C,
    // no output row or one >= R; std::out_of_range: a token id >= V.
    [[nodiscard]] Tensor forward_incremental(
        std::span<const std::uint32_t> tokens, std::span<const std::size_t> positions,
        IncrementalAttentionCache& cache, std::span<const std::size_t> output_rows) const override;
    // N layers of Hkv key/value heads of d (the Hq/Hkv query heads of a group share one
    // stored row), capacity C.
    [[nodiscard]] IncrementalCacheShape incremental_cache_shape() const noexcept override;
    [[nodiscard]] std::size_t vocabulary_size() const noexcept override {
        return config_.vocabulary_size;
    }

    [[nodiscard]] const DecoderConfig& config() const noexcept { return config_; }
    [[nodiscard]] std::size_t maximum_context() const noexcept override {
        return config_.maximum_context;
    }
    [[nodiscard]] AttentionKind attention() const noexcept override { return attention_; }
    void set_attention(AttentionKind kind) override;
    // "Decoder", or the name of the view that built it ("DecoderOnlyTransformer").
    [[nodiscard]] const char* model_name() const noexcept override { return name_; }
    [[nodiscard]] bool embeddings_tied() const noexcept override { return config_.tie_embeddings; }
    // LoRA and NF4 are CausalLanguageModel's. Targets: attention.{query,key,value,output},
    // feed_forward.{gate,up,down} (gated) or feed_forward.{expand,project} (plain), and
    // language_model_head when embeddings are not tied; quantize_nf4 packs every block
    // projection (7N gated, 6N plain) and the untied head.

  protected:
    // A view's constructor: the same model, messages prefixed with `model_name` (a literal).
    Decoder(const char* model_name, const DecoderConfig& config, std::mt19937& generator,
            AttentionKind attention, ActivationCheckpointing checkpointing);
    [[nodiscard]] Variable forward_checked(
        const IndexTensor& tokens,
        const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const override;
    [[nodiscard]] AdaptableProjection attach_untied_head() override;
    [[nodiscard]] Embedding& token_embedding_layer() noexcept override { return *token_embedding_; }
    [[nodiscard]] const Embedding& token_embedding_layer() const noexcept override {
        return *token_embedding_;
    }

  private:
    // h0 = s·E_tok[ids] (the embedding scale applied when it is set), plus E_pos[positions]
    // with learned positions (`positions` of ids shaped like `ids` ([rows], or [B,T] for packed
    // rows), or null: 0..T-1 in every row).
    [[nodiscard]] Variable embed(const IndexTensor& ids, const IndexTensor* positions) const;
    // The RoPE tables of `positions` for every block: [layer] -> tables, computed once per
    // distinct frequency set (a dense and a windowed set at most); empty tables with learned
    // positions.
    [[nodiscard]] std::vector<RotaryTables> tables_for(std::span<const std::size_t> positions,
                                                       ExecutionBackend backend) const;

    const char* name_;
    std::string incremental_operation_;  // "<name>::forward_incremental", for messages
    DecoderConfig config_;
    AttentionKind attention_;
    // Block i reads rope_sets_[rope_set_of_[i]]'s tables: the distinct frequency sets.
    std::vector<std::size_t> rope_set_of_;
    std::vector<std::size_t> rope_set_representative_;
    Embedding* token_embedding_;
    Embedding* position_embedding_ = nullptr;  // learned positions
    std::vector<DecoderBlock*> blocks_;
    const Module* final_norm_;
    Linear* language_model_head_ = nullptr;  // null when tied
};

}  // namespace riftco_transformer
