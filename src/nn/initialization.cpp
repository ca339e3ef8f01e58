#include "riftco_transformer/nn/initialization.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace riftco_transformer {

float uniform_unit(std::mt19937& generator) {
    return static_cast<float>(generator() >> 8U) * 0x1.0p-24F;
}

Tensor uniform_tensor(const Shape& shape, float lo, float hi, std::mt19937& generator,
                      ExecutionBackend backend) {
    if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi)) {
        std::ostringstream message;
        message << "uniform_tensor: bounds must be finite with lo < hi (got lo " << lo << ", hi "
                << hi << ")";
        throw std::invalid_argument(message.str());
    }
    std::vector<float> values(checked_element_count(shape));
    const double width = static_cast<double>(hi) - static_cast<double>(lo);
    for (float& value : values) {
        const double unit = static_cast<double>(uniform_unit(generator));
        const auto drawn = static_cast<float>(static_cast<double>(lo) + width * unit);
        value = drawn < hi ? drawn : std::nextafter(hi, lo);  // rounding may reach hi
    }
    return Tensor(shape, values, backend);
}

Tensor uniform_tensor(const Shape& shape, float lo, float hi, std::mt19937& generator) {
    return uniform_tensor(shape, lo, hi, generator, current_execution_backend());
}

Tensor xavier_uniform(const Shape& shape, std::size_t fan_in, std::size_t fan_out,
                      std::mt19937& generator, ExecutionBackend backend) {
    if (fan_in == 0 || fan_out == 0) {
        std::ostringstream message;
        message << "xavier_uniform: fans must be positive (got fan_in " << fan_in << ", fan_out "
                << fan_out << ")";
        throw std::invalid_argument(message.str());
    }
    const auto limit = static_cast<float>(
        std::sqrt(6.0 / (static_cast<double>(fan_in) + static_cast<double>(fan_out))));
    return uniform_tensor(shape, -limit, limit, generator, backend);
}

}  // namespace riftco_transformer
