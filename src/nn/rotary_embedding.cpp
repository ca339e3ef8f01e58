#include "riftco_transformer/nn/rotary_embedding.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

namespace riftco_transformer {

void require_rotary_arguments(const char* operation, std::size_t head_width, double theta) {
    if (head_width == 0 || head_width % 2 != 0) {
        throw std::invalid_argument(std::string(operation) + ": RoPE needs an even head width (got " +
                                    std::to_string(head_width) + ")");
    }
    if (!std::isfinite(theta) || theta <= 0.0) {
        std::ostringstream message;
        message << operation << ": rope_theta must be finite and > 0 (got " << theta << ")";
        throw std::invalid_argument(message.str());
    }
}

RotaryTables rotary_tables(std::span<const std::size_t> positions, std::size_t head_width,
                           double theta, ExecutionBackend backend) {
    require_rotary_arguments("rotary_tables", head_width, theta);
    if (positions.empty())
        throw std::invalid_argument("rotary_tables: no positions given");
    const std::size_t half = head_width / 2;
    std::vector<double> frequency(half);  // θ^(−2i/d)
    for (std::size_t i = 0; i < half; ++i) {
        frequency[i] =
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_width));
    }
    std::vector<float> cosine(positions.size() * half);
    std::vector<float> sine(positions.size() * half);
    for (std::size_t row = 0; row < positions.size(); ++row) {
        for (std::size_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(positions[row]) * frequency[i];
            cosine[row * half + i] = static_cast<float>(std::cos(angle));
            sine[row * half + i] = static_cast<float>(std::sin(angle));
        }
    }
    const Shape shape{positions.size(), half};
    return {Tensor(shape, cosine, backend), Tensor(shape, sine, backend)};
}

Variable apply_rotary_embedding(const Variable& x, const RotaryTables& tables) {
    constexpr const char* op = "apply_rotary_embedding";
    if (!x.defined())
        throw std::invalid_argument(std::string(op) + ": x is an empty Variable");
    const Shape& shape = x.shape();
    const Shape& table_shape = tables.cosine.shape();
    const bool ranks_fit = shape.size() == 4 && table_shape.size() == 2 &&
                           tables.sine.shape() == table_shape && shape[3] % 2 == 0 &&
                           table_shape[1] * 2 == shape[3];
    // [B,H,T,d] with T table rows, or [R,H,1,d] with R table rows.
    const bool sequence_form = ranks_fit && table_shape[0] == shape[2];
    const bool row_form = ranks_fit && shape[2] == 1 && table_shape[0] == shape[0];
    if (!sequence_form && !row_form) {
        throw std::invalid_argument(std::string(op) + ": x " + shape_to_string(shape) +
                                    " does not fit tables " + shape_to_string(table_shape) +
                                    " (need x [B,H,T,d] with [T,d/2] or x [R,H,1,d] with [R,d/2])");
    }
    // Nothing to differentiate (decoding, evaluation): one fused pass where the backend has
    // it, with the same values as the graph below.
    if (gradient_recording_disabled() || !x.requires_gradient()) {
        return Variable(tensor_ops::rotary_embedding(x.value(), tables.cosine, tables.sine,
                                                     sequence_form ? 2 : 0),
                        false);
    }
    const std::size_t half = shape[3] / 2;
    const Shape half_shape{shape[0], shape[1], shape[2], half};
    // Tables as rank 4 so broadcast_to only repeats: [1,1,T,d/2] or [R,1,1,d/2].
    const Shape table_view = sequence_form ? Shape{1, 1, table_shape[0], half}
                                           : Shape{table_shape[0], 1, 1, half};
    const auto expand = [&](const Tensor& table) {
        return broadcast_to(reshape(Variable(table, false), table_view), half_shape);
    };
    const Variable cosine = expand(tables.cosine);
    const Variable sine = expand(tables.sine);
    const Variable first = slice(x, 3, 0, half);      // x_i
    const Variable second = slice(x, 3, half, half);  // x_{i+d/2}
    return concatenate_last_axis(first * cosine - second * sine, second * cosine + first * sine);
}

}  // namespace riftco_transformer
