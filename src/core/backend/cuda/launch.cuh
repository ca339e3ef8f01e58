#pragma once
// Launch geometry the kernels share: grid-stride loops over 64-bit element counts.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace riftco_transformer::detail::cuda {

constexpr unsigned int threads_per_block = 256;
// Enough blocks to fill an H200 (132 SMs × 2048 threads) several times over; larger counts
// loop inside the kernel.
constexpr std::size_t max_blocks = 8192;

inline unsigned int blocks_for(std::size_t count) {
    const std::size_t blocks = (count + threads_per_block - 1) / threads_per_block;
    return static_cast<unsigned int>(std::clamp<std::size_t>(blocks, 1, max_blocks));
}

__device__ inline std::size_t first_index() {
    return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ inline std::size_t grid_stride() {
    return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

}  // namespace riftco_transformer::detail::cuda
