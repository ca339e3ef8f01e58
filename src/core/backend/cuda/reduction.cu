// Reduction kernels. Sums accumulate in double with a fixed order (per-thread strided sums,
// then a shared-memory tree of fixed shape), so a result never depends on scheduling.

#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

// The sum of every thread's `value` over the block (threads_per_block threads), returned to
// thread 0; the tree's shape is fixed, so the rounding is too.
__device__ double block_sum(double value) {
    __shared__ double partial[threads_per_block];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int half = threads_per_block / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            partial[threadIdx.x] += partial[threadIdx.x + half];
        }
        __syncthreads();
    }
    return partial[0];
}

// x [count] -> partials[b] = Σ x[b·sum_block, (b+1)·sum_block), one block per partial
__global__ void block_partials_kernel(const float* x, std::size_t count, double* partials) {
    const std::size_t first = static_cast<std::size_t>(blockIdx.x) * sum_block;
    const std::size_t end = first + sum_block < count ? first + sum_block : count;
    double total = 0.0;
    for (std::size_t i = first + threadIdx.x; i < end; i += threads_per_block) {
        total += static_cast<double>(x[i]);
    }
    total = block_sum(total);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

// partials [count] -> out[0] = multiplier · Σ partials, one block
__global__ void finish_sum_kernel(const double* partials, std::size_t count, double multiplier,
                                  float* out) {
    double total = 0.0;
    for (std::size_t i = threadIdx.x; i < count; i += threads_per_block) {
        total += partials[i];
    }
    total = block_sum(total);
    if (threadIdx.x == 0) {
        out[0] = static_cast<float>(total * multiplier);
    }
}

// x [outer, extent] -> out[o] = multiplier · Σ_e x[o, e], one block per row
__global__ void row_sum_kernel(const float* x, std::size_t outer, std::size_t extent,
                               double multiplier, float* out) {
    for (std::size_t row = blockIdx.x; row < outer; row += gridDim.x) {
        const float* values = x + row * extent;
        double total = 0.0;
        for (std::size_t e = threadIdx.x; e < extent; e += threads_per_block) {
            total += static_cast<double>(values[e]);
        }
        total = block_sum(total);
        if (threadIdx.x == 0) {
            out[row] = static_cast<float>(total * multiplier);
        }
        __syncthreads();  // partial[] is reused by the next row
    }
}

// x [outer, extent, inner] -> out[o, i] = multiplier · Σ_e x[o, e, i], one thread per (o, i)
// (neighbouring threads read neighbouring columns)
__global__ void column_sum_kernel(const float* x, std::size_t outer, std::size_t extent,
                                  std::size_t inner, double multiplier, float* out) {
    const std::size_t count = outer * inner;
    for (std::size_t item = first_index(); item < count; item += grid_stride()) {
        const std::size_t block = item / inner;
        const std::size_t column = item % inner;
        const float* values = x + block * extent * inner + column;
        double total = 0.0;
        for (std::size_t e = 0; e < extent; ++e) {
            total += static_cast<double>(values[e * inner]);
        }
        out[item] = static_cast<float>(total * multiplier);
    }
}

}  // namespace

void sum_all(const float* x, std::size_t count, double multiplier, double* partials, float* out,
             cudaStream_t stream) {
    const std::size_t blocks = (count + sum_block - 1) / sum_block;
    if (blocks == 0) {
        finish_sum_kernel<<<1, threads_per_block, 0, stream>>>(partials, 0, multiplier, out);
        check_launch("sum (empty)");
        return;
    }
    block_partials_kernel<<<static_cast<unsigned int>(blocks), threads_per_block, 0, stream>>>(
        x, count, partials);
    check_launch("sum (block partials)");
    finish_sum_kernel<<<1, threads_per_block, 0, stream>>>(partials, blocks, multiplier, out);
    check_launch("sum (partials)");
}

void sum_axis(const float* x, std::size_t outer, std::size_t extent, std::size_t inner,
              double multiplier, float* out, cudaStream_t stream) {
    if (outer == 0 || inner == 0) {
        return;
    }
    if (inner == 1) {
        const std::size_t blocks = outer < max_blocks ? outer : max_blocks;
        row_sum_kernel<<<static_cast<unsigned int>(blocks), threads_per_block, 0, stream>>>(
            x, outer, extent, multiplier, out);
        check_launch("sum over the last axis");
        return;
    }
    column_sum_kernel<<<blocks_for(outer * inner), threads_per_block, 0, stream>>>(
        x, outer, extent, inner, multiplier, out);
    check_launch("sum over an axis");
}

}  // namespace riftco_transformer::detail::cuda
