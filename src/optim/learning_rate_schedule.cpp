#include "riftco_transformer/optim/learning_rate_schedule.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "optim/number_text.hpp"

namespace riftco_transformer {

void validate_learning_rate_schedule(const LearningRateSchedule& schedule) {
    switch (schedule.kind) {
        case LearningRateScheduleKind::Constant:
            if (schedule.warmup_steps != 0 || schedule.total_steps != 0 ||
                schedule.minimum_fraction != 0.0) {
                throw std::invalid_argument(
                    "learning-rate schedule: a Constant schedule uses no warmup_steps, "
                    "total_steps or minimum_fraction (got " +
                    std::to_string(schedule.warmup_steps) + ", " +
                    std::to_string(schedule.total_steps) + ", " +
                    detail::number_text(schedule.minimum_fraction) +
                    "); use WarmupCosine or WarmupLinear");
            }
            return;
        case LearningRateScheduleKind::WarmupCosine:
        case LearningRateScheduleKind::WarmupLinear:
            if (schedule.total_steps <= schedule.warmup_steps) {
                throw std::invalid_argument(
                    "learning-rate schedule: total_steps (" + std::to_string(schedule.total_steps) +
                    ") must exceed warmup_steps (" + std::to_string(schedule.warmup_steps) + ")");
            }
            if (!(schedule.minimum_fraction >= 0.0 && schedule.minimum_fraction <= 1.0)) {
                throw std::invalid_argument("learning-rate schedule: minimum_fraction (" +
                                            detail::number_text(schedule.minimum_fraction) +
                                            ") must lie in [0, 1]");
            }
            return;
    }
    throw std::invalid_argument("learning-rate schedule: unknown kind value " +
                                std::to_string(static_cast<std::uint32_t>(schedule.kind)));
}

double scheduled_learning_rate(double base_learning_rate, const LearningRateSchedule& schedule,
                               std::uint64_t step) {
    validate_learning_rate_schedule(schedule);
    if (step == 0) {
        throw std::invalid_argument(
            "scheduled_learning_rate: steps are numbered from 1 (got step 0)");
    }
    if (schedule.kind == LearningRateScheduleKind::Constant) {
        return base_learning_rate;
    }
    const auto t = static_cast<double>(step);
    const auto warmup = static_cast<double>(schedule.warmup_steps);
    const auto total = static_cast<double>(schedule.total_steps);
    const double floor = schedule.minimum_fraction;
    if (step <= schedule.warmup_steps) {
        return base_learning_rate * (t / warmup);
    }
    if (step > schedule.total_steps) {
        return base_learning_rate * floor;
    }
    const double progress = (t - warmup) / (total - warmup);
    if (schedule.kind == LearningRateScheduleKind::WarmupLinear) {
        return base_learning_rate * (floor + (1.0 - floor) * (1.0 - progress));
    }
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return base_learning_rate * (floor + (1.0 - floor) * cosine);
}

}  // namespace riftco_transformer
