#pragma once
// The readable flash-attention oracle: tiles of 8 queries × 8 keys, scalar loops, double
// accumulation, fully masked tiles skipped — the algorithm of docs/ARCHITECTURE.md, 'Attention',
// written for reading, kept with the tests (it is never shipped). The fast path
// (src/core/backend/cpu/attention.cpp) is tested against it. Layouts: q, k, v, context
// [items, T, d] (items = B·H), row statistics [items, T].

#include <cstddef>

namespace riftco_transformer::detail {

void flash_attention_reference_forward(const float* query, const float* key, const float* value,
                                       std::size_t items, std::size_t time, std::size_t width,
                                       float scale, float* context, float* row_max, float* row_sum);

void flash_attention_reference_backward(const float* query, const float* key, const float* value,
                                        const float* context, const float* row_max,
                                        const float* row_sum, const float* upstream,
                                        std::size_t items, std::size_t time, std::size_t width,
                                        float scale, float* query_gradient, float* key_gradient,
                                        float* value_gradient);

}  // namespace riftco_transformer::detail
