// Flash attention kernels (the CPU reference is cpu/attention.cpp), FP32 throughout, memory
// linear in T: nothing of size T×T is ever stored, only tiles in shared memory.
//
// Tiles: `tile` query rows by `tile` keys (32, or 16/8 when the head width d needs it to fit
// the device's shared memory), every row of Q/K/V/dO held with a stride of d + 1 floats so the
// column walks of the dot products do not conflict on shared-memory banks. 256 threads a
// block. Grouped-query attention: query item i = (b, h) reads key/value item ⌊i/r⌋ in place
// (r = Hq/Hkv), so K and V are never repeated.
//
// Forward: one block per (query item, query tile). Per visible key tile: S = scale·Q·Kᵀ
// (masked -> -inf; the causal mask and, with a window W, keys older than t−W+1), then one warp
// per row keeps the online softmax (m, l, and the rescaling e^{m_old−m_new}) with warp-shuffle
// reductions, and the block updates O ← O·e^{m_old−m_new} + P·V, all in shared memory. Key
// tiles entirely outside the visible range of the query tile are never loaded. The outputs
// are those of the CPU capability: O/l, m and l per row. Under a soft cap c (Gemma 2) every
// score is c·tanh(S/c) and dS carries the cap's derivative 1 − tanh²(S/c).
//
// Backward (D_i = Σ dO_i ⊙ O_i first, one warp per row), in two kernels that recompute
// P = e^{S−m}/l and dS = P ⊙ (dO·Vᵀ − D)·scale tile by tile from the saved statistics:
// - dK, dV: one block per (key/value item, key tile); it loops over the r query heads of the
//   group in head order and over the query tiles that can see its keys, accumulating
//   dV += Pᵀ·dO and dK += dSᵀ·Q in shared memory, then writes them once;
// - dQ: one block per (query item, query tile) looping over its visible key tiles,
//   dQ += dS·K.
// Every output element has exactly one writer and is summed in a fixed order: no atomics, and
// the same inputs give the same bits on every run.

#include <cuda/std/limits>

#include <initializer_list>
#include <stdexcept>
#include <string>

#include "core/backend/cuda/attention_kernels.hpp"
#include "core/backend/cuda/block_reduce.cuh"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr unsigned int attention_block = 256;
constexpr unsigned int attention_warps = attention_block / 32U;
constexpr float infinity = ::cuda::std::numeric_limits<float>::infinity();

__device__ inline bool visible(std::uint64_t query, std::uint64_t key, std::uint64_t window) {
    return key <= query && (window == 0 || key + window > query);
}

// The first key tile with a key visible from query q0.
__device__ inline std::uint64_t first_key_tile(std::uint64_t q0, std::uint64_t window,
                                               unsigned tile) {
    const std::uint64_t first_key = window == 0 || q0 < window ? 0 : q0 + 1 - window;
    return first_key / tile * tile;
}

// rows × d of `source` (rows `d` apart) into `tile_rows` (rows d + 1 apart).
__device__ inline void load_rows(const float* source, unsigned rows, unsigned d, float* tile_rows) {
    const unsigned ld = d + 1;
    for (unsigned e = threadIdx.x; e < rows * d; e += blockDim.x) {
        const unsigned r = e / d;
        const unsigned i = e % d;
        tile_rows[r * ld + i] = source[static_cast<std::size_t>(r) * d + i];
    }
}

__device__ inline void zero_rows(unsigned rows, unsigned d, float* tile_rows) {
    const unsigned ld = d + 1;
    for (unsigned e = threadIdx.x; e < rows * d; e += blockDim.x) {
        tile_rows[(e / d) * ld + e % d] = 0.0F;
    }
}

__device__ inline void store_rows(const float* tile_rows, unsigned rows, unsigned d,
                                  float* destination) {
    const unsigned ld = d + 1;
    for (unsigned e = threadIdx.x; e < rows * d; e += blockDim.x) {
        destination[static_cast<std::size_t>(e / d) * d + e % d] = tile_rows[(e / d) * ld + e % d];
    }
}

__global__ void __launch_bounds__(attention_block)
    flash_forward_kernel(FlashGeometry g, unsigned tile, const float* query, const float* key,
                         const float* value, float* context, float* row_max, float* row_sum,
                         unsigned long long* first_failure) {
    extern __shared__ float shared[];
    __shared__ int bad_scores;
    __shared__ int no_finite_row;
    const auto d = static_cast<unsigned>(g.width);
    const unsigned ld = d + 1;
    const unsigned sl = tile + 1;
    const std::uint64_t time = g.time;
    const std::uint64_t tiles = (time + tile - 1) / tile;
    const std::uint64_t item = blockIdx.x / tiles;
    const std::uint64_t q0 = blockIdx.x % tiles * tile;
    const auto rows = static_cast<unsigned>(time - q0 < tile ? time - q0 : tile);
    float* q_tile = shared;
    float* k_tile = q_tile + tile * ld;
    float* v_tile = k_tile + tile * ld;
    float* o_tile = v_tile + tile * ld;
    float* s_tile = o_tile + tile * ld;
    float* m_tile = s_tile + tile * sl;
    float* l_tile = m_tile + tile;
    float* c_tile = l_tile + tile;
    const float* q = query + (item * time + q0) * d;
    const float* k = key + item / g.group * time * d;
    const float* v = value + item / g.group * time * d;
    const unsigned lane = threadIdx.x % 32U;
    const unsigned warp = threadIdx.x / 32U;

    if (threadIdx.x == 0) {
        bad_scores = 0;
        no_finite_row = 0;
    }
    load_rows(q, rows, d, q_tile);
    zero_rows(rows, d, o_tile);
    for (unsigned r = threadIdx.x; r < rows; r += blockDim.x) {
        m_tile[r] = -infinity;
        l_tile[r] = 0.0F;
    }
    __syncthreads();
    for (std::uint64_t k0 = first_key_tile(q0, g.window, tile); k0 < q0 + rows; k0 += tile) {
        const auto cols = static_cast<unsigned>(time - k0 < tile ? time - k0 : tile);
        load_rows(k + k0 * d, cols, d, k_tile);
        load_rows(v + k0 * d, cols, d, v_tile);
        __syncthreads();
        int bad = 0;
        for (unsigned e = threadIdx.x; e < rows * cols; e += blockDim.x) {
            const unsigned r = e / cols;
            const unsigned c = e % cols;
            float dot = 0.0F;
            for (unsigned i = 0; i < d; ++i) {
                dot = fmaf(q_tile[r * ld + i], k_tile[c * ld + i], dot);
            }
            const float score = dot * g.scale;
            const bool seen = visible(q0 + r, k0 + c, g.window);
            bad |= static_cast<int>(seen && (score != score || score == infinity));
            // Gemma 2's soft cap after the check, which it would hide.
            const float capped = g.softcap != 0.0F ? g.softcap * tanhf(score / g.softcap) : score;
            s_tile[r * sl + c] = seen ? capped : -infinity;
        }
        if (bad != 0) {
            bad_scores = 1;
        }
        __syncthreads();
        // The online softmax, one warp per row (a row has at most 32 keys in a tile).
        for (unsigned r = warp; r < rows; r += attention_warps) {
            const float score = lane < cols ? s_tile[r * sl + lane] : -infinity;
            const float old_max = m_tile[r];
            const float new_max = fmaxf(old_max, warp_reduce(score, MaxOp{}));
            if (new_max == -infinity) {  // nothing visible yet
                if (lane < cols) {
                    s_tile[r * sl + lane] = 0.0F;
                }
                if (lane == 0) {
                    c_tile[r] = 1.0F;
                }
                continue;
            }
            const float p = lane < cols ? expf(score - new_max) : 0.0F;
            const float sum = warp_reduce(p, SumOp{});
            __syncwarp();
            if (lane < cols) {
                s_tile[r * sl + lane] = p;
            }
            if (lane == 0) {
                const float correction = expf(old_max - new_max);
                l_tile[r] = l_tile[r] * correction + sum;
                m_tile[r] = new_max;
                c_tile[r] = correction;
            }
        }
        __syncthreads();
        // O ← O·correction + P·V
        for (unsigned e = threadIdx.x; e < rows * d; e += blockDim.x) {
            const unsigned r = e / d;
            const unsigned i = e % d;
            float acc = o_tile[r * ld + i] * c_tile[r];
            for (unsigned c = 0; c < cols; ++c) {
                acc = fmaf(s_tile[r * sl + c], v_tile[c * ld + i], acc);
            }
            o_tile[r * ld + i] = acc;
        }
        __syncthreads();
    }
    float* o = context + (item * time + q0) * d;
    for (unsigned e = threadIdx.x; e < rows * d; e += blockDim.x) {
        const unsigned r = e / d;
        const float m = m_tile[r];
        o[static_cast<std::size_t>(r) * d + e % d] =
            m == -infinity ? 0.0F : o_tile[r * ld + e % d] * (1.0F / l_tile[r]);
    }
    for (unsigned r = threadIdx.x; r < rows; r += blockDim.x) {
        row_max[item * time + q0 + r] = m_tile[r];
        row_sum[item * time + q0 + r] = l_tile[r];
        if (m_tile[r] == -infinity) {
            no_finite_row = 1;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (bad_scores != 0) {
            atomicMin(first_failure, static_cast<unsigned long long>(item));
        } else if (no_finite_row != 0) {
            atomicMin(first_failure, static_cast<unsigned long long>(g.query_items + item));
        }
    }
}

// D_i = Σ dO_i ⊙ O_i, one warp per row.
__global__ void row_dot_kernel(std::uint64_t rows, std::uint64_t d, const float* context,
                               const float* upstream, float* row_dots) {
    const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * (blockDim.x / 32U);
    const unsigned lane = threadIdx.x % 32U;
    for (std::uint64_t row = first_index() / 32U; row < rows; row += warps) {
        float dot = 0.0F;
        for (std::uint64_t i = lane; i < d; i += 32U) {
            dot = fmaf(upstream[row * d + i], context[row * d + i], dot);
        }
        dot = warp_reduce(dot, SumOp{});
        if (lane == 0) {
            row_dots[row] = dot;
        }
    }
}

// The backward's per-query-tile state in shared memory: Q and dO rows, m, 1/l and D.
struct QueryTile {
    float* q;
    float* upstream;
    float* m;
    float* inverse_sum;
    float* dot;
};

__device__ inline void load_query_tile(const FlashGeometry& g, std::uint64_t item, std::uint64_t q0,
                                       unsigned rows, const float* query, const float* upstream,
                                       const float* row_max, const float* row_sum,
                                       const float* row_dots, const QueryTile& t) {
    const auto d = static_cast<unsigned>(g.width);
    load_rows(query + (item * g.time + q0) * d, rows, d, t.q);
    load_rows(upstream + (item * g.time + q0) * d, rows, d, t.upstream);
    for (unsigned r = threadIdx.x; r < rows; r += blockDim.x) {
        const std::uint64_t row = item * g.time + q0 + r;
        t.m[r] = row_max[row];
        t.inverse_sum[r] = 1.0F / row_sum[row];
        t.dot[r] = row_dots[row];
    }
}

// P [rows, cols] and dS = P ⊙ (dO·Vᵀ − D)·scale for query tile q0 and key tile k0 (rows
// `tile` + 1 apart); masked entries are exactly 0.
__device__ inline void probabilities_and_score_gradients(const FlashGeometry& g, unsigned tile,
                                                         unsigned rows, unsigned cols,
                                                         std::uint64_t q0, std::uint64_t k0,
                                                         const QueryTile& t, const float* k_tile,
                                                         const float* v_tile, float* p_tile,
                                                         float* ds_tile) {
    const auto d = static_cast<unsigned>(g.width);
    const unsigned ld = d + 1;
    const unsigned sl = tile + 1;
    for (unsigned e = threadIdx.x; e < rows * cols; e += blockDim.x) {
        const unsigned r = e / cols;
        const unsigned c = e % cols;
        float p = 0.0F;
        float ds = 0.0F;
        if (visible(q0 + r, k0 + c, g.window) && t.m[r] != -infinity) {
            float score = 0.0F;
            float dp = 0.0F;
            for (unsigned i = 0; i < d; ++i) {
                score = fmaf(t.q[r * ld + i], k_tile[c * ld + i], score);
                dp = fmaf(t.upstream[r * ld + i], v_tile[c * ld + i], dp);
            }
            float capped = score * g.scale;
            float slope = 1.0F;  // d capped / d raw
            if (g.softcap != 0.0F) {
                const float tanh_value = tanhf(capped / g.softcap);
                capped = g.softcap * tanh_value;
                slope = 1.0F - tanh_value * tanh_value;
            }
            p = expf(capped - t.m[r]) * t.inverse_sum[r];
            ds = p * (dp - t.dot[r]) * g.scale * slope;
        }
        p_tile[r * sl + c] = p;
        ds_tile[r * sl + c] = ds;
    }
}

__global__ void __launch_bounds__(attention_block)
    flash_key_value_backward_kernel(FlashGeometry g, unsigned tile, const float* query,
                                    const float* key, const float* value, const float* row_max,
                                    const float* row_sum, const float* upstream,
                                    const float* row_dots, float* key_gradient,
                                    float* value_gradient) {
    extern __shared__ float shared[];
    const auto d = static_cast<unsigned>(g.width);
    const unsigned ld = d + 1;
    const unsigned sl = tile + 1;
    const std::uint64_t time = g.time;
    const std::uint64_t tiles = (time + tile - 1) / tile;
    const std::uint64_t kv_item = blockIdx.x / tiles;
    const std::uint64_t k0 = blockIdx.x % tiles * tile;
    const auto cols = static_cast<unsigned>(time - k0 < tile ? time - k0 : tile);
    float* k_tile = shared;
    float* v_tile = k_tile + tile * ld;
    float* dk_tile = v_tile + tile * ld;
    float* dv_tile = dk_tile + tile * ld;
    const QueryTile t{dv_tile + tile * ld, dv_tile + 2 * tile * ld, dv_tile + 3 * tile * ld,
                      dv_tile + 3 * tile * ld + tile, dv_tile + 3 * tile * ld + 2 * tile};
    float* p_tile = t.dot + tile;
    float* ds_tile = p_tile + tile * sl;

    load_rows(key + (kv_item * time + k0) * d, cols, d, k_tile);
    load_rows(value + (kv_item * time + k0) * d, cols, d, v_tile);
    zero_rows(cols, d, dk_tile);
    zero_rows(cols, d, dv_tile);
    // Queries that can see a key of this tile: k0 .. k0+cols−1+W−1 (all later ones when W = 0).
    const std::uint64_t reach = k0 + cols - 1 + g.window;
    const std::uint64_t query_end = g.window == 0 || reach > time ? time : reach;
    for (std::uint64_t h = 0; h < g.group; ++h) {  // the group's query heads, in head order
        const std::uint64_t item = kv_item * g.group + h;
        for (std::uint64_t q0 = k0; q0 < query_end; q0 += tile) {
            const auto rows = static_cast<unsigned>(time - q0 < tile ? time - q0 : tile);
            __syncthreads();  // the previous tile's reads are done
            load_query_tile(g, item, q0, rows, query, upstream, row_max, row_sum, row_dots, t);
            __syncthreads();
            probabilities_and_score_gradients(g, tile, rows, cols, q0, k0, t, k_tile, v_tile,
                                              p_tile, ds_tile);
            __syncthreads();
            // dV += Pᵀ·dO;  dK += dSᵀ·Q
            for (unsigned e = threadIdx.x; e < cols * d; e += blockDim.x) {
                const unsigned c = e / d;
                const unsigned i = e % d;
                float dv = dv_tile[c * ld + i];
                float dk = dk_tile[c * ld + i];
                for (unsigned r = 0; r < rows; ++r) {
                    dv = fmaf(p_tile[r * sl + c], t.upstream[r * ld + i], dv);
                    dk = fmaf(ds_tile[r * sl + c], t.q[r * ld + i], dk);
                }
                dv_tile[c * ld + i] = dv;
                dk_tile[c * ld + i] = dk;
            }
        }
    }
    __syncthreads();
    store_rows(dk_tile, cols, d, key_gradient + (kv_item * time + k0) * d);
    store_rows(dv_tile, cols, d, value_gradient + (kv_item * time + k0) * d);
}

__global__ void __launch_bounds__(attention_block)
    flash_query_backward_kernel(FlashGeometry g, unsigned tile, const float* query,
                                const float* key, const float* value, const float* row_max,
                                const float* row_sum, const float* upstream, const float* row_dots,
                                float* query_gradient) {
    extern __shared__ float shared[];
    const auto d = static_cast<unsigned>(g.width);
    const unsigned ld = d + 1;
    const unsigned sl = tile + 1;
    const std::uint64_t time = g.time;
    const std::uint64_t tiles = (time + tile - 1) / tile;
    const std::uint64_t item = blockIdx.x / tiles;
    const std::uint64_t q0 = blockIdx.x % tiles * tile;
    const auto rows = static_cast<unsigned>(time - q0 < tile ? time - q0 : tile);
    float* k_tile = shared;
    float* v_tile = k_tile + tile * ld;
    float* dq_tile = v_tile + tile * ld;
    const QueryTile t{dq_tile + tile * ld, dq_tile + 2 * tile * ld, dq_tile + 3 * tile * ld,
                      dq_tile + 3 * tile * ld + tile, dq_tile + 3 * tile * ld + 2 * tile};
    float* p_tile = t.dot + tile;
    float* ds_tile = p_tile + tile * sl;
    const float* k = key + item / g.group * time * d;
    const float* v = value + item / g.group * time * d;

    load_query_tile(g, item, q0, rows, query, upstream, row_max, row_sum, row_dots, t);
    zero_rows(rows, d, dq_tile);
    for (std::uint64_t k0 = first_key_tile(q0, g.window, tile); k0 < q0 + rows; k0 += tile) {
        const auto cols = static_cast<unsigned>(time - k0 < tile ? time - k0 : tile);
        __syncthreads();  // the previous tile's reads are done
        load_rows(k + k0 * d, cols, d, k_tile);
        load_rows(v + k0 * d, cols, d, v_tile);
        __syncthreads();
        probabilities_and_score_gradients(g, tile, rows, cols, q0, k0, t, k_tile, v_tile, p_tile,
                                          ds_tile);
        __syncthreads();
        // dQ += dS·K
        for (unsigned e = threadIdx.x; e < rows * d; e += blockDim.x) {
            const unsigned r = e / d;
            const unsigned i = e % d;
            float dq = dq_tile[r * ld + i];
            for (unsigned c = 0; c < cols; ++c) {
                dq = fmaf(ds_tile[r * sl + c], k_tile[c * ld + i], dq);
            }
            dq_tile[r * ld + i] = dq;
        }
    }
    __syncthreads();
    store_rows(dq_tile, rows, d, query_gradient + (item * time + q0) * d);
}

void require_success(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
        throw std::runtime_error(std::string("CUDA ") + what + " failed: " +
                                 cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
    }
}

// Floats of shared memory: `row_tiles` tiles of rows d + 1 apart, `square_tiles` of
// tile × (tile + 1) and `vectors` of `tile`.
std::size_t shared_bytes(unsigned tile, std::uint64_t d, unsigned row_tiles, unsigned square_tiles,
                         unsigned vectors) {
    return sizeof(float) * (static_cast<std::size_t>(row_tiles) * tile * (d + 1) +
                            static_cast<std::size_t>(square_tiles) * tile * (tile + 1) +
                            static_cast<std::size_t>(vectors) * tile);
}

// The largest tile (32, 16 or 8 rows) whose shared memory fits the device's opt-in limit.
unsigned choose_tile(const char* operation, std::uint64_t d, unsigned row_tiles,
                     unsigned square_tiles, unsigned vectors, std::size_t& bytes) {
    int device = 0;
    require_success(cudaGetDevice(&device), "cudaGetDevice");
    int limit = 0;
    require_success(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                    "cudaDeviceGetAttribute (shared memory per block)");
    for (const unsigned tile : {32U, 16U, 8U}) {
        bytes = shared_bytes(tile, d, row_tiles, square_tiles, vectors);
        if (bytes <= static_cast<std::size_t>(limit)) {
            return tile;
        }
    }
    throw std::length_error(std::string(operation) + ": head width " + std::to_string(d) +
                            " needs more shared memory per block than the CUDA device offers");
}

unsigned int grid_of(std::uint64_t items, unsigned tile, std::uint64_t time) {
    return static_cast<unsigned int>(items * ((time + tile - 1) / tile));
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
    require_success(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)),
                    "cudaFuncSetAttribute (flash attention shared memory)");
}

}  // namespace

void flash_attention_forward(const FlashGeometry& geometry, const float* query, const float* key,
                             const float* value, float* context, float* row_max, float* row_sum,
                             unsigned long long* first_failure, cudaStream_t stream) {
    std::size_t bytes = 0;
    const unsigned tile = choose_tile("flash_attention", geometry.width, 4, 1, 3, bytes);
    allow_shared(flash_forward_kernel, bytes);
    flash_forward_kernel<<<grid_of(geometry.query_items, tile, geometry.time), attention_block,
                           bytes, stream>>>(geometry, tile, query, key, value, context, row_max,
                                            row_sum, first_failure);
    check_launch("flash_forward_kernel");
}

void flash_attention_backward(const FlashGeometry& geometry, const float* query, const float* key,
                              const float* value, const float* context, const float* row_max,
                              const float* row_sum, const float* upstream, float* row_dots,
                              float* query_gradient, float* key_gradient, float* value_gradient,
                              cudaStream_t stream) {
    constexpr const char* operation = "flash_attention_backward";
    const std::uint64_t rows = geometry.query_items * geometry.time;
    row_dot_kernel<<<blocks_for(rows * 32U), threads_per_block, 0, stream>>>(
        rows, geometry.width, context, upstream, row_dots);
    check_launch("flash_row_dot_kernel");

    std::size_t bytes = 0;
    unsigned tile = choose_tile(operation, geometry.width, 6, 2, 3, bytes);
    allow_shared(flash_key_value_backward_kernel, bytes);
    flash_key_value_backward_kernel<<<grid_of(geometry.query_items / geometry.group, tile,
                                              geometry.time),
                                      attention_block, bytes, stream>>>(
        geometry, tile, query, key, value, row_max, row_sum, upstream, row_dots, key_gradient,
        value_gradient);
    check_launch("flash_key_value_backward_kernel");

    tile = choose_tile(operation, geometry.width, 5, 2, 3, bytes);
    allow_shared(flash_query_backward_kernel, bytes);
    flash_query_backward_kernel<<<grid_of(geometry.query_items, tile, geometry.time),
                                  attention_block, bytes, stream>>>(
        geometry, tile, query, key, value, row_max, row_sum, upstream, row_dots, query_gradient);
    check_launch("flash_query_backward_kernel");
}

}  // namespace riftco_transformer::detail::cuda
