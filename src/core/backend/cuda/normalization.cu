// LayerNorm and RMSNorm kernels over the last axis. Forward and the input gradient: one block
// per row, row statistics in double like the CPU reference (block_reduce.cuh). Parameter
// gradients: deterministic, no atomics — partial sums in double over fixed blocks of
// gradient_row_block rows (one thread per column), then the blocks folded in block order,
// the CPU reference's scheme.

#include "core/backend/cuda/block_reduce.cuh"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"
#include "core/backend/cuda/row_kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

unsigned int row_blocks(std::size_t rows) {
    return static_cast<unsigned int>(rows < max_blocks ? (rows == 0 ? 1 : rows) : max_blocks);
}

__global__ void layer_norm_kernel(const float* x, const float* gamma, const float* beta,
                                  std::size_t rows, std::size_t width, float epsilon, float* y,
                                  float* means, float* inverses) {
    __shared__ double scratch[32];
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * width;
        double sum = 0.0;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            sum += static_cast<double>(in[j]);
        }
        const double mu = block_reduce(sum, SumOp{}, 0.0, scratch) / static_cast<double>(width);
        double squares = 0.0;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            const double centred = static_cast<double>(in[j]) - mu;
            squares += centred * centred;
        }
        const double variance =
            block_reduce(squares, SumOp{}, 0.0, scratch) / static_cast<double>(width);
        const double inverse = 1.0 / sqrt(variance + static_cast<double>(epsilon));
        if (threadIdx.x == 0) {
            means[row] = static_cast<float>(mu);
            inverses[row] = static_cast<float>(inverse);
        }
        float* out = y + row * width;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            out[j] = static_cast<float>((static_cast<double>(in[j]) - mu) * inverse) * gamma[j] +
                     beta[j];
        }
    }
}

__global__ void rms_norm_kernel(const float* x, const float* gamma, std::size_t rows,
                                std::size_t width, float epsilon, float* y, float* inverses) {
    __shared__ double scratch[32];
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * width;
        double squares = 0.0;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            squares += static_cast<double>(in[j]) * in[j];
        }
        const double mean_square =
            block_reduce(squares, SumOp{}, 0.0, scratch) / static_cast<double>(width);
        const auto inverse =
            static_cast<float>(1.0 / sqrt(mean_square + static_cast<double>(epsilon)));
        if (threadIdx.x == 0) {
            inverses[row] = inverse;
        }
        float* out = y + row * width;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            out[j] = in[j] * inverse * gamma[j];
        }
    }
}

// dx = inv·(ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)), x̂ = (x − μ)·inv, ĝ = g ⊙ γ
__global__ void layer_norm_input_gradient_kernel(const float* x, const float* gamma,
                                                 const float* means, const float* inverses,
                                                 const float* upstream, std::size_t rows,
                                                 std::size_t width, float* dx) {
    __shared__ double scratch[32];
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * width;
        const float* up = upstream + row * width;
        const float mu = means[row];
        const float inverse = inverses[row];
        double sum_g_hat = 0.0;
        double sum_g_hat_x_hat = 0.0;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            const float x_hat = (in[j] - mu) * inverse;
            const float g_hat = up[j] * gamma[j];
            sum_g_hat += static_cast<double>(g_hat);
            sum_g_hat_x_hat += static_cast<double>(g_hat) * x_hat;
        }
        const auto mean_g_hat = static_cast<float>(block_reduce(sum_g_hat, SumOp{}, 0.0, scratch) /
                                                   static_cast<double>(width));
        const auto mean_g_hat_x_hat = static_cast<float>(
            block_reduce(sum_g_hat_x_hat, SumOp{}, 0.0, scratch) / static_cast<double>(width));
        float* d = dx + row * width;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            const float x_hat = (in[j] - mu) * inverse;
            d[j] = inverse * (up[j] * gamma[j] - mean_g_hat - x_hat * mean_g_hat_x_hat);
        }
    }
}

// dx = r·(g ⊙ γ) − x·r³·mean(g ⊙ γ ⊙ x)
__global__ void rms_norm_input_gradient_kernel(const float* x, const float* gamma,
                                               const float* inverses, const float* upstream,
                                               std::size_t rows, std::size_t width, float* dx) {
    __shared__ double scratch[32];
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * width;
        const float* up = upstream + row * width;
        const float r = inverses[row];
        double weighted = 0.0;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            weighted += static_cast<double>(up[j]) * gamma[j] * in[j];
        }
        const float correction = static_cast<float>(block_reduce(weighted, SumOp{}, 0.0, scratch) /
                                                    static_cast<double>(width)) *
                                 r * r * r;
        float* d = dx + row * width;
        for (std::size_t j = threadIdx.x; j < width; j += blockDim.x) {
            d[j] = r * up[j] * gamma[j] - in[j] * correction;
        }
    }
}

// partials[(b·accumulators + a)·width + j] = Σ over the rows of block b, one thread per column:
// LayerNorm (2 accumulators): g ⊙ x̂ and g; RMSNorm (1): g ⊙ x·r.
__global__ void parameter_partials_kernel(const float* x, const float* means, const float* inverses,
                                          const float* upstream, std::size_t rows,
                                          std::size_t width, bool layer_norm, double* partials) {
    const std::size_t column = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (column >= width) {
        return;
    }
    const std::size_t blocks = (rows + gradient_row_block - 1) / gradient_row_block;
    const std::size_t accumulators = layer_norm ? 2 : 1;
    for (std::size_t block = blockIdx.y; block < blocks; block += gridDim.y) {
        const std::size_t first = block * gradient_row_block;
        const std::size_t last =
            first + gradient_row_block < rows ? first + gradient_row_block : rows;
        double scale_sum = 0.0;
        double bias_sum = 0.0;
        for (std::size_t row = first; row < last; ++row) {
            const float in = x[row * width + column];
            const float up = upstream[row * width + column];
            if (layer_norm) {
                const float x_hat = (in - means[row]) * inverses[row];
                scale_sum += static_cast<double>(up) * x_hat;
                bias_sum += static_cast<double>(up);
            } else {
                scale_sum += static_cast<double>(up) * in * inverses[row];
            }
        }
        double* partial = partials + block * accumulators * width;
        partial[column] = scale_sum;
        if (layer_norm) {
            partial[width + column] = bias_sum;
        }
    }
}

// outputs[a][j] = Σ_b partials[(b·accumulators + a)·width + j], blocks in order
__global__ void fold_partials_kernel(const double* partials, std::size_t blocks,
                                     std::size_t accumulators, std::size_t width, float* first,
                                     float* second) {
    for (std::size_t item = first_index(); item < accumulators * width; item += grid_stride()) {
        const std::size_t a = item / width;
        const std::size_t column = item % width;
        double total = 0.0;
        for (std::size_t block = 0; block < blocks; ++block) {
            total += partials[(block * accumulators + a) * width + column];
        }
        (a == 0 ? first : second)[column] = static_cast<float>(total);
    }
}

void parameter_gradients(const float* x, const float* means, const float* inverses,
                         const float* upstream, std::size_t rows, std::size_t width,
                         bool layer_norm, double* partials, float* d_gamma, float* d_beta,
                         cudaStream_t stream) {
    const std::size_t blocks = (rows + gradient_row_block - 1) / gradient_row_block;
    const dim3 grid(static_cast<unsigned int>((width + threads_per_block - 1) / threads_per_block),
                    static_cast<unsigned int>(blocks < 65535 ? blocks : 65535));
    parameter_partials_kernel<<<grid, threads_per_block, 0, stream>>>(
        x, means, inverses, upstream, rows, width, layer_norm, partials);
    check_launch(layer_norm ? "layer_norm_backward (parameter partials)"
                            : "rms_norm_backward (parameter partials)");
    const std::size_t accumulators = layer_norm ? 2 : 1;
    fold_partials_kernel<<<blocks_for(accumulators * width), threads_per_block, 0, stream>>>(
        partials, blocks, accumulators, width, d_gamma, d_beta);
    check_launch(layer_norm ? "layer_norm_backward (parameter gradients)"
                            : "rms_norm_backward (parameter gradients)");
}

}  // namespace

void layer_norm_rows(const float* x, const float* gamma, const float* beta, std::size_t rows,
                     std::size_t width, float epsilon, float* y, float* mean, float* inverse,
                     cudaStream_t stream) {
    layer_norm_kernel<<<row_blocks(rows), threads_per_block, 0, stream>>>(
        x, gamma, beta, rows, width, epsilon, y, mean, inverse);
    check_launch("layer_norm");
}

void layer_norm_backward_rows(const float* x, const float* gamma, const float* mean,
                              const float* inverse, const float* upstream, std::size_t rows,
                              std::size_t width, float* dx, float* d_gamma, float* d_beta,
                              double* partials, cudaStream_t stream) {
    layer_norm_input_gradient_kernel<<<row_blocks(rows), threads_per_block, 0, stream>>>(
        x, gamma, mean, inverse, upstream, rows, width, dx);
    check_launch("layer_norm_backward (input gradient)");
    parameter_gradients(x, mean, inverse, upstream, rows, width, true, partials, d_gamma, d_beta,
                        stream);
}

void rms_norm_rows(const float* x, const float* gamma, std::size_t rows, std::size_t width,
                   float epsilon, float* y, float* inverse, cudaStream_t stream) {
    rms_norm_kernel<<<row_blocks(rows), threads_per_block, 0, stream>>>(x, gamma, rows, width,
                                                                        epsilon, y, inverse);
    check_launch("rms_norm");
}

void rms_norm_backward_rows(const float* x, const float* gamma, const float* inverse,
                            const float* upstream, std::size_t rows, std::size_t width, float* dx,
                            float* d_gamma, double* partials, cudaStream_t stream) {
    rms_norm_input_gradient_kernel<<<row_blocks(rows), threads_per_block, 0, stream>>>(
        x, gamma, inverse, upstream, rows, width, dx);
    check_launch("rms_norm_backward (input gradient)");
    parameter_gradients(x, nullptr, inverse, upstream, rows, width, false, partials, d_gamma,
                        nullptr, stream);
}

}  // namespace riftco_transformer::detail::cuda
