#pragma once
// The Llama / Mistral decoder (spec ENGINE §12):
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
// Beyond the spec's reference: tied embeddings, any RoPE θ, Mistral's sliding window below the
// context (materialized attention masks it), flash attention, block checkpointing, LoRA and
// NF4 on every projection by name, and the incremental (KV-cached) forward.

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

// Stable ABI values (C ABI 2.8): never renumber.
enum class LlamaMistralArchitecture : std::uint32_t { Llama = 0, Mistral = 1 };

// "llama" / "mistral"; unknown value: std::invalid_argument.
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
};

// The one home of the config rules, checked before anything is allocated or drawn:
// std::invalid_argument for an unknown architecture, a zero dimension, D % Hq != 0,
// Hq % Hkv != 0, an odd d_h = D/Hq, eps or θ not finite or not > 0, sliding_window == 0, ids
// or positions that do not fit uint32; std::overflow_error when the parameters need more than
// max_transformer_parameter_bytes (the message names the field).
void validate_llama_mistral_config(const LlamaMistralConfig& config);

class LlamaMistralBlock final : public Module {
  public:
    LlamaMistralBlock(const LlamaMistralConfig& config, std::mt19937& generator,
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
    RMSNorm* attention_norm_;
    GroupedQueryAttention* attention_;
    RMSNorm* feed_forward_norm_;
    SwiGLU* feed_forward_;
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
    [[nodiscard]] Tensor forward_incremental(std::span<const std::uint32_t> tokens,
                                             std::span<const std::size_t> positions,
                                             IncrementalAttentionCache& cache,
                                             std::span<const std::size_t> output_rows) const override;
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
    LlamaMistralConfig config_;
    AttentionKind attention_;
    Embedding* token_embedding_;
    std::vector<LlamaMistralBlock*> blocks_;
    RMSNorm* final_norm_;
    Linear* language_model_head_ = nullptr;  // null when tied
};

}  // namespace riftco_transformer
