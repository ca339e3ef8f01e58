#include "riftco_transformer/programmed/neural_lowering.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/nn/initialization.hpp"

namespace riftco_transformer {
namespace {

constexpr const char* op = "LoweredMultilinearMap";

template <typename Enum>
void require_enum(Enum value, std::uint32_t count, const char* field) {
    if (static_cast<std::uint32_t>(value) >= count) {
        throw std::invalid_argument(std::string(op) + ": unknown " + field + " value " +
                                    std::to_string(static_cast<std::uint32_t>(value)));
    }
}

bool runs_arity(LoweringStrategy strategy, std::size_t arity) {
    switch (strategy) {
        case LoweringStrategy::Linear:
            return arity == 1;
        case LoweringStrategy::LinearAttention:
            return arity == 2;
        default:
            return true;  // Dense and Auto take any arity
    }
}

LoweringStrategy resolve(const NeuralLoweringConfig& config, std::size_t arity) {
    if (config.strategy == LoweringStrategy::Auto) {
        return arity == 1   ? LoweringStrategy::Linear
               : arity == 2 ? LoweringStrategy::LinearAttention
                            : LoweringStrategy::Dense;
    }
    if (runs_arity(config.strategy, arity)) {
        return config.strategy;
    }
    if (config.unsupported == UnsupportedLoweringPolicy::DenseFallback) {
        return LoweringStrategy::Dense;
    }
    throw std::invalid_argument(std::string(op) + ": strategy " +
                                lowering_strategy_name(config.strategy) +
                                " cannot lower a map of arity " + std::to_string(arity) +
                                " (linear takes 1 input, linear_attention 2; use dense, auto or "
                                "the dense fallback policy)");
}

// Rows of `x` ([R, d]) as a [R, d, 1] column batch.
Variable columns(const Variable& x) {
    return reshape(x, {x.shape()[0], x.shape()[1], 1});
}

}  // namespace

const char* lowering_strategy_name(LoweringStrategy strategy) {
    switch (strategy) {
        case LoweringStrategy::Auto:
            return "auto";
        case LoweringStrategy::Dense:
            return "dense";
        case LoweringStrategy::Linear:
            return "linear";
        case LoweringStrategy::LinearAttention:
            return "linear_attention";
    }
    throw std::invalid_argument("lowering_strategy_name: unknown strategy value " +
                                std::to_string(static_cast<std::uint32_t>(strategy)));
}

LoweredMultilinearMap::LoweredMultilinearMap(const MultilinearMap& map,
                                             const NeuralLoweringConfig& config,
                                             ExecutionBackend backend)
    : output_dimension_(map.output_dimension()),
      input_dimensions_(map.input_dimensions()),
      strategy_(LoweringStrategy::Dense) {
    require_enum(config.strategy, 4, "strategy");
    require_enum(config.unsupported, 2, "unsupported policy");
    require_enum(config.precision, 2, "precision");
    require_enum(config.initialization, 2, "initialization");
    if (config.max_coefficient_elements == 0) {
        throw std::invalid_argument(std::string(op) + ": max_coefficient_elements must be > 0");
    }
    if (map.element_count() > config.max_coefficient_elements) {
        throw std::overflow_error(std::string(op) + ": the map's " +
                                  std::to_string(map.element_count()) +
                                  " coefficients exceed max_coefficient_elements " +
                                  std::to_string(config.max_coefficient_elements));
    }
    strategy_ = resolve(config, map.arity());
    if (config.attention_query_axis.has_value()) {
        if (strategy_ != LoweringStrategy::LinearAttention) {
            throw std::invalid_argument(std::string(op) +
                                        ": attention_query_axis is set but the "
                                        "strategy is " +
                                        lowering_strategy_name(strategy_));
        }
        if (*config.attention_query_axis != 1 && *config.attention_query_axis != 2) {
            throw std::invalid_argument(std::string(op) +
                                        ": attention_query_axis must be 1 or 2 "
                                        "(got " +
                                        std::to_string(*config.attention_query_axis) + ")");
        }
        query_axis_ = *config.attention_query_axis;
    }
    Shape shape{output_dimension_};
    shape.insert(shape.end(), input_dimensions_.begin(), input_dimensions_.end());
    Tensor values;
    if (config.initialization == CoefficientInitialization::Compiled) {
        std::vector<float> narrowed(map.element_count());
        const std::span<const double> exact = map.values();
        for (std::size_t i = 0; i < exact.size(); ++i) {
            const auto value = static_cast<float>(exact[i]);
            const double error = std::fabs(static_cast<double>(value) - exact[i]);
            if (!std::isfinite(value) ||
                (config.precision == CoefficientPrecision::ExactFloat32 && error != 0.0)) {
                std::ostringstream message;
                message.precision(17);
                message << op << ": coefficient " << i << " = " << exact[i]
                        << (std::isfinite(value) ? " is not exactly a float32 (use rounded "
                                                   "precision to accept it)"
                                                 : " is beyond the float32 range");
                throw std::invalid_argument(message.str());
            }
            max_rounding_error_ = std::max(max_rounding_error_, error);
            narrowed[i] = value;
        }
        values = Tensor(shape, narrowed, backend);
    } else {
        if (!std::isfinite(config.random_scale) || !(config.random_scale > 0.0F)) {
            std::ostringstream message;
            message << op << ": random_scale must be finite and > 0 (got " << config.random_scale
                    << ")";
            throw std::invalid_argument(message.str());
        }
        std::mt19937 generator(config.random_seed);
        values =
            uniform_tensor(shape, -config.random_scale, config.random_scale, generator, backend);
    }
    if (config.trainable) {
        coefficients_ = register_parameter("coefficients", std::move(values));
    } else {
        coefficients_ = Variable(std::move(values), false);
    }
}

void LoweredMultilinearMap::prepare_transfer(ExecutionBackend backend,
                                             std::vector<std::function<void()>>& commits) {
    if (!coefficients_.requires_gradient() && coefficients_.backend() != backend) {
        Tensor moved = coefficients_.value().to(backend);
        commits.emplace_back(
            [this, moved]() mutable { coefficients_.replace_value(std::move(moved)); });
    }
}

Variable LoweredMultilinearMap::forward(std::span<const Variable> inputs,
                                        const Shape& leading) const {
    const std::size_t arity = input_dimensions_.size();
    if (inputs.size() != arity) {
        throw std::invalid_argument(std::string(op) +
                                    "::forward: " + std::to_string(inputs.size()) +
                                    " inputs for a map of arity " + std::to_string(arity));
    }
    if (leading.empty()) {
        throw std::invalid_argument(std::string(op) + "::forward: the leading shape is empty");
    }
    std::size_t rows = 1;
    for (std::size_t extent : leading)
        rows *= extent;
    for (std::size_t i = 0; i < arity; ++i) {
        Shape expected = leading;
        expected.push_back(input_dimensions_[i]);
        if (!inputs[i].defined() || inputs[i].shape() != expected) {
            throw std::invalid_argument(
                std::string(op) + "::forward: input " + std::to_string(i) + " is " +
                (inputs[i].defined() ? shape_to_string(inputs[i].shape()) : "(empty)") +
                ", expected " + shape_to_string(expected));
        }
    }
    Shape output_shape = leading;
    output_shape.push_back(output_dimension_);
    if (arity == 0) {
        return broadcast_to(coefficients_, output_shape);
    }
    std::vector<Variable> flat;  // [R, d_i]
    for (std::size_t i = 0; i < arity; ++i)
        flat.push_back(reshape(inputs[i], {rows, input_dimensions_[i]}));
    const std::size_t out = output_dimension_;
    Variable y;
    switch (strategy_) {
        case LoweringStrategy::Linear:
            y = linear(flat[0], coefficients_, Variable());  // x·Tᵀ
            break;
        case LoweringStrategy::LinearAttention: {
            // The query contracts T's axis query_axis_; the other ("key") input builds A first.
            const std::size_t d1 = input_dimensions_[0];
            const std::size_t d2 = input_dimensions_[1];
            Variable attention;  // A [R, out, d_query]
            if (query_axis_ == 1) {
                // A[r,o,i] = Σ_j T[o,i,j]·x2[r,j]
                attention =
                    reshape(linear(flat[1], reshape(coefficients_, {out * d1, d2}), Variable()),
                            {rows, out, d1});
                y = matmul(attention, columns(flat[0]));
            } else {
                // A[r,o,j] = Σ_i T[o,i,j]·x1[r,i]
                const Variable by_key = reshape(permute(coefficients_, {0, 2, 1}), {out * d2, d1});
                attention = reshape(linear(flat[0], by_key, Variable()), {rows, out, d2});
                y = matmul(attention, columns(flat[1]));
            }
            break;
        }
        case LoweringStrategy::Dense:
        case LoweringStrategy::Auto: {
            // Contract the last input into T, then each earlier one in turn.
            std::size_t remaining = out;  // O·d_1·…·d_{k-1}
            for (std::size_t i = 0; i + 1 < arity; ++i)
                remaining *= input_dimensions_[i];
            y = linear(flat[arity - 1],
                       reshape(coefficients_, {remaining, input_dimensions_.back()}),
                       Variable());  // [R, O·d_1·…·d_{k-1}]
            for (std::size_t i = arity - 1; i-- > 0;) {
                remaining /= input_dimensions_[i];
                y = matmul(reshape(y, {rows, remaining, input_dimensions_[i]}), columns(flat[i]));
            }
            break;
        }
    }
    return reshape(y, output_shape);
}

}  // namespace riftco_transformer
