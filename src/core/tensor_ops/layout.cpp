#include "riftco_transformer/core/tensor_ops/layout.hpp"

#include <limits>
#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

using detail::allocate_uninitialized;
using detail::require_capability;

const detail::LayoutCapability& layout_of(const detail::BackendAdapter& adapter,
                                          std::string_view operation) {
    return require_capability(adapter.layout(), adapter, operation, "layout");
}

// True when `from` broadcasts to `to` (dimensions matched from the right).
bool broadcasts(const Shape& from, const Shape& to) {
    if (from.size() > to.size()) {
        return false;
    }
    const std::size_t offset = to.size() - from.size();
    for (std::size_t axis = 0; axis < from.size(); ++axis) {
        if (from[axis] != 1 && from[axis] != to[offset + axis]) {
            return false;
        }
    }
    return true;
}

// out_of_range unless [start, start + length) lies within an axis of size `extent`.
void require_window(std::string_view op, std::size_t axis, std::size_t start, std::size_t length,
                    std::size_t extent) {
    if (start >= extent || length > extent - start) {
        std::ostringstream message;
        message << op << ": window [" << start << ", " << start << "+" << length
                << ") exceeds axis " << axis << " of size " << extent;
        throw std::out_of_range(message.str());
    }
}

}  // namespace

Tensor permute(const Tensor& x, std::span<const std::size_t> axes) {
    constexpr std::string_view op = "permute";
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    if (axes.size() != x.rank()) {
        std::ostringstream message;
        message << op << ": " << axes.size() << " axes given for rank " << x.rank() << " input "
                << shape_to_string(x.shape());
        throw std::invalid_argument(message.str());
    }
    std::vector<bool> seen(x.rank(), false);
    Shape shape(x.rank());
    for (std::size_t d = 0; d < axes.size(); ++d) {
        detail::require_axis(op, axes[d], x.rank());
        if (seen[axes[d]]) {
            throw std::invalid_argument(std::string(op) + ": axis " + std::to_string(axes[d]) +
                                        " appears more than once");
        }
        seen[axes[d]] = true;
        shape[d] = x.shape()[axes[d]];
    }
    Tensor out = allocate_uninitialized(std::move(shape), x.backend());
    layout_of(adapter, op).permute(x, axes, out);
    return out;
}

Tensor permute(const Tensor& x, std::initializer_list<std::size_t> axes) {
    return permute(x, std::span<const std::size_t>(axes.begin(), axes.size()));
}

Tensor transpose_2d(const Tensor& x) {
    constexpr std::string_view op = "transpose_2d";
    detail::require_tensor(op, "x", x);
    detail::require_rank(op, {"x", &x}, 2);
    const std::size_t axes[] = {1, 0};
    return permute(x, axes);
}

Tensor reshape(const Tensor& x, Shape shape) {
    detail::require_tensor("reshape", "x", x);
    return x.reshape(std::move(shape));
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
    constexpr std::string_view op = "broadcast_to";
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    static_cast<void>(checked_element_count(shape));
    if (!broadcasts(x.shape(), shape)) {
        throw std::invalid_argument(std::string(op) + ": cannot broadcast " +
                                    shape_to_string(x.shape()) + " to " + shape_to_string(shape));
    }
    Tensor out = allocate_uninitialized(shape, x.backend());
    layout_of(adapter, op).broadcast_to(x, out);
    return out;
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
    constexpr std::string_view op = "sum_to_shape";
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    static_cast<void>(checked_element_count(shape));
    if (!broadcasts(shape, x.shape())) {
        throw std::invalid_argument(std::string(op) + ": " + shape_to_string(shape) +
                                    " does not broadcast to the input shape " +
                                    shape_to_string(x.shape()));
    }
    Tensor out = allocate_uninitialized(shape, x.backend());
    layout_of(adapter, op).sum_to_shape(x, out);
    return out;
}

Tensor concatenate_last_axis(std::span<const Tensor> inputs) {
    constexpr std::string_view op = "concatenate_last_axis";
    if (inputs.empty()) {
        throw std::invalid_argument(std::string(op) + ": no inputs");
    }
    const Tensor& first = inputs.front();
    detail::require_tensor(op, "inputs[0]", first);
    std::size_t width = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Tensor& input = inputs[i];
        const std::string name = "inputs[" + std::to_string(i) + "]";
        static_cast<void>(detail::input_adapter(op, {{"inputs[0]", &first}, {name, &input}}));
        if (input.rank() == 0) {
            throw std::invalid_argument(std::string(op) + ": " + name + " is a scalar");
        }
        if (input.rank() != first.rank()) {
            throw std::invalid_argument(std::string(op) + ": " + name + " has rank " +
                                        std::to_string(input.rank()) + ", inputs[0] has rank " +
                                        std::to_string(first.rank()));
        }
        for (std::size_t axis = 0; axis + 1 < input.rank(); ++axis) {
            if (input.shape()[axis] != first.shape()[axis]) {
                throw std::invalid_argument(
                    std::string(op) + ": " + name + " shape " + shape_to_string(input.shape()) +
                    " differs from inputs[0] shape " + shape_to_string(first.shape()) +
                    " before the last axis");
            }
        }
        const std::size_t part = input.shape().back();
        if (width > std::numeric_limits<std::size_t>::max() - part) {
            throw std::overflow_error(std::string(op) + ": total width overflows");
        }
        width += part;
    }
    Shape shape = first.shape();
    shape.back() = width;
    static_cast<void>(checked_element_count(shape));
    const auto& adapter = detail::require_available_adapter(first.backend(), op);
    Tensor out = allocate_uninitialized(std::move(shape), first.backend());
    layout_of(adapter, op).concatenate_last_axis(inputs, out);
    return out;
}

Tensor concatenate_last_axis(const Tensor& left, const Tensor& right) {
    detail::require_tensor("concatenate_last_axis", "left", left);
    detail::require_tensor("concatenate_last_axis", "right", right);
    const Tensor pair[] = {left, right};
    return concatenate_last_axis(pair);
}

Tensor slice(const Tensor& x, std::size_t axis, std::size_t start, std::size_t length) {
    constexpr std::string_view op = "slice";
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    detail::require_axis(op, axis, x.rank());
    if (length == 0) {
        throw std::invalid_argument(std::string(op) + ": length is 0");
    }
    const std::size_t extent = x.shape()[axis];
    require_window(op, axis, start, length, extent);
    Shape shape = x.shape();
    shape[axis] = length;
    Tensor out = allocate_uninitialized(std::move(shape), x.backend());
    layout_of(adapter, op).slice(x, axis, start, out);
    return out;
}

Tensor slice_backward(const Tensor& upstream, std::size_t axis, std::size_t start,
                      std::size_t extent) {
    constexpr std::string_view op = "slice_backward";
    const auto& adapter = detail::input_adapter(op, {{"upstream", &upstream}});
    detail::require_axis(op, axis, upstream.rank());
    const std::size_t length = upstream.shape()[axis];
    require_window(op, axis, start, length, extent);
    Shape shape = upstream.shape();
    shape[axis] = extent;
    static_cast<void>(checked_element_count(shape));
    Tensor out = allocate_uninitialized(std::move(shape), upstream.backend());
    layout_of(adapter, op).slice_backward(upstream, axis, start, out);
    return out;
}

}  // namespace riftco_transformer::tensor_ops
