// Adam (docs/ARCHITECTURE.md, 'Adam', with AdamW and schedules): options and their validation,
// schedules, construction rules, a hand-computed two-step example, global clipping, the
// overflow-safe global norm, the transactional step (every failure leaves values, moments,
// gradients, versions, step count and beta powers bit-identical), versions and stale graphs,
// contiguous vs paged moments, state capture and restore, and the in-place memory budget.
// Expected values are hand-computed or come from the independent double formulas in
// ReferenceAdam below, never from the optimizer itself.
#include <gtest/gtest.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/node.hpp"
#include "optim/moment_layout.hpp"
#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr double infinity = std::numeric_limits<double>::infinity();
constexpr double quiet_nan = std::numeric_limits<double>::quiet_NaN();
constexpr float float_nan = std::numeric_limits<float>::quiet_NaN();
constexpr float float_infinity = std::numeric_limits<float>::infinity();

Variable leaf(std::vector<float> values) {
    const std::size_t count = values.size();
    return Variable(Tensor({count}, std::span<const float>(values)));
}

Variable leaf(Shape shape, std::uint32_t seed, float lo = -1.0F, float hi = 1.0F) {
    const std::vector<float> values =
        testing::pseudo_random(checked_element_count(shape), lo, hi, seed);
    return Variable(Tensor(std::move(shape), std::span<const float>(values)));
}

// Publishes `values` as the gradient of `parameter` through a real backward pass:
// d/dp Σ(p ⊙ c) = c exactly.
void set_gradient(const Variable& parameter, const std::vector<float>& values) {
    const Variable constant(
        Tensor(parameter.shape(), std::span<const float>(values), parameter.backend()), false);
    Variable loss = sum(parameter * constant);
    loss.backward();
}

void set_random_gradient(const Variable& parameter, std::uint32_t seed, float lo = -1.0F,
                         float hi = 1.0F) {
    set_gradient(parameter, testing::pseudo_random(parameter.value().numel(), lo, hi, seed));
}

// Everything a caller can see of the optimizer and its parameters except the moments (those
// are read through state(), which needs a clean step boundary).
struct ParameterSnapshot {
    std::vector<float> value;
    bool has_gradient = false;
    std::vector<float> gradient;
    std::uint64_t version = 0;
};

struct OptimizerSnapshot {
    std::vector<ParameterSnapshot> parameters;
    std::uint64_t step_count = 0;
    double beta1_power = 0.0;
    double beta2_power = 0.0;
};

OptimizerSnapshot snapshot(const Adam& adam) {
    OptimizerSnapshot result{{}, adam.step_count(), adam.beta1_power(), adam.beta2_power()};
    for (const NamedParameter& entry : adam.parameters()) {
        const Variable& p = entry.parameter;
        const bool has = p.requires_gradient() && p.has_gradient();
        result.parameters.push_back({p.value().to_host(), has,
                                     has ? p.gradient().to_host() : std::vector<float>{},
                                     p.version()});
    }
    return result;
}

::testing::AssertionResult unchanged(const OptimizerSnapshot& before, const Adam& adam) {
    const OptimizerSnapshot now = snapshot(adam);
    if (now.step_count != before.step_count || now.beta1_power != before.beta1_power ||
        now.beta2_power != before.beta2_power) {
        return ::testing::AssertionFailure() << "step count or beta powers changed";
    }
    for (std::size_t i = 0; i < now.parameters.size(); ++i) {
        const ParameterSnapshot& a = before.parameters[i];
        const ParameterSnapshot& b = now.parameters[i];
        if (a.version != b.version) {
            return ::testing::AssertionFailure() << "parameter " << i << " version changed";
        }
        if (a.has_gradient != b.has_gradient) {
            return ::testing::AssertionFailure() << "parameter " << i << " gradient presence";
        }
        if (auto same = testing::bit_identical(a.value, b.value); !same) {
            return same << " (value of parameter " << i << ")";
        }
        if (auto same = testing::bit_identical(a.gradient, b.gradient); !same) {
            return same << " (gradient of parameter " << i << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_state(const AdamState& a, const AdamState& b) {
    if (a.step_count != b.step_count || a.beta1_power != b.beta1_power ||
        a.beta2_power != b.beta2_power) {
        return ::testing::AssertionFailure() << "step count or beta powers differ";
    }
    if (auto same = testing::bit_identical(a.parameter_values, b.parameter_values); !same) {
        return same << " (parameter values)";
    }
    if (auto same = testing::bit_identical(a.first_moments, b.first_moments); !same) {
        return same << " (first moments)";
    }
    if (auto same = testing::bit_identical(a.second_moments, b.second_moments); !same) {
        return same << " (second moments)";
    }
    return ::testing::AssertionSuccess();
}

// After a failed call that left gradients pending: the moments (read once the gradients are
// cleared) equal those of `before`, a state captured at the last clean boundary.
::testing::AssertionResult moments_unchanged(Adam& adam, const AdamState& before) {
    adam.zero_gradients();
    return same_state(adam.state(), before);
}

// An independent double-precision Adam (the formulas of docs/ARCHITECTURE.md, 'Adam', again):
// host vectors, narrowed to float after every step like the engine's FP32 storage.
struct ReferenceAdam {
    double learning_rate = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-8;
    double maximum_norm = 1.0;
    double weight_decay = 0.0;
    std::vector<float> theta;
    std::vector<float> m;
    std::vector<float> v;
    int t = 0;

    explicit ReferenceAdam(std::vector<float> initial)
        : theta(std::move(initial)), m(theta.size(), 0.0F), v(theta.size(), 0.0F) {}

    void step(const std::vector<float>& gradient, double rate) {
        ++t;
        double squares = 0.0;
        for (const float g : gradient) {
            squares += static_cast<double>(g) * g;
        }
        const double norm = std::sqrt(squares);
        const double s = norm > maximum_norm ? maximum_norm / norm : 1.0;
        const double c1 = 1.0 - std::pow(beta1, t);
        const double c2 = 1.0 - std::pow(beta2, t);
        for (std::size_t i = 0; i < theta.size(); ++i) {
            const double g = s * gradient[i];
            const double m_next = beta1 * m[i] + (1.0 - beta1) * g;
            const double v_next = beta2 * v[i] + (1.0 - beta2) * g * g;
            const double m_hat = m_next / c1;
            const double v_hat = v_next / c2;
            const double decayed = theta[i] - rate * weight_decay * theta[i];
            theta[i] = static_cast<float>(decayed - rate * m_hat / (std::sqrt(v_hat) + epsilon));
            m[i] = static_cast<float>(m_next);
            v[i] = static_cast<float>(v_next);
        }
    }
    void step(const std::vector<float>& gradient) { step(gradient, learning_rate); }
};

std::vector<float> concatenated(const std::vector<Variable>& parameters) {
    std::vector<float> all;
    for (const Variable& p : parameters) {
        const std::vector<float> values = p.value().to_host();
        all.insert(all.end(), values.begin(), values.end());
    }
    return all;
}

// ---------------------------------------------------------------------------------------------
// Options

TEST(AdamOptions, DefaultsArePlainAdamAtTheSpecValues) {
    const AdamOptions options;
    EXPECT_EQ(options.learning_rate, 1e-3);
    EXPECT_EQ(options.beta1, 0.9);
    EXPECT_EQ(options.beta2, 0.999);
    EXPECT_EQ(options.epsilon, 1e-8);
    EXPECT_EQ(options.maximum_gradient_norm, 1.0);
    EXPECT_EQ(options.state_storage, AdamStateStorage::Contiguous);
    EXPECT_EQ(options.page_size, 4096U);
    EXPECT_EQ(options.weight_decay, 0.0);
    EXPECT_EQ(options.schedule.kind, LearningRateScheduleKind::Constant);
    EXPECT_EQ(options.schedule.warmup_steps, 0U);
    EXPECT_EQ(options.schedule.total_steps, 0U);
    EXPECT_EQ(options.schedule.minimum_fraction, 0.0);
    EXPECT_NO_THROW(validate_adam_options(options));

    const Variable w = leaf({1.0F, 2.0F});
    const Adam adam({{"w", w}});
    EXPECT_EQ(adam.options().learning_rate, 1e-3);
    EXPECT_EQ(adam.state_storage_kind(), AdamStateStorage::Contiguous);
    EXPECT_EQ(adam.state_page_size(), 4096U);
    EXPECT_EQ(adam.learning_rate(), 1e-3);
}

TEST(AdamOptions, RejectsEveryInvalidOptionWithInvalidArgumentNamingIt) {
    struct Case {
        const char* option;
        std::function<void(AdamOptions&)> change;
    };
    const std::vector<Case> cases = {
        {"learning_rate", [](AdamOptions& o) { o.learning_rate = 0.0; }},
        {"learning_rate", [](AdamOptions& o) { o.learning_rate = -1e-3; }},
        {"learning_rate", [](AdamOptions& o) { o.learning_rate = infinity; }},
        {"learning_rate", [](AdamOptions& o) { o.learning_rate = quiet_nan; }},
        {"beta1", [](AdamOptions& o) { o.beta1 = 0.0; }},
        {"beta1", [](AdamOptions& o) { o.beta1 = 1.0; }},
        {"beta1", [](AdamOptions& o) { o.beta1 = -0.5; }},
        {"beta1", [](AdamOptions& o) { o.beta1 = quiet_nan; }},
        {"beta2", [](AdamOptions& o) { o.beta2 = 0.0; }},
        {"beta2", [](AdamOptions& o) { o.beta2 = 1.0; }},
        {"beta2", [](AdamOptions& o) { o.beta2 = 1.5; }},
        {"beta2", [](AdamOptions& o) { o.beta2 = quiet_nan; }},
        {"epsilon", [](AdamOptions& o) { o.epsilon = 0.0; }},
        {"epsilon", [](AdamOptions& o) { o.epsilon = -1e-8; }},
        {"epsilon", [](AdamOptions& o) { o.epsilon = infinity; }},
        {"epsilon", [](AdamOptions& o) { o.epsilon = quiet_nan; }},
        {"maximum_gradient_norm", [](AdamOptions& o) { o.maximum_gradient_norm = 0.0; }},
        {"maximum_gradient_norm", [](AdamOptions& o) { o.maximum_gradient_norm = -1.0; }},
        {"maximum_gradient_norm", [](AdamOptions& o) { o.maximum_gradient_norm = quiet_nan; }},
        {"state_storage",
         [](AdamOptions& o) { o.state_storage = static_cast<AdamStateStorage>(7); }},
        {"page_size", [](AdamOptions& o) { o.page_size = 0; }},
        {"page_size",
         [](AdamOptions& o) {
             o.state_storage = AdamStateStorage::Paged;
             o.page_size = 0;
         }},
        {"weight_decay", [](AdamOptions& o) { o.weight_decay = -0.01; }},
        {"weight_decay", [](AdamOptions& o) { o.weight_decay = infinity; }},
        {"weight_decay", [](AdamOptions& o) { o.weight_decay = quiet_nan; }},
        {"schedule", [](AdamOptions& o) { o.schedule.warmup_steps = 10; }},
    };
    const Variable w = leaf({1.0F, 2.0F});
    for (const Case& c : cases) {
        AdamOptions options;
        c.change(options);
        try {
            validate_adam_options(options);
            ADD_FAILURE() << c.option << ": accepted";
        } catch (const std::invalid_argument& error) {
            const std::string message = error.what();
            EXPECT_NE(message.find(c.option), std::string::npos) << message;
        }
        EXPECT_THROW(Adam({{"w", w}}, options), std::invalid_argument) << c.option;
    }
    EXPECT_EQ(w.version(), 0U);
    EXPECT_TRUE(testing::bit_identical(w.value().to_host(), {1.0F, 2.0F}));
}

TEST(AdamOptions, InfiniteMaximumGradientNormDisablesClipping) {
    const Variable w = leaf({0.0F, 0.0F});
    Adam adam({{"w", w}}, {.maximum_gradient_norm = infinity});
    set_gradient(w, {3000.0F, 4000.0F});
    const AdamStepStats stats = adam.step();
    EXPECT_DOUBLE_EQ(stats.gradient_norm, 5000.0);
    EXPECT_EQ(stats.clip_scale, 1.0);
    // m1 = (1 − β1)·g, unscaled.
    EXPECT_TRUE(testing::all_close(adam.state().first_moments, {300.0, 400.0}, 0.0, 1e-6));
}

// ---------------------------------------------------------------------------------------------
// Learning-rate schedules

TEST(LearningRateSchedule, RejectsInvalidSchedulesWithInvalidArgument) {
    using Kind = LearningRateScheduleKind;
    const std::vector<LearningRateSchedule> invalid = {
        {Kind::Constant, 5, 0, 0.0},      // a Constant schedule with warmup
        {Kind::Constant, 0, 10, 0.0},     // ... with a decay length
        {Kind::Constant, 0, 0, 0.5},      // ... with a floor
        {Kind::WarmupCosine, 0, 0, 0.0},  // nothing to decay over
        {Kind::WarmupCosine, 10, 10, 0.0},
        {Kind::WarmupCosine, 10, 5, 0.0},
        {Kind::WarmupCosine, 0, 10, -0.1},
        {Kind::WarmupCosine, 0, 10, 1.5},
        {Kind::WarmupCosine, 0, 10, quiet_nan},
        {Kind::WarmupLinear, 0, 0, 0.0},
        {Kind::WarmupLinear, 10, 10, 0.0},
        {Kind::WarmupLinear, 0, 10, -0.1},
        {Kind::WarmupLinear, 0, 10, 1.5},
        {Kind::WarmupLinear, 0, 10, quiet_nan},
        {static_cast<Kind>(9), 0, 0, 0.0},
    };
    for (const LearningRateSchedule& schedule : invalid) {
        EXPECT_THROW(validate_learning_rate_schedule(schedule), std::invalid_argument);
        EXPECT_THROW(static_cast<void>(scheduled_learning_rate(1.0, schedule, 1)),
                     std::invalid_argument);
        AdamOptions options;
        options.schedule = schedule;
        EXPECT_THROW(validate_adam_options(options), std::invalid_argument);
    }
    EXPECT_THROW(static_cast<void>(scheduled_learning_rate(1.0, {}, 0)), std::invalid_argument);
}

TEST(LearningRateSchedule, ConstantKeepsTheBaseRate) {
    for (const std::uint64_t step : {1ULL, 2ULL, 1000ULL, 1ULL << 40U}) {
        EXPECT_EQ(scheduled_learning_rate(3e-4, {}, step), 3e-4);
    }
}

TEST(LearningRateSchedule, WarmupCosineMatchesHandComputedRates) {
    // base 0.01, W = 2, T = 6, f = 0.1:
    //   t=1: 0.01·1/2 = 0.005            t=2: 0.01·2/2 = 0.01
    //   t=3: p = 1/4, cos(π/4) = 0.707107, factor 0.1 + 0.9·½·1.707107 = 0.868198 -> 0.00868198
    //   t=4: p = 1/2, cos = 0,          factor 0.1 + 0.45 = 0.55                -> 0.0055
    //   t=5: p = 3/4, cos = −0.707107,  factor 0.1 + 0.45·0.292893 = 0.231802   -> 0.00231802
    //   t=6: p = 1,   cos = −1,         factor 0.1                              -> 0.001
    //   t=7, 100: past T                                                        -> 0.001
    const LearningRateSchedule schedule{LearningRateScheduleKind::WarmupCosine, 2, 6, 0.1};
    const std::vector<std::pair<std::uint64_t, double>> expected = {
        {1, 0.005},      {2, 0.01},  {3, 0.00868198}, {4, 0.0055},
        {5, 0.00231802}, {6, 0.001}, {7, 0.001},      {100, 0.001}};
    for (const auto& [step, rate] : expected) {
        EXPECT_NEAR(scheduled_learning_rate(0.01, schedule, step), rate, 1e-8) << "step " << step;
    }
}

TEST(LearningRateSchedule, WarmupLinearMatchesHandComputedRates) {
    // base 0.01, W = 2, T = 6, f = 0.1:
    //   t=1: 0.005   t=2: 0.01   (warmup)
    //   t=3: p = 1/4, factor 0.1 + 0.9·0.75 = 0.775 -> 0.00775
    //   t=4: p = 1/2, factor 0.1 + 0.9·0.5  = 0.55  -> 0.0055
    //   t=5: p = 3/4, factor 0.1 + 0.9·0.25 = 0.325 -> 0.00325
    //   t=6: p = 1,   factor 0.1                   -> 0.001;  t=7, 100: past T -> 0.001
    const LearningRateSchedule schedule{LearningRateScheduleKind::WarmupLinear, 2, 6, 0.1};
    const std::vector<std::pair<std::uint64_t, double>> expected = {
        {1, 0.005},   {2, 0.01},  {3, 0.00775}, {4, 0.0055},
        {5, 0.00325}, {6, 0.001}, {7, 0.001},   {100, 0.001}};
    for (const auto& [step, rate] : expected) {
        EXPECT_NEAR(scheduled_learning_rate(0.01, schedule, step), rate, 1e-15) << "step " << step;
    }
}

TEST(LearningRateSchedule, NoWarmupIsPureCosineAndFloorOneIsWarmupThenConstant) {
    // W = 0, T = 4, f = 0: t=1: ½(1 + cos(π/4)) = 0.853553; t=2: 0.5; t=4: 0.
    const LearningRateSchedule cosine{LearningRateScheduleKind::WarmupCosine, 0, 4, 0.0};
    EXPECT_NEAR(scheduled_learning_rate(1.0, cosine, 1), 0.853553390593, 1e-12);
    EXPECT_NEAR(scheduled_learning_rate(1.0, cosine, 2), 0.5, 1e-15);
    EXPECT_NEAR(scheduled_learning_rate(1.0, cosine, 4), 0.0, 1e-15);
    // W = 4, f = 1: 0.25, 0.5, 0.75, 1, then 1 for ever.
    const LearningRateSchedule warmup{LearningRateScheduleKind::WarmupCosine, 4, 5, 1.0};
    const std::vector<double> rates = {0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0};
    for (std::size_t i = 0; i < rates.size(); ++i) {
        EXPECT_DOUBLE_EQ(scheduled_learning_rate(2.0, warmup, i + 1), 2.0 * rates[i]);
    }
}

TEST(LearningRateSchedule, AdamStepsUseTheScheduledRate) {
    // Each coordinate's first-step update is lr_1·sign(g) (m̂ = g, √v̂ = |g|); later steps are
    // checked against ReferenceAdam fed the hand-computed rates of the test above.
    const Variable w = leaf({1.0F, -1.0F});
    AdamOptions options;
    options.learning_rate = 0.01;
    options.schedule = {LearningRateScheduleKind::WarmupCosine, 2, 6, 0.1};
    Adam adam({{"w", w}}, options);
    ReferenceAdam reference({1.0F, -1.0F});
    const std::vector<double> rates = {0.005, 0.01, 0.00868198, 0.0055, 0.00231802, 0.001, 0.001};
    for (std::size_t i = 0; i < rates.size(); ++i) {
        EXPECT_NEAR(adam.learning_rate(), rates[i], 1e-8);
        const std::vector<float> g = {0.5F - 0.1F * static_cast<float>(i), 0.25F};
        set_gradient(w, g);
        const AdamStepStats stats = adam.step();
        EXPECT_NEAR(stats.learning_rate, rates[i], 1e-8);
        reference.step(g, stats.learning_rate);
        if (i == 0) {
            EXPECT_TRUE(testing::all_close(w.value(), {1.0 - 0.005, -1.0 - 0.005}));
        }
        EXPECT_TRUE(testing::all_close(w.value(), testing::to_double(reference.theta)));
    }
}

// ---------------------------------------------------------------------------------------------
// Construction

TEST(AdamConstruction, RejectsAnEmptyList) {
    EXPECT_THROW(Adam(ParameterList{}), std::invalid_argument);
}

TEST(AdamConstruction, RejectsEmptyAndRepeatedNames) {
    const Variable a = leaf({1.0F});
    const Variable b = leaf({2.0F});
    EXPECT_THROW(Adam({{"", a}}), std::invalid_argument);
    EXPECT_THROW(Adam({{"a", a}, {"", b}}), std::invalid_argument);
    EXPECT_THROW(Adam({{"x", a}, {"x", b}}), std::invalid_argument);
    EXPECT_EQ(a.version(), 0U);
    EXPECT_EQ(b.version(), 0U);
}

TEST(AdamConstruction, RejectsAnEmptyVariable) {
    const Variable a = leaf({1.0F});
    EXPECT_THROW(Adam({{"a", a}, {"empty", Variable()}}), std::invalid_argument);
    EXPECT_THROW(Adam({{"empty", Variable()}}), std::invalid_argument);
}

TEST(AdamConstruction, RejectsANonLeaf) {
    const Variable a = leaf({1.0F, 2.0F});
    const Variable doubled = a * 2.0F;
    EXPECT_THROW(Adam({{"a", a}, {"doubled", doubled}}), std::invalid_argument);
}

TEST(AdamConstruction, RejectsAFrozenParameter) {
    // Frozen parameters are rejected rather than skipped: an optimizer that silently kept
    // moments for a parameter it never updates would hide a mistake in the list.
    const Variable a = leaf({1.0F});
    Variable frozen = leaf({2.0F});
    frozen.set_requires_gradient(false);
    EXPECT_THROW(Adam({{"a", a}, {"frozen", frozen}}), std::invalid_argument);
    const Variable constant(Tensor({1}, {3.0F}), false);
    EXPECT_THROW(Adam({{"constant", constant}}), std::invalid_argument);
}

TEST(AdamConstruction, RejectsTheSameParameterListedTwice) {
    const Variable a = leaf({1.0F});
    const Variable alias = a;  // a second handle on the same leaf
    EXPECT_THROW(Adam({{"a", a}, {"alias", alias}}), std::invalid_argument);
}

TEST(AdamConstruction, RejectsAGradientWhoseShapeDiffersWithLogicError) {
    // Backward never publishes such a gradient; the rule guards the in-place kernel against
    // anything that bypasses it.
    const Variable a = leaf({1.0F, 2.0F});
    a.node()->gradient = Tensor({3}, 0.5F);
    EXPECT_THROW(Adam({{"a", a}}), std::logic_error);
    EXPECT_EQ(a.node()->gradient.numel(), 3U);
}

TEST(AdamConstruction, RejectsNonFiniteValuesWithDomainError) {
    for (const float bad : {float_nan, float_infinity, -float_infinity}) {
        const Variable good = leaf({1.0F});
        const Variable a = leaf({1.0F, bad, 3.0F});
        EXPECT_THROW(Adam({{"good", good}, {"a", a}}), std::domain_error);
        EXPECT_EQ(a.version(), 0U);
    }
}

TEST(AdamConstruction, RejectsNonFiniteGradientsWithDomainError) {
    for (const float bad : {float_nan, float_infinity, -float_infinity}) {
        const Variable a = leaf({1.0F, 2.0F});
        set_gradient(a, {0.5F, bad});
        try {
            const Adam adam({{"weights", a}});
            ADD_FAILURE() << "accepted a gradient element " << bad;
        } catch (const std::domain_error& error) {
            EXPECT_NE(std::string(error.what()).find("'weights'"), std::string::npos);
        }
        ASSERT_TRUE(a.has_gradient());
        EXPECT_EQ(a.gradient().flat(0), 0.5F);
    }
}

TEST(AdamConstruction, StartsAtZeroMomentsUnitBetaPowersAndStepZero) {
    const Variable w = leaf({2, 3}, 1U);
    const Variable b = leaf({1.0F, 2.0F, 3.0F});
    const Adam adam({{"w", w}, {"b", b}});
    EXPECT_EQ(adam.step_count(), 0U);
    EXPECT_EQ(adam.beta1_power(), 1.0);
    EXPECT_EQ(adam.beta2_power(), 1.0);
    EXPECT_EQ(adam.backend(), ExecutionBackend::Cpu);
    EXPECT_EQ(adam.parameter_tensor_count(), 2U);
    EXPECT_EQ(adam.state_value_count(), 9U);
    EXPECT_EQ(adam.state_payload_bytes(), 2U * 9U * 4U);
    EXPECT_EQ(adam.state_page_count(), 0U);
    const AdamState state = adam.state();
    EXPECT_EQ(state.step_count, 0U);
    EXPECT_EQ(state.first_moments, std::vector<float>(9, 0.0F));
    EXPECT_EQ(state.second_moments, std::vector<float>(9, 0.0F));
    EXPECT_TRUE(testing::bit_identical(state.parameter_values, concatenated({w, b})));
}

// ---------------------------------------------------------------------------------------------
// Moment layout

TEST(AdamMomentLayout, PagesStayInsideOneParameterAndCountCeilings) {
    const std::vector<std::size_t> counts = {10, 4, 3};
    const auto paged = detail::moment_page_extents(counts, AdamStateStorage::Paged, 4);
    // ceil(10/4) + ceil(4/4) + ceil(3/4) = 3 + 1 + 1 pages.
    const std::vector<std::array<std::size_t, 3>> expected = {
        {0, 0, 4}, {0, 4, 4}, {0, 8, 2}, {1, 0, 4}, {2, 0, 3}};
    ASSERT_EQ(paged.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(paged[i].parameter, expected[i][0]);
        EXPECT_EQ(paged[i].offset, expected[i][1]);
        EXPECT_EQ(paged[i].count, expected[i][2]);
    }
    const auto contiguous = detail::moment_page_extents(counts, AdamStateStorage::Contiguous, 4);
    ASSERT_EQ(contiguous.size(), 3U);
    EXPECT_EQ(contiguous[0].count, 10U);

    AdamOptions options;
    options.state_storage = AdamStateStorage::Paged;
    options.page_size = 4;
    const Adam adam({{"a", leaf({10}, 1U)}, {"b", leaf({4}, 2U)}, {"c", leaf({3}, 3U)}}, options);
    EXPECT_EQ(adam.state_page_count(), 5U);
    EXPECT_EQ(adam.state_page_size(), 4U);
    EXPECT_EQ(adam.state_storage_kind(), AdamStateStorage::Paged);
    EXPECT_EQ(adam.state_payload_bytes(), 2U * 17U * 4U);
}

TEST(AdamMomentLayout, StateByteCountOverflowIsOverflowError) {
    constexpr std::size_t most = std::numeric_limits<std::size_t>::max();
    EXPECT_EQ(detail::checked_state_value_count(std::vector<std::size_t>{3, 4}), 7U);
    EXPECT_EQ(detail::checked_state_value_count(std::vector<std::size_t>{most / 8}), most / 8);
    EXPECT_THROW(static_cast<void>(
                     detail::checked_state_value_count(std::vector<std::size_t>{most / 8 + 1})),
                 std::overflow_error);
    EXPECT_THROW(
        static_cast<void>(detail::checked_state_value_count(std::vector<std::size_t>{most, 1})),
        std::overflow_error);
}

// ---------------------------------------------------------------------------------------------
// step()

TEST(AdamStep, MatchesAHandComputedTwoStepExample) {
    // θ0: w = (1, −2), b = (0.5); lr = 0.1, β1 = 0.9, β2 = 0.999, ε = 1e-8, G_max = 1.
    //
    // Step 1: g = (0.3, −0.4 | 1.2), ‖g‖ = √(0.09 + 0.16 + 1.44) = √1.69 = 1.3 > 1
    //   s = 1/1.3 = 0.769231, g̃ = (0.230769, −0.307692 | 0.923077)
    //   c1 = 1 − 0.9 = 0.1, c2 = 1 − 0.999 = 0.001
    //   m1 = 0.1·g̃ = (0.0230769, −0.0307692 | 0.0923077)
    //   v1 = 0.001·g̃² = (5.32544e-5, 9.46746e-5 | 8.52071e-4)
    //   m̂ = m1/c1 = g̃ and v̂ = v1/c2 = g̃², so Δ = lr·g̃/(|g̃| + ε) = 0.1·sign(g̃) (to 1e-8)
    //   θ1 = (1 − 0.1, −2 + 0.1 | 0.5 − 0.1) = (0.9, −1.9 | 0.4)
    //
    // Step 2: g = (0.1, 0.2 | −0.2), ‖g‖ = √(0.01 + 0.04 + 0.04) = 0.3 <= 1, s = 1
    //   c1 = 1 − 0.9² = 0.19, c2 = 1 − 0.999² = 0.001999
    //   m2 = 0.9·m1 + 0.1·g = (0.0307692, −0.00769231 | 0.0630769)
    //   v2 = 0.999·v1 + 0.001·g² = (6.32012e-5, 1.34580e-4 | 8.91219e-4)
    //   m̂ = m2/0.19 = (0.161943, −0.0404858 | 0.331984)
    //   √v̂ = √(v2/0.001999) = (0.177810, 0.259468 | 0.667707)
    //   Δ = 0.1·m̂/(√v̂ + ε) = (0.0910766, −0.0156034 | 0.0497200)
    //   θ2 = θ1 − Δ = (0.8089234, −1.8843966 | 0.3502800)
    const Variable w = leaf({1.0F, -2.0F});
    const Variable b = leaf({0.5F});
    Adam adam({{"w", w}, {"b", b}}, {.learning_rate = 0.1});

    set_gradient(w, {0.3F, -0.4F});
    set_gradient(b, {1.2F});
    const AdamStepStats first = adam.step();
    EXPECT_EQ(first.step, 1U);
    EXPECT_NEAR(first.gradient_norm, 1.3, 1e-6);
    EXPECT_NEAR(first.clip_scale, 1.0 / 1.3, 1e-6);
    EXPECT_EQ(first.learning_rate, 0.1);
    EXPECT_TRUE(testing::all_close(w.value(), {0.9, -1.9}));
    EXPECT_TRUE(testing::all_close(b.value(), {0.4}));
    AdamState state = adam.state();
    EXPECT_TRUE(
        testing::all_close(state.first_moments, {0.0230769, -0.0307692, 0.0923077}, 0.0, 1e-5));
    EXPECT_TRUE(
        testing::all_close(state.second_moments, {5.32544e-5, 9.46746e-5, 8.52071e-4}, 0.0, 1e-5));
    EXPECT_DOUBLE_EQ(adam.beta1_power(), 0.9);
    EXPECT_DOUBLE_EQ(adam.beta2_power(), 0.999);

    set_gradient(w, {0.1F, 0.2F});
    set_gradient(b, {-0.2F});
    const AdamStepStats second = adam.step();
    EXPECT_EQ(second.step, 2U);
    EXPECT_NEAR(second.gradient_norm, 0.3, 1e-6);
    EXPECT_EQ(second.clip_scale, 1.0);
    EXPECT_TRUE(testing::all_close(w.value(), {0.8089234, -1.8843966}));
    EXPECT_TRUE(testing::all_close(b.value(), {0.3502800}));
    state = adam.state();
    EXPECT_TRUE(
        testing::all_close(state.first_moments, {0.0307692, -0.00769231, 0.0630769}, 0.0, 1e-5));
    EXPECT_TRUE(
        testing::all_close(state.second_moments, {6.32012e-5, 1.34580e-4, 8.91219e-4}, 0.0, 1e-5));
    EXPECT_DOUBLE_EQ(adam.beta1_power(), 0.81);
    EXPECT_DOUBLE_EQ(adam.beta2_power(), 0.998001);

    // The same two steps by the double formulas (ReferenceAdam), to float tolerance.
    ReferenceAdam reference({1.0F, -2.0F, 0.5F});
    reference.learning_rate = 0.1;
    reference.step({0.3F, -0.4F, 1.2F});
    reference.step({0.1F, 0.2F, -0.2F});
    EXPECT_TRUE(testing::all_close(concatenated({w, b}), testing::to_double(reference.theta)));
    EXPECT_TRUE(testing::all_close(state.first_moments, testing::to_double(reference.m)));
    EXPECT_TRUE(testing::all_close(state.second_moments, testing::to_double(reference.v)));
}

TEST(AdamStep, ClipsWithOneGlobalFactorThatKeepsTheDirection) {
    // g = (3, 4 | 12): ‖g‖ = 13 > G_max = 2.6, s = 0.2, g̃ = (0.6, 0.8 | 2.4) = g·s.
    const Variable a = leaf({0.0F, 0.0F});
    const Variable b = leaf({0.0F});
    Adam adam({{"a", a}, {"b", b}}, {.maximum_gradient_norm = 2.6});
    set_gradient(a, {3.0F, 4.0F});
    set_gradient(b, {12.0F});
    const AdamStepStats stats = adam.step();
    EXPECT_DOUBLE_EQ(stats.gradient_norm, 13.0);
    EXPECT_DOUBLE_EQ(stats.clip_scale, 0.2);
    // m1 = (1 − β1)·g̃ = 0.1·(0.6, 0.8, 2.4); v1 = 0.001·g̃².
    const AdamState state = adam.state();
    EXPECT_TRUE(testing::all_close(state.first_moments, {0.06, 0.08, 0.24}));
    EXPECT_TRUE(testing::all_close(state.second_moments, {0.00036, 0.00064, 0.00576}));
}

TEST(AdamStep, NormAtOrBelowTheMaximumIsNotClipped) {
    // g = (3, 4): ‖g‖ = 5 exactly (scale 4, Σ(x/4)² = 1.5625, √ = 1.25, 4·1.25 = 5).
    for (const double maximum : {5.0, 6.0}) {
        const Variable a = leaf({0.0F, 0.0F});
        Adam adam({{"a", a}}, {.maximum_gradient_norm = maximum});
        set_gradient(a, {3.0F, 4.0F});
        const AdamStepStats stats = adam.step();
        EXPECT_EQ(stats.gradient_norm, 5.0);
        EXPECT_EQ(stats.clip_scale, 1.0) << "G_max " << maximum;
        EXPECT_TRUE(testing::all_close(adam.state().first_moments, {0.3, 0.4}));
    }
}

TEST(AdamStep, AllZeroFirstStepCountsWithNormZeroAndScaleOne) {
    const Variable a = leaf({1.0F, -2.0F});
    const Variable b = leaf({3.0F});
    Adam adam({{"a", a}, {"b", b}});
    set_gradient(a, {0.0F, 0.0F});  // an explicit zero gradient; b has none at all
    const AdamStepStats stats = adam.step();
    EXPECT_EQ(stats.step, 1U);
    EXPECT_EQ(stats.gradient_norm, 0.0);
    EXPECT_EQ(stats.clip_scale, 1.0);
    EXPECT_EQ(adam.step_count(), 1U);
    EXPECT_EQ(adam.beta1_power(), 0.9);
    // m = v = 0 gives Δ = lr·0/(0 + ε) = 0: nothing moves.
    EXPECT_TRUE(testing::bit_identical(concatenated({a, b}), {1.0F, -2.0F, 3.0F}));
    EXPECT_EQ(a.version(), 1U);
    EXPECT_EQ(b.version(), 1U);
}

TEST(AdamStep, ParametersWithoutGradientsTakeZeroGradientsAndMoveOnlyThroughTheirMoments) {
    const Variable a = leaf({1.0F});
    const Variable b = leaf({1.0F});
    Adam adam({{"a", a}, {"b", b}}, {.learning_rate = 0.1});
    ReferenceAdam reference({1.0F, 1.0F});
    reference.learning_rate = 0.1;
    // Step 1: only a has a gradient; b's moments stay zero and b does not move.
    set_gradient(a, {0.5F});
    adam.step();
    reference.step({0.5F, 0.0F});
    EXPECT_EQ(b.value().flat(0), 1.0F);
    // Step 2: a has no gradient now, b has one. a still moves (its moments are non-zero):
    //   m2 = 0.9·0.05 = 0.045, v2 = 0.999·0.00025, Δ = 0.1·(0.045/0.19)/(√(v2/0.001999) + ε).
    set_gradient(b, {0.5F});
    adam.step();
    reference.step({0.0F, 0.5F});
    const double expected_a =
        0.9 - 0.1 * (0.045 / 0.19) / (std::sqrt(0.999 * 0.00025 / 0.001999) + 1e-8);
    EXPECT_NEAR(a.value().flat(0), expected_a, 1e-6);
    EXPECT_TRUE(testing::all_close(concatenated({a, b}), testing::to_double(reference.theta)));
}

TEST(AdamStep, BumpsVersionsClearsGradientsAndMakesOlderGraphsStale) {
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    const Variable input(Tensor({2}, {0.5F, -0.5F}), false);
    set_gradient(w, {0.1F, 0.2F});
    Variable stale_loss = sum(w * input);  // reads w at version 0
    const std::uint64_t version = w.version();
    adam.step();
    EXPECT_EQ(w.version(), version + 1);
    EXPECT_FALSE(w.has_gradient());
    EXPECT_EQ(w.gradient().to_host(), std::vector<float>(2, 0.0F));
    EXPECT_THROW(stale_loss.backward(), std::logic_error);
    // A graph built after the step works.
    Variable fresh_loss = sum(w * input);
    fresh_loss.backward();
    EXPECT_TRUE(testing::bit_identical(w.gradient().to_host(), {0.5F, -0.5F}));
}

TEST(AdamStep, ZeroGradientsClearsGradientsAndNothingElse) {
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    set_gradient(w, {0.1F, 0.2F});
    adam.step();
    const AdamState before = adam.state();
    set_gradient(w, {0.3F, 0.4F});
    const std::uint64_t version = w.version();
    adam.zero_gradients();
    EXPECT_FALSE(w.has_gradient());
    EXPECT_EQ(w.version(), version);
    EXPECT_TRUE(same_state(adam.state(), before));
}

TEST(AdamStep, RejectsNonFiniteGradientsWithDomainErrorChangingNothing) {
    for (const float bad : {float_nan, float_infinity, -float_infinity}) {
        const Variable a = leaf({1.0F, 2.0F});
        const Variable b = leaf({3.0F, 4.0F, 5.0F});
        Adam adam({{"a", a}, {"b", b}}, {.learning_rate = 0.1});
        set_gradient(a, {0.1F, 0.2F});
        set_gradient(b, {0.3F, 0.4F, 0.5F});
        adam.step();  // non-zero moments and beta powers below 1
        const AdamState clean = adam.state();
        set_gradient(a, {0.1F, 0.2F});  // a alone would be a valid update
        set_gradient(b, {0.3F, bad, 0.5F});
        const OptimizerSnapshot before = snapshot(adam);
        try {
            adam.step();
            ADD_FAILURE() << "accepted a gradient element " << bad;
        } catch (const std::domain_error& error) {
            EXPECT_NE(std::string(error.what()).find("'b' has element 1"), std::string::npos)
                << error.what();
        }
        EXPECT_TRUE(unchanged(before, adam));
        EXPECT_TRUE(moments_unchanged(adam, clean));
    }
}

TEST(AdamStep, RejectsANonFiniteValueWithDomainErrorChangingNothing) {
    const Variable a = leaf({1.0F, 2.0F});
    Variable b = leaf({3.0F, 4.0F});
    Adam adam({{"a", a}, {"b", b}});
    set_gradient(a, {0.1F, 0.2F});
    set_gradient(b, {0.1F, 0.2F});
    adam.step();
    const AdamState clean = adam.state();
    const Tensor good_b = b.value();
    b.set_value(Tensor({2}, {3.0F, float_infinity}));
    set_gradient(a, {0.1F, 0.2F});
    set_gradient(b, {0.1F, 0.2F});
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(adam.step(), std::domain_error);
    EXPECT_TRUE(unchanged(before, adam));
    EXPECT_THROW(static_cast<void>(adam.state()), std::logic_error);  // gradients pending
    adam.zero_gradients();
    EXPECT_THROW(static_cast<void>(adam.state()), std::domain_error);  // b is not finite
    b.set_value(good_b);
    AdamState now = adam.state();
    EXPECT_TRUE(testing::bit_identical(now.first_moments, clean.first_moments));
    EXPECT_TRUE(testing::bit_identical(now.second_moments, clean.second_moments));
    EXPECT_EQ(now.step_count, 1U);
}

TEST(AdamStep, RejectsASecondMomentThatOverflowsFloatWithOverflowErrorChangingNothing) {
    // Without clipping, g = 1e30 gives v1 = 0.001·1e60 = 1e57 > FLT_MAX (3.4e38). Parameter a
    // comes first and its update alone is valid: it must not be written either.
    const Variable a = leaf({1.0F, 2.0F});
    const Variable b = leaf({3.0F, 4.0F});
    Adam adam({{"a", a}, {"b", b}}, {.maximum_gradient_norm = infinity});
    const AdamState clean = adam.state();
    set_gradient(a, {0.1F, 0.2F});
    set_gradient(b, {0.5F, 1e30F});
    const OptimizerSnapshot before = snapshot(adam);
    try {
        adam.step();
        ADD_FAILURE() << "accepted an overflowing update";
    } catch (const std::overflow_error& error) {
        EXPECT_NE(std::string(error.what()).find("'b' element 1"), std::string::npos)
            << error.what();
    }
    EXPECT_TRUE(unchanged(before, adam));
    EXPECT_TRUE(moments_unchanged(adam, clean));
}

TEST(AdamStep, RejectsAValueThatOverflowsFloatWithOverflowErrorChangingNothing) {
    // θ = −3e38, g > 0: Δ = lr·sign(g) = 1e38, θ' = −4e38 < −FLT_MAX (finite in double only).
    const Variable a = leaf({1.0F});
    const Variable b = leaf({-3e38F, 0.0F});
    Adam adam({{"a", a}, {"b", b}}, {.learning_rate = 1e38});
    const AdamState clean = adam.state();
    set_gradient(a, {0.0F});
    set_gradient(b, {0.5F, 0.0F});
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(adam.step(), std::overflow_error);
    EXPECT_TRUE(unchanged(before, adam));
    EXPECT_TRUE(moments_unchanged(adam, clean));
}

TEST(AdamStep, RejectsAStepCountAtItsMaximumWithOverflowError) {
    // A state at t = 2^64 − 1: β^t underflows to 0, which load_state accepts.
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    AdamState state = adam.state();
    state.step_count = std::numeric_limits<std::uint64_t>::max();
    state.beta1_power = 0.0;
    state.beta2_power = 0.0;
    adam.load_state(state);
    EXPECT_EQ(adam.step_count(), std::numeric_limits<std::uint64_t>::max());
    set_gradient(w, {0.1F, 0.2F});
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(adam.step(), std::overflow_error);
    EXPECT_TRUE(unchanged(before, adam));
    EXPECT_EQ(adam.learning_rate(), 1e-3);
}

TEST(AdamStep, RejectsAParameterFrozenAfterConstructionWithLogicError) {
    const Variable a = leaf({1.0F});
    Variable b = leaf({2.0F});
    Adam adam({{"a", a}, {"b", b}});
    set_gradient(a, {0.5F});
    b.set_requires_gradient(false);
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(adam.step(), std::logic_error);
    EXPECT_TRUE(unchanged(before, adam));
}

TEST(AdamStep, RejectsAParameterWhoseShapeChangedWithLogicError) {
    const Variable a = leaf({1.0F, 2.0F});
    Adam adam({{"a", a}});
    a.node()->value = Tensor({3}, {1.0F, 2.0F, 3.0F});  // bypasses set_value's shape rule
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(adam.step(), std::logic_error);
    EXPECT_TRUE(unchanged(before, adam));
}

TEST(AdamStep, RejectsAGradientWhoseShapeDiffersWithLogicError) {
    const Variable a = leaf({1.0F, 2.0F});
    Adam adam({{"a", a}});
    a.node()->gradient = Tensor({1}, 0.5F);  // bypasses backward's shape rule
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(adam.step(), std::logic_error);
    EXPECT_TRUE(unchanged(before, adam));
}

TEST(AdamStep, CopiesOfAValueKeepTheOldValue) {
    // Copy-on-write: a Tensor copied from a parameter before the step is an independent value.
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}}, {.learning_rate = 0.5});
    const Tensor copy = w.value();
    set_gradient(w, {1.0F, 1.0F});
    adam.step();
    EXPECT_TRUE(testing::bit_identical(copy.to_host(), {1.0F, 2.0F}));
    EXPECT_TRUE(testing::all_close(w.value(), {0.5, 1.5}));
}

TEST(AdamStep, ResultsDoNotDependOnTheThreadCount) {
    const testing::ThreadCountGuard guard;
    std::vector<std::vector<float>> results;
    std::vector<double> norms;
    for (const std::size_t threads : {1U, 2U, 5U}) {
        set_cpu_thread_count(threads);
        const Variable big = leaf({300000}, 1U);
        const Variable small = leaf({7}, 2U);
        Adam adam({{"big", big}, {"small", small}}, {.learning_rate = 0.01});
        double norm = 0.0;
        for (std::uint32_t step = 0; step < 3; ++step) {
            set_random_gradient(big, 10U + step);
            set_random_gradient(small, 20U + step);
            norm = adam.step().gradient_norm;
        }
        results.push_back(concatenated({big, small}));
        norms.push_back(norm);
    }
    for (std::size_t i = 1; i < results.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(results[i], results[0]));
        EXPECT_EQ(norms[i], norms[0]);
    }
}

TEST(AdamW, DecoupledWeightDecayMatchesHandComputation) {
    // λ = 0.5, lr = 0.01, θ0 = (2, −1), g = (0.5, 0) then (0.5, 0):
    // Step 1: the first coordinate moves by lr·sign(g) = 0.01 after decay; the second has
    //   m = v = 0 and only decays: θ1 = θ0·(1 − lr·λ) − Δ = (2·0.995 − 0.01, −1·0.995)
    //   = (1.98, −0.995).
    // Step 2: m2 = 0.9·0.05 + 0.05 = 0.095, v2 = 0.999·0.00025 + 0.00025 = 0.00049975,
    //   Δ = 0.01·(0.095/0.19)/√(0.00049975/0.001999) = 0.01·0.5/0.5 = 0.01 (v̂ = 0.25 exactly):
    //   θ2 = (1.98·0.995 − 0.01, −0.995·0.995) = (1.9601, −0.990025).
    const Variable w = leaf({2.0F, -1.0F});
    Adam adam({{"w", w}}, {.learning_rate = 0.01, .weight_decay = 0.5});
    set_gradient(w, {0.5F, 0.0F});
    adam.step();
    EXPECT_TRUE(testing::all_close(w.value(), {1.98, -0.995}));
    set_gradient(w, {0.5F, 0.0F});
    adam.step();
    EXPECT_TRUE(testing::all_close(w.value(), {1.9601, -0.990025}));

    ReferenceAdam reference({2.0F, -1.0F});
    reference.learning_rate = 0.01;
    reference.weight_decay = 0.5;
    reference.step({0.5F, 0.0F});
    reference.step({0.5F, 0.0F});
    EXPECT_TRUE(testing::all_close(w.value(), testing::to_double(reference.theta)));
}

TEST(AdamW, WeightDecayFollowsTheScheduledRate) {
    // Warmup over 4 steps: lr_1 = 0.25·0.1 = 0.025; a zero-gradient coordinate decays by
    // (1 − lr_1·λ) = 1 − 0.025·0.2 = 0.995.
    const Variable w = leaf({1.0F});
    AdamOptions options;
    options.learning_rate = 0.1;
    options.weight_decay = 0.2;
    options.schedule = {LearningRateScheduleKind::WarmupCosine, 4, 10, 0.0};
    Adam adam({{"w", w}}, options);
    set_gradient(w, {0.0F});
    adam.step();
    EXPECT_TRUE(testing::all_close(w.value(), {0.995}));
}

// ---------------------------------------------------------------------------------------------
// Moment storage

TEST(AdamMomentStorage, PagedAndContiguousGiveBitIdenticalResults) {
    std::vector<std::vector<float>> values;
    std::vector<AdamState> states;
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        const Variable w = leaf({5, 7}, 1U);
        const Variable b = leaf({3}, 2U);
        const Variable e = leaf({16}, 3U);
        AdamOptions options;
        options.learning_rate = 0.05;
        options.state_storage = storage;
        options.page_size = 4;  // pages of 4, 4, ..., 3 | 3 | 4, 4, 4, 4
        Adam adam({{"w", w}, {"b", b}, {"e", e}}, options);
        EXPECT_EQ(adam.state_page_count(), storage == AdamStateStorage::Paged ? 9U + 1U + 4U : 0U);
        for (std::uint32_t step = 0; step < 4; ++step) {
            set_random_gradient(w, 10U + step, -2.0F, 2.0F);
            set_random_gradient(b, 20U + step, -2.0F, 2.0F);
            if (step != 2) {
                set_random_gradient(e, 30U + step, -2.0F, 2.0F);  // e has no gradient at step 2
            }
            adam.step();
        }
        values.push_back(concatenated({w, b, e}));
        states.push_back(adam.state());
    }
    EXPECT_TRUE(testing::bit_identical(values[0], values[1]));
    EXPECT_TRUE(same_state(states[0], states[1]));
}

// ---------------------------------------------------------------------------------------------
// Global gradient norm

TEST(GlobalGradientNorm, MatchesAHandComputedNorm) {
    // (3, 4 | 12): √(9 + 16 + 144) = 13; a parameter without a gradient adds nothing.
    const Variable a = leaf({0.0F, 0.0F});
    const Variable b = leaf({0.0F});
    const Variable untouched = leaf({7.0F});
    set_gradient(a, {3.0F, 4.0F});
    set_gradient(b, {12.0F});
    EXPECT_DOUBLE_EQ(global_gradient_norm({{"a", a}, {"b", b}, {"untouched", untouched}}), 13.0);
    EXPECT_EQ(global_gradient_norm({}), 0.0);
    EXPECT_EQ(global_gradient_norm({{"untouched", untouched}}), 0.0);
}

TEST(GlobalGradientNorm, FrozenParametersContributeNothing) {
    const Variable a = leaf({0.0F});
    Variable frozen = leaf({0.0F});
    set_gradient(a, {2.0F});
    set_gradient(frozen, {100.0F});
    frozen.set_requires_gradient(false);
    EXPECT_DOUBLE_EQ(global_gradient_norm({{"a", a}, {"frozen", frozen}}), 2.0);
}

TEST(GlobalGradientNorm, HugeGradientsDoNotOverflow) {
    // 1000 elements of 1e30: a float sum of squares overflows (1e60 > 3.4e38); the norm is
    // 1e30·√1000 = 3.16228e31.
    const Variable a = leaf(std::vector<float>(1000, 0.0F));
    set_gradient(a, std::vector<float>(1000, 1e30F));
    EXPECT_NEAR(global_gradient_norm({{"a", a}}) / (static_cast<double>(1e30F) * std::sqrt(1000.0)),
                1.0, 1e-12);
    // Four elements at FLT_MAX: ‖g‖ = 2·FLT_MAX, finite in double although above float's range.
    const Variable b = leaf(std::vector<float>(4, 0.0F));
    set_gradient(b, std::vector<float>(4, FLT_MAX));
    EXPECT_EQ(global_gradient_norm({{"b", b}}), 2.0 * static_cast<double>(FLT_MAX));
    // Adam clips it: s = 1/(2·FLT_MAX), g̃ = 0.5 per element, m1 = 0.05.
    Adam adam({{"b", b}});
    const AdamStepStats stats = adam.step();
    EXPECT_EQ(stats.gradient_norm, 2.0 * static_cast<double>(FLT_MAX));
    EXPECT_DOUBLE_EQ(stats.clip_scale, 1.0 / (2.0 * static_cast<double>(FLT_MAX)));
    EXPECT_TRUE(testing::all_close(adam.state().first_moments, std::vector<double>(4, 0.05)));
}

TEST(GlobalGradientNorm, TinyGradientsDoNotUnderflow) {
    // 100 subnormal floats of 1e-40: squares (1e-80) underflow float to 0; the norm is
    // 1e-40·√100 = 1e-39.
    const Variable a = leaf(std::vector<float>(100, 0.0F));
    a.node()->gradient = Tensor({100}, 1e-40F);
    EXPECT_NEAR(global_gradient_norm({{"a", a}}) / (static_cast<double>(1e-40F) * 10.0), 1.0,
                1e-12);
    // The smallest subnormal: four of them have norm 2·denorm_min.
    const Variable b = leaf(std::vector<float>(4, 0.0F));
    const float smallest = std::numeric_limits<float>::denorm_min();
    b.node()->gradient = Tensor({4}, smallest);
    EXPECT_EQ(global_gradient_norm({{"b", b}}), 2.0 * static_cast<double>(smallest));
}

TEST(GlobalGradientNorm, AgreesWithTheSpecsSequentialScaledSum) {
    // Oracle: the element-by-element running pair (docs/ARCHITECTURE.md, 'Adam'), over values
    // spanning 60 decades.
    std::vector<Variable> parameters;
    ParameterList list;
    std::vector<float> all;
    for (std::uint32_t i = 0; i < 3; ++i) {
        const std::size_t count = 20000 + 777 * i;
        std::vector<float> g = testing::pseudo_random(count, -1.0F, 1.0F, 40U + i);
        const std::vector<float> exponents = testing::pseudo_random(count, -30.0F, 30.0F, 50U + i);
        for (std::size_t j = 0; j < count; ++j) {
            g[j] *= std::pow(10.0F, std::floor(exponents[j]));
        }
        parameters.push_back(leaf(std::vector<float>(count, 0.0F)));
        set_gradient(parameters.back(), g);
        list.push_back({std::string("p").append(std::to_string(i)), parameters.back()});
        all.insert(all.end(), g.begin(), g.end());
    }
    double scale = 0.0;
    double sum = 0.0;
    for (const float x : all) {
        const double magnitude = std::fabs(static_cast<double>(x));
        if (magnitude == 0.0) {
            continue;
        }
        if (scale < magnitude) {
            sum = 1.0 + sum * (scale / magnitude) * (scale / magnitude);
            scale = magnitude;
        } else {
            sum += (magnitude / scale) * (magnitude / scale);
        }
    }
    const double expected = scale * std::sqrt(sum);
    EXPECT_NEAR(global_gradient_norm(list) / expected, 1.0, 1e-12);
}

TEST(GlobalGradientNorm, RejectsBadEntries) {
    const Variable a = leaf({1.0F, 2.0F});
    set_gradient(a, {0.5F, 0.5F});
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"a", a}, {"null", Variable()}})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"a", a}, {"again", a}})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"a", a}, {"interior", a * 2.0F}})),
                 std::invalid_argument);
    const Variable b = leaf({1.0F, 2.0F});
    b.node()->gradient = Tensor({3}, 1.0F);
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"a", a}, {"b", b}})), std::logic_error);
    const Variable c = leaf({1.0F, 2.0F});
    set_gradient(c, {float_nan, 1.0F});
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"a", a}, {"c", c}})), std::domain_error);
    EXPECT_TRUE(testing::bit_identical(a.gradient().to_host(), {0.5F, 0.5F}));
}

// ---------------------------------------------------------------------------------------------
// State capture and restore

TEST(AdamState, RoundTripResumesExactlyAcrossLayouts) {
    // Optimizer A runs 3 steps; B (fresh parameters, paged moments) loads A's state; both then
    // take 4 identical steps and end bit-identical.
    const Variable a_w = leaf({4, 5}, 1U);
    const Variable a_b = leaf({5}, 2U);
    Adam a({{"w", a_w}, {"b", a_b}}, {.learning_rate = 0.02});
    for (std::uint32_t step = 0; step < 3; ++step) {
        set_random_gradient(a_w, 10U + step);
        set_random_gradient(a_b, 20U + step);
        a.step();
    }
    const AdamState captured = a.state();
    EXPECT_EQ(captured.step_count, 3U);
    EXPECT_EQ(captured.parameter_values.size(), 25U);

    const Variable b_w = leaf({4, 5}, 7U);
    const Variable b_b = leaf({5}, 8U);
    AdamOptions paged;
    paged.learning_rate = 0.02;
    paged.state_storage = AdamStateStorage::Paged;
    paged.page_size = 3;
    Adam b({{"w", b_w}, {"b", b_b}}, paged);
    const std::uint64_t version = b_w.version();
    b.load_state(captured);
    EXPECT_EQ(b_w.version(), version + 1);
    EXPECT_EQ(b.step_count(), 3U);
    EXPECT_EQ(b.beta1_power(), a.beta1_power());
    EXPECT_EQ(b.beta2_power(), a.beta2_power());
    EXPECT_TRUE(same_state(b.state(), captured));

    for (std::uint32_t step = 3; step < 7; ++step) {
        set_random_gradient(a_w, 10U + step);
        set_random_gradient(a_b, 20U + step);
        set_random_gradient(b_w, 10U + step);
        set_random_gradient(b_b, 20U + step);
        const AdamStepStats sa = a.step();
        const AdamStepStats sb = b.step();
        EXPECT_EQ(sa.gradient_norm, sb.gradient_norm);
        EXPECT_EQ(sa.step, sb.step);
    }
    EXPECT_TRUE(testing::bit_identical(concatenated({a_w, a_b}), concatenated({b_w, b_b})));
    EXPECT_TRUE(same_state(a.state(), b.state()));
}

TEST(AdamState, NeedsACleanStepBoundary) {
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    const AdamState clean = adam.state();
    set_gradient(w, {0.1F, 0.2F});
    const OptimizerSnapshot before = snapshot(adam);
    EXPECT_THROW(static_cast<void>(adam.state()), std::logic_error);
    EXPECT_THROW(adam.load_state(clean), std::logic_error);
    EXPECT_TRUE(unchanged(before, adam));
    EXPECT_TRUE(moments_unchanged(adam, clean));
}

TEST(AdamState, LoadRejectsWrongCountsAndNonFiniteOrNegativeValues) {
    const Variable w = leaf({1.0F, 2.0F});
    const Variable b = leaf({3.0F});
    Adam adam({{"w", w}, {"b", b}}, {.learning_rate = 0.1});
    set_gradient(w, {0.1F, 0.2F});
    set_gradient(b, {0.3F});
    adam.step();
    const AdamState clean = adam.state();
    using Field = std::vector<float> AdamState::*;
    const std::vector<Field> fields = {&AdamState::parameter_values, &AdamState::first_moments,
                                       &AdamState::second_moments};
    std::vector<AdamState> invalid;
    for (const Field field : fields) {
        AdamState shorter = clean;
        (shorter.*field).pop_back();
        invalid.push_back(shorter);
        AdamState longer = clean;
        (longer.*field).push_back(0.0F);
        invalid.push_back(longer);
        for (const float bad : {float_nan, float_infinity, -float_infinity}) {
            AdamState non_finite = clean;
            (non_finite.*field)[1] = bad;
            invalid.push_back(non_finite);
        }
    }
    AdamState negative = clean;
    negative.second_moments[2] = -1e-6F;
    invalid.push_back(negative);
    const OptimizerSnapshot before = snapshot(adam);
    for (const AdamState& state : invalid) {
        EXPECT_THROW(adam.load_state(state), std::invalid_argument);
        EXPECT_TRUE(unchanged(before, adam));
        EXPECT_TRUE(same_state(adam.state(), clean));
    }
}

TEST(AdamState, LoadRejectsBetaPowersInconsistentWithTheStepCount) {
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    const AdamState clean = adam.state();
    const auto with = [&](std::uint64_t step, double power1, double power2) {
        AdamState state = clean;
        state.step_count = step;
        state.beta1_power = power1;
        state.beta2_power = power2;
        return state;
    };
    const double p1 = std::pow(0.9, 3);
    const double p2 = std::pow(0.999, 3);
    const std::vector<AdamState> invalid = {
        with(0, 0.9, 1.0),                            // t = 0 needs exactly 1
        with(0, 1.0, 1.0 - 1e-16),                    // ... for both
        with(3, 1.0, p2),                             // exactly 1 after a step
        with(3, p1, 1.0),                             //
        with(3, -p1, p2),                             // outside [0, 1]
        with(3, p1, 1.5),                             //
        with(3, quiet_nan, p2),                       //
        with(3, p1 * (1.0 + 1e-11), p2),              // off by 1e-11 relative
        with(3, p1, p2 * (1.0 - 1e-11)),              //
        with(3, 0.9, p2),                             // the power of another step count
        with(20000, 1e-300, std::pow(0.999, 20000)),  // 0.9^20000 underflows; 1e-300 > DBL_MIN
    };
    const OptimizerSnapshot before = snapshot(adam);
    for (const AdamState& state : invalid) {
        EXPECT_THROW(adam.load_state(state), std::invalid_argument)
            << "t=" << state.step_count << " " << state.beta1_power << " " << state.beta2_power;
        EXPECT_TRUE(unchanged(before, adam));
    }
    EXPECT_TRUE(same_state(adam.state(), clean));
}

TEST(AdamState, LoadAcceptsPowersWithinTheToleranceAndUnderflowedPowers) {
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    AdamState state = adam.state();
    state.step_count = 3;
    state.beta1_power = std::pow(0.9, 3) * (1.0 + 1e-13);
    state.beta2_power = std::pow(0.999, 3) * (1.0 - 1e-13);
    EXPECT_NO_THROW(adam.load_state(state));
    // 0.9^20000 is far below DBL_MIN: 0 and DBL_MIN itself are both accepted.
    state.step_count = 20000;
    state.beta2_power = std::pow(0.999, 20000);  // 2.0e-9, still normal: must match
    for (const double underflowed : {0.0, DBL_MIN, DBL_MIN / 4}) {
        state.beta1_power = underflowed;
        EXPECT_NO_THROW(adam.load_state(state)) << underflowed;
    }
    // The next step uses c1 = 1 − 0.9^20001 = 1.
    set_gradient(w, {0.1F, 0.2F});
    EXPECT_EQ(adam.step().step, 20001U);
}

TEST(AdamState, LoadCommitsValuesMomentsCountersAndClearsGradients) {
    const Variable w = leaf({1.0F, 2.0F});
    Adam adam({{"w", w}});
    AdamState state;
    state.step_count = 2;
    state.beta1_power = 0.81;
    state.beta2_power = 0.998001;
    state.parameter_values = {5.0F, -6.0F};
    state.first_moments = {0.25F, -0.5F};
    state.second_moments = {0.125F, 0.0F};
    adam.load_state(state);
    EXPECT_EQ(w.version(), 1U);
    EXPECT_FALSE(w.has_gradient());
    EXPECT_EQ(adam.step_count(), 2U);
    EXPECT_TRUE(testing::bit_identical(w.value().to_host(), {5.0F, -6.0F}));
    EXPECT_TRUE(same_state(adam.state(), state));
}

TEST(AdamState, CaptureRejectsNonFiniteValuesWithDomainError) {
    Variable w = leaf({1.0F, 2.0F});
    const Adam adam({{"w", w}});
    w.set_value(Tensor({2}, {1.0F, float_nan}));
    EXPECT_THROW(static_cast<void>(adam.state()), std::domain_error);
}

// ---------------------------------------------------------------------------------------------
// Memory

TEST(AdamMemory, StepWritesInPlaceWithoutCopiesOfParametersOrMoments) {
    // Three 4 MiB parameters (12 MiB) and their moments (24 MiB). The step allocates no tensor:
    // the peak stays within a small fraction of a single parameter, and the released gradients
    // lower the live bytes by 12 MiB.
    constexpr std::size_t count = std::size_t{1} << 20U;
    constexpr std::size_t parameter_bytes = 3 * count * sizeof(float);
    std::vector<Variable> parameters;
    ParameterList list;
    for (std::uint32_t i = 0; i < 3; ++i) {
        parameters.push_back(leaf({count}, 60U + i));
        list.push_back({std::string("p").append(std::to_string(i)), parameters.back()});
    }
    Adam adam(list);
    for (std::uint32_t i = 0; i < 3; ++i) {
        set_random_gradient(parameters[i], 70U + i);
    }
    const std::size_t live_before = cpu_memory_statistics().live_bytes;
    reset_cpu_peak_memory();
    adam.step();
    const CpuMemoryStatistics after = cpu_memory_statistics();
    const std::size_t extra = after.peak_live_bytes - live_before;
    EXPECT_LT(extra, count * sizeof(float) / 16) << "transient bytes " << extra;
    EXPECT_LE(after.live_bytes + parameter_bytes, live_before);
}

}  // namespace
}  // namespace riftco_transformer
