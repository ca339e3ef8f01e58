// Differentiable reductions: the rule broadcasts the upstream back over the reduced axes
// (and divides by the count for mean).

#include <optional>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/reduction.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;
using detail::make_result;
using detail::require_defined;

namespace {

// out = reduce(x) over everything (axis absent) or one axis; rule: broadcast back · factor.
Variable reduction(std::string_view operation, const Variable& x, Tensor out,
                   std::optional<std::size_t> axis, double factor) {
    Shape input_shape = x.shape();
    // The upstream has the output's shape; with keep_dims semantics it broadcasts directly.
    Shape kept_shape = input_shape;
    if (axis) {
        kept_shape[*axis] = 1;
    } else {
        kept_shape.assign(input_shape.size(), 1);
    }
    const auto scale = static_cast<float>(factor);
    return make_result(operation, std::move(out), {&x},
                       [input_shape, kept_shape, scale](const Tensor& g, std::span<const bool>) {
                           Tensor spread = ops::broadcast_to(g.reshape(kept_shape), input_shape);
                           return std::vector<Tensor>{scale == 1.0F ? std::move(spread)
                                                                    : ops::scale(spread, scale)};
                       });
}

}  // namespace

Variable sum(const Variable& x) {
    require_defined(x, "sum", "x");
    return reduction("sum", x, ops::sum(x.value()), std::nullopt, 1.0);
}

Variable sum(const Variable& x, std::size_t axis, bool keep_dims) {
    require_defined(x, "sum", "x");
    return reduction("sum", x, ops::sum(x.value(), axis, keep_dims), axis, 1.0);
}

Variable mean(const Variable& x) {
    require_defined(x, "mean", "x");
    return reduction("mean", x, ops::mean(x.value()), std::nullopt,
                     1.0 / static_cast<double>(x.value().numel()));
}

Variable mean(const Variable& x, std::size_t axis, bool keep_dims) {
    require_defined(x, "mean", "x");
    Tensor out = ops::mean(x.value(), axis, keep_dims);  // validates the axis
    return reduction("mean", x, std::move(out), axis, 1.0 / static_cast<double>(x.shape()[axis]));
}

}  // namespace riftco_transformer
