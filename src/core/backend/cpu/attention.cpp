// CPU flash attention: exact causal attention in memory linear in T. Queries and keys are
// walked in tiles of 64 with GEMM tiles (single-threaded inside the parallel region); only the
// per-row max m_i and exponential sum l_i are kept between passes. Grouped-query attention
// (Q [B,Hq,T,d], K, V [B,Hkv,T,d], r = Hq/Hkv) reads key/value head ⌊h/r⌋ in place: with
// query items ordered (b, h), query item i reads key/value item ⌊i/r⌋.
//
// Visible keys of query t: max(0, t−W+1)..t (W = options.window; 0: 0..t). Key tiles entirely
// outside the visible range of a query tile (after its last query, or before the window of
// its first) are never touched, so time is O(T·min(T, W+tile)) and scratch is O(tile²).
//
// Forward, one work item per (batch, query head); per query tile Q_i [q,d] and visible key
// tile K_j, V_j [k,d]:
//   S = scale·Q_i·K_jᵀ (masked -> -inf); m' = max(m, rowmax S)
//   l = l·e^{m−m'} + Σ e^{S−m'};  acc = acc·e^{m−m'} + e^{S−m'}·V_j;  m = m'
//   O_i = acc / l
// Backward (D_i = rowsum(dO_i ⊙ O_i)): P = e^{S−m}/l recomputed per tile, then
//   dV_j += Pᵀ·dO_i;  dP = dO_i·V_jᵀ;  dS = P ⊙ (dP − D_i)
//   dQ_i += scale·dS·K_j;  dK_j += scale·dSᵀ·Q_i
// One backward work item per (batch, key/value head): it loops over the r query heads of its
// group in order, so dK and dV of a group have exactly one writer (no races, no scratch
// copies of K or V) and a summation order that does not depend on the thread count.
// Masked entries have P = 0 exactly, so they contribute nothing in either direction.

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/vector_math.hpp"
#include "core/backend/cpu/parallel_for.hpp"

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

// The first key tile with a key visible from query q0 (window 0: none older is masked).
std::size_t first_key_tile(std::size_t q0, std::size_t window) {
    const std::size_t first_key = window == 0 || q0 < window ? 0 : q0 + 1 - window;
    return first_key / tile * tile;
}

// scores [rows, cols] for queries q0.. and keys k0..: scale, mask the future and (window > 0)
// keys older than the window, and report a NaN or +inf among the visible scores.
bool scale_and_mask(float* scores, std::size_t rows, std::size_t cols, std::size_t q0,
                    std::size_t k0, float scale, std::size_t window) {
    bool bad = false;
    for (std::size_t r = 0; r < rows; ++r) {
        float* row = scores + r * cols;
        const std::size_t query = q0 + r;
        for (std::size_t c = 0; c < cols; ++c) {
            const float value = row[c] * scale;
            const std::size_t key = k0 + c;
            const bool visible = key <= query && (window == 0 || key + window > query);
            bad = bad ||
                  (visible && (value != value || value == std::numeric_limits<float>::infinity()));
            row[c] = visible ? value : negative_infinity;
        }
    }
    return bad;
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
    const std::size_t items = query.numel() / (time * width);  // B·Hq
    const std::size_t group = query.shape()[1] / key.shape()[1];  // r = Hq/Hkv
    const std::size_t window = options.window;
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
            for (std::size_t q0 = 0; q0 < time; q0 += tile) {
                const std::size_t rows = std::min(tile, time - q0);
                std::fill_n(m + q0, rows, negative_infinity);
                std::fill_n(l + q0, rows, 0.0F);
                std::fill_n(o + q0 * width, rows * width, 0.0F);
                // Key tiles entirely after the last query of this tile, or entirely before
                // the window of its first query, are skipped.
                for (std::size_t k0 = first_key_tile(q0, window); k0 < q0 + rows; k0 += tile) {
                    const std::size_t cols = std::min(tile, time - k0);
                    tile_gemm(false, true, rows, cols, width, q + q0 * width, width, k + k0 * width,
                              width, scores.data(), cols);
                    if (scale_and_mask(scores.data(), rows, cols, q0, k0, scale, window)) {
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

void CpuAttention::flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const Tensor& context, const Tensor& row_max,
                                  const Tensor& row_sum, const Tensor& upstream, float scale,
                                  const tensor_ops::FlashAttentionOptions& options,
                                  Tensor& query_gradient, Tensor& key_gradient,
                                  Tensor& value_gradient) const {
    const std::size_t time = query.shape()[2];
    const std::size_t width = query.shape()[3];
    const std::size_t key_value_items = key.numel() / (time * width);  // B·Hkv
    const std::size_t group = query.shape()[1] / key.shape()[1];      // r = Hq/Hkv
    const std::size_t window = options.window;
    const float* q_all = cpu_data(query);
    const float* k_all = cpu_data(key);
    const float* v_all = cpu_data(value);
    const float* o_all = cpu_data(context);
    const float* m_all = cpu_data(row_max);
    const float* l_all = cpu_data(row_sum);
    const float* g_all = cpu_data(upstream);
    float* dq_all = cpu_output(query_gradient);
    float* dk_all = cpu_output(key_gradient);
    float* dv_all = cpu_output(value_gradient);
    parallel_for(key_value_items, 1, [&](std::size_t begin, std::size_t end) {
        std::vector<float> probabilities(tile * tile);
        std::vector<float> d_scores(tile * tile);
        std::vector<float> product(tile * width);
        std::vector<float> row_dot_products(time);
        for (std::size_t kv_item = begin; kv_item < end; ++kv_item) {
            const std::size_t kv_offset = kv_item * time * width;
            const float* k = k_all + kv_offset;
            const float* v = v_all + kv_offset;
            float* dk = dk_all + kv_offset;
            float* dv = dv_all + kv_offset;
            std::fill_n(dk, time * width, 0.0F);
            std::fill_n(dv, time * width, 0.0F);
            // The r query heads of this key/value head, in order.
            for (std::size_t item = kv_item * group; item < (kv_item + 1) * group; ++item) {
                const std::size_t offset = item * time * width;
                const float* q = q_all + offset;
                const float* o = o_all + offset;
                const float* g = g_all + offset;
                const float* m = m_all + item * time;
                const float* l = l_all + item * time;
                float* dq = dq_all + offset;
                std::fill_n(dq, time * width, 0.0F);
                for (std::size_t t = 0; t < time; ++t) {
                    row_dot_products[t] =
                        static_cast<float>(row_dot(g + t * width, o + t * width, width));
                }
                for (std::size_t q0 = 0; q0 < time; q0 += tile) {
                    const std::size_t rows = std::min(tile, time - q0);
                    for (std::size_t k0 = first_key_tile(q0, window); k0 < q0 + rows;
                         k0 += tile) {
                        const std::size_t cols = std::min(tile, time - k0);
                        float* p = probabilities.data();
                        tile_gemm(false, true, rows, cols, width, q + q0 * width, width,
                                  k + k0 * width, width, p, cols);
                        static_cast<void>(scale_and_mask(p, rows, cols, q0, k0, scale, window));
                        for (std::size_t r = 0; r < rows; ++r) {
                            const float row_max_value = m[q0 + r];
                            const float inverse = 1.0F / l[q0 + r];
                            float* pr = p + r * cols;
                            for (std::size_t c = 0; c < cols; ++c) {
                                pr[c] = fast_exp(pr[c] - row_max_value) * inverse;
                            }
                        }
                        // dV_j += Pᵀ·dO_i   ([cols, rows] x [rows, d])
                        tile_gemm(true, false, cols, width, rows, p, cols, g + q0 * width, width,
                                  product.data(), width);
                        for (std::size_t i = 0; i < cols * width; ++i)
                            dv[k0 * width + i] += product[i];
                        // dP = dO_i·V_jᵀ; dS = P ⊙ (dP − D_i)·scale
                        float* ds = d_scores.data();
                        tile_gemm(false, true, rows, cols, width, g + q0 * width, width,
                                  v + k0 * width, width, ds, cols);
                        for (std::size_t r = 0; r < rows; ++r) {
                            const float d_row = row_dot_products[q0 + r];
                            float* dsr = ds + r * cols;
                            const float* pr = p + r * cols;
                            for (std::size_t c = 0; c < cols; ++c)
                                dsr[c] = pr[c] * (dsr[c] - d_row) * scale;
                        }
                        // dQ_i += dS·K_j;  dK_j += dSᵀ·Q_i
                        tile_gemm(false, false, rows, width, cols, ds, cols, k + k0 * width, width,
                                  product.data(), width);
                        for (std::size_t i = 0; i < rows * width; ++i)
                            dq[q0 * width + i] += product[i];
                        tile_gemm(true, false, cols, width, rows, ds, cols, q + q0 * width, width,
                                  product.data(), width);
                        for (std::size_t i = 0; i < cols * width; ++i)
                            dk[k0 * width + i] += product[i];
                    }
                }
            }
        }
    });
}

}  // namespace riftco_transformer::detail
