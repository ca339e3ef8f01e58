#pragma once
// Causal self-attention (docs/ARCHITECTURE.md, 'Attention').
//
// S = Q·Kᵀ·(1/√d_h) with the scale computed in float, future keys masked (key t_k is visible
// from query t_q iff t_k <= t_q), P = softmax over keys, O = P·V. Masked probabilities and
// their gradients are exactly 0. Q, K and V are [B,H,T,d_h] with identical shapes and one
// backend (std::invalid_argument otherwise).

#include <cstddef>
#include <cstdint>
#include <random>
#include <string_view>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

// How attention is executed: runtime policy, never part of a model's parameters or state.
enum class AttentionKind : std::uint32_t {
    Materialized = 0,  // keeps the [B,H,T,T] probabilities for backward
    Flash = 1,         // memory-linear: keeps per-row max and sum, recomputes in backward
};

// The one home of the AttentionKind rule (layers, models, the C ABI's conversions call it):
// an unknown value is std::invalid_argument "<operation>: unknown attention kind value <v>".
void require_attention_kind(std::string_view operation, AttentionKind kind);

struct AttentionOutputs {
    Variable context;        // [B,H,T,d_h]
    Variable probabilities;  // [B,H,T,T]; an upstream here contributes to dQ and dK only
};

// The materialized algorithm, returning both outputs (their gradients add up when both are
// used).
[[nodiscard]] AttentionOutputs causal_scaled_dot_product_attention(const Variable& query,
                                                                   const Variable& key,
                                                                   const Variable& value);

// The memory-linear algorithm (context only): no [B,H,T,T] buffer in either direction.
[[nodiscard]] Variable flash_causal_attention(const Variable& query, const Variable& key,
                                              const Variable& value);

// The context alone, computed by `kind`; both kinds agree within float tolerance.
[[nodiscard]] Variable causal_attention(const Variable& query, const Variable& key,
                                        const Variable& value, AttentionKind kind);

// What one incremental attention step sees beyond its own rows.
struct IncrementalAttentionOptions {
    // 0: every position of the request. W > 0: the row at position p sees positions
    // max(0, p−W+1)..p (Mistral's sliding window; W > p sees them all).
    std::size_t window = 0;
    // 0: none. c > 0: every score s becomes c·tanh(s/c) (Gemma 2's attention-logit soft cap).
    float softcap = 0.0F;
};

// The K/V store of the inference-only ("incremental") attention step, implemented by the
// serving layer's KV caches (serving/kv_cache.hpp). One call handles R independent query
// rows of one layer: row r is one position of one request (a decode step, or one token of a
// prefill chunk).
class IncrementalAttentionCache {
  public:
    virtual ~IncrementalAttentionCache() = default;
    // query [R, Hq, 1, d_h]; key, value [R, Hkv, 1, d_h] of `layer`, Hq % Hkv == 0 (query head
    // h reads key/value head ⌊h/(Hq/Hkv)⌋; the cache stores the Hkv heads, never repeated):
    // stores every row's key and value at its position first, then returns the context
    // [R, Hq, 1, d_h] in which row r attends to its request's positions up to position_r (its
    // own included), the last options.window of them under a window. Detached: no graph.
    [[nodiscard]] virtual Tensor append_and_attend(std::size_t layer, const Tensor& query,
                                                   const Tensor& key, const Tensor& value,
                                                   const IncrementalAttentionOptions& options) = 0;
    // Multi-head attention without a window (Hq == Hkv for the GPT decoder).
    [[nodiscard]] Tensor append_and_attend(std::size_t layer, const Tensor& query,
                                           const Tensor& key, const Tensor& value) {
        return append_and_attend(layer, query, key, value, IncrementalAttentionOptions{});
    }
};

// Four biased projections "query", "key", "value", "output" (D -> D); no norm, no residual.
class CausalSelfAttention final : public Module {
  public:
    // D == 0, H == 0 or D % H != 0: std::invalid_argument.
    CausalSelfAttention(std::size_t width, std::size_t head_count, std::mt19937& generator,
                        AttentionKind kind = AttentionKind::Materialized);
    // x [B,T,D] -> [B,T,D]. Any other shape: std::invalid_argument.
    [[nodiscard]] Variable forward(const Variable& x) const;
    // The incremental form: x [R, D] (R independent rows) -> [R, D], with `cache` as the
    // K/V store of this layer. Run under a NoGradientGuard (detached values).
    [[nodiscard]] Variable forward_incremental(const Variable& x, std::size_t layer,
                                               IncrementalAttentionCache& cache) const;

    [[nodiscard]] AttentionKind kind() const noexcept { return kind_; }
    void set_kind(AttentionKind kind);
    [[nodiscard]] std::size_t head_count() const noexcept { return head_count_; }

  private:
    std::size_t width_;
    std::size_t head_count_;
    AttentionKind kind_;
    Linear* query_;
    Linear* key_;
    Linear* value_;
    Linear* output_;
};

}  // namespace riftco_transformer
