#pragma once
// Learning-rate schedules for the optimizers (an additive option of Adam:
// docs/ARCHITECTURE.md, 'Adam'). A schedule multiplies the base learning rate by a factor that
// depends on the 1-based number t of the step being taken:
//
//   Constant:      factor(t) = 1
//   WarmupCosine:  W = warmup_steps, T = total_steps, f = minimum_fraction
//     t <= W:      factor = t / W                                    (linear warmup)
//     W < t <= T:  factor = f + (1 − f)·½·(1 + cos(π·(t − W)/(T − W))) (cosine decay to f)
//     t > T:       factor = f
//   WarmupLinear:  as WarmupCosine, but the decay is a straight line:
//     W < t <= T:  factor = f + (1 − f)·(1 − (t − W)/(T − W))
//
// W = 0 gives a pure cosine (or linear) decay; f = 1 gives a linear warmup followed by a
// constant rate.

#include <cstdint>

namespace riftco_transformer {

enum class LearningRateScheduleKind : std::uint32_t {
    Constant = 0,
    WarmupCosine = 1,
    WarmupLinear = 2,
};

struct LearningRateSchedule {
    LearningRateScheduleKind kind = LearningRateScheduleKind::Constant;
    std::uint64_t warmup_steps = 0;  // WarmupCosine and WarmupLinear only
    std::uint64_t total_steps = 0;   // WarmupCosine and WarmupLinear only: > warmup_steps
    double minimum_fraction = 0.0;   // WarmupCosine and WarmupLinear only: in [0, 1]
};

// std::invalid_argument naming the field and its value when: the kind is unknown; a Constant
// schedule sets any warmup/decay field (it would be silently ignored); a WarmupCosine or
// WarmupLinear schedule has total_steps <= warmup_steps or a minimum_fraction outside [0, 1] (NaN
// included).
void validate_learning_rate_schedule(const LearningRateSchedule& schedule);

// base_learning_rate · factor(step) for the step numbered `step` (1 for the first step).
// Validates the schedule (as above); step 0 is std::invalid_argument.
[[nodiscard]] double scheduled_learning_rate(double base_learning_rate,
                                             const LearningRateSchedule& schedule,
                                             std::uint64_t step);

}  // namespace riftco_transformer
