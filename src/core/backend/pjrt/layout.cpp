// Layout programs: data movement only (transpose, broadcast_in_dim, concatenate, dynamic
// slices), so every result is bit-identical to the CPU reference (cpu/layout.cpp); the one
// arithmetic operation, sum_to_shape, is the reduction family's float32 sum (scaled_sum).
//
// Programs are keyed by the shapes they move (and the permutation); slice windows are
// runtime u32 parameters, so sliding a window of one shape never recompiles. A result whose
// elements are the input's in the same order (an identity permutation, a broadcast that only
// adds unit axes, a concatenation of one input) shares the input's immutable buffer.

#include <string>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {

namespace {

using Results = std::pair<std::string, std::string>;

// x viewed as [outer, extent, inner] around `axis`.
std::vector<std::size_t> around_axis(const Shape& shape, std::size_t axis) {
    std::size_t outer = 1;
    std::size_t inner = 1;
    for (std::size_t d = 0; d < axis; ++d) {
        outer *= shape[d];
    }
    for (std::size_t d = axis + 1; d < shape.size(); ++d) {
        inner *= shape[d];
    }
    return {outer, shape[axis], inner};
}

// The rank-0 u32 start of a window, from its tensor<1xui32> parameter.
std::string start_scalar(ProgramText& program) {
    const std::string start = program.parameter(tensor_type({1}, "ui32"));
    return program.let("stablehlo.reshape " + start + " : (tensor<1xui32>) -> tensor<ui32>");
}

class PjrtLayout final : public LayoutCapability {
  public:
    explicit PjrtLayout(const Context& context) : context_(context) {}

    // x [s_0..s_r) -> out [s_axes[0], ..]
    void permute(const Tensor& x, std::span<const std::size_t> axes, Tensor& out) const override {
        bool identity = true;
        for (std::size_t d = 0; d < axes.size(); ++d) {
            identity = identity && axes[d] == d;
        }
        if (identity) {
            give(context_, out, buffer_of(x));
            return;
        }
        const Shape& shape = x.shape();
        const std::string key = "permute/" + shape_key(shape) + "/" + integer_list(axes);
        auto text = [&] {
            ProgramText program;
            const std::string flat = program.parameter(flat_type(shape));
            const std::string value =
                program.reshape(flat, std::vector<std::size_t>{x.numel()}, shape);
            const std::string moved =
                program.let("stablehlo.transpose " + value + ", dims = " + integer_list(axes) +
                            " : (" + tensor_type(shape) + ") -> " + tensor_type(out.shape()));
            const Results results[] = {
                {program.flatten(moved, out.shape()), flat_type(out.shape())}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(x)}, {{ElementType::F32, out.numel()}})[0]);
    }

    // x [..] right-aligned against out [..]: axes of extent 1 repeat.
    void broadcast_to(const Tensor& x, Tensor& out) const override {
        if (x.numel() == out.numel()) {
            give(context_, out, buffer_of(x));  // only unit axes added: same elements
            return;
        }
        const Shape& from = x.shape();
        const Shape& to = out.shape();
        const std::string key = "broadcast_to/" + shape_key(from) + "/" + shape_key(to);
        auto text = [&] {
            ProgramText program;
            const std::string flat = program.parameter(flat_type(from));
            const std::string value =
                program.reshape(flat, std::vector<std::size_t>{x.numel()}, from);
            std::vector<std::size_t> dimensions(from.size());
            for (std::size_t axis = 0; axis < from.size(); ++axis) {
                dimensions[axis] = to.size() - from.size() + axis;
            }
            const std::string spread = program.let("stablehlo.broadcast_in_dim " + value +
                                                   ", dims = " + integer_list(dimensions) + " : (" +
                                                   tensor_type(from) + ") -> " + tensor_type(to));
            const Results results[] = {{program.flatten(spread, to), flat_type(to)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(x)}, {{ElementType::F32, out.numel()}})[0]);
    }

    // x [..] -> out [..] (out broadcasts to x): Σ over x's leading extra axes and over the
    // axes where out has extent 1 and x does not (the reduction family's float32 sum).
    void sum_to_shape(const Tensor& x, Tensor& out) const override {
        const Shape& from = x.shape();
        const Shape& to = out.shape();
        const std::size_t offset = from.size() - to.size();
        std::vector<std::size_t> axes;
        std::vector<std::size_t> kept;
        for (std::size_t axis = 0; axis < from.size(); ++axis) {
            if (axis < offset || (to[axis - offset] == 1 && from[axis] != 1)) {
                axes.push_back(axis);
            } else {
                kept.push_back(from[axis]);
            }
        }
        const std::string key = "sum_to_shape/" + shape_key(from) + "/" + shape_key(to);
        auto text = [&] {
            ProgramText program;
            const std::string flat = program.parameter(flat_type(from));
            const std::string value =
                program.reshape(flat, std::vector<std::size_t>{x.numel()}, from);
            const std::string total = scaled_sum(program, value, from, axes, kept, 1.0F);
            const Results results[] = {{program.flatten(total, kept), flat_type(to)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(x)}, {{ElementType::F32, out.numel()}})[0]);
    }

    // inputs [rows.., w_i] -> out [rows.., Σ w_i], the inputs side by side in order.
    void concatenate_last_axis(std::span<const Tensor> inputs, Tensor& out) const override {
        if (inputs.size() == 1) {
            give(context_, out, buffer_of(inputs.front()));
            return;
        }
        // Only the row count and the widths shape the program: [rows, w_i] -> [rows, Σ w_i].
        const std::size_t total_width = out.shape().back();
        const std::size_t rows = out.numel() / total_width;
        std::string key = "concatenate_last_axis/" + std::to_string(rows) + "/";
        std::vector<BufferPointer> buffers;
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            key += i == 0 ? "" : "+";
            key += std::to_string(inputs[i].shape().back());
            buffers.push_back(buffer_of(inputs[i]));
        }
        auto text = [&] {
            ProgramText program;
            std::string operands;
            std::string operand_types;
            for (std::size_t i = 0; i < inputs.size(); ++i) {
                const std::size_t width = inputs[i].shape().back();
                const std::size_t matrix[] = {rows, width};
                const std::string flat = program.parameter(flat_type(matrix));
                const char* separator = i == 0 ? "" : ", ";
                operands += separator;
                operands += program.reshape(flat, std::vector<std::size_t>{rows * width}, matrix);
                operand_types += separator;
                operand_types += tensor_type(matrix);
            }
            const std::size_t joined[] = {rows, total_width};
            const std::string result =
                program.let("stablehlo.concatenate " + operands + ", dim = 1 : (" + operand_types +
                            ") -> " + tensor_type(joined));
            const Results results[] = {{program.flatten(result, joined), flat_type(joined)}};
            return program.finish(results);
        };
        const Output outputs[] = {{ElementType::F32, out.numel()}};
        give(context_, out, run(context_, key, text, buffers, outputs)[0]);
    }

    // x [outer, extent, inner] -> out [outer, length, inner] from row `start` of the axis.
    void slice(const Tensor& x, std::size_t axis, std::size_t start, Tensor& out) const override {
        const std::vector<std::size_t> whole = around_axis(x.shape(), axis);
        const std::vector<std::size_t> window = around_axis(out.shape(), axis);
        const std::string key = "slice/" + shape_key(whole) + "/" + std::to_string(window[1]);
        auto text = [&] {
            ProgramText program;
            const std::string flat = program.parameter(flat_type(whole));
            const std::string at = start_scalar(program);
            const std::string value =
                program.reshape(flat, std::vector<std::size_t>{x.numel()}, whole);
            const std::string zero =
                program.integer_constant(0, std::vector<std::size_t>{}, "ui32");
            const std::string part = program.let(
                "stablehlo.dynamic_slice " + value + ", " + zero + ", " + at + ", " + zero +
                ", sizes = " + integer_list(window) + " : (" + tensor_type(whole) +
                ", tensor<ui32>, tensor<ui32>, tensor<ui32>) -> " + tensor_type(window));
            const Results results[] = {{program.flatten(part, window), flat_type(window)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text,
                 {buffer_of(x), index_scalar_buffer(context_, static_cast<std::uint32_t>(start))},
                 {{ElementType::F32, out.numel()}})[0]);
    }

    // x [outer, length, inner] -> out [outer, extent, inner]: zeros, x at row `start`.
    void slice_backward(const Tensor& x, std::size_t axis, std::size_t start,
                        Tensor& out) const override {
        const std::vector<std::size_t> window = around_axis(x.shape(), axis);
        const std::vector<std::size_t> whole = around_axis(out.shape(), axis);
        const std::string key =
            "slice_backward/" + shape_key(whole) + "/" + std::to_string(window[1]);
        auto text = [&] {
            ProgramText program;
            const std::string flat = program.parameter(flat_type(window));
            const std::string at = start_scalar(program);
            const std::string value =
                program.reshape(flat, std::vector<std::size_t>{x.numel()}, window);
            const std::string zeros = program.constant(0.0F, whole);
            const std::string zero =
                program.integer_constant(0, std::vector<std::size_t>{}, "ui32");
            const std::string placed = program.let(
                "stablehlo.dynamic_update_slice " + zeros + ", " + value + ", " + zero + ", " + at +
                ", " + zero + " : (" + tensor_type(whole) + ", " + tensor_type(window) +
                ", tensor<ui32>, tensor<ui32>, tensor<ui32>) -> " + tensor_type(whole));
            const Results results[] = {{program.flatten(placed, whole), flat_type(whole)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text,
                 {buffer_of(x), index_scalar_buffer(context_, static_cast<std::uint32_t>(start))},
                 {{ElementType::F32, out.numel()}})[0]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<LayoutCapability> make_layout(const Context& context) {
    return std::make_unique<PjrtLayout>(context);
}

}  // namespace riftco_transformer::detail::pjrt
