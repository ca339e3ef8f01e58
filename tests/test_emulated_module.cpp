// Module backend moves (docs/ARCHITECTURE.md, 'Modules and initialisation') against the test-only
// library variant in which ExecutionBackend::Metal is an emulated device (host memory, CPU kernels,
// its own storage identity): to(backend) moves every parameter that is elsewhere (values kept,
// version bumped, gradient cleared, older graphs stale) and leaves the ones already there
// untouched; modules built under a scoped backend live there; a model computes the same logits on
// either side.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/module.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

// Every test starts and ends with the thread on the CPU, even after a failed assertion.
class EmulatedModule : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(execution_backend_available(metal));
        ASSERT_EQ(current_execution_backend(), cpu);
    }
    void TearDown() override { set_execution_backend(cpu); }
};

TransformerDimensions small_dimensions() {
    return {.vocabulary_size = 13,
            .maximum_context = 8,
            .model_width = 8,
            .head_count = 2,
            .block_count = 2,
            .feed_forward_width = 12};
}

// Two parameters on explicitly chosen backends: "first" [3] and "second" [2,2].
class MixedPlacement final : public Module {
  public:
    MixedPlacement(ExecutionBackend first, ExecutionBackend second) {
        static_cast<void>(register_parameter("first", Tensor({3}, {1.0F, 2.0F, 3.0F}, first)));
        static_cast<void>(
            register_parameter("second", Tensor({2, 2}, {4.0F, 5.0F, 6.0F, 7.0F}, second)));
    }
};

// Σ over every parameter of Σ its elements (gradients of ones), on the parameters' backends.
Variable sum_of_all(const ParameterList& list) {
    Variable total = sum(list.front().parameter);
    for (std::size_t i = 1; i < list.size(); ++i)
        total = total + sum(list[i].parameter);
    return total;
}

}  // namespace

TEST_F(EmulatedModule, MovingToMetalMovesEveryParameterAndClearsItsGradient) {
    std::mt19937 generator(3U);
    DecoderOnlyTransformer model(small_dimensions(), generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 4, 13, 1U);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 4, 13, 2U);
    cross_entropy(model.forward(tokens, {2, 4}), targets).backward();
    // A graph built before the move.
    Variable stale = cross_entropy(model.forward(tokens, {2, 4}), targets);

    const ParameterList list = model.parameters();
    std::vector<std::vector<float>> values;
    std::vector<std::uint64_t> versions;
    std::vector<const void*> identities;
    for (const NamedParameter& named : list) {
        ASSERT_TRUE(named.parameter.has_gradient()) << named.name;
        values.push_back(named.parameter.value().to_host());
        versions.push_back(named.parameter.version());
        identities.push_back(named.parameter.node().get());
    }

    model.to(metal);

    EXPECT_EQ(model.backend(), metal);
    const ParameterList moved = model.parameters();
    ASSERT_EQ(moved.size(), list.size());
    for (std::size_t i = 0; i < moved.size(); ++i) {
        const Variable& p = moved[i].parameter;
        EXPECT_EQ(moved[i].name, list[i].name);
        EXPECT_EQ(p.node().get(), identities[i]) << "the same leaf, moved in place";
        EXPECT_EQ(p.backend(), metal) << moved[i].name;
        EXPECT_EQ(p.value().backend(), metal) << moved[i].name;
        EXPECT_TRUE(testing::bit_identical(p.value().to_host(), values[i])) << moved[i].name;
        EXPECT_GT(p.version(), versions[i]) << moved[i].name;
        EXPECT_FALSE(p.has_gradient()) << moved[i].name;
        EXPECT_TRUE(p.requires_gradient()) << moved[i].name;
    }
    // Handles taken before the move (the old list) see the moved leaves.
    EXPECT_EQ(list[0].parameter.backend(), metal);

    // The graph built before the move is stale: backward fails and publishes nothing.
    EXPECT_THROW(stale.backward(), std::logic_error);
    for (const NamedParameter& named : model.parameters()) {
        EXPECT_FALSE(named.parameter.has_gradient()) << named.name;
    }
}

TEST_F(EmulatedModule, ASecondMoveToMetalTouchesNothing) {
    std::mt19937 generator(4U);
    Linear layer(3, 2, generator);
    layer.to(metal);
    const ParameterList list = layer.parameters();
    Variable total = sum_of_all(list);
    total.backward();
    Variable pending = sum_of_all(list);
    std::vector<std::uint64_t> versions;
    for (const NamedParameter& named : list)
        versions.push_back(named.parameter.version());

    layer.to(metal);

    for (std::size_t i = 0; i < list.size(); ++i) {
        EXPECT_EQ(list[i].parameter.version(), versions[i]) << list[i].name;
        EXPECT_EQ(list[i].parameter.backend(), metal) << list[i].name;
        EXPECT_TRUE(list[i].parameter.has_gradient()) << list[i].name;
    }
    EXPECT_NO_THROW(pending.backward());
}

TEST_F(EmulatedModule, OnlyParametersElsewhereAreMoved) {
    MixedPlacement module(metal, cpu);
    EXPECT_EQ(module.backend(), metal) << "the first parameter's backend";
    const ParameterList list = module.parameters();
    Variable total = sum(list[0].parameter);
    total.backward();
    const std::uint64_t first_version = list[0].parameter.version();
    const std::uint64_t second_version = list[1].parameter.version();

    module.to(metal);

    EXPECT_EQ(list[0].parameter.version(), first_version) << "already there: untouched";
    EXPECT_TRUE(list[0].parameter.has_gradient());
    EXPECT_TRUE(testing::all_close(list[0].parameter.gradient(), {1.0, 1.0, 1.0}));
    EXPECT_GT(list[1].parameter.version(), second_version);
    EXPECT_EQ(list[1].parameter.backend(), metal);
    EXPECT_TRUE(testing::all_close(list[1].parameter.value(), {4.0, 5.0, 6.0, 7.0}));

    // And back: only the two Metal parameters move.
    module.to(cpu);
    for (const NamedParameter& named : list)
        EXPECT_EQ(named.parameter.backend(), cpu);
    EXPECT_GT(list[0].parameter.version(), first_version);
    EXPECT_FALSE(list[0].parameter.has_gradient());
    EXPECT_TRUE(testing::all_close(list[0].parameter.value(), {1.0, 2.0, 3.0}));
}

TEST_F(EmulatedModule, AModelBuiltUnderAScopedBackendLivesThere) {
    std::mt19937 generator(5U);
    std::unique_ptr<DecoderOnlyTransformer> model;
    {
        const ScopedExecutionBackend scope(metal);
        model = std::make_unique<DecoderOnlyTransformer>(small_dimensions(), generator);
    }
    EXPECT_EQ(current_execution_backend(), cpu);
    EXPECT_EQ(model->backend(), metal);
    for (const NamedParameter& named : model->parameters()) {
        EXPECT_EQ(named.parameter.backend(), metal) << named.name;
    }
    // The same seed gives the same values on either backend.
    std::mt19937 cpu_generator(5U);
    const DecoderOnlyTransformer on_cpu(small_dimensions(), cpu_generator);
    const ParameterList a = model->parameters();
    const ParameterList b = on_cpu.parameters();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(a[i].parameter.value().to_host(),
                                           b[i].parameter.value().to_host()))
            << a[i].name;
    }
}

TEST_F(EmulatedModule, AModelComputesTheSameLogitsAndGradientsOnMetalAsOnCpu) {
    std::mt19937 cpu_generator(6U);
    std::mt19937 metal_generator(6U);
    const DecoderOnlyTransformer on_cpu(small_dimensions(), cpu_generator);
    DecoderOnlyTransformer on_metal(small_dimensions(), metal_generator);
    on_metal.to(metal);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(3 * 6, 13, 7U);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(3 * 6, 13, 8U);

    // The thread default stays on the CPU: the model runs on its parameters' backend.
    const Variable cpu_logits = on_cpu.forward(tokens, {3, 6});
    const Variable metal_logits = on_metal.forward(tokens, {3, 6});
    EXPECT_EQ(metal_logits.backend(), metal);
    EXPECT_EQ(metal_logits.shape(), (Shape{3, 6, 13}));
    EXPECT_TRUE(testing::all_close(metal_logits.value(),
                                   testing::to_double(cpu_logits.value().to_host()), 1e-6, 1e-6));

    cross_entropy(cpu_logits, targets).backward();
    cross_entropy(metal_logits, targets).backward();
    const ParameterList a = on_metal.parameters();
    const ParameterList b = on_cpu.parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].parameter.gradient().backend(), metal) << a[i].name;
        EXPECT_TRUE(testing::all_close(a[i].parameter.gradient(),
                                       testing::to_double(b[i].parameter.gradient().to_host()),
                                       1e-6, 1e-6))
            << a[i].name;
    }
}

TEST_F(EmulatedModule, AModelBuiltOnMetalRunsWithTheThreadOnEitherBackend) {
    std::mt19937 generator(9U);
    std::unique_ptr<DecoderOnlyTransformer> model;
    {
        const ScopedExecutionBackend scope(metal);
        model = std::make_unique<DecoderOnlyTransformer>(small_dimensions(), generator);
    }
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 5, 13, 10U);
    const std::vector<float> with_cpu_default = model->forward(tokens, {2, 5}).value().to_host();
    std::vector<float> with_metal_default;
    {
        const ScopedExecutionBackend scope(metal);
        const Variable logits = model->forward(tokens, {2, 5});
        EXPECT_EQ(logits.backend(), metal);
        with_metal_default = logits.value().to_host();
    }
    EXPECT_TRUE(testing::bit_identical(with_cpu_default, with_metal_default));
}

}  // namespace riftco_transformer
