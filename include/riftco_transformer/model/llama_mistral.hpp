#pragma once
// The rotary decoder (docs/ARCHITECTURE.md, 'The rotary decoder'): Llama / Mistral and, by
// configuration, the families that differ from it only in orthogonal choices (Qwen 2/2.5, Qwen 3,
// Gemma 2, Gemma 3, Phi-3):
//   h0 = E_tok[id]                               no position table: RoPE inside attention
//   a  = x + GQA(RMSNorm(x))                     pre-norm blocks, bias-free projections
//   y  = a + SwiGLU(RMSNorm(a))                  down(silu(gate(a)) ⊙ up(a))
//   logits = RMSNorm(h_N) · Wᵀ                   W = language_model_head.weight, or E_tok when
//                                                embeddings are tied (no head parameter)
// Parameters, in order: token_embedding.weight; per block blocks.{i}.attention_norm.scale,
// attention.{query,key,value,output}.weight, feed_forward_norm.scale,
// feed_forward.{gate,up,down}.weight; final_norm.scale; language_model_head.weight (untied).
// Random draws, in order: token embedding; per block q, k, v, o, gate, up, down; head.
//
// Beyond a minimal Llama/Mistral: tied embeddings, any RoPE θ, Mistral's sliding window below the
// context (materialized attention masks it), flash attention, block checkpointing, LoRA and
// NF4 on every projection by name, and the incremental (KV-cached) forward.
//
// The family choices (each off by default, so a config of Llama's fields is Llama exactly):
//   head_width d independent of D/Hq (q: D -> Hq·d, o: Hq·d -> D);
//   query_key_value_bias: biases on q, k, v (Qwen 2), registered after each weight;
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

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "riftco_transformer/model/causal_language_model.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/grouped_query_attention.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

// Stable ABI values (C ABI 2.8; Qwen 2 onwards 2.10): never renumber. The architecture names the
// family (what import, export and chat formats follow); the model's structure is the config's
// choices, which architecture_preset fills in.
enum class LlamaMistralArchitecture : std::uint32_t {
    Llama = 0,
    Mistral = 1,
    Qwen2 = 2,
    Qwen3 = 3,
    Gemma2 = 4,  // 2.11
    Gemma3 = 5,
    Phi3 = 6,
};

// "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3" (GGUF's general.architecture
// values); unknown value: std::invalid_argument.
[[nodiscard]] std::string_view llama_mistral_architecture_name(LlamaMistralArchitecture value);

struct LlamaMistralConfig {
    LlamaMistralArchitecture architecture = LlamaMistralArchitecture::Llama;
    std::size_t vocabulary_size = 0;       // V
    std::size_t maximum_context = 0;       // C
    std::size_t model_width = 0;           // D
    std::size_t query_head_count = 0;      // Hq
    std::size_t key_value_head_count = 0;  // Hkv
    std::size_t block_count = 0;           // N
    std::size_t feed_forward_width = 0;    // F
    float rms_norm_epsilon = 1e-5F;
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
// 10000 unless given; Phi-3 none.
// The choices already set in `dimensions` that a family does not fix are kept.
[[nodiscard]] LlamaMistralConfig architecture_preset(LlamaMistralArchitecture architecture,
                                                     const LlamaMistralConfig& dimensions);

// The one home of the config rules, checked before anything is allocated or drawn:
// std::invalid_argument for an unknown architecture or activation, a zero dimension,
// D % Hq != 0 without head_width, Hq % Hkv != 0, an odd head width, eps or θ (or a local θ
// that is set) not finite or not > 0, sliding_window == 0, a window period without a window,
// embedding or attention scale or a soft cap not finite or < 0, rope_scaling's rules, ids or
// positions that do not fit uint32; std::overflow_error when the parameters need more than
// max_transformer_parameter_bytes (the message names the field).
void validate_llama_mistral_config(const LlamaMistralConfig& config);

class LlamaMistralBlock final : public Module {
  public:
    // Block `layer` of `config` (its window and RoPE follow the layer's place).
    LlamaMistralBlock(const LlamaMistralConfig& config, std::size_t layer, std::mt19937& generator,
                      AttentionKind attention);
    // x [B,T,D] -> [B,T,D] with the RoPE tables of positions 0..T-1 (computed once per model
    // forward for every block).
    [[nodiscard]] Variable forward(const Variable& x, const RotaryTables& tables) const;
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

    RMSNorm* attention_norm_;
    GroupedQueryAttention* attention_;
    RMSNorm* post_attention_norm_ = nullptr;
    RMSNorm* feed_forward_norm_;
    SwiGLU* feed_forward_;
    RMSNorm* post_feed_forward_norm_ = nullptr;
};

class LlamaMistralTransformer final : public CausalLanguageModel {
  public:
    explicit LlamaMistralTransformer(
        const LlamaMistralConfig& config, std::mt19937& generator,
        AttentionKind attention = AttentionKind::Materialized,
        ActivationCheckpointing checkpointing = ActivationCheckpointing::Disabled);

    // forward(tokens, shape) and forward(IndexTensor) are CausalLanguageModel's: token ids
    // [B,T] -> logits [B,T,V] with its argument rules.

    // R independent rows (token tokens[r] at positions[r]) through every block with `cache`
    // holding each layer's rotated keys and values (Hkv heads, and the sliding window when
    // set); returns the detached logits [n, V] of output_rows. The rules of
    // DecoderOnlyTransformer::forward_incremental.
    [[nodiscard]] Tensor forward_incremental(
        std::span<const std::uint32_t> tokens, std::span<const std::size_t> positions,
        IncrementalAttentionCache& cache, std::span<const std::size_t> output_rows) const override;
    // N layers of Hkv key/value heads of D/Hq (the Hq/Hkv query heads of a group share one
    // stored row), capacity C.
    [[nodiscard]] IncrementalCacheShape incremental_cache_shape() const noexcept override;
    [[nodiscard]] std::size_t vocabulary_size() const noexcept override {
        return config_.vocabulary_size;
    }

    [[nodiscard]] const LlamaMistralConfig& config() const noexcept { return config_; }
    [[nodiscard]] std::size_t maximum_context() const noexcept override {
        return config_.maximum_context;
    }
    [[nodiscard]] AttentionKind attention() const noexcept override { return attention_; }
    void set_attention(AttentionKind kind) override;
    [[nodiscard]] const char* model_name() const noexcept override {
        return "LlamaMistralTransformer";
    }
    [[nodiscard]] bool embeddings_tied() const noexcept override { return config_.tie_embeddings; }
    // LoRA and NF4 are CausalLanguageModel's. Targets: attention.{query,key,value,output},
    // feed_forward.{gate,up,down}, and language_model_head when embeddings are not tied;
    // quantize_nf4 packs all 7N projections and the untied head.

  protected:
    [[nodiscard]] Variable forward_checked(const IndexTensor& tokens) const override;
    [[nodiscard]] AdaptableProjection attach_untied_head() override;

  private:
    // h0 = s·E_tok[ids] (the embedding scale applied when it is set).
    [[nodiscard]] Variable embed(const IndexTensor& ids) const;
    // The RoPE tables of `positions` for every block: [layer] -> tables, computed once per
    // distinct frequency set (a dense and a windowed set at most).
    [[nodiscard]] std::vector<RotaryTables> tables_for(std::span<const std::size_t> positions,
                                                       ExecutionBackend backend) const;

    LlamaMistralConfig config_;
    AttentionKind attention_;
    // Block i reads rope_sets_[rope_set_of_[i]]'s tables: the distinct frequency sets.
    std::vector<std::size_t> rope_set_of_;
    std::vector<std::size_t> rope_set_representative_;
    Embedding* token_embedding_;
    std::vector<LlamaMistralBlock*> blocks_;
    RMSNorm* final_norm_;
    Linear* language_model_head_ = nullptr;  // null when tied
};

}  // namespace riftco_transformer
