// CPU flash attention: exact causal attention in memory linear in T. Queries and keys are
// walked in tiles of 64 with GEMM tiles (single-threaded inside the parallel region); only the
// per-row max m_i and exponential sum l_i are kept between passes. Grouped-query attention
// (Q [B,Hq,T,d], K, V [B,Hkv,T,d], r = Hq/Hkv) reads key/value head ⌊h/r⌋ in place: with
// query items ordered (b, h), query item i reads key/value item ⌊i/r⌋.
//
// Visible keys of query t: max(0, t−W+1, t−p_t)..t (W = options.window; 0: no window bound;
// p_t = token t's position inside its document in a packed row, 0.. without documents: the
// row is one document). Both bounds never decrease along a row, so a query tile's first
// query has its lowest. Key tiles entirely outside the visible range of a query tile (after
// its last query, or before the bound of its first) are never touched, so time is
// O(T·min(T, W+tile)) and scratch is O(tile²).
//
// Forward, one work item per (batch, query head); per query tile Q_i [q,d] and visible key
// tile K_j, V_j [k,d]:
//   S = scale·Q_i·K_jᵀ (masked -> -inf); m' = max(m, rowmax S)
//   l = l·e^{m−m'} + Σ e^{S−m'};  acc = acc·e^{m−m'} + e^{S−m'}·V_j;  m = m'
//   O_i = acc / l
// Backward (D_i = rowsum(dO_i ⊙ O_i)): P = e^{S−m}/l recomputed per tile, then
//   dV_j += Pᵀ·dO_i;  dP = dO_i·V_jᵀ;  dS = P ⊙ (dP − D_i)
//   dQ_i += scale·dS·K_j;  dK_j += scale·dSᵀ·Q_i
// Under a soft cap c (Gemma 2), S = c·tanh(scale·Q_i·K_jᵀ/c) in both passes and dS is
// multiplied elementwise by the cap's derivative 1 − tanh²(·).
// Backward, grouped heads (r > 1): dK and dV of a key/value head are the sum, in head order,
// of the r query heads' shares, each share computed whole; so the bits never depend on the
// schedule or the thread count. When the B·Hkv groups balance the threads as well as the
// B·Hq heads would, one work item per (batch, key/value head) owns its dK, dV and loops over
// its r query heads (one [T,d] share per thread at a time). Otherwise one work item per
// (batch, query head) writes its share to a [B·Hq,T,d] buffer, then the shares are summed
// in head order. Either way every output has exactly one writer: no races, and K, V are
// never repeated.
// Masked entries have P = 0 exactly, so they contribute nothing in either direction.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/host_block_cache.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr std::size_t tile = 64;
constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

// C[m,n] = op(A)·op(B), row-major with the given leading dimensions.
void tile_gemm(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
               const float* a, std::size_t lda, const float* b, std::size_t ldb, float* c,
               std::size_t ldc) {
    GemmArguments g;
    g.transpose_a = transpose_a;
    g.transpose_b = transpose_b;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.lda = lda;
    g.b = b;
    g.ldb = ldb;
    g.c = c;
    g.ldc = ldc;
    gemm(g);
}

// The first key visible from query `query`: the window's bound (window 0: none) or its
// document's first token (positions: the row's positions inside documents; null: one
// document), whichever is later.
std::size_t first_visible_key(std::size_t query, std::size_t window,
                              const std::uint32_t* positions) {
    const std::size_t window_first = window == 0 || query < window ? 0 : query + 1 - window;
    const std::size_t document_first = positions == nullptr ? 0 : query - positions[query];
    return std::max(window_first, document_first);
}

// The first key tile with a key visible from query q0.
std::size_t first_key_tile(std::size_t q0, std::size_t window, const std::uint32_t* positions) {
    return first_visible_key(q0, window, positions) / tile * tile;
}

// scores [rows, cols] for queries q0.. and keys k0..: scale, cap (softcap c > 0: c·tanh(s/c)),
// mask the future and (window > 0) keys older than the window, and report a NaN or +inf among
// the visible scores (checked before the cap, which would hide an overflow). With a cap and
// `derivative`, the cap's derivative 1 − tanh²(s/c) of each entry is written there ([rows,
// cols]; masked entries too, where it is never used). The cap is chosen once per tile.
bool scale_and_mask(float* scores, std::size_t rows, std::size_t cols, std::size_t q0,
                    std::size_t k0, float scale, std::size_t window, const std::uint32_t* positions,
                    float softcap = 0.0F, float* derivative = nullptr) {
    int bad = 0;
    const float inverse_cap = softcap != 0.0F ? 1.0F / softcap : 0.0F;
    constexpr float positive_infinity = std::numeric_limits<float>::infinity();
    for (std::size_t r = 0; r < rows; ++r) {
        float* row = scores + r * cols;
        const std::size_t query = q0 + r;
        // Key `key` is visible when first <= key <= query (the window's or the document's first
        // key, or 0). The loops are branch-free (bitwise tests, selects) so that they vectorise.
        const std::size_t first = first_visible_key(query, window, positions);
        for (std::size_t c = 0; c < cols; ++c) {
            const float value = row[c] * scale;
            const std::size_t key = k0 + c;
            const bool visible = (key <= query) & (key >= first);
            bad |= static_cast<int>(visible & ((value != value) | (value == positive_infinity)));
            // float to float: clang-tidy 14 misreads the infinity constant as a narrowing.
            // NOLINTNEXTLINE(bugprone-narrowing-conversions)
            row[c] = visible ? value : negative_infinity;
        }
        if (softcap == 0.0F)
            continue;
        // Every entry's tanh, kept where the key is visible: masked entries stay −inf, a
        // visible −inf is capped to −c as on every backend.
        if (derivative == nullptr) {
            for (std::size_t c = 0; c < cols; ++c) {
                const std::size_t key = k0 + c;
                const bool visible = (key <= query) & (key >= first);
                const float t = fast_tanh(row[c] * inverse_cap);
                row[c] = visible ? softcap * t : negative_infinity;
            }
        } else {
            float* slope = derivative + r * cols;
            for (std::size_t c = 0; c < cols; ++c) {
                const std::size_t key = k0 + c;
                const bool visible = (key <= query) & (key >= first);
                const float t = fast_tanh(row[c] * inverse_cap);
                row[c] = visible ? softcap * t : negative_infinity;
                slope[c] = 1.0F - t * t;
            }
        }
    }
    return bad != 0;
}

[[noreturn]] void throw_bad_scores(std::size_t item, bool no_finite) {
    std::ostringstream message;
    message << "flash attention: (batch·head) " << item
            << (no_finite ? " has a query row with no finite visible score"
                          : " has a visible score that is NaN or +inf");
    throw std::domain_error(message.str());
}

}  // namespace

void CpuAttention::flash_forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                 float scale, const tensor_ops::FlashAttentionOptions& options,
                                 Tensor& context, Tensor& row_max, Tensor& row_sum) const {
    const std::size_t time = query.shape()[2];
    const std::size_t width = query.shape()[3];
    const std::size_t items = query.numel() / (time * width);     // B·Hq
    const std::size_t group = query.shape()[1] / key.shape()[1];  // r = Hq/Hkv
    const std::size_t heads = query.shape()[1];                   // Hq: item / Hq is the row
    const std::size_t window = options.window;
    const std::uint32_t* packed =
        options.documents == nullptr ? nullptr : options.documents->positions.data();
    const float* q_all = cpu_data(query);
    const float* k_all = cpu_data(key);
    const float* v_all = cpu_data(value);
    float* o_all = cpu_output(context);
    float* m_all = cpu_output(row_max);
    float* l_all = cpu_output(row_sum);
    FirstFailingRow nan_or_inf;
    FirstFailingRow no_finite;
    parallel_for(items, 1, [&](std::size_t begin, std::size_t end) {
        std::vector<float> scores(tile * tile);
        std::vector<float> update(tile * width);
        for (std::size_t item = begin; item < end; ++item) {
            const float* q = q_all + item * time * width;
            const float* k = k_all + item / group * time * width;
            const float* v = v_all + item / group * time * width;
            float* o = o_all + item * time * width;
            float* m = m_all + item * time;
            float* l = l_all + item * time;
            const std::uint32_t* positions =
                packed == nullptr ? nullptr : packed + item / heads * time;
            for (std::size_t q0 = 0; q0 < time; q0 += tile) {
                const std::size_t rows = std::min(tile, time - q0);
                std::fill_n(m + q0, rows, negative_infinity);
                std::fill_n(l + q0, rows, 0.0F);
                std::fill_n(o + q0 * width, rows * width, 0.0F);
                // Key tiles entirely after the last query of this tile, or entirely before
                // the window of its first query, are skipped.
                for (std::size_t k0 = first_key_tile(q0, window, positions); k0 < q0 + rows;
                     k0 += tile) {
                    const std::size_t cols = std::min(tile, time - k0);
                    tile_gemm(false, true, rows, cols, width, q + q0 * width, width, k + k0 * width,
                              width, scores.data(), cols);
                    if (scale_and_mask(scores.data(), rows, cols, q0, k0, scale, window, positions,
                                       options.softcap)) {
                        nan_or_inf.record(item);
                    }
                    for (std::size_t r = 0; r < rows; ++r) {
                        float* s = scores.data() + r * cols;
                        const float old_max = m[q0 + r];
                        const float new_max = std::max(old_max, detail::row_max(s, cols));
                        if (new_max == negative_infinity) {
                            std::fill_n(s, cols, 0.0F);  // nothing visible yet
                            continue;
                        }
                        for (std::size_t c = 0; c < cols; ++c)
                            s[c] = fast_exp(s[c] - new_max);
                        const float correction = fast_exp(old_max - new_max);
                        l[q0 + r] =
                            l[q0 + r] * correction + static_cast<float>(detail::row_sum(s, cols));
                        float* acc = o + (q0 + r) * width;
                        for (std::size_t d = 0; d < width; ++d)
                            acc[d] *= correction;
                        m[q0 + r] = new_max;
                    }
                    // acc += P·V_j  ([rows, cols] x [cols, d])
                    tile_gemm(false, false, rows, width, cols, scores.data(), cols, v + k0 * width,
                              width, update.data(), width);
                    float* acc = o + q0 * width;
                    for (std::size_t i = 0; i < rows * width; ++i)
                        acc[i] += update[i];
                }
                for (std::size_t r = 0; r < rows; ++r) {
                    if (m[q0 + r] == negative_infinity) {
                        no_finite.record(item);
                        continue;
                    }
                    const float inverse = 1.0F / l[q0 + r];
                    float* out = o + (q0 + r) * width;
                    for (std::size_t d = 0; d < width; ++d)
                        out[d] *= inverse;
                }
            }
        }
    });
    if (nan_or_inf.any())
        throw_bad_scores(nan_or_inf.row(), false);
    if (no_finite.any())
        throw_bad_scores(no_finite.row(), true);
}

namespace {

// The backward's read-only inputs and outputs, [items, T, d] (items = B·Hq for Q, O, dO, dQ;
// B·Hkv for K, V, dK, dV) and [B·Hq, T] for the row statistics.
struct BackwardTensors {
    std::size_t time;
    std::size_t width;
    std::size_t group;  // r = Hq/Hkv
    std::size_t heads;  // Hq: query item / Hq is its batch row
    std::size_t window;
    const std::uint32_t* positions;  // [B·T] positions inside documents; null: unpacked
    float scale;
    float softcap;  // 0: none
    const float* query;
    const float* key;
    const float* value;
    const float* context;
    const float* row_max;
    const float* row_sum;
    const float* upstream;
    float* query_gradient;
    float* key_gradient;
    float* value_gradient;
};

// Uninitialised floats from the host block cache (recycled: no fresh pages per call).
class HostScratch {
  public:
    explicit HostScratch(std::size_t count)
        : bytes_(count * sizeof(float)), data_(static_cast<float*>(acquire_host_block(bytes_))) {}
    ~HostScratch() { release_host_block(data_, bytes_); }
    HostScratch(const HostScratch&) = delete;
    HostScratch& operator=(const HostScratch&) = delete;
    [[nodiscard]] float* get() const noexcept { return data_; }

  private:
    std::size_t bytes_;
    float* data_;
};

// Per-thread tiles: O(tile² + tile·d + T) floats.
struct BackwardScratch {
    explicit BackwardScratch(const BackwardTensors& b)
        : probabilities(tile * tile),
          d_scores(tile * tile),
          cap_derivative(b.softcap != 0.0F ? tile * tile : 0),
          product(tile * b.width),
          row_dot_products(b.time) {}
    std::vector<float> probabilities;
    std::vector<float> d_scores;
    std::vector<float> cap_derivative;  // 1 − tanh²(s/c) of the tile under a soft cap
    std::vector<float> product;
    std::vector<float> row_dot_products;
};

// One query head `item`: dQ of the head (overwritten) and the head's share of dK, dV of its
// key/value head, written to dk, dv [T,d] (overwritten).
void query_head_backward(const BackwardTensors& b, std::size_t item, float* dk, float* dv,
                         BackwardScratch& scratch) {
    const std::size_t time = b.time;
    const std::size_t width = b.width;
    const std::size_t offset = item * time * width;
    const std::size_t kv_offset = item / b.group * time * width;
    const float* q = b.query + offset;
    const float* o = b.context + offset;
    const float* g = b.upstream + offset;
    const float* k = b.key + kv_offset;
    const float* v = b.value + kv_offset;
    const float* m = b.row_max + item * time;
    const float* l = b.row_sum + item * time;
    float* dq = b.query_gradient + offset;
    const std::uint32_t* positions =
        b.positions == nullptr ? nullptr : b.positions + item / b.heads * time;
    std::fill_n(dq, time * width, 0.0F);
    std::fill_n(dk, time * width, 0.0F);
    std::fill_n(dv, time * width, 0.0F);
    std::vector<float>& row_dot_products = scratch.row_dot_products;
    for (std::size_t t = 0; t < time; ++t)
        row_dot_products[t] = static_cast<float>(row_dot(g + t * width, o + t * width, width));
    for (std::size_t q0 = 0; q0 < time; q0 += tile) {
        const std::size_t rows = std::min(tile, time - q0);
        for (std::size_t k0 = first_key_tile(q0, b.window, positions); k0 < q0 + rows; k0 += tile) {
            const std::size_t cols = std::min(tile, time - k0);
            float* p = scratch.probabilities.data();
            float* product = scratch.product.data();
            tile_gemm(false, true, rows, cols, width, q + q0 * width, width, k + k0 * width, width,
                      p, cols);
            float* slope = b.softcap != 0.0F ? scratch.cap_derivative.data() : nullptr;
            static_cast<void>(scale_and_mask(p, rows, cols, q0, k0, b.scale, b.window, positions,
                                             b.softcap, slope));
            for (std::size_t r = 0; r < rows; ++r) {
                const float row_max_value = m[q0 + r];
                const float inverse = 1.0F / l[q0 + r];
                float* pr = p + r * cols;
                for (std::size_t c = 0; c < cols; ++c)
                    pr[c] = fast_exp(pr[c] - row_max_value) * inverse;
            }
            // dV_j += Pᵀ·dO_i   ([cols, rows] x [rows, d])
            tile_gemm(true, false, cols, width, rows, p, cols, g + q0 * width, width, product,
                      width);
            for (std::size_t i = 0; i < cols * width; ++i)
                dv[k0 * width + i] += product[i];
            // dP = dO_i·V_jᵀ; dS = P ⊙ (dP − D_i)·scale
            float* ds = scratch.d_scores.data();
            tile_gemm(false, true, rows, cols, width, g + q0 * width, width, v + k0 * width, width,
                      ds, cols);
            for (std::size_t r = 0; r < rows; ++r) {
                const float d_row = row_dot_products[q0 + r];
                float* dsr = ds + r * cols;
                const float* pr = p + r * cols;
                for (std::size_t c = 0; c < cols; ++c)
                    dsr[c] = pr[c] * (dsr[c] - d_row) * b.scale;
                if (slope != nullptr) {
                    const float* sr = slope + r * cols;
                    for (std::size_t c = 0; c < cols; ++c)
                        dsr[c] *= sr[c];
                }
            }
            // dQ_i += dS·K_j;  dK_j += dSᵀ·Q_i
            tile_gemm(false, false, rows, width, cols, ds, cols, k + k0 * width, width, product,
                      width);
            for (std::size_t i = 0; i < rows * width; ++i)
                dq[q0 * width + i] += product[i];
            tile_gemm(true, false, cols, width, rows, ds, cols, q + q0 * width, width, product,
                      width);
            for (std::size_t i = 0; i < cols * width; ++i)
                dk[k0 * width + i] += product[i];
        }
    }
}

// dK, dV [B·Hkv,T,d] = Σ_{h=0..r−1} share_h, rows [first_row, last_row) of the flattened
// [B·Hkv·T] rows; shares [B·Hq,T,d], added in head order.
void sum_group_shares(const BackwardTensors& b, const float* key_shares, const float* value_shares,
                      std::size_t first_row, std::size_t last_row) {
    const std::size_t width = b.width;
    const std::size_t rows_per_item = b.time;
    for (std::size_t row = first_row; row < last_row; ++row) {
        const std::size_t kv_item = row / rows_per_item;
        const std::size_t t = row % rows_per_item;
        float* dk = b.key_gradient + row * width;
        float* dv = b.value_gradient + row * width;
        std::fill_n(dk, width, 0.0F);
        std::fill_n(dv, width, 0.0F);
        for (std::size_t item = kv_item * b.group; item < (kv_item + 1) * b.group; ++item) {
            const std::size_t share = (item * rows_per_item + t) * width;
            for (std::size_t i = 0; i < width; ++i) {
                dk[i] += key_shares[share + i];
                dv[i] += value_shares[share + i];
            }
        }
    }
}

}  // namespace

void CpuAttention::flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const Tensor& context, const Tensor& row_max,
                                  const Tensor& row_sum, const Tensor& upstream, float scale,
                                  const tensor_ops::FlashAttentionOptions& options,
                                  Tensor& query_gradient, Tensor& key_gradient,
                                  Tensor& value_gradient) const {
    const std::size_t time = query.shape()[2];
    const std::size_t width = query.shape()[3];
    const BackwardTensors b{
        time,
        width,
        query.shape()[1] / key.shape()[1],
        query.shape()[1],
        options.window,
        options.documents == nullptr ? nullptr : options.documents->positions.data(),
        scale,
        options.softcap,
        cpu_data(query),
        cpu_data(key),
        cpu_data(value),
        cpu_data(context),
        cpu_data(row_max),
        cpu_data(row_sum),
        cpu_data(upstream),
        cpu_output(query_gradient),
        cpu_output(key_gradient),
        cpu_output(value_gradient)};
    const std::size_t head_size = time * width;
    const std::size_t query_items = query.numel() / head_size;    // B·Hq
    const std::size_t key_value_items = key.numel() / head_size;  // B·Hkv
    if (b.group == 1) {
        // Multi-head attention: each head's share is its whole gradient.
        parallel_for(query_items, 1, [&](std::size_t begin, std::size_t end) {
            BackwardScratch scratch(b);
            for (std::size_t item = begin; item < end; ++item) {
                query_head_backward(b, item, b.key_gradient + item * head_size,
                                    b.value_gradient + item * head_size, scratch);
            }
        });
        return;
    }
    // Grouped heads: dK, dV of a key/value head = Σ over its r query heads of each head's
    // share, added in head order, so every schedule below gives the same bits.
    // The busiest thread's share of query heads under each schedule (parallel_for's chunks).
    const std::size_t threads = cpu_thread_count();
    const auto busiest = [&](std::size_t items) { return (items + threads - 1) / threads; };
    if (busiest(key_value_items) * b.group <= busiest(query_items)) {
        // The groups balance the threads as well as single heads would: one item per (batch,
        // key/value head); the thread owns dK, dV of its group (no races) and keeps one
        // head's share at a time.
        parallel_for(key_value_items, 1, [&](std::size_t begin, std::size_t end) {
            BackwardScratch scratch(b);
            std::vector<float> key_share(head_size);
            std::vector<float> value_share(head_size);
            for (std::size_t kv_item = begin; kv_item < end; ++kv_item) {
                float* dk = b.key_gradient + kv_item * head_size;
                float* dv = b.value_gradient + kv_item * head_size;
                std::fill_n(dk, head_size, 0.0F);
                std::fill_n(dv, head_size, 0.0F);
                for (std::size_t item = kv_item * b.group; item < (kv_item + 1) * b.group; ++item) {
                    query_head_backward(b, item, key_share.data(), value_share.data(), scratch);
                    for (std::size_t i = 0; i < head_size; ++i) {
                        dk[i] += key_share[i];
                        dv[i] += value_share[i];
                    }
                }
            }
        });
        return;
    }
    // Too few groups to balance the threads (small batch, few key/value heads): one item per
    // query head, each writing its share to its own slot ([B·Hq,T,d], the size of dQ), then
    // the shares summed in head order.
    const HostScratch key_shares(query_items * head_size);
    const HostScratch value_shares(query_items * head_size);
    parallel_for(query_items, 1, [&](std::size_t begin, std::size_t end) {
        BackwardScratch scratch(b);
        for (std::size_t item = begin; item < end; ++item) {
            query_head_backward(b, item, key_shares.get() + item * head_size,
                                value_shares.get() + item * head_size, scratch);
        }
    });
    parallel_for(key_value_items * time, items_per_thread_for(2 * b.group * width),
                 [&](std::size_t begin, std::size_t end) {
                     sum_group_shares(b, key_shares.get(), value_shares.get(), begin, end);
                 });
}

}  // namespace riftco_transformer::detail
