// CPU paged decode attention. Both kernels walk a request's visible positions
// t = first..length−1 (first = max(0, length − W) under a window W, else 0) in logical order
// and find position t's key and value for query head h at
//   pool[(page_table[t / S] · Hkv + ⌊h/(Hq/Hkv)⌋) · S + t % S] · d_h
// so which physical pages hold a sequence, and how large the pages are, never changes the
// arithmetic: a paged and a contiguous cache give the same bits. The Hq/Hkv query heads of a
// group read the same stored rows (no repeated copy). Under a soft cap c (Gemma 2) each
// score s becomes c·tanh(s/c) after the NaN/+inf check and before the softmax.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/paged_attention_kernels.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr std::string_view operation = "paged_decode_attention";

[[noreturn]] void throw_bad_score(std::size_t request, std::size_t head, std::size_t position,
                                  float score) {
    std::ostringstream message;
    message << operation << ": score of request " << request << ", head " << head << ", position "
            << position << " is " << score << " (NaN and +inf are rejected)";
    throw std::domain_error(message.str());
}

// Offset (in floats) of position t's row for pool head `head`.
std::size_t row_offset(const PagedAttentionGeometry& g, std::span<const std::uint32_t> table,
                       std::size_t head, std::size_t position) {
    const std::size_t page = table[position / g.page_size];
    return ((page * g.heads + head) * g.page_size + position % g.page_size) * g.head_width;
}

bool is_nan_or_positive_infinity(float x) {
    return std::isnan(x) || x == std::numeric_limits<float>::infinity();
}

// The first position a request of `length` sees under `window` (0: no window).
std::size_t first_visible(std::size_t length, std::size_t window) {
    return window == 0 || window >= length ? 0 : length - window;
}

}  // namespace

void paged_attention_reference(const PagedAttentionGeometry& g, const float* query,
                               const float* key_pool, const float* value_pool,
                               std::span<const tensor_ops::PagedAttentionRequest> requests,
                               float scale, float* context,
                               const tensor_ops::PagedAttentionOptions& options) {
    const std::size_t query_heads = g.query_heads();
    std::vector<double> scores;
    std::vector<double> accumulator(g.head_width);
    for (std::size_t r = 0; r < requests.size(); ++r) {
        const auto& request = requests[r];
        const std::size_t first = first_visible(request.length, options.window);
        scores.assign(request.length - first, 0.0);
        for (std::size_t h = 0; h < query_heads; ++h) {
            const std::size_t pool_head = h / g.group_size;
            const float* q = query + (r * query_heads + h) * g.head_width;
            // s_t = scale · q·k_t over the visible positions, scores[t − first]
            double maximum = -std::numeric_limits<double>::infinity();
            for (std::size_t t = first; t < request.length; ++t) {
                const float* k = key_pool + row_offset(g, request.page_table, pool_head, t);
                double dot = 0.0;
                for (std::size_t i = 0; i < g.head_width; ++i) {
                    dot += static_cast<double>(q[i]) * k[i];
                }
                const auto score = static_cast<float>(dot * scale);
                if (is_nan_or_positive_infinity(score)) {
                    throw_bad_score(r, h, t, score);
                }
                double& s = scores[t - first];
                s = static_cast<double>(dot) * scale;
                if (options.softcap != 0.0F) {
                    s = options.softcap * std::tanh(s / options.softcap);
                }
                maximum = std::max(maximum, s);
            }
            // p_t = e^{s_t − max} / Σ e^{s − max};  context = Σ p_t · v_t
            double sum = 0.0;
            for (double& s : scores) {
                s = std::exp(s - maximum);
                sum += s;
            }
            std::fill(accumulator.begin(), accumulator.end(), 0.0);
            for (std::size_t t = first; t < request.length; ++t) {
                const float* v = value_pool + row_offset(g, request.page_table, pool_head, t);
                for (std::size_t i = 0; i < g.head_width; ++i) {
                    accumulator[i] += scores[t - first] * v[i];
                }
            }
            float* out = context + (r * query_heads + h) * g.head_width;
            for (std::size_t i = 0; i < g.head_width; ++i) {
                out[i] = static_cast<float>(accumulator[i] / sum);
            }
        }
    }
}

namespace {

// out[row] = Σ q_i·k_row_i for Rows keys `stride` floats apart, over fixed float lanes (the
// compiler vectorises them; the lane order is fixed, so deterministic). One load of q serves
// every key, and each row's arithmetic is the same whatever Rows is, so blocking keys four at
// a time never changes a bit.
template <std::size_t Rows>
inline void lane_dots(const float* q, const float* k, std::size_t stride, std::size_t n,
                      float* out) {
    constexpr std::size_t lanes = 8;
    float partial[Rows][lanes] = {};
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
        for (std::size_t row = 0; row < Rows; ++row) {
            const float* kr = k + row * stride;
            for (std::size_t l = 0; l < lanes; ++l) {
                partial[row][l] += q[i + l] * kr[i + l];
            }
        }
    }
    for (std::size_t row = 0; row < Rows; ++row) {
        const float* kr = k + row * stride;
        float result = 0.0F;
        for (std::size_t t = i; t < n; ++t) {
            result += q[t] * kr[t];
        }
        for (const float p : partial[row]) {
            result += p;
        }
        out[row] = result;
    }
}

// The pool rows of positions [first, length) for `pool_head`, one page run at a time in
// logical order: visit(rows of this page [count, d] contiguous, index of the run's first
// position relative to `first`, count).
template <typename Visit>
void for_each_page_run(const PagedAttentionGeometry& g, const float* pool,
                       std::span<const std::uint32_t> table, std::size_t pool_head,
                       std::size_t first, std::size_t length, Visit&& visit) {
    const std::size_t d = g.head_width;
    const std::size_t page_stride = g.heads * g.page_size * d;  // floats per physical page
    for (std::size_t t = first; t < length;) {
        const std::size_t offset = t % g.page_size;
        const std::size_t count = std::min(g.page_size - offset, length - t);
        visit(pool + table[t / g.page_size] * page_stride + (pool_head * g.page_size + offset) * d,
              t - first, count);
        t += count;
    }
}

// One (request, query head) pair; `scores` holds at least the request's visible count.
void fast_pair(const PagedAttentionGeometry& g, const float* q, const float* key_pool,
               const float* value_pool, const tensor_ops::PagedAttentionRequest& request,
               std::size_t request_index, std::size_t head,
               const tensor_ops::PagedAttentionOptions& options, float scale, float* scores,
               float* out) {
    const std::size_t window = options.window;
    const std::size_t d = g.head_width;
    const std::size_t first = first_visible(request.length, window);
    const std::size_t visible = request.length - first;
    const std::size_t pool_head = head / g.group_size;
    // Scores, page run by page run: the rows of one page and head are contiguous [S, d].
    for_each_page_run(g, key_pool, request.page_table, pool_head, first, request.length,
                      [&](const float* k, std::size_t start, std::size_t rows) {
                          std::size_t o = 0;
                          for (; o + 4 <= rows; o += 4) {
                              lane_dots<4>(q, k + o * d, d, d, scores + start + o);
                          }
                          for (; o < rows; ++o) {
                              lane_dots<1>(q, k + o * d, d, d, scores + start + o);
                          }
                          for (o = 0; o < rows; ++o) {
                              scores[start + o] *= scale;
                          }
                      });
    if (row_has_nan_or_positive_infinity(scores, visible)) {
        for (std::size_t i = 0; i < visible; ++i) {
            if (is_nan_or_positive_infinity(scores[i])) {
                throw_bad_score(request_index, head, first + i, scores[i]);
            }
        }
    }
    if (options.softcap != 0.0F) {  // Gemma 2: s = c·tanh(s/c), chosen once per pair
        const float cap = options.softcap;
        const float inverse_cap = 1.0F / cap;
        for (std::size_t i = 0; i < visible; ++i) {
            scores[i] = cap * fast_tanh(scores[i] * inverse_cap);
        }
    }
    const float maximum = row_max(scores, visible);
    for (std::size_t i = 0; i < visible; ++i) {
        scores[i] = fast_exp(scores[i] - maximum);
    }
    const auto inverse_sum = static_cast<float>(1.0 / row_sum(scores, visible));
    std::fill_n(out, d, 0.0F);
    for_each_page_run(g, value_pool, request.page_table, pool_head, first, request.length,
                      [&](const float* v, std::size_t start, std::size_t rows) {
                          for (std::size_t o = 0; o < rows; ++o) {
                              const float p = scores[start + o];
                              const float* row = v + o * d;
                              for (std::size_t i = 0; i < d; ++i) {
                                  out[i] += p * row[i];
                              }
                          }
                      });
    for (std::size_t i = 0; i < d; ++i) {
        out[i] *= inverse_sum;
    }
}

}  // namespace

void paged_attention_fast(const PagedAttentionGeometry& g, const float* query,
                          const float* key_pool, const float* value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          float* context, const tensor_ops::PagedAttentionOptions& options) {
    std::size_t longest = 0;
    std::size_t total = 0;
    for (const auto& request : requests) {
        const std::size_t visible = request.length - first_visible(request.length, options.window);
        longest = std::max(longest, visible);
        total += visible;
    }
    const std::size_t query_heads = g.query_heads();
    const std::size_t pairs = requests.size() * query_heads;
    const std::size_t floats_per_pair =
        std::max<std::size_t>(1, 2 * total / std::max<std::size_t>(1, requests.size())) *
        g.head_width;
    parallel_for(pairs, items_per_thread_for(floats_per_pair),
                 [&](std::size_t begin, std::size_t end) {
                     std::vector<float> scores(longest);
                     for (std::size_t item = begin; item < end; ++item) {
                         // Zigzag order (0, last, 1, last-1, ...): a prefill chunk's rows grow
                         // by one position each, so contiguous chunks of pairs in row order
                         // would give the last thread most of the work.
                         const std::size_t pair = item % 2 == 0 ? item / 2 : pairs - 1 - item / 2;
                         const std::size_t r = pair / query_heads;
                         const std::size_t h = pair % query_heads;
                         const std::size_t row = (r * query_heads + h) * g.head_width;
                         fast_pair(g, query + row, key_pool, value_pool, requests[r], r, h, options,
                                   scale, scores.data(), context + row);
                     }
                 });
}

namespace {

enum class KernelChoice { Fast, Reference };

// RIFTCO_TRANSFORMER_PAGED_ATTENTION, read once: "reference" picks the reference kernel;
// unset or anything else, the fast one.
KernelChoice kernel_choice() {
    static const KernelChoice choice = [] {
        const char* value = std::getenv("RIFTCO_TRANSFORMER_PAGED_ATTENTION");
        return value != nullptr && std::strcmp(value, "reference") == 0 ? KernelChoice::Reference
                                                                        : KernelChoice::Fast;
    }();
    return choice;
}

// Pools [P,Hkv,S,d_h]; query [R,Hq,1,d_h] (Hq % Hkv == 0, checked by tensor_ops).
PagedAttentionGeometry geometry_of(const Tensor& pool, std::size_t query_heads) {
    const Shape& shape = pool.shape();
    return {shape[0], shape[1], shape[2], shape[3], query_heads / shape[1]};
}

}  // namespace

void CpuPagedAttention::decode_attention(
    const Tensor& query, const Tensor& key_pool, const Tensor& value_pool,
    std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
    const tensor_ops::PagedAttentionOptions& options, Tensor& context) const {
    const PagedAttentionGeometry g = geometry_of(key_pool, query.shape()[1]);
    if (kernel_choice() == KernelChoice::Reference) {
        paged_attention_reference(g, cpu_data(query), cpu_data(key_pool), cpu_data(value_pool),
                                  requests, scale, cpu_output(context), options);
    } else {
        paged_attention_fast(g, cpu_data(query), cpu_data(key_pool), cpu_data(value_pool), requests,
                             scale, cpu_output(context), options);
    }
}

void CpuPagedAttention::write_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                                        const Tensor& value,
                                        std::span<const tensor_ops::PagedSlot> slots) const {
    const PagedAttentionGeometry g = geometry_of(key_pool, key_pool.shape()[1]);
    float* keys = static_cast<CpuStorage&>(TensorAccess::unique_storage(key_pool)).data();
    float* values = static_cast<CpuStorage&>(TensorAccess::unique_storage(value_pool)).data();
    const float* key_rows = cpu_data(key);
    const float* value_rows = cpu_data(value);
    for (std::size_t r = 0; r < slots.size(); ++r) {
        for (std::size_t h = 0; h < g.heads; ++h) {
            const std::size_t target =
                ((slots[r].page * g.heads + h) * g.page_size + slots[r].offset) * g.head_width;
            const std::size_t source = (r * g.heads + h) * g.head_width;
            std::copy_n(key_rows + source, g.head_width, keys + target);
            std::copy_n(value_rows + source, g.head_width, values + target);
        }
    }
}

}  // namespace riftco_transformer::detail
