// CPU layout kernels.

#include <algorithm>
#include <vector>

#include "core/backend/cpu/axis_sum.hpp"
#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/strided.hpp"
#include "core/tensor/shape.hpp"

namespace riftco_transformer::detail {

void strided_copy(const float* src, std::span<const std::size_t> out_shape,
                  std::span<const std::size_t> source_strides, float* dst) {
    if (out_shape.empty()) {
        dst[0] = src[0];
        return;
    }
    // Rows: every output index but the last axis; each row is one strided inner loop.
    const std::size_t rank = out_shape.size();
    const std::size_t width = out_shape[rank - 1];
    const std::size_t inner_stride = source_strides[rank - 1];
    std::size_t rows = 1;
    for (std::size_t axis = 0; axis + 1 < rank; ++axis)
        rows *= out_shape[axis];

    parallel_for(rows, items_per_thread_for(width),
                 [&](std::size_t row_begin, std::size_t row_end) {
                     // Decompose the first row index, then advance it like an odometer.
                     std::vector<std::size_t> index(rank - 1, 0);
                     std::size_t remainder = row_begin;
                     std::size_t source_offset = 0;
                     for (std::size_t axis = rank - 1; axis-- > 0;) {
                         index[axis] = remainder % out_shape[axis];
                         remainder /= out_shape[axis];
                         source_offset += index[axis] * source_strides[axis];
                     }
                     for (std::size_t row = row_begin; row < row_end; ++row) {
                         float* out_row = dst + row * width;
                         const float* in_row = src + source_offset;
                         if (inner_stride == 1) {
                             std::copy_n(in_row, width, out_row);
                         } else if (inner_stride == 0) {
                             std::fill_n(out_row, width, in_row[0]);
                         } else {
                             for (std::size_t j = 0; j < width; ++j)
                                 out_row[j] = in_row[j * inner_stride];
                         }
                         for (std::size_t axis = rank - 1; axis-- > 0;) {
                             source_offset += source_strides[axis];
                             if (++index[axis] < out_shape[axis]) {
                                 break;
                             }
                             source_offset -= index[axis] * source_strides[axis];
                             index[axis] = 0;
                         }
                     }
                 });
}

namespace {

// Strides of `from` aligned to the axes of `to` (right-aligned), 0 where `from` broadcasts.
std::vector<std::size_t> broadcast_strides(std::span<const std::size_t> from,
                                           std::span<const std::size_t> to) {
    const std::vector<std::size_t> from_strides = row_major_strides(from);
    std::vector<std::size_t> strides(to.size(), 0);
    const std::size_t offset = to.size() - from.size();
    for (std::size_t axis = 0; axis < from.size(); ++axis) {
        strides[offset + axis] = from[axis] == 1 ? 0 : from_strides[axis];
    }
    return strides;
}

}  // namespace

void CpuLayout::permute(const Tensor& x, std::span<const std::size_t> axes, Tensor& out) const {
    const std::vector<std::size_t> input_strides = row_major_strides(x.shape());
    std::vector<std::size_t> strides(axes.size());
    for (std::size_t d = 0; d < axes.size(); ++d)
        strides[d] = input_strides[axes[d]];
    strided_copy(cpu_data(x), out.shape(), strides, cpu_output(out));
}

void CpuLayout::broadcast_to(const Tensor& x, Tensor& out) const {
    strided_copy(cpu_data(x), out.shape(), broadcast_strides(x.shape(), out.shape()),
                 cpu_output(out));
}

void CpuLayout::sum_to_shape(const Tensor& x, Tensor& out) const {
    const std::vector<std::size_t> target = broadcast_strides(out.shape(), x.shape());
    const float* src = cpu_data(x);
    float* dst = cpu_output(out);
    const std::size_t rank = x.rank();
    // Common case (bias gradients): out is x's trailing dimensions, so the reduction is
    // column sums over the merged leading axes.
    std::size_t leading = 0;
    while (leading < rank && target[leading] == 0)
        ++leading;
    bool trailing_kept = true;
    for (std::size_t axis = leading; axis < rank; ++axis) {
        trailing_kept = trailing_kept && (target[axis] != 0 || x.shape()[axis] == 1);
    }
    if (trailing_kept) {
        sum_over_axis(src, 1, x.numel() / out.numel(), out.numel(), 1.0, dst);
        return;
    }
    // General case: walk x in row-major order; each element lands on its broadcast source.
    // Serial and accumulated in double, so the result is independent of thread count.
    std::vector<double> totals(out.numel(), 0.0);
    std::vector<std::size_t> index(rank, 0);
    std::size_t target_offset = 0;
    const std::size_t width = x.shape()[rank - 1];
    const std::size_t inner_stride = target[rank - 1];
    for (std::size_t base = 0; base < x.numel(); base += width) {
        for (std::size_t j = 0; j < width; ++j)
            totals[target_offset + j * inner_stride] += src[base + j];
        for (std::size_t axis = rank - 1; axis-- > 0;) {
            target_offset += target[axis];
            if (++index[axis] < x.shape()[axis]) {
                break;
            }
            target_offset -= index[axis] * target[axis];
            index[axis] = 0;
        }
    }
    for (std::size_t i = 0; i < totals.size(); ++i)
        dst[i] = static_cast<float>(totals[i]);
}

void CpuLayout::concatenate_last_axis(std::span<const Tensor> inputs, Tensor& out) const {
    const std::size_t total_width = out.shape().back();
    const std::size_t rows = out.numel() / total_width;
    float* dst = cpu_output(out);
    parallel_for(rows, items_per_thread_for(total_width), [&](std::size_t begin, std::size_t end) {
        for (std::size_t row = begin; row < end; ++row) {
            float* out_row = dst + row * total_width;
            for (const Tensor& input : inputs) {
                const std::size_t width = input.shape().back();
                out_row = std::copy_n(cpu_data(input) + row * width, width, out_row);
            }
        }
    });
}

namespace {

// x viewed as [outer, extent, inner] around `axis`.
struct AxisBlocks {
    std::size_t outer = 1;
    std::size_t inner = 1;
};

AxisBlocks blocks_around(const Shape& shape, std::size_t axis) {
    AxisBlocks blocks;
    for (std::size_t d = 0; d < axis; ++d)
        blocks.outer *= shape[d];
    for (std::size_t d = axis + 1; d < shape.size(); ++d)
        blocks.inner *= shape[d];
    return blocks;
}

// Copies `length` rows of `inner` floats per outer block between a tensor whose axis has
// `from_extent` entries (reading from row `from_start`) and one with `to_extent` (writing at
// row `to_start`).
void copy_axis_window(const float* src, std::size_t from_extent, std::size_t from_start, float* dst,
                      std::size_t to_extent, std::size_t to_start, std::size_t length,
                      AxisBlocks blocks) {
    const std::size_t run = length * blocks.inner;
    parallel_for(blocks.outer, items_per_thread_for(run), [&](std::size_t begin, std::size_t end) {
        for (std::size_t o = begin; o < end; ++o) {
            std::copy_n(src + (o * from_extent + from_start) * blocks.inner, run,
                        dst + (o * to_extent + to_start) * blocks.inner);
        }
    });
}

}  // namespace

void CpuLayout::slice(const Tensor& x, std::size_t axis, std::size_t start, Tensor& out) const {
    // x [.., extent, ..] -> out [.., length, ..]
    copy_axis_window(cpu_data(x), x.shape()[axis], start, cpu_output(out), out.shape()[axis], 0,
                     out.shape()[axis], blocks_around(x.shape(), axis));
}

void CpuLayout::slice_backward(const Tensor& x, std::size_t axis, std::size_t start,
                               Tensor& out) const {
    // x [.., length, ..] -> out [.., extent, ..], zero outside the window
    float* dst = cpu_output(out);
    std::fill_n(dst, out.numel(), 0.0F);
    copy_axis_window(cpu_data(x), x.shape()[axis], 0, dst, out.shape()[axis], start,
                     x.shape()[axis], blocks_around(x.shape(), axis));
}

}  // namespace riftco_transformer::detail
