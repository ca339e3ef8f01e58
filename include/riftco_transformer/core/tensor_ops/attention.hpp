#pragma once
// Memory-linear ("flash") causal attention, the raw form. Q [B,Hq,T,d_h]; K, V [B,Hkv,T,d_h]
// with Hq % Hkv == 0 (grouped-query attention: query head h reads key/value head
// ⌊h/(Hq/Hkv)⌋; Hkv == Hq is plain multi-head attention) and one backend
// (std::invalid_argument otherwise); scale = 1/√d_h computed in float. An optional sliding
// window W lets query t see only keys max(0, t−W+1)..t. An optional soft cap c > 0 (Gemma 2's
// attention-logit soft-capping) replaces each score s = scale·q·k by c·tanh(s/c) before the
// mask and the softmax; the VJP multiplies by its derivative 1 − tanh²(s/c). A visible score
// that is NaN or +inf, or a query row without a finite visible score: std::domain_error; a soft
// cap that is not finite or < 0: std::invalid_argument.
//
// Packed rows (supervised fine-tuning packs several examples into one row): with documents, a
// row of T tokens is a run of documents, and token t's position inside its document is
// positions[b·T + t]; query t then sees only the keys of its own document, t − positions..t
// (and the window's bound, when it is tighter). The CPU and PJRT kernels have it; CUDA and
// Metal refuse it (std::invalid_argument naming the backend), never a silent dense fallback.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// Document boundaries of a packed [B,T] batch: positions[b·T + t] is token t's position
// inside its document. Row b's positions start at 0 and each next one is 0 (a new document)
// or the previous + 1, so t − positions[b·T + t] (the document's first token) never
// decreases along a row.
struct PackedDocuments {
    std::size_t batch = 0;
    std::size_t time = 0;
    std::vector<std::uint32_t> positions;  // [B·T], row-major
};

// The one home of the packing rules: positions.size() == batch·time (batch, time > 0), each
// row as above. std::invalid_argument naming `operation`, the row and the token otherwise.
[[nodiscard]] std::shared_ptr<const PackedDocuments> packed_documents(
    std::string_view operation, std::span<const std::uint32_t> positions, std::size_t batch,
    std::size_t time);

// std::invalid_argument naming `operation` and the backend unless `backend`'s flash kernel
// bounds keys by document (the CPU's and PJRT's).
void require_packed_attention(std::string_view operation, ExecutionBackend backend);

struct FlashAttentionOptions {
    // 0: dense causal attention. W > 0: query t sees keys max(0, t−W+1)..t (W >= T is dense).
    std::size_t window = 0;
    // 0: no capping. c > 0: scores c·tanh(s/c) (Gemma 2: 50).
    float softcap = 0.0F;
    // Packed rows: query t of row b sees only its own document (see above); null: every row
    // is one document. Its batch and time must be Q's B and T.
    std::shared_ptr<const PackedDocuments> documents = nullptr;
};

struct FlashAttentionResult {
    Tensor context;                 // [B,Hq,T,d_h]
    Tensor row_max;                 // [B,Hq,T]: m_i = max_{j visible from i} S_ij
    Tensor row_sum;                 // [B,Hq,T]: l_i = Σ_{j visible from i} exp(S_ij − m_i)
    FlashAttentionOptions options;  // the forward's: the VJP masks and caps exactly the same way
};

struct FlashAttentionGradients {
    Tensor query;  // [B,Hq,T,d_h]
    Tensor key;    // [B,Hkv,T,d_h]: the sum over the query heads of each group
    Tensor value;  // [B,Hkv,T,d_h]
};

// The one home of the attention input rules. Every form: Q, K, V non-singular, on one
// backend, rank 4 (std::invalid_argument naming `operation` and the shapes otherwise);
// returns scale = 1/√d_h in float.
// attention_scale (materialized attention and every form without head groups): identical
// shapes [B,H,T,d_h].
[[nodiscard]] float attention_scale(std::string_view operation, const Tensor& query,
                                    const Tensor& key, const Tensor& value);
// grouped_attention_scale (flash attention): K and V identical [B,Hkv,T,d_h]; Q [B,Hq,T,d_h]
// with the same B, T and d_h, and Hq a multiple of Hkv (Hkv > 0).
[[nodiscard]] float grouped_attention_scale(std::string_view operation, const Tensor& query,
                                            const Tensor& key, const Tensor& value);

// inp Q [B,Hq,T,d], K, V [B,Hkv,T,d] -> context [B,Hq,T,d], row statistics [B,Hq,T]
[[nodiscard]] FlashAttentionResult flash_attention(const Tensor& query, const Tensor& key,
                                                   const Tensor& value,
                                                   const FlashAttentionOptions& options = {});

// The VJP from the forward's outputs (its window included) and the upstream gradient of the
// context; recomputes the probabilities tile by tile. dK and dV have K's shape.
[[nodiscard]] FlashAttentionGradients flash_attention_backward(const Tensor& query,
                                                               const Tensor& key,
                                                               const Tensor& value,
                                                               const FlashAttentionResult& forward,
                                                               const Tensor& upstream);

}  // namespace riftco_transformer::tensor_ops
