#pragma once
// The two CPU kernels of paged decode attention (tensor_ops/paged_attention.hpp), exposed so
// tests can run both on the same inputs; CpuPagedAttention picks one per call.

#include <cstddef>
#include <cstdint>
#include <span>

#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"

namespace riftco_transformer::detail {

// The pool and query geometry of one call: pools [pages, heads, page_size, head_width],
// query and context [requests, heads·group_size, 1, head_width]. Query head h reads pool head
// ⌊h / group_size⌋ (grouped-query attention; group_size 1: multi-head attention).
struct PagedAttentionGeometry {
    std::size_t pages = 0;
    std::size_t heads = 0;  // Hkv, the pools' heads
    std::size_t page_size = 0;
    std::size_t head_width = 0;
    std::size_t group_size = 1;  // Hq / Hkv query heads per pool head

    [[nodiscard]] std::size_t query_heads() const noexcept { return heads * group_size; }
};

// Readable reference: one (request, query head) at a time, every sum in double, std::exp.
// options.window as in tensor_ops::paged_decode_attention.
void paged_attention_reference(const PagedAttentionGeometry& geometry, const float* query,
                               const float* key_pool, const float* value_pool,
                               std::span<const tensor_ops::PagedAttentionRequest> requests,
                               float scale, float* context,
                               const tensor_ops::PagedAttentionOptions& options = {});

// Fast path: threaded over (request, query head) pairs; within a pair the scores, their
// maximum, the exponentials, their sum and the weighted value sum are float loops the compiler
// vectorises over fixed lanes (fast_exp, no libm), keys and values read page by page in place.
void paged_attention_fast(const PagedAttentionGeometry& geometry, const float* query,
                          const float* key_pool, const float* value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          float* context, const tensor_ops::PagedAttentionOptions& options = {});

}  // namespace riftco_transformer::detail
