#pragma once
// Paged decode attention (docs/ARCHITECTURE.md, 'Attention' and 'Decoding and KV caches'): the
// inference-only attention of the KV-cached decode path. It is detached (no backward rule)
// and never gathers K/V into a contiguous tensor: every key and value is read in place from
// a pool of pages through each request's page table.
//
// Layouts:
//   key_pool, value_pool  [P, Hkv, S, d_h]  P physical pages of S positions ("page_offset")
//   query, context        [R, Hq, 1, d_h]   R independent requests (R = 1: [1,Hq,1,d_h])
// Hq % Hkv == 0 (grouped-query attention): query head h reads pool head ⌊h/(Hq/Hkv)⌋, so the
// Hq/Hkv query heads of a group share one stored K/V row (Hkv == Hq: multi-head attention).
// Request r sees its logical positions t in [first_r, length_r), first_r = max(0, length_r − W)
// for a sliding window W > 0 (options.window; 0: every position); position t lives in
// physical page page_table_r[t / S] at offset t % S. For each query head:
//   s_t = scale·q·k_t (c·tanh(s_t/c) under a soft cap c),  p = softmax(s) over the visible
//   positions,  context = Σ_t p_t·v_t
// The arithmetic of one request does not depend on S or on which pages hold its positions,
// so a paged and a contiguous (one page of S = C) cache give bit-identical results.
//
// Errors (all checked before anything is computed or written):
//   std::invalid_argument: ranks or shapes that differ from the above (the message names the
//   argument and shape; a query head count that is not a multiple of the pools' Hkv among
//   them), a request count != R, a length of 0 or longer than its page table covers
//   (length > table·S), a page id >= P among the pages covering [0, length), tensors on
//   different backends;
//   std::domain_error: a score that is NaN or +inf (raised at the backend's sync point).
//   std::runtime_error: the backend lacks the paged-attention capability.

#include <cstddef>
#include <cstdint>
#include <span>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

struct PagedAttentionRequest {
    std::span<const std::uint32_t> page_table;  // logical page -> physical page
    std::size_t length = 0;                     // visible positions [0, length)
};

// Where one K/V row goes: pool[page, :, offset, :].
struct PagedSlot {
    std::uint32_t page = 0;
    std::uint32_t offset = 0;
};

struct PagedAttentionOptions {
    // 0: a request sees all its positions. W > 0: the last W, max(0, length − W)..length − 1
    // (W >= length sees them all).
    std::size_t window = 0;
    // 0: no capping. c > 0: s_t = c·tanh(scale·q·k_t / c) (Gemma 2's attention-logit soft cap);
    // not finite or < 0: std::invalid_argument.
    float softcap = 0.0F;
};

// inp query [R,Hq,1,d_h], pools [P,Hkv,S,d_h] -> context [R,Hq,1,d_h] (see above).
// scale: 1/√d_h when 0 is passed.
[[nodiscard]] Tensor paged_decode_attention(const Tensor& query, const Tensor& key_pool,
                                            const Tensor& value_pool,
                                            std::span<const PagedAttentionRequest> requests,
                                            float scale = 0.0F,
                                            const PagedAttentionOptions& options = {});

// Stores row r of key and value ([R, Hkv, 1, d_h]: the pools' head count, so an Hkv-head pool
// takes the unrepeated key/value heads) at slots[r] of the pools ([P, Hkv, S, d_h])
// in place. The pools' storage is made unique first, so a copy of a pool never observes the
// write. std::invalid_argument: shapes as above, slots.size() != R, a page >= P or an offset
// >= S, two rows with the same slot, mixed backends. Nothing is written on any error.
void write_paged_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                           const Tensor& value, std::span<const PagedSlot> slots);

}  // namespace riftco_transformer::tensor_ops
