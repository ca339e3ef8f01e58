#include <limits>
#include <sstream>
#include <stdexcept>

#include "core/tensor/shape.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

std::size_t checked_element_count(std::span<const std::size_t> shape) {
    constexpr std::size_t max_elements = std::numeric_limits<std::size_t>::max() / sizeof(float);
    std::size_t count = 1;
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
        const std::size_t dimension = shape[axis];
        if (dimension == 0) {
            throw std::invalid_argument("tensor shape " + shape_to_string(shape) + ": dimension " +
                                        std::to_string(axis) + " is zero");
        }
        if (count > max_elements / dimension) {
            throw std::overflow_error("tensor shape " + shape_to_string(shape) +
                                      ": element count overflows");
        }
        count *= dimension;
    }
    return count;
}

std::vector<std::size_t> detail::row_major_strides(std::span<const std::size_t> shape) {
    std::vector<std::size_t> strides(shape.size());
    std::size_t stride = 1;
    for (std::size_t axis = shape.size(); axis-- > 0;) {
        strides[axis] = stride;
        stride *= shape[axis];
    }
    return strides;
}

std::string shape_to_string(std::span<const std::size_t> shape) {
    std::ostringstream text;
    text << '[';
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
        if (axis != 0) {
            text << ',';
        }
        text << shape[axis];
    }
    text << ']';
    return text.str();
}

}  // namespace riftco_transformer
