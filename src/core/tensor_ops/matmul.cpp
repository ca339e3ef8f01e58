#include "riftco_transformer/core/tensor_ops/matmul.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

constexpr std::string_view op = "matmul";

// The result shape of op(left)·op(right) after every shape rule passed.
Shape product_shape(const Tensor& left, const Tensor& right, bool transpose_left,
                    bool transpose_right) {
    detail::require_minimum_rank(op, {"left", &left}, 2);
    detail::require_minimum_rank(op, {"right", &right}, 2);
    if (left.rank() != right.rank()) {
        std::ostringstream message;
        message << op << ": ranks differ (left " << shape_to_string(left.shape()) << ", right "
                << shape_to_string(right.shape()) << "); batch dimensions do not broadcast";
        throw std::invalid_argument(message.str());
    }
    const std::size_t rank = left.rank();
    for (std::size_t axis = 0; axis + 2 < rank; ++axis) {
        if (left.shape()[axis] != right.shape()[axis]) {
            std::ostringstream message;
            message << op << ": batch dimension " << axis << " differs (left "
                    << shape_to_string(left.shape()) << ", right " << shape_to_string(right.shape())
                    << ")";
            throw std::invalid_argument(message.str());
        }
    }
    const std::size_t m = left.shape()[rank - (transpose_left ? 1 : 2)];
    const std::size_t k_left = left.shape()[rank - (transpose_left ? 2 : 1)];
    const std::size_t k_right = right.shape()[rank - (transpose_right ? 1 : 2)];
    const std::size_t n = right.shape()[rank - (transpose_right ? 2 : 1)];
    if (k_left != k_right) {
        std::ostringstream message;
        message << op << ": inner dimensions differ (left K=" << k_left << ", right K=" << k_right
                << "; left " << shape_to_string(left.shape()) << ", right "
                << shape_to_string(right.shape()) << ")";
        throw std::invalid_argument(message.str());
    }
    Shape shape(left.shape().begin(), left.shape().end() - 2);
    shape.push_back(m);
    shape.push_back(n);
    static_cast<void>(checked_element_count(shape));
    return shape;
}

const detail::MatmulCapability& matmul_of(const detail::BackendAdapter& adapter) {
    return detail::require_capability(adapter.matmul(), adapter, op, "matmul");
}

}  // namespace

Tensor matmul(const Tensor& left, const Tensor& right, bool transpose_left, bool transpose_right) {
    const auto& adapter = detail::input_adapter(op, {{"left", &left}, {"right", &right}});
    Shape shape = product_shape(left, right, transpose_left, transpose_right);
    Tensor out = detail::allocate_uninitialized(std::move(shape), left.backend());
    matmul_of(adapter).batched_matmul(left, right, transpose_left, transpose_right, out);
    return out;
}

Tensor matmul(const Tensor& left, const Tensor& right) {
    return matmul(left, right, false, false);
}

Tensor matmul(const Tensor& left, const Tensor& right, ExecutionBackend execution_backend) {
    const auto& storage_adapter = detail::input_adapter(op, {{"left", &left}, {"right", &right}});
    Shape shape = product_shape(left, right, false, false);
    const auto& execution_adapter = detail::require_available_adapter(execution_backend, op);
    const auto& capability = matmul_of(execution_adapter);
    if (execution_backend == left.backend()) {
        Tensor out = detail::allocate_uninitialized(std::move(shape), left.backend());
        capability.batched_matmul(left, right, false, false, out);
        return out;
    }
    // Stage through the execution backend, return on the inputs' storage backend.
    static_cast<void>(storage_adapter);
    const Tensor staged_left = left.to(execution_backend);
    const Tensor staged_right = right.to(execution_backend);
    Tensor staged_out = detail::allocate_uninitialized(std::move(shape), execution_backend);
    capability.batched_matmul(staged_left, staged_right, false, false, staged_out);
    return staged_out.to(left.backend());
}

std::vector<Tensor> project_many(const Tensor& x, std::span<const Tensor> weights) {
    constexpr std::string_view many = "project_many";
    const auto& adapter = detail::input_adapter(many, {{"x", &x}});
    if (weights.empty()) {
        throw std::invalid_argument(std::string(many) + ": no weights given");
    }
    if (x.rank() != 2) {
        throw std::invalid_argument(std::string(many) + ": x must be [R,K] (got " +
                                    shape_to_string(x.shape()) + ")");
    }
    const std::size_t k = x.shape()[1];
    std::vector<const Tensor*> inputs(weights.size());
    std::vector<Tensor> outs;
    outs.reserve(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
        const Tensor& w = weights[i];
        // The checks cost no allocation on the decode path; a failure builds the name.
        if (w.is_singular() || w.backend() != x.backend() || w.rank() != 2 || w.shape()[1] != k) {
            const std::string name = "weights[" + std::to_string(i) + "]";
            // A singular or foreign weight: the shared rule names it.
            static_cast<void>(detail::input_adapter(many, {{"x", &x}, {name, &w}}));
            throw std::invalid_argument(
                std::string(many) + ": " + name + " must be [N," + std::to_string(k) + "] for x " +
                shape_to_string(x.shape()) + " (got " + shape_to_string(w.shape()) + ")");
        }
        inputs[i] = &w;
        outs.push_back(detail::allocate_uninitialized({x.shape()[0], w.shape()[0]}, x.backend()));
    }
    std::vector<Tensor*> outputs(outs.size());
    for (std::size_t i = 0; i < outs.size(); ++i)
        outputs[i] = &outs[i];
    matmul_of(adapter).project_many(x, inputs, outputs);
    return outs;
}

}  // namespace riftco_transformer::tensor_ops
