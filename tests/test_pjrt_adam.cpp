// Adam on the PJRT device (src/core/backend/pjrt/adam.cpp) against the CPU reference, through
// the public optimizer API and tensor_ops/optimizer.hpp.
//
// Tolerances:
// - Without clipping (s = 1 exactly on both sides) every θ', m', v' is bit-identical to the
//   CPU: the device evaluates the same f64 expression with no fused multiply-add and exact
//   float-denormal conversions, so the tests require it.
// - The gradient sum of squares is summed in f64 in another order than the CPU's blocked dot
//   product: ‖g‖ within 1e-12 relative (the f64 rounding of a few thousand terms is ~1e-15).
//   With clipping active, s = G_max/‖g‖ inherits that difference, which changes a float
//   result only when its f64 value lies within ~1e-15 of a rounding boundary; values and
//   moments are held to 1e-6 relative (+1e-12 absolute), a few float ulps at most.
// - First non-finite elements (tensor, element, value) and error messages are exact.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "riftco_transformer/optim/gradient_norm.hpp"
#include "support/pjrt_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using test::close_to;
using test::pjrt_test_backend;
using test::uniform_values;

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr double norm_tolerance = 1e-12;   // relative, ‖g‖ and the clip factor
constexpr double clipped_relative = 1e-6;  // θ', m', v' under a clip factor
constexpr double clipped_absolute = 1e-12;
constexpr std::size_t result_bytes = 22 * 4;  // the step check's result words

class PjrtAdam : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }
    ExecutionBackend device = pjrt_test_backend();
};

struct ParameterSpec {
    std::string name;
    Shape shape;
};

// Shapes that cover one block, several blocks of the 4096-element norm partials with a
// short last one, and tiny tensors.
const std::vector<ParameterSpec> model_shapes = {
    {"embedding", {37, 129}},  // 4773: two norm blocks, five pages of 1000
    {"projection", {9000}},    // three norm blocks
    {"bias", {7}},
    {"scale", {3, 4}},
};

ParameterList make_parameters(const std::vector<ParameterSpec>& specs, ExecutionBackend backend) {
    ParameterList parameters;
    unsigned seed = 1;
    for (const ParameterSpec& spec : specs) {
        const std::vector<float> values =
            uniform_values(checked_element_count(spec.shape), -1.0F, 1.0F, seed++);
        parameters.push_back(
            {spec.name, Variable(Tensor(spec.shape, std::span<const float>(values), backend))});
    }
    return parameters;
}

void set_gradient(Variable parameter, const std::vector<float>& values) {
    parameter.set_gradient(
        Tensor(parameter.shape(), std::span<const float>(values), parameter.backend()));
}

// The gradients of step `step`: uniform in [-amplitude, amplitude), the same on both sides.
void set_gradients(const ParameterList& parameters, unsigned step, float amplitude) {
    unsigned seed = 100 * (step + 1);
    for (const NamedParameter& entry : parameters) {
        set_gradient(entry.parameter, uniform_values(entry.parameter.value().numel(), -amplitude,
                                                     amplitude, seed++));
    }
}

std::vector<float> values_of(const ParameterList& parameters) {
    std::vector<float> all;
    for (const NamedParameter& entry : parameters) {
        const std::vector<float> values = entry.parameter.value().to_host();
        all.insert(all.end(), values.begin(), values.end());
    }
    return all;
}

AdamOptions clipped_decayed(AdamStateStorage storage) {
    AdamOptions options;
    options.learning_rate = 0.01;
    options.weight_decay = 0.1;
    options.maximum_gradient_norm = 1.0;
    options.state_storage = storage;
    options.page_size = 1000;
    return options;
}

struct TrainingRun {
    std::vector<AdamStepStats> steps;
    std::vector<float> values;
    AdamState state;
};

TrainingRun train(ExecutionBackend backend, const AdamOptions& options, unsigned steps,
                  float amplitude) {
    const ParameterList parameters = make_parameters(model_shapes, backend);
    Adam adam(parameters, options);
    TrainingRun run;
    for (unsigned step = 0; step < steps; ++step) {
        set_gradients(parameters, step, amplitude);
        run.steps.push_back(adam.step());
        for (const NamedParameter& entry : parameters) {
            EXPECT_EQ(entry.parameter.backend(), backend);
        }
    }
    run.values = values_of(parameters);
    run.state = adam.state();
    return run;
}

void expect_clipped_parity(const TrainingRun& device, const TrainingRun& reference) {
    ASSERT_EQ(device.steps.size(), reference.steps.size());
    for (std::size_t i = 0; i < device.steps.size(); ++i) {
        EXPECT_LT(reference.steps[i].clip_scale, 1.0) << "clipping is active at step " << i;
        EXPECT_NEAR(device.steps[i].gradient_norm, reference.steps[i].gradient_norm,
                    norm_tolerance * reference.steps[i].gradient_norm);
        EXPECT_NEAR(device.steps[i].clip_scale, reference.steps[i].clip_scale,
                    norm_tolerance * reference.steps[i].clip_scale);
        EXPECT_EQ(device.steps[i].step, reference.steps[i].step);
        EXPECT_EQ(device.steps[i].learning_rate, reference.steps[i].learning_rate);
    }
    EXPECT_TRUE(close_to(device.values, reference.values, clipped_absolute, clipped_relative));
    EXPECT_TRUE(close_to(device.state.first_moments, reference.state.first_moments,
                         clipped_absolute, clipped_relative));
    EXPECT_TRUE(close_to(device.state.second_moments, reference.state.second_moments,
                         clipped_absolute, clipped_relative));
    EXPECT_EQ(device.state.step_count, reference.state.step_count);
}

TEST_F(PjrtAdam, ClippedDecayedStepsMatchTheCpuWithContiguousMoments) {
    const AdamOptions options = clipped_decayed(AdamStateStorage::Contiguous);
    expect_clipped_parity(train(device, options, 6, 2.0F), train(cpu, options, 6, 2.0F));
}

TEST_F(PjrtAdam, ClippedDecayedStepsMatchTheCpuWithPagedMoments) {
    const AdamOptions options = clipped_decayed(AdamStateStorage::Paged);
    const TrainingRun on_device = train(device, options, 6, 2.0F);
    expect_clipped_parity(on_device, train(cpu, options, 6, 2.0F));
    // Both layouts give the same logical result on the CPU, so the paged device run also
    // matches the contiguous CPU run.
    expect_clipped_parity(on_device,
                          train(cpu, clipped_decayed(AdamStateStorage::Contiguous), 6, 2.0F));
}

TEST_F(PjrtAdam, UnclippedStepsAreBitIdenticalToTheCpuInBothLayouts) {
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        AdamOptions options = clipped_decayed(storage);
        options.maximum_gradient_norm = std::numeric_limits<double>::infinity();
        const TrainingRun on_device = train(device, options, 5, 2.0F);
        const TrainingRun reference = train(cpu, options, 5, 2.0F);
        for (std::size_t i = 0; i < reference.steps.size(); ++i) {
            EXPECT_EQ(on_device.steps[i].clip_scale, 1.0);
            EXPECT_NEAR(on_device.steps[i].gradient_norm, reference.steps[i].gradient_norm,
                        norm_tolerance * reference.steps[i].gradient_norm);
        }
        EXPECT_TRUE(testing::bit_identical(on_device.values, reference.values));
        EXPECT_TRUE(
            testing::bit_identical(on_device.state.first_moments, reference.state.first_moments));
        EXPECT_TRUE(
            testing::bit_identical(on_device.state.second_moments, reference.state.second_moments));
    }
}

TEST_F(PjrtAdam, FloatDenormalMomentsAndValuesAreBitIdenticalToTheCpu) {
    // g = ±3e-20 gives v' = (1−β2)·g² ≈ 9e-43, a float denormal; values near 1e-40 are
    // denormal too. The device's converts flush denormals, the program must not.
    std::vector<std::vector<float>> values;
    std::vector<AdamState> states;
    for (const ExecutionBackend backend : {device, cpu}) {
        std::vector<float> start(64);
        std::vector<float> gradient(64);
        for (std::size_t i = 0; i < start.size(); ++i) {
            start[i] = (i % 2 == 0 ? 1.0F : -1.0F) * 1e-40F * static_cast<float>(i + 1);
            gradient[i] = (i % 3 == 0 ? -3e-20F : 3e-20F) * static_cast<float>(i % 5 + 1);
        }
        const Variable w(Tensor({64}, std::span<const float>(start), backend));
        AdamOptions options;
        options.learning_rate = 1e-45;  // keeps θ' in the denormal range
        options.epsilon = 1e-8;
        Adam adam({{"w", w}}, options);
        for (int step = 0; step < 3; ++step) {
            set_gradient(w, gradient);
            adam.step();
        }
        values.push_back(w.value().to_host());
        states.push_back(adam.state());
    }
    EXPECT_TRUE(testing::bit_identical(values[0], values[1]));
    EXPECT_TRUE(testing::bit_identical(states[0].first_moments, states[1].first_moments));
    EXPECT_TRUE(testing::bit_identical(states[0].second_moments, states[1].second_moments));
    bool any_denormal = false;
    for (const float v : states[1].second_moments) {
        any_denormal = any_denormal || std::fpclassify(v) == FP_SUBNORMAL;
    }
    EXPECT_TRUE(any_denormal) << "the test must reach float denormal second moments";
}

TEST_F(PjrtAdam, AParameterWithoutAGradientMatchesTheCpu) {
    std::vector<TrainingRun> runs;
    for (const ExecutionBackend backend : {device, cpu}) {
        const ParameterList parameters = make_parameters(model_shapes, backend);
        Adam adam(parameters, clipped_decayed(AdamStateStorage::Paged));
        TrainingRun run;
        for (unsigned step = 0; step < 5; ++step) {
            set_gradients(parameters, step, 2.0F);
            if (step == 2 || step == 3) {
                Variable skipped = parameters[1].parameter;
                skipped.zero_gradient();  // backward never reached it
            }
            run.steps.push_back(adam.step());
        }
        run.values = values_of(parameters);
        run.state = adam.state();
        runs.push_back(std::move(run));
    }
    expect_clipped_parity(runs[0], runs[1]);
}

// The message and category of `step` on each backend; both must throw.
template <typename Error>
std::string message_of(Adam& adam) {
    try {
        adam.step();
    } catch (const Error& error) {
        return error.what();
    }
    ADD_FAILURE() << "the step did not throw the expected category";
    return {};
}

// Everything a failed step must leave as it was.
struct Snapshot {
    std::vector<float> values;
    std::vector<std::uint64_t> versions;
    std::uint64_t step_count;
    double beta1_power;

    static Snapshot of(const ParameterList& parameters, const Adam& adam) {
        Snapshot snapshot{values_of(parameters), {}, adam.step_count(), adam.beta1_power()};
        for (const NamedParameter& entry : parameters) {
            snapshot.versions.push_back(entry.parameter.version());
        }
        return snapshot;
    }
    void expect_unchanged(const ParameterList& parameters, const Adam& adam) const {
        const Snapshot now = of(parameters, adam);
        EXPECT_TRUE(testing::bit_identical(now.values, values));
        EXPECT_EQ(now.versions, versions);
        EXPECT_EQ(now.step_count, step_count);
        EXPECT_EQ(now.beta1_power, beta1_power);
    }
};

// One good step, then `spoil` on the next step's gradients; the step must fail on both
// backends with the same category and message and change nothing (moments included).
template <typename Error, typename Spoil>
void expect_rejected_like_the_cpu(ExecutionBackend device, AdamStateStorage storage,
                                  const AdamOptions& base, Spoil spoil,
                                  const std::string& expected) {
    std::vector<std::string> messages;
    for (const ExecutionBackend backend : {device, cpu}) {
        const ParameterList parameters = make_parameters(model_shapes, backend);
        AdamOptions options = base;
        options.state_storage = storage;
        options.page_size = 1000;
        Adam adam(parameters, options);
        set_gradients(parameters, 0, 2.0F);
        adam.step();
        const AdamState clean = adam.state();
        set_gradients(parameters, 1, 2.0F);
        std::vector<std::vector<float>> clean_values;
        for (const NamedParameter& entry : parameters) {
            clean_values.push_back(entry.parameter.value().to_host());
        }
        spoil(parameters);
        const Snapshot before = Snapshot::of(parameters, adam);
        std::vector<std::vector<float>> gradients;
        for (const NamedParameter& entry : parameters) {
            gradients.push_back(entry.parameter.gradient().to_host());
        }
        messages.push_back(message_of<Error>(adam));
        before.expect_unchanged(parameters, adam);
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            EXPECT_TRUE(
                testing::bit_identical(parameters[i].parameter.gradient().to_host(), gradients[i]));
        }
        // The moments, read once the values are finite again (state() requires it).
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            Variable parameter = parameters[i].parameter;
            parameter.set_value(
                Tensor(parameter.shape(), std::span<const float>(clean_values[i]), backend));
        }
        const AdamState after = adam.state();
        EXPECT_TRUE(testing::bit_identical(after.first_moments, clean.first_moments));
        EXPECT_TRUE(testing::bit_identical(after.second_moments, clean.second_moments));
    }
    EXPECT_EQ(messages[0], messages[1]);
    EXPECT_NE(messages[1].find(expected), std::string::npos) << messages[1];
}

// Replaces element `element` of parameter `index`'s gradient by `value`.
auto spoil_gradient(std::size_t index, std::size_t element, float value) {
    return [=](const ParameterList& parameters) {
        Variable parameter = parameters[index].parameter;
        std::vector<float> gradient = parameter.gradient().to_host();
        gradient[element] = value;
        set_gradient(parameter, gradient);
    };
}

TEST_F(PjrtAdam, ANonFiniteGradientIsRejectedWithTheCpuErrorChangingNothing) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        const AdamOptions options = clipped_decayed(storage);
        // In the second norm block of the first tensor, in the last block of the second.
        expect_rejected_like_the_cpu<std::domain_error>(
            device, storage, options, spoil_gradient(0, 4500, nan),
            "Adam::step: the gradient of parameter 'embedding' has element 4500 = ");
        expect_rejected_like_the_cpu<std::domain_error>(
            device, storage, options, spoil_gradient(1, 8999, -inf),
            "the gradient of parameter 'projection' has element 8999 = ");
        // Two bad gradients: the first in list order is named.
        expect_rejected_like_the_cpu<std::domain_error>(
            device, storage, options,
            [&](const ParameterList& parameters) {
                spoil_gradient(3, 5, inf)(parameters);
                spoil_gradient(2, 6, nan)(parameters);
            },
            "parameter 'bias' has element 6 = ");
    }
}

TEST_F(PjrtAdam, AnUpdateThatOverflowsFloatIsRejectedWithTheCpuErrorChangingNothing) {
    // A huge rate pushes θ' past FLT_MAX in one element of the third page of the first
    // parameter: the overflow_error names that element of that parameter.
    AdamOptions options;
    options.learning_rate = 1e38;
    options.maximum_gradient_norm = std::numeric_limits<double>::infinity();
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        expect_rejected_like_the_cpu<std::overflow_error>(
            device, storage, options,
            [](const ParameterList& parameters) {
                // θ = −3e38 with a gradient that dominates m̂/√v̂ ≈ 0.74: θ' ≈ −3.7e38.
                Variable parameter = parameters[0].parameter;
                std::vector<float> values = parameter.value().to_host();
                std::vector<float> gradient = parameter.gradient().to_host();
                values[2345] = -3e38F;
                gradient[2345] = 1e6F;
                parameter.set_value(
                    Tensor({37, 129}, std::span<const float>(values), parameter.backend()));
                set_gradient(parameter, gradient);
            },
            "Adam::step: the update of parameter 'embedding' element 2345 is not finite");
    }
}

TEST_F(PjrtAdam, ANonFiniteValueIsRejectedWithTheCpuErrorChangingNothing) {
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        expect_rejected_like_the_cpu<std::domain_error>(
            device, storage, clipped_decayed(storage),
            [](const ParameterList& parameters) {
                Variable parameter = parameters[1].parameter;
                std::vector<float> values = parameter.value().to_host();
                const std::vector<float> gradient = parameter.gradient().to_host();
                values[4321] = std::numeric_limits<float>::infinity();
                parameter.set_value(
                    Tensor({9000}, std::span<const float>(values), parameter.backend()));
                set_gradient(parameter, gradient);
            },
            "Adam::step: the value of parameter 'projection' has element 4321 = inf");
    }
}

TEST_F(PjrtAdam, AStepReadsTheHostOnceAndCompilesOnlyOnItsFirstStep) {
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        const ParameterList parameters = make_parameters(model_shapes, device);
        Adam adam(parameters, clipped_decayed(storage));
        std::uint64_t compiles_after_first = 0;
        for (unsigned step = 0; step < 5; ++step) {
            set_gradients(parameters, step, 2.0F);
            const std::uint64_t reads = host_read_count();
            const auto before = test::pjrt_statistics();
            adam.step();
            const auto after = test::pjrt_statistics();
            EXPECT_EQ(host_read_count() - reads, 1U) << "step " << step;
            EXPECT_EQ(after.downloads - before.downloads, 1U) << "step " << step;
            EXPECT_EQ(after.bytes_to_host - before.bytes_to_host, result_bytes) << "step " << step;
            // Fused: the checking program's θ', m', v' are the ones applied (no second run).
            EXPECT_EQ(after.executions - before.executions, 1U) << "step " << step;
            if (step == 0) {
                compiles_after_first = after.compiles;
            } else {
                EXPECT_EQ(after.compiles, compiles_after_first) << "step " << step;
            }
        }
    }
}

TEST_F(PjrtAdam, ThousandsOfPagesCompileABoundedNumberOfProgramsAndMatchTheCpu) {
    // 3001 pages of 64 elements (and two shorter last pages): the step's compile count must
    // not grow with the page count, and the step still reads the host once.
    const std::vector<ParameterSpec> shapes = {
        {"table", {100, 960}},  // 1500 pages
        {"mixer", {96005}},     // 1500 pages and one of 5
        {"bias", {7}},          // one short page
    };
    AdamOptions options = clipped_decayed(AdamStateStorage::Paged);
    options.page_size = 64;
    std::vector<TrainingRun> runs;
    for (const ExecutionBackend backend : {device, cpu}) {
        const ParameterList parameters = make_parameters(shapes, backend);
        Adam adam(parameters, options);
        ASSERT_EQ(adam.state_page_count(), 3002U);
        TrainingRun run;
        const auto before = test::pjrt_statistics();
        for (unsigned step = 0; step < 3; ++step) {
            set_gradients(parameters, step, 2.0F);
            const std::uint64_t reads = host_read_count();
            const auto downloads = test::pjrt_statistics().downloads;
            run.steps.push_back(adam.step());
            if (backend == device) {
                EXPECT_EQ(host_read_count() - reads, 1U) << "step " << step;
                EXPECT_EQ(test::pjrt_statistics().downloads - downloads, 1U) << "step " << step;
            }
        }
        if (backend == device) {
            EXPECT_LE(test::pjrt_statistics().compiles - before.compiles, 8U);
        }
        run.values = values_of(parameters);
        run.state = adam.state();
        runs.push_back(std::move(run));
    }
    expect_clipped_parity(runs[0], runs[1]);
}

TEST_F(PjrtAdam, AStepGivesValuesNewStoragesThatNoCopyObserves) {
    const ParameterList parameters = make_parameters(model_shapes, device);
    Adam adam(parameters, clipped_decayed(AdamStateStorage::Paged));
    set_gradients(parameters, 0, 2.0F);
    const Tensor copy = parameters[0].parameter.value();  // shares the storage
    const std::vector<float> before = copy.to_host();
    adam.step();
    EXPECT_TRUE(testing::bit_identical(copy.to_host(), before));
    EXPECT_FALSE(testing::bit_identical(parameters[0].parameter.value().to_host(), before));
}

// ---- tensor_ops requests -------------------------------------------------------------------

std::vector<Tensor> tensors_on(ExecutionBackend backend,
                               const std::vector<std::vector<float>>& values) {
    std::vector<Tensor> tensors;
    for (const std::vector<float>& v : values) {
        tensors.emplace_back(Shape{v.size()}, std::span<const float>(v), backend);
    }
    return tensors;
}

// The list with entry `null_at` left null.
std::vector<const Tensor*> list_of(const std::vector<Tensor>& tensors, std::size_t null_at) {
    std::vector<const Tensor*> list;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        list.push_back(i == null_at ? nullptr : &tensors[i]);
    }
    return list;
}

TEST_F(PjrtAdam, GradientStatisticsMatchTheCpu) {
    const std::vector<std::vector<float>> values = {
        uniform_values(10000, -3.0F, 3.0F, 1),  // three blocks
        uniform_values(5, -1e30F, 1e30F, 2),    // squares past float range
        uniform_values(3, -1.0F, 1.0F, 3),      // skipped (null)
        std::vector<float>(4096, 2e-41F),       // denormals only
        uniform_values(4097, -1e-3F, 1e-3F, 4),
    };
    for (const std::size_t null_at : {std::size_t{2}, std::size_t{99}}) {
        const std::vector<Tensor> on_device = tensors_on(device, values);
        const std::vector<Tensor> on_cpu = tensors_on(cpu, values);
        const auto d = tensor_ops::gradient_statistics(device, list_of(on_device, null_at));
        const auto r = tensor_ops::gradient_statistics(cpu, list_of(on_cpu, null_at));
        EXPECT_EQ(d.first_non_finite.tensor, 5U);
        EXPECT_EQ(r.first_non_finite.tensor, 5U);
        EXPECT_EQ(d.squares.scale, r.squares.scale);
        EXPECT_NEAR(d.squares.scaled_squares, r.squares.scaled_squares,
                    norm_tolerance * r.squares.scaled_squares);
        EXPECT_NEAR(d.squares.norm(), r.squares.norm(), norm_tolerance * r.squares.norm());
    }
    // Only denormals: scale and Σx² are not flushed.
    const std::vector<Tensor> tiny = tensors_on(device, {values[3]});
    const std::vector<Tensor> tiny_cpu = tensors_on(cpu, {values[3]});
    const auto d = tensor_ops::gradient_statistics(device, list_of(tiny, 9));
    const auto r = tensor_ops::gradient_statistics(cpu, list_of(tiny_cpu, 9));
    EXPECT_GT(r.squares.norm(), 0.0);
    EXPECT_EQ(d.squares.scale, r.squares.scale);
    EXPECT_NEAR(d.squares.norm(), r.squares.norm(), norm_tolerance * r.squares.norm());
    // Nothing to sum: an empty list, or only nulls.
    const auto empty = tensor_ops::gradient_statistics(device, {});
    EXPECT_EQ(empty.first_non_finite.tensor, 0U);
    EXPECT_EQ(empty.squares.norm(), 0.0);
}

TEST_F(PjrtAdam, FirstNonFiniteNamesTheCpuTensorElementAndValue) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    struct Case {
        std::size_t tensor;
        std::size_t element;
        float value;
    };
    for (const Case bad : {Case{0, 0, nan}, Case{0, 9999, -inf}, Case{1, 4, inf},
                           Case{4, 4096, nan}, Case{4, 17, -inf}}) {
        std::vector<std::vector<float>> values = {
            uniform_values(10000, -3.0F, 3.0F, 1), uniform_values(5, -1.0F, 1.0F, 2),
            uniform_values(3, -1.0F, 1.0F, 3), uniform_values(7, -1.0F, 1.0F, 5),
            uniform_values(4097, -1.0F, 1.0F, 4)};
        values[bad.tensor][bad.element] = bad.value;
        values[2][1] = nan;     // in the null entry: never seen
        values[4][4000] = inf;  // a later bad element of tensor 4
        const std::vector<Tensor> on_device = tensors_on(device, values);
        const std::vector<Tensor> on_cpu = tensors_on(cpu, values);
        for (const bool squares : {false, true}) {
            const auto d = squares ? tensor_ops::gradient_statistics(device, list_of(on_device, 2))
                                         .first_non_finite
                                   : tensor_ops::first_non_finite(device, list_of(on_device, 2));
            const auto r =
                squares ? tensor_ops::gradient_statistics(cpu, list_of(on_cpu, 2)).first_non_finite
                        : tensor_ops::first_non_finite(cpu, list_of(on_cpu, 2));
            EXPECT_EQ(d.tensor, r.tensor);
            EXPECT_EQ(d.element, r.element);
            EXPECT_TRUE(testing::bit_identical({d.value}, {r.value}));
            EXPECT_EQ(d.tensor, bad.tensor);
        }
    }
    // global_gradient_norm is the same request through the optimizer's API.
    const ParameterList parameters = make_parameters(model_shapes, device);
    const ParameterList reference = make_parameters(model_shapes, cpu);
    set_gradients(parameters, 3, 1.0F);
    set_gradients(reference, 3, 1.0F);
    EXPECT_NEAR(global_gradient_norm(parameters), global_gradient_norm(reference),
                norm_tolerance * global_gradient_norm(reference));
}

// Slices that are not a whole parameter: a value read by two partial slices (one without a
// gradient) and a part left alone, applied with no check before it (the update program).
TEST_F(PjrtAdam, PartialSlicesWithoutAPriorCheckMatchTheCpu) {
    const tensor_ops::AdamUpdateScalars scalars{.beta1 = 0.9,
                                                .beta2 = 0.99,
                                                .bias_correction1 = 1.0 - 0.9 * 0.9,
                                                .bias_correction2 = 1.0 - 0.99 * 0.99,
                                                .learning_rate = 0.05,
                                                .epsilon = 1e-6,
                                                .clip_scale = 0.37,
                                                .decay_factor = 1.0 - 0.05 * 0.01};
    std::vector<std::vector<float>> results;
    for (const ExecutionBackend backend : {device, cpu}) {
        const std::vector<float> start = uniform_values(20, -1.0F, 1.0F, 1);
        const std::vector<float> gradient_values = uniform_values(20, -1.0F, 1.0F, 2);
        Tensor value({20}, std::span<const float>(start), backend);
        const Tensor gradient({20}, std::span<const float>(gradient_values), backend);
        std::vector<float> m0 = uniform_values(6, -0.1F, 0.1F, 3);
        std::vector<float> v0 = uniform_values(6, 0.0F, 0.1F, 4);
        Tensor m_a({6}, std::span<const float>(m0), backend);
        Tensor v_a({6}, std::span<const float>(v0), backend);
        Tensor m_b({4}, std::span<const float>(m0.data(), 4), backend);
        Tensor v_b({4}, std::span<const float>(v0.data(), 4), backend);
        // Listed out of offset order: [12, 16) without a gradient, then [2, 8).
        const tensor_ops::AdamSlice slices[] = {{&value, nullptr, 12, &m_b, &v_b},
                                                {&value, &gradient, 2, &m_a, &v_a}};
        const tensor_ops::AdamStepCheck check = tensor_ops::adam_step_check(
            backend, scalars, std::numeric_limits<double>::infinity(), {}, slices);
        EXPECT_EQ(check.check.value_slice, 2U);
        EXPECT_EQ(check.check.update_slice, 2U);
        // A different clip factor than the check saw: the device evaluates again.
        tensor_ops::adam_apply(backend, scalars, slices);
        std::vector<float> all = value.to_host();
        for (const Tensor* t : {&m_a, &v_a, &m_b, &v_b}) {
            const std::vector<float> part = t->to_host();
            all.insert(all.end(), part.begin(), part.end());
        }
        results.push_back(all);
        // The uncovered elements are untouched.
        for (const std::size_t i : {0, 1, 8, 11, 16, 19}) {
            EXPECT_EQ(all[i], start[i]) << i;
        }
    }
    EXPECT_TRUE(testing::bit_identical(results[0], results[1]));
}

// check_update (no statistics) finds the same slice and element as the CPU, through pages.
TEST_F(PjrtAdam, CheckUpdateNamesTheCpuSliceAndElement) {
    const detail::AdamCapability* device_adam = detail::find_backend_adapter(device)->adam();
    const detail::AdamCapability* cpu_adam = detail::find_backend_adapter(cpu)->adam();
    ASSERT_NE(device_adam, nullptr);
    const tensor_ops::AdamUpdateScalars scalars{.beta1 = 0.9,
                                                .beta2 = 0.999,
                                                .bias_correction1 = 0.1,
                                                .bias_correction2 = 0.001,
                                                .learning_rate = 1e38,
                                                .epsilon = 1e-8,
                                                .clip_scale = 1.0,
                                                .decay_factor = 1.0};
    std::vector<tensor_ops::AdamCheck> checks;
    for (const ExecutionBackend backend : {device, cpu}) {
        std::vector<float> start = uniform_values(30, -1.0F, 1.0F, 1);
        start[23] = -3e38F;                                   // θ' overflows in the third page
        start[27] = std::numeric_limits<float>::quiet_NaN();  // and θ is NaN in the fourth
        std::vector<float> gradient_values(30, 1.0F);
        Tensor value({30}, std::span<const float>(start), backend);
        const Tensor gradient({30}, std::span<const float>(gradient_values), backend);
        std::vector<Tensor> moments;  // (m, v) of pages [0, 8), [8, 16), [16, 24), [24, 30)
        for (int page = 0; page < 4; ++page) {
            const std::size_t count = page < 3 ? 8 : 6;
            moments.push_back(Tensor::zeros({count}, backend));
            moments.push_back(Tensor::zeros({count}, backend));
        }
        std::vector<tensor_ops::AdamSlice> slices;
        std::size_t offset = 0;
        for (int page = 0; page < 4; ++page) {
            const std::size_t count = moments[2 * page].numel();
            slices.push_back(
                {&value, &gradient, offset, &moments[2 * page], &moments[2 * page + 1]});
            offset += count;
        }
        const detail::AdamCapability* adam = backend == cpu ? cpu_adam : device_adam;
        checks.push_back(adam->check_update(scalars, slices));
    }
    EXPECT_EQ(checks[0].value_slice, checks[1].value_slice);
    EXPECT_EQ(checks[0].value_element, checks[1].value_element);
    EXPECT_TRUE(std::isnan(checks[0].value));
    EXPECT_EQ(checks[0].update_slice, checks[1].update_slice);
    EXPECT_EQ(checks[0].update_element, checks[1].update_element);
    EXPECT_EQ(checks[1].value_slice, 3U);
    EXPECT_EQ(checks[1].value_element, 3U);
    EXPECT_EQ(checks[1].update_slice, 2U);
}

}  // namespace
}  // namespace riftco_transformer
