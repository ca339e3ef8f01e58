// Packed-NF4 linear kernels. The nibbles are decoded in registers from the packed codes: the
// codebook sits in shared memory, the block scale is read (legacy) or decoded from its 8-bit
// code (double-quantized) per element with the CPU's exact float arithmetic,
//   ŝ = clamp(μ + (t·(q − 128))/127, 0, FLT_MAX),  w = ŝ·codebook[code]
// (round-to-nearest intrinsics, so nvcc never contracts them), so every decoded weight is the
// CPU's float. No float32 copy of the matrix exists. Sums run in float in a fixed order.
//
// forward (y = x·deq(W)ᵀ): one warp per output feature o and up to `row_tile` rows of x; the
// lanes walk the input features (coalesced reads of x and of the codes), decode each weight
// once for all rows of the tile, and a fixed butterfly of shuffles sums the lanes.
// input backward (dx = g·deq(W)): one block per 32 input columns and `row_tile` rows; warp w
// of the block takes the output features o ≡ w (mod warps), lane c its column (coalesced code
// reads), and the warps' partials are summed in warp order through shared memory.

#include <cfloat>

#include "core/backend/cuda/attention_nf4_adam_kernels.hpp"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr unsigned int row_tile = 8;
constexpr unsigned int warps = threads_per_block / 32;
constexpr std::size_t max_row_blocks = 65535;

__device__ inline float decoded_scale(const Nf4DeviceWeight& w, std::uint64_t block) {
    if (!w.double_quantized) {
        return w.scales[block];
    }
    const float range = w.scale_ranges[block >> w.group_shift];
    const auto step = static_cast<float>(static_cast<int>(w.scale_codes[block]) - 128);
    const float delta = __fdiv_rn(__fmul_rn(range, step), 127.0F);
    const float scale = __fadd_rn(w.scale_offset, delta);
    if (!(scale > 0.0F)) {
        return 0.0F;
    }
    return scale > FLT_MAX ? FLT_MAX : scale;
}

__device__ inline float decoded_weight(const Nf4DeviceWeight& w, const float* codebook,
                                       std::uint64_t flat) {
    const std::uint8_t byte = w.codes[flat >> 1U];
    const unsigned code = (flat & 1U) != 0 ? (byte >> 4U) : (byte & 0x0FU);
    return __fmul_rn(decoded_scale(w, flat >> w.block_shift), codebook[code]);
}

__device__ inline void load_codebook(const Nf4DeviceWeight& w, float* codebook) {
    if (threadIdx.x < 16) {
        codebook[threadIdx.x] = w.codebook[threadIdx.x];
    }
    __syncthreads();
}

__global__ void nf4_forward_kernel(Nf4DeviceWeight w, const float* x, std::size_t rows, float* y) {
    __shared__ float codebook[16];
    load_codebook(w, codebook);
    const unsigned lane = threadIdx.x % 32;
    const std::uint64_t o = static_cast<std::uint64_t>(blockIdx.x) * warps + threadIdx.x / 32;
    if (o >= w.out_features) {
        return;
    }
    const std::uint64_t in = w.in_features;
    for (std::size_t first = static_cast<std::size_t>(blockIdx.y) * row_tile; first < rows;
         first += static_cast<std::size_t>(gridDim.y) * row_tile) {
        const unsigned count =
            rows - first < row_tile ? static_cast<unsigned>(rows - first) : row_tile;
        float sum[row_tile] = {};
        for (std::uint64_t i = lane; i < in; i += 32) {
            const float weight = decoded_weight(w, codebook, o * in + i);
#pragma unroll
            for (unsigned r = 0; r < row_tile; ++r) {
                if (r < count) {
                    sum[r] = fmaf(x[(first + r) * in + i], weight, sum[r]);
                }
            }
        }
#pragma unroll
        for (unsigned r = 0; r < row_tile; ++r) {
            for (unsigned offset = 16; offset > 0; offset /= 2) {
                sum[r] += __shfl_xor_sync(0xFFFFFFFFU, sum[r], offset);
            }
        }
        if (lane == 0) {
            for (unsigned r = 0; r < count; ++r) {
                y[(first + r) * w.out_features + o] = sum[r];
            }
        }
    }
}

__global__ void nf4_input_backward_kernel(Nf4DeviceWeight w, const float* g, std::size_t rows,
                                          float* dx) {
    __shared__ float codebook[16];
    __shared__ float partial[warps][row_tile][32];
    load_codebook(w, codebook);
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    const std::uint64_t in = w.in_features;
    const std::uint64_t out = w.out_features;
    const std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * 32 + lane;
    for (std::size_t first = static_cast<std::size_t>(blockIdx.y) * row_tile; first < rows;
         first += static_cast<std::size_t>(gridDim.y) * row_tile) {
        const unsigned count =
            rows - first < row_tile ? static_cast<unsigned>(rows - first) : row_tile;
        float sum[row_tile] = {};
        if (c < in) {
            for (std::uint64_t o = warp; o < out; o += warps) {
                const float weight = decoded_weight(w, codebook, o * in + c);
#pragma unroll
                for (unsigned r = 0; r < row_tile; ++r) {
                    if (r < count) {
                        sum[r] = fmaf(g[(first + r) * out + o], weight, sum[r]);
                    }
                }
            }
        }
#pragma unroll
        for (unsigned r = 0; r < row_tile; ++r) {
            partial[warp][r][lane] = sum[r];
        }
        __syncthreads();
        // Thread (r, lane) of the first row_tile warps adds the warps' partials in order.
        if (warp < count && c < in) {
            float total = 0.0F;
            for (unsigned k = 0; k < warps; ++k) {
                total += partial[k][warp][lane];
            }
            dx[(first + warp) * in + c] = total;
        }
        __syncthreads();
    }
}

unsigned int row_blocks(std::size_t rows) {
    const std::size_t tiles = (rows + row_tile - 1) / row_tile;
    return static_cast<unsigned int>(tiles < max_row_blocks ? tiles : max_row_blocks);
}

}  // namespace

static_assert(row_tile <= warps, "the backward's final sum uses one warp per row of a tile");

void nf4_forward(const Nf4DeviceWeight& weight, const float* x, std::size_t rows, float* y,
                 cudaStream_t stream) {
    if (rows == 0 || weight.out_features == 0) {
        return;
    }
    const dim3 grid(static_cast<unsigned int>((weight.out_features + warps - 1) / warps),
                    row_blocks(rows));
    nf4_forward_kernel<<<grid, threads_per_block, 0, stream>>>(weight, x, rows, y);
    check_launch("nf4_forward_kernel");
}

void nf4_input_backward(const Nf4DeviceWeight& weight, const float* g, std::size_t rows, float* dx,
                        cudaStream_t stream) {
    if (rows == 0 || weight.in_features == 0) {
        return;
    }
    const dim3 grid(static_cast<unsigned int>((weight.in_features + 31) / 32), row_blocks(rows));
    nf4_input_backward_kernel<<<grid, threads_per_block, 0, stream>>>(weight, g, rows, dx);
    check_launch("nf4_input_backward_kernel");
}

}  // namespace riftco_transformer::detail::cuda
