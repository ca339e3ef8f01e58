#include "riftco_transformer/nn/rotary_embedding.hpp"

#include <algorithm>
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
        throw std::invalid_argument(std::string(operation) +
                                    ": RoPE needs an even head width (got " +
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
    const std::vector<double> frequency = rotary_frequencies(head_width, theta, RopeScaling{});
    return rotary_tables(positions, frequency, backend);
}

const char* rope_scaling_name(RopeScalingKind kind) {
    switch (kind) {
        case RopeScalingKind::None:
            return "none";
        case RopeScalingKind::Linear:
            return "linear";
        case RopeScalingKind::Llama3:
            return "llama3";
        case RopeScalingKind::FrequencyFactors:
            return "frequency_factors";
        case RopeScalingKind::Yarn:
            return "yarn";
    }
    throw std::invalid_argument("rope_scaling: unknown kind value " +
                                std::to_string(static_cast<std::uint32_t>(kind)));
}

void require_rope_scaling(const char* operation, std::size_t head_width,
                          const RopeScaling& scaling) {
    const auto fail = [&](const std::string& what) {
        throw std::invalid_argument(std::string(operation) + ": rope_scaling." + what);
    };
    const auto positive = [&](const char* field, double value) {
        if (!std::isfinite(value) || value <= 0.0) {
            std::ostringstream what;
            what << field << " must be finite and > 0 (got " << value << ")";
            fail(what.str());
        }
    };
    (void)rope_scaling_name(scaling.kind);
    if (scaling.kind == RopeScalingKind::Linear || scaling.kind == RopeScalingKind::Llama3 ||
        scaling.kind == RopeScalingKind::Yarn)
        positive("factor", scaling.factor);
    if (scaling.kind == RopeScalingKind::Yarn) {
        positive("beta_slow", scaling.beta_slow);
        positive("beta_fast", scaling.beta_fast);
        if (scaling.beta_fast <= scaling.beta_slow) {
            std::ostringstream what;
            what << "beta_fast " << scaling.beta_fast << " must be greater than beta_slow "
                 << scaling.beta_slow;
            fail(what.str());
        }
        if (!std::isfinite(scaling.attention_factor) || scaling.attention_factor < 0.0) {
            std::ostringstream what;
            what << "attention_factor must be finite and >= 0 (0: 0.1·ln(factor) + 1; got "
                 << scaling.attention_factor << ")";
            fail(what.str());
        }
        if (scaling.original_context == 0)
            fail("original_context must be positive (got 0)");
    }
    if (scaling.kind == RopeScalingKind::Llama3) {
        positive("low_frequency_factor", scaling.low_frequency_factor);
        positive("high_frequency_factor", scaling.high_frequency_factor);
        if (scaling.high_frequency_factor <= scaling.low_frequency_factor) {
            std::ostringstream what;
            what << "high_frequency_factor " << scaling.high_frequency_factor
                 << " must be greater than low_frequency_factor " << scaling.low_frequency_factor;
            fail(what.str());
        }
        if (scaling.original_context == 0)
            fail("original_context must be positive (got 0)");
    }
    if (scaling.kind == RopeScalingKind::FrequencyFactors) {
        if (scaling.frequency_factors.size() != head_width / 2) {
            fail("frequency_factors: " + std::to_string(scaling.frequency_factors.size()) +
                 " values given, head width " + std::to_string(head_width) + " needs " +
                 std::to_string(head_width / 2));
        }
        for (std::size_t i = 0; i < scaling.frequency_factors.size(); ++i)
            positive(("frequency_factors[" + std::to_string(i) + "]").c_str(),
                     scaling.frequency_factors[i]);
    }
}

std::vector<double> rotary_frequencies(std::size_t head_width, double theta,
                                       const RopeScaling& scaling) {
    require_rotary_arguments("rotary_frequencies", head_width, theta);
    require_rope_scaling("rotary_frequencies", head_width, scaling);
    const std::size_t half = head_width / 2;
    std::vector<double> frequency(half);  // θ^(−2i/d)
    for (std::size_t i = 0; i < half; ++i) {
        frequency[i] =
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_width));
    }
    constexpr double two_pi = 6.283185307179586476925286766559;
    // YaRN's ramp bounds: the dimension at which a frequency turns `rotations` times over the
    // original context, floored (fast) and ceiled (slow), clamped to [0, d − 1].
    double ramp_low = 0.0;
    double ramp_high = 0.0;
    if (scaling.kind == RopeScalingKind::Yarn) {
        const double width = static_cast<double>(head_width);
        const double context = static_cast<double>(scaling.original_context);
        const auto correction_dimension = [&](double rotations) {
            return width * std::log(context / (rotations * two_pi)) / (2.0 * std::log(theta));
        };
        ramp_low = std::max(std::floor(correction_dimension(scaling.beta_fast)), 0.0);
        ramp_high = std::min(std::ceil(correction_dimension(scaling.beta_slow)), width - 1.0);
        if (ramp_high == ramp_low)
            ramp_high += 0.001;  // no division by zero
    }
    for (std::size_t i = 0; i < half; ++i) {
        switch (scaling.kind) {
            case RopeScalingKind::None:
                break;
            case RopeScalingKind::Linear:
                frequency[i] /= scaling.factor;
                break;
            case RopeScalingKind::Llama3: {
                const double context = static_cast<double>(scaling.original_context);
                const double wavelength = two_pi / frequency[i];
                if (wavelength > context / scaling.low_frequency_factor) {
                    frequency[i] /= scaling.factor;
                } else if (wavelength >= context / scaling.high_frequency_factor) {
                    const double smooth =
                        (context / wavelength - scaling.low_frequency_factor) /
                        (scaling.high_frequency_factor - scaling.low_frequency_factor);
                    frequency[i] =
                        (1.0 - smooth) * frequency[i] / scaling.factor + smooth * frequency[i];
                }
                break;
            }
            case RopeScalingKind::FrequencyFactors:
                frequency[i] /= static_cast<double>(scaling.frequency_factors[i]);
                break;
            case RopeScalingKind::Yarn: {
                const double ramp = std::clamp(
                    (static_cast<double>(i) - ramp_low) / (ramp_high - ramp_low), 0.0, 1.0);
                frequency[i] = frequency[i] / scaling.factor * ramp + frequency[i] * (1.0 - ramp);
                break;
            }
        }
    }
    return frequency;
}

double rotary_magnitude(const RopeScaling& scaling) {
    if (scaling.kind != RopeScalingKind::Yarn)
        return 1.0;
    if (scaling.attention_factor != 0.0)
        return scaling.attention_factor;
    return scaling.factor <= 1.0 ? 1.0 : 0.1 * std::log(scaling.factor) + 1.0;
}

RotaryTables rotary_tables(std::span<const std::size_t> positions,
                           std::span<const double> frequency, ExecutionBackend backend,
                           double magnitude) {
    if (positions.empty())
        throw std::invalid_argument("rotary_tables: no positions given");
    if (frequency.empty())
        throw std::invalid_argument("rotary_tables: no frequencies given");
    if (!std::isfinite(magnitude) || !(magnitude > 0.0)) {
        std::ostringstream message;
        message << "rotary_tables: magnitude must be finite and > 0 (got " << magnitude << ")";
        throw std::invalid_argument(message.str());
    }
    const std::size_t half = frequency.size();
    std::vector<float> cosine(positions.size() * half);
    std::vector<float> sine(positions.size() * half);
    for (std::size_t row = 0; row < positions.size(); ++row) {
        for (std::size_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(positions[row]) * frequency[i];
            cosine[row * half + i] = static_cast<float>(magnitude * std::cos(angle));
            sine[row * half + i] = static_cast<float>(magnitude * std::sin(angle));
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
    // [B,H,T,d] with T table rows, or [R,H,1,d] with R table rows, or (packed rows, each
    // batch row at its own positions) [B,H,T,d] with B·T table rows.
    const bool sequence_form = ranks_fit && table_shape[0] == shape[2];
    const bool row_form = ranks_fit && shape[2] == 1 && table_shape[0] == shape[0];
    const bool packed_form =
        ranks_fit && !sequence_form && !row_form && table_shape[0] == shape[0] * shape[2];
    if (!sequence_form && !row_form && !packed_form) {
        throw std::invalid_argument(
            std::string(op) + ": x " + shape_to_string(shape) + " does not fit tables " +
            shape_to_string(table_shape) +
            " (need x [B,H,T,d] with [T,d/2] or [B·T,d/2], or x [R,H,1,d] with [R,d/2])");
    }
    // Nothing to differentiate (decoding, evaluation): one fused pass where the backend has
    // it, with the same values as the graph below.
    if (!packed_form && (gradient_recording_disabled() || !x.requires_gradient())) {
        return Variable(tensor_ops::rotary_embedding(x.value(), tables.cosine, tables.sine,
                                                     sequence_form ? 2 : 0),
                        false);
    }
    const std::size_t half = shape[3] / 2;
    const Shape half_shape{shape[0], shape[1], shape[2], half};
    // Tables as rank 4 so broadcast_to only repeats: [1,1,T,d/2], [R,1,1,d/2] or [B,1,T,d/2].
    const Shape table_view = sequence_form ? Shape{1, 1, table_shape[0], half}
                             : row_form    ? Shape{table_shape[0], 1, 1, half}
                                           : Shape{shape[0], 1, shape[2], half};
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
