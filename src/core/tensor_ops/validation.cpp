#include "core/tensor_ops/validation.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace riftco_transformer::detail {

void require_tensor(std::string_view operation, std::string_view argument, const Tensor& tensor) {
    if (tensor.is_singular()) {
        std::ostringstream message;
        message << operation << ": " << argument
                << " is a singular tensor (default-constructed or moved-from)";
        throw std::logic_error(message.str());
    }
}

void require_indices(std::string_view operation, std::string_view argument,
                     const IndexTensor& indices, ExecutionBackend backend, std::size_t bound,
                     std::string_view what) {
    if (indices.is_singular()) {
        std::ostringstream message;
        message << operation << ": " << argument
                << " is a singular index tensor (default-constructed or moved-from)";
        throw std::logic_error(message.str());
    }
    if (indices.backend() != backend) {
        std::ostringstream message;
        message << operation << ": " << argument << " are on "
                << execution_backend_name(indices.backend()) << ", the data on "
                << execution_backend_name(backend);
        throw std::invalid_argument(message.str());
    }
    if (indices.numel() > 0 && indices.max_id() >= bound) {
        std::ostringstream message;
        message << operation << ": " << argument << "[" << indices.max_id_position()
                << "] = " << indices.max_id() << " is out of range for " << bound << " " << what;
        throw std::out_of_range(message.str());
    }
}

std::string describe(const Tensor& tensor) {
    if (tensor.is_singular()) {
        return "singular tensor";
    }
    return "shape " + shape_to_string(tensor.shape()) + " on " +
           std::string(execution_backend_name(tensor.backend()));
}

const BackendAdapter& input_adapter(std::string_view operation,
                                    std::initializer_list<NamedTensor> inputs) {
    const NamedTensor* first = nullptr;
    for (const NamedTensor& input : inputs) {
        require_tensor(operation, input.first, *input.second);
        if (first == nullptr) {
            first = &input;
        } else if (input.second->backend() != first->second->backend()) {
            std::ostringstream message;
            message << operation << ": inputs are on different backends (" << first->first << " on "
                    << execution_backend_name(first->second->backend()) << ", " << input.first
                    << " on " << execution_backend_name(input.second->backend()) << ")";
            throw std::invalid_argument(message.str());
        }
    }
    return require_available_adapter(first->second->backend(), operation);
}

void require_same_shape(std::string_view operation, NamedTensor left, NamedTensor right) {
    if (left.second->shape() != right.second->shape()) {
        std::ostringstream message;
        message << operation << ": shapes differ (" << left.first << ' '
                << shape_to_string(left.second->shape()) << ", " << right.first << ' '
                << shape_to_string(right.second->shape()) << ")";
        throw std::invalid_argument(message.str());
    }
}

void require_axis(std::string_view operation, std::size_t axis, std::size_t rank) {
    if (axis >= rank) {
        std::ostringstream message;
        message << operation << ": axis " << axis << " is out of range for rank " << rank;
        throw std::out_of_range(message.str());
    }
}

void require_rank(std::string_view operation, NamedTensor tensor, std::size_t rank) {
    if (tensor.second->rank() != rank) {
        std::ostringstream message;
        message << operation << ": " << tensor.first << " must have rank " << rank << " (got "
                << shape_to_string(tensor.second->shape()) << ")";
        throw std::invalid_argument(message.str());
    }
}

void require_minimum_rank(std::string_view operation, NamedTensor tensor, std::size_t rank) {
    if (tensor.second->rank() < rank) {
        std::ostringstream message;
        message << operation << ": " << tensor.first << " must have rank >= " << rank << " (got "
                << shape_to_string(tensor.second->shape()) << ")";
        throw std::invalid_argument(message.str());
    }
}

void require_finite(std::string_view operation, std::string_view argument, float value) {
    if (!std::isfinite(value)) {
        std::ostringstream message;
        message << operation << ": " << argument << " must be finite (got " << value << ")";
        throw std::invalid_argument(message.str());
    }
}

void require_finite_positive(std::string_view operation, std::string_view argument, float value) {
    if (!std::isfinite(value) || !(value > 0.0F)) {
        std::ostringstream message;
        message << operation << ": " << argument << " must be finite and > 0 (got " << value << ")";
        throw std::invalid_argument(message.str());
    }
}

void require_softcap(std::string_view operation, std::string_view argument, float value) {
    if (!std::isfinite(value) || value < 0.0F) {
        std::ostringstream message;
        message << operation << ": " << argument << " must be finite and >= 0 (0: no soft cap; got "
                << value << ")";
        throw std::invalid_argument(message.str());
    }
}

}  // namespace riftco_transformer::detail
