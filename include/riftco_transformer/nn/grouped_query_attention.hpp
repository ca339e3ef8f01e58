#pragma once
// Grouped-query attention with RoPE, the attention of Llama and Mistral
// (docs/ARCHITECTURE.md, 'The decoder').
//
// Hq query heads share Hkv key/value heads (Hq % Hkv == 0, r = Hq/Hkv): query head h reads
// key/value head ⌊h/r⌋. Keys are rotated (RoPE, split-half) at their absolute positions before
// they are stored or compared, queries at theirs. Mistral's sliding window W restricts query t
// to keys t−W+1..t; a window ≥ T is dense causal attention.
//
// AttentionKind::Flash runs the memory-linear kernel on the Hkv key/value heads as they are
// (no repeated copy) with the window applied inside it; AttentionKind::Materialized is the
// reference: K/V repeated to Hq heads (repeat_key_value_heads), then materialized attention,
// masked by sliding_window_causal_attention when the window is shorter than the sequence.
// Gemma 2's attention-logit soft cap c replaces every score s by c·tanh(s/c) before the mask
// and the softmax, in every kind and in the incremental form.

#include <cstddef>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/module.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {

// x [B,Hkv,T,d] -> [B,Hkv·r,T,d]: each key/value head repeated r times contiguously. VJP: the
// r copies summed. r == 0: std::invalid_argument.
[[nodiscard]] Variable repeat_key_value_heads(const Variable& x, std::size_t repeats);

// Materialized causal attention in which query t sees keys max(0, t−W+1)..t. Q, K, V
// [B,H,T,d] (attention_scale's rules); window == 0: std::invalid_argument. Masked
// probabilities and their gradients are exactly 0.
[[nodiscard]] Variable sliding_window_causal_attention(const Variable& query, const Variable& key,
                                                       const Variable& value, std::size_t window);

// Materialized causal attention with the scores soft-capped: s = c·tanh(scale·q·k / c), then
// the window (0: none; W >= T: dense) and the causal softmax. Q, K, V [B,H,T,d]
// (attention_scale's rules); cap finite and > 0 (std::invalid_argument otherwise).
[[nodiscard]] Variable soft_capped_causal_attention(const Variable& query, const Variable& key,
                                                    const Variable& value, std::size_t window,
                                                    float cap);

struct GroupedQueryAttentionShape {
    std::size_t width = 0;                 // D
    std::size_t query_head_count = 0;      // Hq, D % Hq == 0 unless head_width is given
    std::size_t key_value_head_count = 0;  // Hkv, Hq % Hkv == 0
    double rope_theta = 10000.0;
    std::optional<std::size_t> sliding_window;  // W > 0 when set
    // The choices of the other families (defaults: Llama's attention exactly).
    std::size_t head_width = 0;         // d, even; 0: D/Hq (Qwen 3, Gemma: any d)
    bool query_key_value_bias = false;  // biases on query, key and value (Qwen 2)
    // QK-norm (Qwen 3, Gemma 3): RMSNorm over each head's d values of q and k, before RoPE,
    // with parameters "query_norm.scale" and "key_norm.scale" [d].
    bool query_key_norm = false;
    float query_key_norm_epsilon = 1e-6F;
    bool norm_weight_offset = false;  // QK-norm weights in Gemma's (1 + w) form
    // Scores are scale·q·k; 0: 1/√d. Gemma: query_pre_attn_scalar^(−1/2). Applied by scaling
    // the rotated queries by scale·√d, so every attention kernel (1/√d) computes it.
    float attention_scale = 0.0F;
    RopeScaling rope_scaling;
    // Attention-logit soft cap c (Gemma 2: 50): scores c·tanh(s/c); 0: none; finite, >= 0.
    float attention_softcap = 0.0F;
    // false: no RoPE (positions enter elsewhere, GPT-2's learned table): queries and keys are
    // used as projected, the head width may be odd, and θ and rope_scaling are not read.
    bool rotary = true;
    bool output_bias = false;  // a bias on the output projection (GPT-2)
};

// Projections "query" (D -> Hq·d), "key" and "value" (D -> Hkv·d), "output" (Hq·d -> D),
// drawn in that order, bias-free unless query_key_value_bias (zero biases on q, k, v) and
// output_bias (on output); then "query_norm" and "key_norm" with QK-norm.
class GroupedQueryAttention final : public Module {
  public:
    // Any rule above broken, or an odd head width: std::invalid_argument.
    GroupedQueryAttention(const GroupedQueryAttentionShape& shape, std::mt19937& generator,
                          AttentionKind kind = AttentionKind::Materialized);
    // x [B,T,D] -> [B,T,D], positions 0..T-1.
    [[nodiscard]] Variable forward(const Variable& x) const;
    // The same with the RoPE tables of positions 0..T-1 given (rotary_tables): a model computes
    // them once per forward for all its blocks. Without RoPE the tables are not read (empty).
    // Packed rows (documents): the tables hold B·T rows, token t of row b at row b·T + t (its
    // position inside its document), and attention stays inside each document, in both kinds.
    [[nodiscard]] Variable forward(
        const Variable& x, const RotaryTables& tables,
        const std::shared_ptr<const tensor_ops::PackedDocuments>& documents = nullptr) const;
    // The incremental form: x [R,D], row r at the position of tables' row r; `cache` stores
    // this layer's rotated keys and values with Hkv heads as they are (queries [R,Hq,1,d], keys
    // and values [R,Hkv,1,d]: no repeated copy), and row r attends within the sliding window
    // (positions max(0, p−W+1)..p) when one is set, at any position up to the cache's capacity.
    [[nodiscard]] Variable forward_incremental(const Variable& x, const RotaryTables& tables,
                                               std::size_t layer,
                                               IncrementalAttentionCache& cache) const;
    // The RoPE tables of `positions` for this layer's head width and θ, on `backend`; without
    // RoPE: std::logic_error.
    [[nodiscard]] RotaryTables rotary_tables_for(std::span<const std::size_t> positions,
                                                 ExecutionBackend backend) const;

    [[nodiscard]] const GroupedQueryAttentionShape& shape() const noexcept { return shape_; }
    [[nodiscard]] std::size_t head_width() const noexcept {
        return shape_.head_width != 0 ? shape_.head_width : shape_.width / shape_.query_head_count;
    }
    // ω_i of this layer's RoPE (θ and scaling), computed once at construction.
    [[nodiscard]] const std::vector<double>& rotary_frequencies() const noexcept {
        return frequencies_;
    }
    // The factor of its cos/sin tables (YaRN's attention factor; 1 otherwise).
    [[nodiscard]] double rotary_magnitude() const noexcept { return magnitude_; }
    [[nodiscard]] AttentionKind kind() const noexcept { return kind_; }
    void set_kind(AttentionKind kind);

  private:
    // A projection [B,T,heads·d] (sequence) or [R,heads·d] (rows) split into heads,
    // [B,heads,T,d] or [R,heads,1,d], normed over d by `norm` when given, rotated when `tables`
    // is given, and multiplied by `multiplier` when it is not 1 (values: neither).
    [[nodiscard]] Variable split_heads(const Variable& projected, std::size_t heads,
                                       const RMSNorm* norm, const RotaryTables* tables,
                                       float multiplier) const;

    GroupedQueryAttentionShape shape_;
    AttentionKind kind_;
    std::vector<double> frequencies_;
    double magnitude_ = 1.0;
    float query_multiplier_ = 1.0F;  // scale·√d; 1 without a configured scale
    Linear* query_;
    Linear* key_;
    Linear* value_;
    Linear* output_;
    RMSNorm* query_norm_ = nullptr;
    RMSNorm* key_norm_ = nullptr;
};

}  // namespace riftco_transformer
