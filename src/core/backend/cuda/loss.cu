// Fused softmax cross-entropy: one block per row of logits (max, Σ exp in double, the
// gradient written in place of the softmax), one double loss per row, then one block sums the
// rows' losses in a fixed order (deterministic) and checks the mean.

#include <cuda/std/limits>

#include "core/backend/cuda/block_reduce.cuh"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"
#include "core/backend/cuda/row_kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

__global__ void cross_entropy_kernel(const float* logits, const std::uint32_t* targets,
                                     const std::uint32_t* selected, std::size_t rows,
                                     std::size_t vocabulary, std::size_t time_extent,
                                     std::size_t offset, std::size_t count, float inverse_count,
                                     double* row_loss, float* gradient,
                                     unsigned long long* first_failure) {
    __shared__ float float_scratch[32];
    __shared__ double double_scratch[32];
    constexpr float infinity = ::cuda::std::numeric_limits<float>::infinity();
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* z = logits + row * vocabulary;
        float* g = gradient + row * vocabulary;
        const std::size_t t = row % time_extent;
        const bool counted =
            t >= offset && t < offset + count && (selected == nullptr || selected[row] != 0);
        const std::uint32_t target = targets[row];
        const float target_logit = counted ? z[target] : 0.0F;
        if (!counted || !isfinite(target_logit)) {
            if (counted && threadIdx.x == 0) {
                atomicMin(first_failure, static_cast<unsigned long long>(row));
            }
            for (std::size_t j = threadIdx.x; j < vocabulary; j += blockDim.x) {
                g[j] = 0.0F;
            }
            if (threadIdx.x == 0) {
                row_loss[row] = 0.0;
            }
            continue;
        }
        float max = -infinity;
        for (std::size_t j = threadIdx.x; j < vocabulary; j += blockDim.x) {
            max = fmaxf(max, z[j]);
        }
        max = block_reduce(max, MaxOp{}, -infinity, float_scratch);
        double sum = 0.0;
        for (std::size_t j = threadIdx.x; j < vocabulary; j += blockDim.x) {
            sum += static_cast<double>(expf(z[j] - max));
        }
        sum = block_reduce(sum, SumOp{}, 0.0, double_scratch);
        const float scale = static_cast<float>(1.0 / sum) * inverse_count;
        for (std::size_t j = threadIdx.x; j < vocabulary; j += blockDim.x) {
            const float value = expf(z[j] - max) * scale;
            g[j] = j == target ? value - inverse_count : value;
        }
        if (threadIdx.x == 0) {
            row_loss[row] = log(sum) + static_cast<double>(max) - static_cast<double>(target_logit);
        }
    }
}

__global__ void cross_entropy_mean_kernel(const double* row_loss, std::size_t rows,
                                          std::size_t averaged, float* loss, double* mean_out,
                                          unsigned long long* first_failure) {
    __shared__ double scratch[32];
    double total = 0.0;
    for (std::size_t row = threadIdx.x; row < rows; row += blockDim.x) {
        total += row_loss[row];
    }
    total = block_reduce(total, SumOp{}, 0.0, scratch);
    if (threadIdx.x == 0) {
        const double mean = total / static_cast<double>(averaged);
        const double largest = static_cast<double>(::cuda::std::numeric_limits<float>::max());
        if (!isfinite(mean) || mean > largest) {
            atomicMin(first_failure, 0ULL);
        }
        mean_out[0] = mean;
        loss[0] = static_cast<float>(mean);
    }
}

}  // namespace

void cross_entropy_rows(const float* logits, const std::uint32_t* targets,
                        const std::uint32_t* selected, std::size_t rows, std::size_t vocabulary,
                        std::size_t time_extent, std::size_t offset, std::size_t count,
                        float inverse_count, double* row_loss, float* gradient,
                        unsigned long long* first_failure, cudaStream_t stream) {
    const auto blocks = static_cast<unsigned int>(rows < max_blocks ? rows : max_blocks);
    cross_entropy_kernel<<<blocks == 0 ? 1 : blocks, threads_per_block, 0, stream>>>(
        logits, targets, selected, rows, vocabulary, time_extent, offset, count, inverse_count,
        row_loss, gradient, first_failure);
    check_launch("cross_entropy");
}

void cross_entropy_mean(const double* row_loss, std::size_t rows, std::size_t averaged, float* loss,
                        double* mean_out, unsigned long long* first_failure, cudaStream_t stream) {
    cross_entropy_mean_kernel<<<1, threads_per_block, 0, stream>>>(row_loss, rows, averaged, loss,
                                                                   mean_out, first_failure);
    check_launch("cross_entropy (mean)");
}

}  // namespace riftco_transformer::detail::cuda
