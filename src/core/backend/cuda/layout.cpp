// Layout capability: permute, broadcast and slices as index-mapped copies (bit-exact),
// concatenation as one column copy per input, sum_to_shape as a double-precision sum over the
// broadcast axes (layout.cu).

#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/kernels.hpp"
#include "core/tensor/shape.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// The walk over `extents` reading through `strides`, with neighbouring axes merged wherever
// they still form one stride (stride[d] = stride[d+1]·extent[d+1]) and extent-1 axes dropped.
AxisWalk make_walk(std::span<const std::size_t> extents, std::span<const std::size_t> strides,
                   const char* operation) {
    std::vector<std::size_t> merged_extents;
    std::vector<std::size_t> merged_strides;
    for (std::size_t d = 0; d < extents.size(); ++d) {
        if (extents[d] == 1) {
            continue;
        }
        if (!merged_extents.empty() && merged_strides.back() == strides[d] * extents[d]) {
            merged_extents.back() *= extents[d];
            merged_strides.back() = strides[d];
            continue;
        }
        merged_extents.push_back(extents[d]);
        merged_strides.push_back(strides[d]);
    }
    if (merged_extents.size() > max_walk_rank) {
        std::ostringstream message;
        message << operation << ": a layout of " << merged_extents.size()
                << " independent axes exceeds the CUDA kernels' limit of " << max_walk_rank;
        throw std::length_error(message.str());
    }
    AxisWalk walk;
    walk.rank = static_cast<std::uint32_t>(merged_extents.size());
    for (std::size_t d = 0; d < merged_extents.size(); ++d) {
        walk.extent[d] = merged_extents[d];
        walk.stride[d] = merged_strides[d];
    }
    return walk;
}

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

struct AxisBlocks {
    std::size_t outer = 1;
    std::size_t inner = 1;
};

AxisBlocks blocks_around(const Shape& shape, std::size_t axis) {
    AxisBlocks blocks;
    for (std::size_t d = 0; d < axis; ++d) {
        blocks.outer *= shape[d];
    }
    for (std::size_t d = axis + 1; d < shape.size(); ++d) {
        blocks.inner *= shape[d];
    }
    return blocks;
}

class CudaLayout final : public LayoutCapability {
  public:
    void permute(const Tensor& x, std::span<const std::size_t> axes, Tensor& out) const override {
        const std::vector<std::size_t> input_strides = row_major_strides(x.shape());
        std::vector<std::size_t> strides(axes.size());
        for (std::size_t d = 0; d < axes.size(); ++d) {
            strides[d] = input_strides[axes[d]];
        }
        const cudaStream_t stream = current_stream();
        strided_copy(device_input(x, stream), make_walk(out.shape(), strides, "permute"),
                     out.numel(), device_output(out, stream), stream);
    }

    void broadcast_to(const Tensor& x, Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        strided_copy(
            device_input(x, stream),
            make_walk(out.shape(), broadcast_strides(x.shape(), out.shape()), "broadcast_to"),
            out.numel(), device_output(out, stream), stream);
    }

    void sum_to_shape(const Tensor& x, Tensor& out) const override {
        // x's axes split into those out keeps (walked by out's elements) and those summed.
        const std::vector<std::size_t> target = broadcast_strides(out.shape(), x.shape());
        const std::vector<std::size_t> x_strides = row_major_strides(x.shape());
        std::vector<std::size_t> kept_extents;
        std::vector<std::size_t> kept_strides;
        std::vector<std::size_t> reduced_extents;
        std::vector<std::size_t> reduced_strides;
        std::size_t reduced_count = 1;
        for (std::size_t axis = 0; axis < x.rank(); ++axis) {
            if (x.shape()[axis] == 1) {
                continue;
            }
            if (target[axis] != 0) {
                kept_extents.push_back(x.shape()[axis]);
                kept_strides.push_back(x_strides[axis]);
            } else {
                reduced_extents.push_back(x.shape()[axis]);
                reduced_strides.push_back(x_strides[axis]);
                reduced_count *= x.shape()[axis];
            }
        }
        const cudaStream_t stream = current_stream();
        sum_walk(device_input(x, stream), make_walk(kept_extents, kept_strides, "sum_to_shape"),
                 out.numel(), make_walk(reduced_extents, reduced_strides, "sum_to_shape"),
                 reduced_count, device_output(out, stream), stream);
    }

    void concatenate_last_axis(std::span<const Tensor> inputs, Tensor& out) const override {
        const std::size_t total_width = out.shape().back();
        const std::size_t rows = out.numel() / total_width;
        const cudaStream_t stream = current_stream();
        float* destination = device_output(out, stream);
        std::size_t column = 0;
        for (const Tensor& input : inputs) {
            const std::size_t width = input.shape().back();
            copy_columns(device_input(input, stream), rows, width, destination, total_width, column,
                         stream);
            column += width;
        }
    }

    void slice(const Tensor& x, std::size_t axis, std::size_t start, Tensor& out) const override {
        // x [.., extent, ..] -> out [.., length, ..]
        const AxisBlocks blocks = blocks_around(x.shape(), axis);
        const cudaStream_t stream = current_stream();
        copy_axis_window(device_input(x, stream), x.shape()[axis], start,
                         device_output(out, stream), out.shape()[axis], 0, out.shape()[axis],
                         blocks.outer, blocks.inner, stream);
    }

    void slice_backward(const Tensor& x, std::size_t axis, std::size_t start,
                        Tensor& out) const override {
        // x [.., length, ..] -> out [.., extent, ..], zero outside the window
        const AxisBlocks blocks = blocks_around(x.shape(), axis);
        const cudaStream_t stream = current_stream();
        float* destination = device_output(out, stream);
        fill(destination, out.numel(), 0.0F, stream);
        copy_axis_window(device_input(x, stream), x.shape()[axis], 0, destination,
                         out.shape()[axis], start, x.shape()[axis], blocks.outer, blocks.inner,
                         stream);
    }
};

}  // namespace

std::unique_ptr<LayoutCapability> make_layout(const Runtime& /*runtime*/) {
    return std::make_unique<CudaLayout>();
}

}  // namespace riftco_transformer::detail::cuda
