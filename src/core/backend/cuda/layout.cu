// Layout kernels: data movement by index arithmetic (bit-exact), and the double-precision sum
// behind sum_to_shape.

#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

// The source offset of element `index` of a row-major walk.
__device__ std::size_t walk_offset(const AxisWalk& walk, std::size_t index) {
    std::size_t offset = 0;
    for (std::uint32_t d = walk.rank; d-- > 0;) {
        offset += (index % walk.extent[d]) * walk.stride[d];
        index /= walk.extent[d];
    }
    return offset;
}

// dst [count] <- src through `walk`
__global__ void strided_copy_kernel(const float* src, AxisWalk walk, std::size_t count,
                                    float* dst) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        dst[i] = src[walk_offset(walk, i)];
    }
}

// src [outer, from_extent, inner] -> dst [outer, to_extent, inner], `length` rows of the axis
__global__ void copy_axis_window_kernel(const float* src, std::size_t from_extent,
                                        std::size_t from_start, float* dst, std::size_t to_extent,
                                        std::size_t to_start, std::size_t length, std::size_t inner,
                                        std::size_t count) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        const std::size_t within = i % inner;
        const std::size_t row = (i / inner) % length;
        const std::size_t block = i / (inner * length);
        dst[(block * to_extent + to_start + row) * inner + within] =
            src[(block * from_extent + from_start + row) * inner + within];
    }
}

// src [rows, width] -> dst [rows, total_width] at column_offset
__global__ void copy_columns_kernel(const float* src, std::size_t width, float* dst,
                                    std::size_t total_width, std::size_t column_offset,
                                    std::size_t count) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        const std::size_t row = i / width;
        const std::size_t column = i % width;
        dst[row * total_width + column_offset + column] = src[i];
    }
}

// out [out_count] = Σ over `reduced` of x at base(o), accumulated in double in row-major order
__global__ void sum_walk_kernel(const float* x, AxisWalk kept, std::size_t out_count,
                                AxisWalk reduced, std::size_t reduced_count, float* out) {
    for (std::size_t o = first_index(); o < out_count; o += grid_stride()) {
        const float* base = x + walk_offset(kept, o);
        double total = 0.0;
        for (std::size_t r = 0; r < reduced_count; ++r) {
            total += static_cast<double>(base[walk_offset(reduced, r)]);
        }
        out[o] = static_cast<float>(total);
    }
}

}  // namespace

void strided_copy(const float* src, const AxisWalk& walk, std::size_t count, float* dst,
                  cudaStream_t stream) {
    if (count == 0) {
        return;
    }
    strided_copy_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(src, walk, count, dst);
    check_launch("strided copy");
}

void copy_axis_window(const float* src, std::size_t from_extent, std::size_t from_start, float* dst,
                      std::size_t to_extent, std::size_t to_start, std::size_t length,
                      std::size_t outer, std::size_t inner, cudaStream_t stream) {
    const std::size_t count = outer * length * inner;
    if (count == 0) {
        return;
    }
    copy_axis_window_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(
        src, from_extent, from_start, dst, to_extent, to_start, length, inner, count);
    check_launch("axis window copy");
}

void copy_columns(const float* src, std::size_t rows, std::size_t width, float* dst,
                  std::size_t total_width, std::size_t column_offset, cudaStream_t stream) {
    const std::size_t count = rows * width;
    if (count == 0) {
        return;
    }
    copy_columns_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(
        src, width, dst, total_width, column_offset, count);
    check_launch("column copy");
}

void sum_walk(const float* x, const AxisWalk& kept, std::size_t out_count, const AxisWalk& reduced,
              std::size_t reduced_count, float* out, cudaStream_t stream) {
    if (out_count == 0) {
        return;
    }
    sum_walk_kernel<<<blocks_for(out_count), threads_per_block, 0, stream>>>(
        x, kept, out_count, reduced, reduced_count, out);
    check_launch("sum over broadcast axes");
}

}  // namespace riftco_transformer::detail::cuda
