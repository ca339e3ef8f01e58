// CPU LayerNorm and RMSNorm over the last axis. Row statistics accumulate in double (the
// oracle-grade reference), the elementwise passes run in float; threaded over rows.
// Parameter gradients (Σ over rows) are reduced per fixed block of rows, then across blocks
// in block order, so they do not depend on the thread count.

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr std::size_t gradient_row_block = 64;

// Runs row_kernel(row, scale_acc, bias_acc) for every row, with per-block accumulators of
// width W (double), then folds the blocks in order into the output parameter gradients.
template <typename RowKernel>
void rows_with_parameter_gradients(std::size_t rows, std::size_t width, std::size_t accumulators,
                                   RowKernel&& row_kernel, std::span<float* const> outputs) {
    const std::size_t blocks = (rows + gradient_row_block - 1) / gradient_row_block;
    std::vector<double> partial(blocks * accumulators * width, 0.0);
    parallel_for(blocks, items_per_thread_for(gradient_row_block * width * 4),
                 [&](std::size_t begin, std::size_t end) {
                     for (std::size_t block = begin; block < end; ++block) {
                         double* block_partial = partial.data() + block * accumulators * width;
                         const std::size_t last = std::min(rows, (block + 1) * gradient_row_block);
                         for (std::size_t row = block * gradient_row_block; row < last; ++row) {
                             row_kernel(row, block_partial);
                         }
                     }
                 });
    for (std::size_t a = 0; a < accumulators; ++a) {
        for (std::size_t j = 0; j < width; ++j) {
            double total = 0.0;
            for (std::size_t block = 0; block < blocks; ++block) {
                total += partial[(block * accumulators + a) * width + j];
            }
            outputs[a][j] = static_cast<float>(total);
        }
    }
}

}  // namespace

void CpuNormalization::layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                  float epsilon, Tensor& out, Tensor& mean,
                                  Tensor& inverse_deviation) const {
    // x [rows, W] -> y [rows, W], mean [rows], inverse_deviation [rows]
    const std::size_t width = x.shape().back();
    const std::size_t rows = x.numel() / width;
    const float* src = cpu_data(x);
    const float* gamma = cpu_data(scale);
    const float* beta = cpu_data(bias);
    float* dst = cpu_output(out);
    float* means = cpu_output(mean);
    float* inverses = cpu_output(inverse_deviation);
    parallel_for(rows, items_per_thread_for(3 * width), [&](std::size_t begin, std::size_t end) {
        for (std::size_t row = begin; row < end; ++row) {
            const float* in = src + row * width;
            const double mu = row_sum(in, width) / static_cast<double>(width);
            const double variance =
                row_centered_square_sum(in, width, mu) / static_cast<double>(width);
            const double inverse = 1.0 / std::sqrt(variance + static_cast<double>(epsilon));
            means[row] = static_cast<float>(mu);
            inverses[row] = static_cast<float>(inverse);
            // Centre in double: a float copy of μ can be off by half an ulp of μ, which is
            // large next to the spread when |μ| >> σ.
            float* y = dst + row * width;
            for (std::size_t j = 0; j < width; ++j) {
                y[j] = static_cast<float>((in[j] - mu) * inverse) * gamma[j] + beta[j];
            }
        }
    });
}

void CpuNormalization::layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean,
                                           const Tensor& inverse_deviation, const Tensor& upstream,
                                           Tensor& input_gradient, Tensor& scale_gradient,
                                           Tensor& bias_gradient) const {
    // x̂ = (x − μ)·inv, ĝ = g ⊙ γ:
    // dx = inv·(ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)); dγ = Σ_rows g ⊙ x̂; dβ = Σ_rows g
    const std::size_t width = x.shape().back();
    const std::size_t rows = x.numel() / width;
    const float* src = cpu_data(x);
    const float* gamma = cpu_data(scale);
    const float* means = cpu_data(mean);
    const float* inverses = cpu_data(inverse_deviation);
    const float* g = cpu_data(upstream);
    float* dx = cpu_output(input_gradient);
    float* const outputs[] = {cpu_output(scale_gradient), cpu_output(bias_gradient)};
    rows_with_parameter_gradients(
        rows, width, 2,
        [&](std::size_t row, double* partial) {
            const float* in = src + row * width;
            const float* up = g + row * width;
            float* d = dx + row * width;
            const float mu = means[row];
            const float inverse = inverses[row];
            double sum_g_hat = 0.0;
            double sum_g_hat_x_hat = 0.0;
            double* d_gamma = partial;
            double* d_beta = partial + width;
            for (std::size_t j = 0; j < width; ++j) {
                const float x_hat = (in[j] - mu) * inverse;
                const float g_hat = up[j] * gamma[j];
                sum_g_hat += g_hat;
                sum_g_hat_x_hat += static_cast<double>(g_hat) * x_hat;
                d_gamma[j] += static_cast<double>(up[j]) * x_hat;
                d_beta[j] += up[j];
            }
            const auto mean_g_hat = static_cast<float>(sum_g_hat / static_cast<double>(width));
            const auto mean_g_hat_x_hat =
                static_cast<float>(sum_g_hat_x_hat / static_cast<double>(width));
            for (std::size_t j = 0; j < width; ++j) {
                const float x_hat = (in[j] - mu) * inverse;
                d[j] = inverse * (up[j] * gamma[j] - mean_g_hat - x_hat * mean_g_hat_x_hat);
            }
        },
        outputs);
}

void CpuNormalization::rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& out,
                                Tensor& inverse_rms) const {
    // y = x·γ·r, r = 1/√(mean(x²) + eps)
    const std::size_t width = x.shape().back();
    const std::size_t rows = x.numel() / width;
    const float* src = cpu_data(x);
    const float* gamma = cpu_data(scale);
    float* dst = cpu_output(out);
    float* inverses = cpu_output(inverse_rms);
    parallel_for(rows, items_per_thread_for(2 * width), [&](std::size_t begin, std::size_t end) {
        for (std::size_t row = begin; row < end; ++row) {
            const float* in = src + row * width;
            const double mean_square = row_dot(in, in, width) / static_cast<double>(width);
            const auto inverse =
                static_cast<float>(1.0 / std::sqrt(mean_square + static_cast<double>(epsilon)));
            inverses[row] = inverse;
            float* y = dst + row * width;
            for (std::size_t j = 0; j < width; ++j)
                y[j] = in[j] * inverse * gamma[j];
        }
    });
}

void CpuNormalization::rms_norm_backward(const Tensor& x, const Tensor& scale,
                                         const Tensor& inverse_rms, const Tensor& upstream,
                                         Tensor& input_gradient, Tensor& scale_gradient) const {
    // dx = r·(g ⊙ γ) − x·r³·mean(g ⊙ γ ⊙ x); dγ = Σ_rows g ⊙ x·r
    const std::size_t width = x.shape().back();
    const std::size_t rows = x.numel() / width;
    const float* src = cpu_data(x);
    const float* gamma = cpu_data(scale);
    const float* inverses = cpu_data(inverse_rms);
    const float* g = cpu_data(upstream);
    float* dx = cpu_output(input_gradient);
    float* const outputs[] = {cpu_output(scale_gradient)};
    rows_with_parameter_gradients(
        rows, width, 1,
        [&](std::size_t row, double* d_gamma) {
            const float* in = src + row * width;
            const float* up = g + row * width;
            float* d = dx + row * width;
            const float r = inverses[row];
            double weighted = 0.0;
            for (std::size_t j = 0; j < width; ++j) {
                weighted += static_cast<double>(up[j]) * gamma[j] * in[j];
                d_gamma[j] += static_cast<double>(up[j]) * in[j] * r;
            }
            const auto correction =
                static_cast<float>(weighted / static_cast<double>(width)) * r * r * r;
            for (std::size_t j = 0; j < width; ++j) {
                d[j] = r * up[j] * gamma[j] - in[j] * correction;
            }
        },
        outputs);
}

}  // namespace riftco_transformer::detail
