// Adam across backends (docs/ARCHITECTURE.md, 'Adam'), against the test-only library variant
// in which ExecutionBackend::Metal is an emulated device (host memory, CPU kernels, its own
// storage identity): the optimizer captures its parameters' backend, keeps its moments
// there, rejects mixed backends at construction and a parameter moved after construction at
// step (std::invalid_argument, nothing changed), and its logical state moves between
// backends. global_gradient_norm reports mixed backends as std::logic_error.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/autograd/node.hpp"
#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

class EmulatedAdam : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(execution_backend_available(metal));
        ASSERT_EQ(current_execution_backend(), cpu);
    }
    void TearDown() override { set_execution_backend(cpu); }
};

Variable leaf(Shape shape, std::uint32_t seed, ExecutionBackend backend) {
    const std::vector<float> values =
        testing::pseudo_random(checked_element_count(shape), -1.0F, 1.0F, seed);
    return Variable(Tensor(std::move(shape), std::span<const float>(values), backend));
}

// d/dp Σ(p ⊙ c) = c, computed on the parameter's backend.
void set_gradient(const Variable& parameter, std::uint32_t seed) {
    const std::vector<float> values =
        testing::pseudo_random(parameter.value().numel(), -1.0F, 1.0F, seed);
    const Variable constant(
        Tensor(parameter.shape(), std::span<const float>(values), parameter.backend()), false);
    Variable loss = sum(parameter * constant);
    loss.backward();
}

std::vector<float> host_values(const std::vector<Variable>& parameters) {
    std::vector<float> all;
    for (const Variable& p : parameters) {
        const std::vector<float> values = p.value().to_host();
        all.insert(all.end(), values.begin(), values.end());
    }
    return all;
}

TEST_F(EmulatedAdam, RunsOnTheDeviceAndMatchesTheCpuBitForBit) {
    std::vector<std::vector<float>> results;
    std::vector<AdamState> states;
    for (const ExecutionBackend backend : {cpu, metal}) {
        const Variable w = leaf({6, 5}, 1U, backend);
        const Variable b = leaf({5}, 2U, backend);
        Adam adam({{"w", w}, {"b", b}}, {.learning_rate = 0.01, .weight_decay = 0.1});
        EXPECT_EQ(adam.backend(), backend);
        for (std::uint32_t step = 0; step < 3; ++step) {
            set_gradient(w, 10U + step);
            set_gradient(b, 20U + step);
            adam.step();
            EXPECT_EQ(w.backend(), backend);
        }
        results.push_back(host_values({w, b}));
        states.push_back(adam.state());
    }
    EXPECT_TRUE(testing::bit_identical(results[0], results[1]));
    EXPECT_TRUE(testing::bit_identical(states[0].first_moments, states[1].first_moments));
    EXPECT_TRUE(testing::bit_identical(states[0].second_moments, states[1].second_moments));
}

TEST_F(EmulatedAdam, ConstructionRejectsParametersOnDifferentBackends) {
    const Variable on_cpu = leaf({3}, 1U, cpu);
    const Variable on_metal = leaf({3}, 2U, metal);
    EXPECT_THROW(Adam({{"cpu", on_cpu}, {"metal", on_metal}}), std::invalid_argument);
    EXPECT_THROW(Adam({{"metal", on_metal}, {"cpu", on_cpu}}), std::invalid_argument);
    EXPECT_EQ(on_cpu.backend(), cpu);
    EXPECT_EQ(on_metal.backend(), metal);
}

TEST_F(EmulatedAdam, ConstructionRejectsAGradientOnAnotherBackend) {
    const Variable w = leaf({3}, 1U, cpu);
    w.node()->gradient = Tensor({3}, 0.5F, metal);  // bypasses backward's backend rule
    EXPECT_THROW(Adam({{"w", w}}), std::invalid_argument);
    EXPECT_EQ(w.node()->gradient.backend(), metal);
}

TEST_F(EmulatedAdam, AParameterMovedAfterConstructionIsRejectedChangingNothing) {
    const Variable a = leaf({4}, 1U, cpu);
    const Variable b = leaf({4}, 2U, cpu);
    Adam adam({{"a", a}, {"b", b}});
    set_gradient(a, 3U);
    adam.step();
    const AdamState clean = adam.state();
    // A backend move replaces the leaf's value with a copy on the other backend.
    b.node()->value = b.value().to(metal);
    set_gradient(a, 4U);
    const std::vector<float> a_before = a.value().to_host();
    const std::vector<float> a_gradient = a.gradient().to_host();
    const std::vector<float> b_before = b.value().to_host();
    const std::uint64_t a_version = a.version();
    EXPECT_THROW(adam.step(), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(a.value().to_host(), a_before));
    EXPECT_TRUE(testing::bit_identical(a.gradient().to_host(), a_gradient));
    EXPECT_TRUE(testing::bit_identical(b.value().to_host(), b_before));
    EXPECT_EQ(b.backend(), metal);
    EXPECT_EQ(a.version(), a_version);
    EXPECT_EQ(adam.step_count(), 1U);
    // State capture and restore apply the same parameter checks.
    adam.zero_gradients();
    EXPECT_THROW(static_cast<void>(adam.state()), std::invalid_argument);
    EXPECT_THROW(adam.load_state(clean), std::invalid_argument);
    EXPECT_EQ(a.version(), a_version);
    EXPECT_TRUE(testing::bit_identical(b.value().to_host(), b_before));
    // Moved back, the optimizer carries on from the state it had.
    b.node()->value = b.value().to(cpu);
    const AdamState now = adam.state();
    EXPECT_TRUE(testing::bit_identical(now.first_moments, clean.first_moments));
    EXPECT_TRUE(testing::bit_identical(now.second_moments, clean.second_moments));
    EXPECT_EQ(now.beta1_power, clean.beta1_power);
}

TEST_F(EmulatedAdam, StepRejectsAGradientOnAnotherBackend) {
    const Variable w = leaf({3}, 1U, cpu);
    Adam adam({{"w", w}});
    w.node()->gradient = Tensor({3}, 0.5F, metal);
    EXPECT_THROW(adam.step(), std::invalid_argument);
    EXPECT_EQ(adam.step_count(), 0U);
    EXPECT_EQ(w.version(), 0U);
    EXPECT_EQ(w.node()->gradient.backend(), metal);
}

TEST_F(EmulatedAdam, StateCapturedOnTheCpuResumesOnTheDevice) {
    const Variable cpu_w = leaf({7}, 1U, cpu);
    Adam on_cpu({{"w", cpu_w}}, {.learning_rate = 0.05});
    for (std::uint32_t step = 0; step < 2; ++step) {
        set_gradient(cpu_w, 10U + step);
        on_cpu.step();
    }
    const Variable metal_w = leaf({7}, 9U, metal);
    AdamOptions paged;
    paged.learning_rate = 0.05;
    paged.state_storage = AdamStateStorage::Paged;
    paged.page_size = 2;
    Adam on_metal({{"w", metal_w}}, paged);
    on_metal.load_state(on_cpu.state());
    EXPECT_EQ(metal_w.backend(), metal);
    for (std::uint32_t step = 2; step < 5; ++step) {
        set_gradient(cpu_w, 10U + step);
        set_gradient(metal_w, 10U + step);
        on_cpu.step();
        on_metal.step();
    }
    EXPECT_TRUE(testing::bit_identical(cpu_w.value().to_host(), metal_w.value().to_host()));
}

TEST_F(EmulatedAdam, GlobalGradientNormRejectsMixedBackendsWithLogicError) {
    const Variable on_cpu = leaf({3}, 1U, cpu);
    const Variable on_metal = leaf({3}, 2U, metal);
    set_gradient(on_cpu, 3U);
    set_gradient(on_metal, 4U);
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"cpu", on_cpu}, {"metal", on_metal}})),
                 std::logic_error);
    // On one backend the norm works, and agrees between the backends.
    const Variable twin = leaf({3}, 1U, cpu);
    twin.node()->gradient = on_metal.gradient().to(cpu);
    EXPECT_EQ(global_gradient_norm({{"metal", on_metal}}), global_gradient_norm({{"twin", twin}}));
    // A gradient on another backend than its value.
    twin.node()->gradient = Tensor({3}, 1.0F, metal);
    EXPECT_THROW(static_cast<void>(global_gradient_norm({{"twin", twin}})), std::logic_error);
}

}  // namespace
}  // namespace riftco_transformer
