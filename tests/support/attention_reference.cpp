#include "support/attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace riftco_transformer::detail {
namespace {

constexpr std::size_t tile = 8;

// S_ij = scale·q_i·k_j in double, or -inf when key j is after query i.
double score(const float* q, const float* k, std::size_t i, std::size_t j, std::size_t width,
             float scale) {
    if (j > i) {
        return -std::numeric_limits<double>::infinity();
    }
    double dot = 0.0;
    for (std::size_t d = 0; d < width; ++d) {
        dot += static_cast<double>(q[i * width + d]) * static_cast<double>(k[j * width + d]);
    }
    return dot * static_cast<double>(scale);
}

}  // namespace

void flash_attention_reference_forward(const float* query, const float* key, const float* value,
                                       std::size_t items, std::size_t time, std::size_t width,
                                       float scale, float* context, float* row_max,
                                       float* row_sum) {
    for (std::size_t item = 0; item < items; ++item) {
        const std::size_t base = item * time * width;
        const float* q = query + base;
        const float* k = key + base;
        const float* v = value + base;
        for (std::size_t q0 = 0; q0 < time; q0 += tile) {
            const std::size_t q1 = std::min(time, q0 + tile);
            for (std::size_t i = q0; i < q1; ++i) {
                double m = -std::numeric_limits<double>::infinity();
                double l = 0.0;
                std::vector<double> numerator(width, 0.0);
                // Key tiles starting after query i are fully masked: skipped.
                for (std::size_t k0 = 0; k0 <= i; k0 += tile) {
                    const std::size_t k1 = std::min(time, k0 + tile);
                    double tile_max = -std::numeric_limits<double>::infinity();
                    for (std::size_t j = k0; j < k1; ++j)
                        tile_max = std::max(tile_max, score(q, k, i, j, width, scale));
                    const double new_max = std::max(m, tile_max);
                    const double rescale =
                        m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(m - new_max);
                    l *= rescale;
                    for (double& n : numerator)
                        n *= rescale;
                    for (std::size_t j = k0; j < k1 && j <= i; ++j) {
                        const double weight = std::exp(score(q, k, i, j, width, scale) - new_max);
                        l += weight;
                        for (std::size_t d = 0; d < width; ++d)
                            numerator[d] += weight * v[j * width + d];
                    }
                    m = new_max;
                }
                for (std::size_t d = 0; d < width; ++d) {
                    context[base + i * width + d] = static_cast<float>(numerator[d] / l);
                }
                row_max[item * time + i] = static_cast<float>(m);
                row_sum[item * time + i] = static_cast<float>(l);
            }
        }
    }
}

void flash_attention_reference_backward(const float* query, const float* key, const float* value,
                                        const float* context, const float* row_max,
                                        const float* row_sum, const float* upstream,
                                        std::size_t items, std::size_t time, std::size_t width,
                                        float scale, float* query_gradient, float* key_gradient,
                                        float* value_gradient) {
    for (std::size_t item = 0; item < items; ++item) {
        const std::size_t base = item * time * width;
        const float* q = query + base;
        const float* k = key + base;
        const float* v = value + base;
        const float* o = context + base;
        const float* g = upstream + base;
        std::vector<double> dq(time * width, 0.0);
        std::vector<double> dk(time * width, 0.0);
        std::vector<double> dv(time * width, 0.0);
        for (std::size_t i = 0; i < time; ++i) {
            // D_i = Σ_d dO_id·O_id; P_ij = exp(S_ij − m_i)/l_i; dS_ij = P_ij·(dP_ij − D_i)
            double d_row = 0.0;
            for (std::size_t d = 0; d < width; ++d)
                d_row += static_cast<double>(g[i * width + d]) * o[i * width + d];
            const double m = row_max[item * time + i];
            const double l = row_sum[item * time + i];
            for (std::size_t j = 0; j <= i; ++j) {
                const double p = std::exp(score(q, k, i, j, width, scale) - m) / l;
                double dp = 0.0;
                for (std::size_t d = 0; d < width; ++d) {
                    dp += static_cast<double>(g[i * width + d]) * v[j * width + d];
                    dv[j * width + d] += p * g[i * width + d];
                }
                const double ds = p * (dp - d_row) * static_cast<double>(scale);
                for (std::size_t d = 0; d < width; ++d) {
                    dq[i * width + d] += ds * k[j * width + d];
                    dk[j * width + d] += ds * q[i * width + d];
                }
            }
        }
        for (std::size_t e = 0; e < time * width; ++e) {
            query_gradient[base + e] = static_cast<float>(dq[e]);
            key_gradient[base + e] = static_cast<float>(dk[e]);
            value_gradient[base + e] = static_cast<float>(dv[e]);
        }
    }
}

}  // namespace riftco_transformer::detail
