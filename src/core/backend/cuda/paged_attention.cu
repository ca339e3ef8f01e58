// Paged decode attention kernels. One block per (request, pool head, slice of that head's
// query group): the block's query heads share every K/V page row it reads, each row loaded
// once for all of them. Warp w takes the visible positions first + w, first + w + warps, ...
// in logical order, finds each row through the request's page table in place (no gather),
// and keeps an online softmax per query head: running maximum m, running sum l and the
// weighted value sum, rescaled by e^{m_old − m_new} when the maximum grows. The warps' states
// are merged in warp order at the end. Scores are scale·(q·k) with the dot product summed in
// float by a fixed butterfly; a score that is NaN or +inf lowers the check slot (the CPU's
// check, deferred to the next sync point).

#include <cmath>

#include "core/backend/cuda/attention_nf4_adam_kernels.hpp"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr unsigned int attention_threads = 128;
constexpr unsigned int attention_warps = attention_threads / 32;
// Dynamic shared memory per block stays within the default 48 KiB.
constexpr std::size_t shared_budget = 48 * 1024;

__device__ inline float warp_sum(float value) {
    for (unsigned offset = 16; offset > 0; offset /= 2) {
        value += __shfl_xor_sync(0xFFFFFFFFU, value, offset);
    }
    return value;
}

// Shared memory: q [heads][d], then per warp: accumulators [heads][d], m [heads], l [heads].
__global__ void paged_decode_kernel(PagedGeometry g, unsigned heads_per_block, const float* query,
                                    const float* key_pool, const float* value_pool,
                                    const std::uint32_t* requests, const std::uint32_t* tables,
                                    float scale, float* context,
                                    unsigned long long* first_failure) {
    extern __shared__ float shared[];
    const std::uint64_t d = g.head_width;
    const std::uint64_t r = blockIdx.x;
    const std::uint64_t pool_head = blockIdx.y;
    const std::uint64_t first_head_in_group =
        static_cast<std::uint64_t>(blockIdx.z) * heads_per_block;
    const unsigned heads = static_cast<unsigned>(
        g.group_size - first_head_in_group < heads_per_block ? g.group_size - first_head_in_group
                                                             : heads_per_block);
    const std::uint64_t query_heads = g.kv_heads * g.group_size;
    const std::uint64_t first_head = pool_head * g.group_size + first_head_in_group;
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;

    float* q = shared;
    float* warp_state = shared + heads_per_block * d;
    const std::size_t per_warp = heads_per_block * (d + 2);
    float* accumulator = warp_state + warp * per_warp;
    float* maximum = accumulator + heads_per_block * d;
    float* total = maximum + heads_per_block;

    for (std::uint64_t i = threadIdx.x; i < heads * d; i += attention_threads) {
        q[i] = query[(r * query_heads + first_head) * d + i];
    }
    for (std::uint64_t i = lane; i < heads * d; i += 32) {
        accumulator[i] = 0.0F;
    }
    for (unsigned h = lane; h < heads; h += 32) {
        maximum[h] = -INFINITY;
        total[h] = 0.0F;
    }
    __syncthreads();

    const std::uint32_t* table = tables + requests[3 * r];
    const std::uint64_t length = requests[3 * r + 1];
    const std::uint64_t first = requests[3 * r + 2];
    const std::uint64_t page_stride = g.kv_heads * g.page_size * d;
    for (std::uint64_t t = first + warp; t < length; t += attention_warps) {
        const std::uint64_t row = static_cast<std::uint64_t>(table[t / g.page_size]) * page_stride +
                                  (pool_head * g.page_size + t % g.page_size) * d;
        const float* k = key_pool + row;
        const float* v = value_pool + row;
        for (unsigned h = 0; h < heads; ++h) {
            float dot = 0.0F;
            for (std::uint64_t i = lane; i < d; i += 32) {
                dot = fmaf(q[h * d + i], k[i], dot);
            }
            const float s = warp_sum(dot) * scale;
            if (isnan(s) || s == INFINITY) {
                if (lane == 0) {
                    const std::uint64_t position =
                        (r * query_heads + first_head + h) * g.longest_visible + (t - first);
                    atomicMin(first_failure,
                              static_cast<unsigned long long>(2 * position + (isnan(s) ? 1 : 0)));
                }
            }
            // Gemma 2's soft cap after the check, which it would hide.
            const float capped = g.softcap != 0.0F ? g.softcap * tanhf(s / g.softcap) : s;
            const float old_maximum = maximum[h];
            const float new_maximum = fmaxf(old_maximum, capped);
            const float rescale = expf(old_maximum - new_maximum);
            const float p = expf(capped - new_maximum);
            float* a = accumulator + h * d;
            for (std::uint64_t i = lane; i < d; i += 32) {
                a[i] = fmaf(p, v[i], a[i] * rescale);
            }
            __syncwarp();
            if (lane == 0) {
                total[h] = fmaf(total[h], rescale, p);
                maximum[h] = new_maximum;
            }
            __syncwarp();
        }
    }
    __syncthreads();

    // Merge the warps' states in warp order: thread i handles elements i, i + threads, ...
    for (std::uint64_t e = threadIdx.x; e < heads * d; e += attention_threads) {
        const unsigned h = static_cast<unsigned>(e / d);
        float m = -INFINITY;
        for (unsigned w = 0; w < attention_warps; ++w) {
            m = fmaxf(m, warp_state[w * per_warp + heads_per_block * d + h]);
        }
        float sum = 0.0F;
        float value = 0.0F;
        for (unsigned w = 0; w < attention_warps; ++w) {
            const float* state = warp_state + w * per_warp;
            const float wm = state[heads_per_block * d + h];
            if (wm == -INFINITY) {
                continue;  // this warp saw no position
            }
            const float factor = expf(wm - m);
            sum = fmaf(state[heads_per_block * d + heads_per_block + h], factor, sum);
            value = fmaf(state[e], factor, value);
        }
        context[(r * query_heads + first_head) * d + e] = value / sum;
    }
}

__global__ void paged_write_kernel(PagedGeometry g, const std::uint32_t* slots, std::size_t rows,
                                   const float* key, const float* value, float* key_pool,
                                   float* value_pool) {
    const std::uint64_t d = g.head_width;
    const std::uint64_t count = rows * g.kv_heads * d;
    for (std::uint64_t e = first_index(); e < count; e += grid_stride()) {
        const std::uint64_t r = e / (g.kv_heads * d);
        const std::uint64_t h = (e / d) % g.kv_heads;
        const std::uint64_t i = e % d;
        const std::uint64_t target =
            ((static_cast<std::uint64_t>(slots[2 * r]) * g.kv_heads + h) * g.page_size +
             slots[2 * r + 1]) *
                d +
            i;
        key_pool[target] = key[e];
        value_pool[target] = value[e];
    }
}

}  // namespace

void paged_decode(const PagedGeometry& geometry, const float* query, const float* key_pool,
                  const float* value_pool, const std::uint32_t* requests,
                  const std::uint32_t* tables, float scale, float* context,
                  unsigned long long* first_failure, cudaStream_t stream) {
    if (geometry.requests == 0) {
        return;
    }
    // As many of a group's query heads per block as the shared memory holds (at least one).
    const std::size_t per_head = geometry.head_width * (attention_warps + 1) + 2 * attention_warps;
    std::size_t heads = shared_budget / (per_head * sizeof(float));
    heads = heads < 1 ? 1 : (heads > geometry.group_size ? geometry.group_size : heads);
    const std::size_t slices = (geometry.group_size + heads - 1) / heads;
    const std::size_t bytes = heads * per_head * sizeof(float);
    const dim3 grid(static_cast<unsigned int>(geometry.requests),
                    static_cast<unsigned int>(geometry.kv_heads),
                    static_cast<unsigned int>(slices));
    paged_decode_kernel<<<grid, attention_threads, bytes, stream>>>(
        geometry, static_cast<unsigned>(heads), query, key_pool, value_pool, requests, tables,
        scale, context, first_failure);
    check_launch("paged_decode_kernel");
}

void paged_write(const PagedGeometry& geometry, const std::uint32_t* slots, std::size_t rows,
                 const float* key, const float* value, float* key_pool, float* value_pool,
                 cudaStream_t stream) {
    const std::size_t count = rows * geometry.kv_heads * geometry.head_width;
    if (count == 0) {
        return;
    }
    paged_write_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(
        geometry, slots, rows, key, value, key_pool, value_pool);
    check_launch("paged_write_kernel");
}

}  // namespace riftco_transformer::detail::cuda
