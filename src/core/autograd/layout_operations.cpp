// Differentiable layout operations: each rule is the adjoint layout operation.

#include <vector>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;
using detail::make_result;
using detail::require_defined;

Variable permute(const Variable& x, std::span<const std::size_t> axes) {
    require_defined(x, "permute", "x");
    Tensor out = ops::permute(x.value(), axes);
    // out axis d is input axis axes[d], so the inverse sends d back to axes[d].
    std::vector<std::size_t> inverse(axes.size());
    for (std::size_t d = 0; d < axes.size(); ++d)
        inverse[axes[d]] = d;
    return make_result("permute", std::move(out), {&x},
                       [inverse](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::permute(g, inverse)};
                       });
}

Variable permute(const Variable& x, std::initializer_list<std::size_t> axes) {
    return permute(x, std::span<const std::size_t>(axes.begin(), axes.size()));
}

Variable transpose_2d(const Variable& x) {
    require_defined(x, "transpose_2d", "x");
    return make_result("transpose_2d", ops::transpose_2d(x.value()), {&x},
                       [](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::transpose_2d(g)};
                       });
}

Variable reshape(const Variable& x, Shape shape) {
    require_defined(x, "reshape", "x");
    Shape input_shape = x.shape();
    return make_result("reshape", ops::reshape(x.value(), std::move(shape)), {&x},
                       [input_shape](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{g.reshape(input_shape)};
                       });
}

Variable broadcast_to(const Variable& x, const Shape& shape) {
    require_defined(x, "broadcast_to", "x");
    Shape input_shape = x.shape();
    return make_result("broadcast_to", ops::broadcast_to(x.value(), shape), {&x},
                       [input_shape](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::sum_to_shape(g, input_shape)};
                       });
}

Variable sum_to_shape(const Variable& x, const Shape& shape) {
    require_defined(x, "sum_to_shape", "x");
    Shape input_shape = x.shape();
    return make_result("sum_to_shape", ops::sum_to_shape(x.value(), shape), {&x},
                       [input_shape](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::broadcast_to(g, input_shape)};
                       });
}

Variable concatenate_last_axis(std::span<const Variable> inputs) {
    std::vector<Tensor> values;
    values.reserve(inputs.size());
    std::vector<std::size_t> widths;
    widths.reserve(inputs.size());
    for (const Variable& input : inputs) {
        require_defined(input, "concatenate_last_axis", "input");
        values.push_back(input.value());
    }
    Tensor out = ops::concatenate_last_axis(values);
    for (const Tensor& value : values)
        widths.push_back(value.shape().back());
    return make_result("concatenate_last_axis", std::move(out), inputs,
                       [widths](const Tensor& g, std::span<const bool> needed) {
                           // [.., Σ w] -> one [.., w_i] slice per input
                           std::vector<Tensor> gradients(widths.size());
                           const std::size_t axis = g.rank() - 1;
                           std::size_t offset = 0;
                           for (std::size_t i = 0; i < widths.size(); ++i) {
                               if (needed[i])
                                   gradients[i] = ops::slice(g, axis, offset, widths[i]);
                               offset += widths[i];
                           }
                           return gradients;
                       });
}

Variable concatenate_last_axis(const Variable& left, const Variable& right) {
    const Variable pair[] = {left, right};
    return concatenate_last_axis(pair);
}

Variable slice(const Variable& x, std::size_t axis, std::size_t start, std::size_t length) {
    require_defined(x, "slice", "x");
    Tensor out = ops::slice(x.value(), axis, start, length);  // validates axis and window
    const std::size_t extent = x.shape()[axis];
    return make_result("slice", std::move(out), {&x},
                       [axis, start, extent](const Tensor& g, std::span<const bool>) {
                           return std::vector<Tensor>{ops::slice_backward(g, axis, start, extent)};
                       });
}

}  // namespace riftco_transformer
