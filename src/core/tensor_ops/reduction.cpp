#include "riftco_transformer/core/tensor_ops/reduction.hpp"

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

const detail::ReductionCapability& reduction_of(const detail::BackendAdapter& adapter,
                                                std::string_view operation) {
    return detail::require_capability(adapter.reduction(), adapter, operation, "reduction");
}

Tensor reduce_all(std::string_view op, const Tensor& x, bool average) {
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    Tensor out = detail::allocate_uninitialized(Shape{}, x.backend());
    const double multiplier = average ? 1.0 / static_cast<double>(x.numel()) : 1.0;
    reduction_of(adapter, op).sum_all(x, multiplier, out);
    return out;
}

Tensor reduce_axis(std::string_view op, const Tensor& x, std::size_t axis, bool keep_dims,
                   bool average) {
    const auto& adapter = detail::input_adapter(op, {{"x", &x}});
    detail::require_axis(op, axis, x.rank());
    Shape shape = x.shape();
    const std::size_t extent = shape[axis];
    if (keep_dims) {
        shape[axis] = 1;
    } else {
        shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(axis));
    }
    Tensor out = detail::allocate_uninitialized(std::move(shape), x.backend());
    const double multiplier = average ? 1.0 / static_cast<double>(extent) : 1.0;
    reduction_of(adapter, op).sum_axis(x, axis, multiplier, out);
    return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
    return reduce_all("sum", x, false);
}
Tensor sum(const Tensor& x, std::size_t axis, bool keep_dims) {
    return reduce_axis("sum", x, axis, keep_dims, false);
}
Tensor mean(const Tensor& x) {
    return reduce_all("mean", x, true);
}
Tensor mean(const Tensor& x, std::size_t axis, bool keep_dims) {
    return reduce_axis("mean", x, axis, keep_dims, true);
}

}  // namespace riftco_transformer::tensor_ops
