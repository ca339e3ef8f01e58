#pragma once
// Paged decode attention (spec ENGINE §7 "Paged decode"; WORKFLOWS §4.1-4.2): the
// inference-only attention of the KV-cached decode path. It is detached (no backward rule)
// and never gathers K/V into a contiguous tensor: every key and value is read in place from
// a pool of pages through each request's page table.
//
// Layouts:
//   key_pool, value_pool  [P, H, S, d_h]  P physical pages of S positions ("page_offset")
//   query, context        [R, H, 1, d_h]  R independent requests (R = 1: [1,H,1,d_h])
// Request r attends to its logical positions t in [0, length_r); position t lives in
// physical page page_table_r[t / S] at offset t % S. For each head:
//   s_t = scale·q·k_t,  p = softmax(s) over the request's positions,  context = Σ_t p_t·v_t
// The arithmetic of one request does not depend on S or on which pages hold its positions,
// so a paged and a contiguous (one page of S = C) cache give bit-identical results.
//
// Errors (all checked before anything is computed or written):
//   std::invalid_argument: ranks or shapes that differ from the above (the message names the
//   argument and shape), a request count != R, a length of 0 or longer than its page table
//   covers (length > table·S), a page id >= P, tensors on different backends;
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

// context [R, H, 1, d_h] (see above). scale: 1/√d_h when 0 is passed.
[[nodiscard]] Tensor paged_decode_attention(const Tensor& query, const Tensor& key_pool,
                                            const Tensor& value_pool,
                                            std::span<const PagedAttentionRequest> requests,
                                            float scale = 0.0F);

// Stores row r of key and value ([R, H, 1, d_h]) at slots[r] of the pools ([P, H, S, d_h])
// in place. The pools' storage is made unique first, so a copy of a pool never observes the
// write. std::invalid_argument: shapes as above, slots.size() != R, a page >= P or an offset
// >= S, two rows with the same slot, mixed backends. Nothing is written on any error.
void write_paged_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                           const Tensor& value, std::span<const PagedSlot> slots);

}  // namespace riftco_transformer::tensor_ops
