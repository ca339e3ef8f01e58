// Softmax kernels: one block per slice (row), three passes over it (max and the NaN/+inf
// check, Σ exp in double, normalise), each reduced over the block with warp shuffles
// (block_reduce.cuh). Exponents scale·(x − max) are <= 0, so exp never overflows.

#include <cuda/std/limits>

#include "core/backend/cuda/block_reduce.cuh"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"
#include "core/backend/cuda/row_kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// Where slice `slice` lives: its first element, the distance between its elements, and how
// many of its `extent` elements are visible.
struct SliceView {
    std::size_t base;
    std::size_t stride;
    std::size_t visible;
};

__device__ SliceView slice_view(std::size_t slice, std::size_t extent, std::size_t inner,
                                bool causal) {
    if (causal) {
        return {slice * extent, 1, slice % extent + 1};
    }
    const std::size_t o = slice / inner;
    const std::size_t i = slice % inner;
    return {o * extent * inner + i, inner, extent};
}

__global__ void softmax_kernel(const float* x, std::size_t slices, std::size_t extent,
                               std::size_t inner, bool causal, float scale, float* y,
                               unsigned long long* first_failure) {
    __shared__ float float_scratch[32];
    __shared__ double double_scratch[32];
    __shared__ int flag_scratch[32];
    constexpr float infinity = ::cuda::std::numeric_limits<float>::infinity();
    for (std::size_t slice = blockIdx.x; slice < slices; slice += gridDim.x) {
        const SliceView view = slice_view(slice, extent, inner, causal);
        const float* in = x + view.base;
        float* out = y + view.base;
        int bad = 0;
        float max = -infinity;
        for (std::size_t e = threadIdx.x; e < view.visible; e += blockDim.x) {
            const float value = in[e * view.stride];
            bad |= static_cast<int>(value != value) | static_cast<int>(value == infinity);
            max = fmaxf(max, value);
        }
        bad = block_reduce(bad, OrOp{}, 0, flag_scratch);
        max = block_reduce(max, MaxOp{}, -infinity, float_scratch);
        if (bad != 0 || max == -infinity) {
            if (threadIdx.x == 0) {
                atomicMin(first_failure, static_cast<unsigned long long>(slice));
            }
            continue;  // the row is left unwritten, as the reference does before it throws
        }
        double sum = 0.0;
        for (std::size_t e = threadIdx.x; e < view.visible; e += blockDim.x) {
            sum += static_cast<double>(expf(scale * (in[e * view.stride] - max)));
        }
        sum = block_reduce(sum, SumOp{}, 0.0, double_scratch);
        const auto inverse = static_cast<float>(1.0 / sum);
        for (std::size_t e = threadIdx.x; e < view.visible; e += blockDim.x) {
            out[e * view.stride] = expf(scale * (in[e * view.stride] - max)) * inverse;
        }
        for (std::size_t e = view.visible + threadIdx.x; e < extent; e += blockDim.x) {
            out[e * view.stride] = 0.0F;
        }
    }
}

__global__ void softmax_backward_kernel(const float* p, const float* g, std::size_t slices,
                                        std::size_t extent, std::size_t inner, bool causal,
                                        float scale, float* dx) {
    __shared__ double double_scratch[32];
    for (std::size_t slice = blockIdx.x; slice < slices; slice += gridDim.x) {
        const SliceView view = slice_view(slice, extent, inner, causal);
        double dot = 0.0;
        for (std::size_t e = threadIdx.x; e < view.visible; e += blockDim.x) {
            const std::size_t at = view.base + e * view.stride;
            dot += static_cast<double>(g[at]) * p[at];
        }
        const auto row_dot = static_cast<float>(block_reduce(dot, SumOp{}, 0.0, double_scratch));
        for (std::size_t e = threadIdx.x; e < view.visible; e += blockDim.x) {
            const std::size_t at = view.base + e * view.stride;
            dx[at] = scale * p[at] * (g[at] - row_dot);
        }
        for (std::size_t e = view.visible + threadIdx.x; e < extent; e += blockDim.x) {
            dx[view.base + e * view.stride] = 0.0F;
        }
    }
}

unsigned int row_blocks(std::size_t rows) {
    return static_cast<unsigned int>(rows < max_blocks ? (rows == 0 ? 1 : rows) : max_blocks);
}

}  // namespace

void softmax_rows(const float* x, std::size_t outer, std::size_t extent, std::size_t inner,
                  bool causal, float scale, float* y, unsigned long long* first_failure,
                  cudaStream_t stream) {
    const std::size_t slices = causal ? outer : outer * inner;
    if (slices == 0 || extent == 0) {
        return;
    }
    softmax_kernel<<<row_blocks(slices), threads_per_block, 0, stream>>>(
        x, slices, extent, inner, causal, scale, y, first_failure);
    check_launch(causal ? "causal_softmax" : "softmax");
}

void softmax_backward_rows(const float* p, const float* g, std::size_t outer, std::size_t extent,
                           std::size_t inner, bool causal, float scale, float* dx,
                           cudaStream_t stream) {
    const std::size_t slices = causal ? outer : outer * inner;
    if (slices == 0 || extent == 0) {
        return;
    }
    softmax_backward_kernel<<<row_blocks(slices), threads_per_block, 0, stream>>>(
        p, g, slices, extent, inner, causal, scale, dx);
    check_launch(causal ? "causal_softmax_backward" : "softmax_backward");
}

}  // namespace riftco_transformer::detail::cuda
