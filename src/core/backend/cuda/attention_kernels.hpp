#pragma once
// Launchers of the flash attention kernels (attention.cu), seen by the adapter's host code.
// Like kernels.hpp: plain device pointers, asynchronous on `stream`, runtime_error when a
// launch fails, and no engine tensor header, so nvcc compiles only kernels.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace riftco_transformer::detail::cuda {

// Q, O, dO, dQ [query_items, T, d] (query_items = B·Hq); K, V, dK, dV [query_items/group, T, d];
// row statistics [query_items, T]. Query item i reads key/value item ⌊i/group⌋.
struct FlashGeometry {
    std::uint64_t query_items = 0;
    std::uint64_t group = 1;  // r = Hq/Hkv
    std::uint64_t time = 0;
    std::uint64_t width = 0;
    std::uint64_t window = 0;  // 0: dense causal
    float scale = 1.0F;
    float softcap = 0.0F;  // 0: none; c > 0: S = c·tanh(scale·q·k/c), dS ⊙ (1 − tanh²)
};

// Forward. first_failure <- the smallest query item with a visible score that is NaN or +inf;
// failing that, query_items + the smallest item with a row that sees no finite score.
void flash_attention_forward(const FlashGeometry& geometry, const float* query, const float* key,
                             const float* value, float* context, float* row_max, float* row_sum,
                             unsigned long long* first_failure, cudaStream_t stream);

// Backward. `row_dots` is scratch for query_items·T floats (D_i = Σ dO_i ⊙ O_i).
void flash_attention_backward(const FlashGeometry& geometry, const float* query, const float* key,
                              const float* value, const float* context, const float* row_max,
                              const float* row_sum, const float* upstream, float* row_dots,
                              float* query_gradient, float* key_gradient, float* value_gradient,
                              cudaStream_t stream);

}  // namespace riftco_transformer::detail::cuda
