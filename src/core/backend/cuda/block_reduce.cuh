#pragma once
// Row reductions of one thread block (softmax, normalization, loss): a warp-shuffle tree in
// each warp, then the warps' results folded by the first warp. The tree's shape depends only
// on blockDim.x (a multiple of 32, at most 1024), so a row's result never depends on
// scheduling: the same inputs give the same bits on every run.

#include <cuda_runtime.h>

namespace riftco_transformer::detail::cuda {

constexpr unsigned int full_warp_mask = 0xFFFFFFFFU;

struct SumOp {
    template <typename T>
    __device__ T operator()(T a, T b) const {
        return a + b;
    }
};

// max that ignores NaN (like the CPU reference's row_max: a NaN never wins a comparison)
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct OrOp {
    __device__ int operator()(int a, int b) const { return a | b; }
};

template <typename T, typename Op>
__device__ T warp_reduce(T value, Op op) {
    for (int offset = 16; offset > 0; offset /= 2) {
        value = op(value, __shfl_xor_sync(full_warp_mask, value, offset));
    }
    return value;
}

// The reduction of every thread's `value` over the block, returned to every thread.
// `scratch` holds 32 values in shared memory; it may be reused right after the call.
template <typename T, typename Op>
__device__ T block_reduce(T value, Op op, T identity, T* scratch) {
    const unsigned int lane = threadIdx.x % 32U;
    const unsigned int warp = threadIdx.x / 32U;
    const unsigned int warps = (blockDim.x + 31U) / 32U;
    value = warp_reduce(value, op);
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    if (warp == 0) {
        value = lane < warps ? scratch[lane] : identity;
        value = warp_reduce(value, op);
        if (lane == 0) {
            scratch[0] = value;
        }
    }
    __syncthreads();
    const T result = scratch[0];
    __syncthreads();  // scratch is free again for the next reduction
    return result;
}

}  // namespace riftco_transformer::detail::cuda
