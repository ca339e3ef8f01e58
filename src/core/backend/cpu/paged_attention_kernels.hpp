#pragma once
// The two CPU kernels of paged decode attention (tensor_ops/paged_attention.hpp), exposed so
// tests can run both on the same inputs; CpuPagedAttention picks one per call.

#include <cstddef>
#include <cstdint>
#include <span>

#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"

namespace riftco_transformer::detail {

// The pool and query geometry of one call: pools [pages, heads, page_size, head_width],
// query and context [requests, heads, 1, head_width].
struct PagedAttentionGeometry {
    std::size_t pages = 0;
    std::size_t heads = 0;
    std::size_t page_size = 0;
    std::size_t head_width = 0;
};

// Readable reference: one (request, head) at a time, every sum in double, std::exp.
void paged_attention_reference(const PagedAttentionGeometry& geometry, const float* query,
                               const float* key_pool, const float* value_pool,
                               std::span<const tensor_ops::PagedAttentionRequest> requests,
                               float scale, float* context);

// Fast path: threaded over (request, head) pairs; within a pair the scores, their maximum,
// the exponentials, their sum and the weighted value sum are float loops the compiler
// vectorises over fixed lanes (fast_exp, no libm), keys and values read page by page in place.
void paged_attention_fast(const PagedAttentionGeometry& geometry, const float* query,
                          const float* key_pool, const float* value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          float* context);

}  // namespace riftco_transformer::detail
