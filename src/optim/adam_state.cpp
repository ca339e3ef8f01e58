// Adam state capture and restore for exact resume (docs/ARCHITECTURE.md, 'Adam'). The state
// is logical: flat floats in parameter-list order, so it moves between layouts and backends.

#include <cfloat>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optim/number_text.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace riftco_transformer {
namespace {

constexpr double beta_power_tolerance = 1e-12;  // relative (docs/ARCHITECTURE.md, 'Adam')

// A stored β^t must be what t steps produce (docs/ARCHITECTURE.md, 'Adam'): in [0, 1];
// exactly 1 iff t = 0; otherwise within a relative 1e-12 of β^t, or anything <= DBL_MIN once
// β^t is that small (where the relative comparison is meaningless).
void check_beta_power(const char* name, double beta, std::uint64_t step, double power) {
    const auto reject = [&](const std::string& problem) {
        throw std::invalid_argument("Adam::load_state: " + std::string(name) + " " +
                                    detail::number_text(power) + " " + problem);
    };
    if (!(power >= 0.0 && power <= 1.0)) {
        reject("lies outside [0, 1]");
    }
    if (step == 0) {
        if (power != 1.0) {
            reject("must be exactly 1 at step count 0");
        }
        return;
    }
    if (power == 1.0) {
        reject("is 1 but the step count is " + std::to_string(step));
    }
    const double expected = std::pow(beta, static_cast<double>(step));
    if (expected < DBL_MIN && power <= DBL_MIN) {
        return;
    }
    if (!(std::fabs(power - expected) <= beta_power_tolerance * expected)) {
        reject("does not match beta^" + std::to_string(step) + " = " +
               detail::number_text(expected) + " (relative tolerance 1e-12)");
    }
}

void check_values(const char* name, std::span<const float> values, std::size_t expected_count,
                  bool non_negative) {
    if (values.size() != expected_count) {
        throw std::invalid_argument("Adam::load_state: " + std::string(name) + " holds " +
                                    std::to_string(values.size()) + " values, the optimizer " +
                                    std::to_string(expected_count));
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (!std::isfinite(values[i]) || (non_negative && values[i] < 0.0F)) {
            throw std::invalid_argument(
                "Adam::load_state: " + std::string(name) + " element " + std::to_string(i) + " = " +
                detail::number_text(values[i]) +
                (non_negative ? " (must be finite and >= 0)" : " (must be finite)"));
        }
    }
}

}  // namespace

void Adam::require_clean_boundary(const char* operation) const {
    for (const NamedParameter& entry : parameters_) {
        if (!leaf_view(entry.parameter, operation).gradient.is_singular()) {
            throw std::logic_error(std::string(operation) + ": parameter '" + entry.name +
                                   "' holds a gradient that no step consumed; step() or "
                                   "zero_gradients() first");
        }
    }
}

AdamState Adam::state() const {
    constexpr const char* operation = "Adam::state";
    check_parameters(operation);
    require_clean_boundary(operation);
    require_finite_values(operation);
    AdamState state;
    state.step_count = step_count_;
    state.beta1_power = beta1_power_;
    state.beta2_power = beta2_power_;
    state.parameter_values.resize(value_count_);
    state.first_moments.resize(value_count_);
    state.second_moments.resize(value_count_);
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const Tensor& value = leaf_view(parameters_[i].parameter, operation).value;
        value.copy_to_host(
            std::span<float>(state.parameter_values).subspan(parameter_offsets_[i], value.numel()));
    }
    for (const MomentPage& page : pages_) {
        const std::size_t first = parameter_offsets_[page.parameter] + page.offset;
        const std::size_t count = page.first_moment.numel();
        page.first_moment.copy_to_host(std::span<float>(state.first_moments).subspan(first, count));
        page.second_moment.copy_to_host(
            std::span<float>(state.second_moments).subspan(first, count));
    }
    return state;
}

void Adam::load_state(const AdamState& state) {
    constexpr const char* operation = "Adam::load_state";
    check_parameters(operation);
    require_clean_boundary(operation);
    check_values("parameter_values", state.parameter_values, value_count_, false);
    check_values("first_moments", state.first_moments, value_count_, false);
    check_values("second_moments", state.second_moments, value_count_, true);
    check_beta_power("beta1_power", options_.beta1, state.step_count, state.beta1_power);
    check_beta_power("beta2_power", options_.beta2, state.step_count, state.beta2_power);

    // Stage: every value and moment is uploaded whole into a fresh tensor (the only step that
    // can still fail, so a failure changes nothing); nothing is written at an offset of a live
    // buffer. Commit: the fresh tensors replace the live ones (moves, which cannot fail).
    std::vector<Tensor> values;
    values.reserve(parameters_.size());
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const Tensor& value = leaf_view(parameters_[i].parameter, operation).value;
        values.emplace_back(value.shape(),
                            std::span<const float>(state.parameter_values)
                                .subspan(parameter_offsets_[i], value.numel()),
                            backend_);
    }
    std::vector<std::pair<Tensor, Tensor>> moments;
    moments.reserve(pages_.size());
    for (const MomentPage& page : pages_) {
        const std::size_t first = parameter_offsets_[page.parameter] + page.offset;
        const std::size_t count = page.first_moment.numel();
        moments.emplace_back(
            Tensor({count}, std::span<const float>(state.first_moments).subspan(first, count),
                   backend_),
            Tensor({count}, std::span<const float>(state.second_moments).subspan(first, count),
                   backend_));
    }
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        leaf_view(parameters_[i].parameter, operation).value = std::move(values[i]);
    }
    for (std::size_t p = 0; p < pages_.size(); ++p) {
        pages_[p].first_moment = std::move(moments[p].first);
        pages_[p].second_moment = std::move(moments[p].second);
    }
    for (NamedParameter& entry : parameters_) {
        mark_leaf_updated(entry.parameter);
    }
    step_count_ = state.step_count;
    beta1_power_ = state.beta1_power;
    beta2_power_ = state.beta2_power;
}

}  // namespace riftco_transformer
