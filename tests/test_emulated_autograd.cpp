// Autograd across backends (docs/ARCHITECTURE.md, 'Autograd' and 'Choosing a backend'), against the
// test-only library variant in which ExecutionBackend::Metal is an emulated device (host memory,
// CPU kernels, its own storage identity): a graph stays on its inputs' backend in both directions
// whatever the thread default is at backward time, and every mixed-backend rule (seed, operands,
// custom_gradient inputs and VJP results, checkpoint dependencies) is std::invalid_argument
// that changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {
namespace ops = tensor_ops;

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

// Every test starts and ends with the thread on the CPU, even after a failed assertion.
class EmulatedAutograd : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(execution_backend_available(metal));
        ASSERT_EQ(current_execution_backend(), cpu);
    }
    void TearDown() override { set_execution_backend(cpu); }
};

Tensor random_tensor(Shape shape, std::uint32_t seed, ExecutionBackend backend, float lo = -1.0F,
                     float hi = 1.0F) {
    const std::vector<float> values =
        testing::pseudo_random(checked_element_count(shape), lo, hi, seed);
    return Tensor(std::move(shape), std::span<const float>(values), backend);
}

// The leaves of a graph that exercises every differentiable operation.
struct ModelLeaves {
    Variable x;       // [2,3,4]
    Variable weight;  // [4,4]
    Variable bias;    // [4]
    Variable scale;   // [4]
    Variable shift;   // [4]
    Variable table;   // [5,4]
    Variable gate;    // [4]
};

ModelLeaves make_leaves(ExecutionBackend backend) {
    return {Variable(random_tensor({2, 3, 4}, 1U, backend)),
            Variable(random_tensor({4, 4}, 2U, backend)),
            Variable(random_tensor({4}, 3U, backend, -0.5F, 0.5F)),
            Variable(random_tensor({4}, 4U, backend, 0.5F, 1.5F)),
            Variable(random_tensor({4}, 5U, backend, -0.5F, 0.5F)),
            Variable(random_tensor({5, 4}, 6U, backend)),
            Variable(random_tensor({4}, 7U, backend))};
}

std::vector<Variable> leaf_list(const ModelLeaves& leaves) {
    return {leaves.x,     leaves.scale, leaves.weight, leaves.bias,
            leaves.shift, leaves.table, leaves.gate};
}

// A scalar loss through every differentiable operation; each intermediate is appended to
// `intermediates`.
Variable model_loss(const ModelLeaves& l, std::vector<Variable>& intermediates) {
    const auto keep = [&](Variable v) {
        intermediates.push_back(v);
        return v;
    };
    const std::vector<std::size_t> rows = {0, 2, 2, 4, 1, 3};
    const std::vector<std::uint32_t> targets = {0, 4, 2, 1, 3, 0};
    const Variable flat = keep(reshape(l.x, {6, 4}));
    const Variable projected =
        keep(keep(matmul(flat, l.weight)) + keep(broadcast_to(l.bias, {6, 4})));
    const Variable normed = keep(layer_norm(keep(gelu(projected)), l.scale, l.shift));
    const Variable gated = keep(normed * keep(silu(keep(broadcast_to(l.gate, {6, 4})))));
    const Variable positive = keep(keep(exp(gated)) + 0.5F);
    const Variable arithmetic =
        keep(keep(keep(sqrt(positive)) - keep(log(positive))) / keep(2.0F - keep(-positive)));
    const Variable mixed = keep(keep(keep(1.0F / positive) * 0.5F) + keep(relu(arithmetic)));
    const Variable embedded = keep(gather_rows(l.table, rows, {6}));
    const Variable joined =
        keep(concatenate_last_axis(keep(rms_norm(mixed, l.scale)), keep(erf(embedded))));
    const Variable cube = keep(permute(keep(reshape(joined, {2, 3, 8})), {1, 0, 2}));  // [3,2,8]
    const Variable probabilities = keep(softmax(cube, 2));
    const Variable window = keep(slice(probabilities, 2, 1, 5));  // [3,2,5]
    const Variable logits = keep(reshape(keep(window * 4.0F), {6, 5}));
    const Variable summary = keep(transpose_2d(keep(sum_to_shape(logits, {1, 5}))));  // [5,1]
    const Variable regulariser = keep(mean(keep(sum(summary, 1, true))));
    return keep(keep(cross_entropy(logits, targets)) + keep(regulariser * 0.1F) +
                keep(mean(keep(sum(flat, 0)), 0) / 3.0F));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Graphs stay on their backend

TEST_F(EmulatedAutograd, GraphOnMetalKeepsEveryValueAndLeafGradientOnMetal) {
    const ModelLeaves on_metal = make_leaves(metal);
    std::vector<Variable> metal_intermediates;
    Variable metal_loss = model_loss(on_metal, metal_intermediates);
    for (std::size_t i = 0; i < metal_intermediates.size(); ++i) {
        EXPECT_EQ(metal_intermediates[i].backend(), metal) << "intermediate " << i;
        EXPECT_EQ(metal_intermediates[i].value().backend(), metal) << "intermediate " << i;
    }
    metal_loss.backward();  // the implicit seed is created on the output's backend

    const ModelLeaves on_cpu = make_leaves(cpu);
    std::vector<Variable> cpu_intermediates;
    Variable cpu_loss = model_loss(on_cpu, cpu_intermediates);
    cpu_loss.backward();
    EXPECT_TRUE(testing::all_close(metal_loss.value(), {double{cpu_loss.value().item()}}));

    const std::vector<Variable> metal_leaves = leaf_list(on_metal);
    const std::vector<Variable> cpu_leaves = leaf_list(on_cpu);
    for (std::size_t i = 0; i < metal_leaves.size(); ++i) {
        SCOPED_TRACE("leaf " + std::to_string(i));
        EXPECT_EQ(metal_leaves[i].value().backend(), metal);
        ASSERT_TRUE(metal_leaves[i].has_gradient());
        EXPECT_EQ(metal_leaves[i].gradient().backend(), metal);
        EXPECT_TRUE(testing::all_close(metal_leaves[i].gradient(),
                                       testing::to_double(cpu_leaves[i].gradient().to_host())));
    }
}

TEST_F(EmulatedAutograd, MissingGradientOfAMetalLeafReadsAsZerosOnMetal) {
    Variable x(Tensor({2, 2}, 1.0F, metal));
    EXPECT_FALSE(x.has_gradient());
    const Tensor gradient = x.gradient();
    EXPECT_EQ(gradient.backend(), metal);
    EXPECT_TRUE(testing::all_close(gradient, {0.0, 0.0, 0.0, 0.0}));
}

namespace {

// y = matmul(a, b) for a [2,3,4], b [2,4,5] built on `backend`, and the seed w.
const std::vector<float> a_values = testing::pseudo_random(24, -1.0F, 1.0F, 11U);
const std::vector<float> b_values = testing::pseudo_random(40, -1.0F, 1.0F, 12U);
const std::vector<float> w_values = testing::pseudo_random(30, -1.5F, 1.5F, 13U);

struct MatmulReference {
    std::vector<double> a_gradient;
    std::vector<double> b_gradient;
};

// The same computation with CPU leaves.
MatmulReference cpu_matmul_reference() {
    Variable a(Tensor({2, 3, 4}, std::span<const float>(a_values), cpu));
    Variable b(Tensor({2, 4, 5}, std::span<const float>(b_values), cpu));
    Variable y = matmul(a, b);
    y.backward(Tensor({2, 3, 5}, std::span<const float>(w_values), cpu));
    return {testing::to_double(a.gradient().to_host()), testing::to_double(b.gradient().to_host())};
}

}  // namespace

TEST_F(EmulatedAutograd, MatmulBackwardStaysOnMetalAfterAScopedDefaultEnds) {
    Variable a;
    Variable b;
    Variable y;
    {
        const ScopedExecutionBackend scope(metal);
        a = Variable(Tensor({2, 3, 4}, std::span<const float>(a_values)));  // thread default
        b = Variable(Tensor({2, 4, 5}, std::span<const float>(b_values)));
        y = matmul(a, b);
    }
    ASSERT_EQ(current_execution_backend(), cpu);
    ASSERT_EQ(a.backend(), metal);
    ASSERT_EQ(y.backend(), metal);
    y.backward(Tensor({2, 3, 5}, std::span<const float>(w_values), metal));
    EXPECT_EQ(a.gradient().backend(), metal);
    EXPECT_EQ(b.gradient().backend(), metal);
    const MatmulReference reference = cpu_matmul_reference();
    EXPECT_TRUE(testing::all_close(a.gradient(), reference.a_gradient));
    EXPECT_TRUE(testing::all_close(b.gradient(), reference.b_gradient));
}

TEST_F(EmulatedAutograd, MatmulBackwardStaysOnMetalAfterSetExecutionBackendSwitchesToCpu) {
    set_execution_backend(metal);
    Variable a(Tensor({2, 3, 4}, std::span<const float>(a_values)));
    Variable b(Tensor({2, 4, 5}, std::span<const float>(b_values)));
    Variable y = matmul(a, b);
    Variable loss = sum(y * Variable(Tensor({2, 3, 5}, std::span<const float>(w_values)), false));
    set_execution_backend(cpu);
    ASSERT_EQ(loss.backend(), metal);
    loss.backward();  // implicit seed: on the output's backend, not the thread default
    EXPECT_EQ(a.gradient().backend(), metal);
    EXPECT_EQ(b.gradient().backend(), metal);
    const MatmulReference reference = cpu_matmul_reference();
    EXPECT_TRUE(testing::all_close(a.gradient(), reference.a_gradient));
    EXPECT_TRUE(testing::all_close(b.gradient(), reference.b_gradient));
}

TEST_F(EmulatedAutograd, MatmulBackwardStaysOnCpuWhenTheDefaultIsMetalAtBackward) {
    Variable a(Tensor({2, 3, 4}, std::span<const float>(a_values), cpu));
    Variable b(Tensor({2, 4, 5}, std::span<const float>(b_values), cpu));
    Variable y = matmul(a, b);
    const Tensor seed({2, 3, 5}, std::span<const float>(w_values), cpu);
    const ScopedExecutionBackend scope(metal);
    y.backward(seed);
    EXPECT_EQ(a.gradient().backend(), cpu);
    EXPECT_EQ(b.gradient().backend(), cpu);
    const MatmulReference reference = cpu_matmul_reference();
    EXPECT_TRUE(testing::all_close(a.gradient(), reference.a_gradient));
    EXPECT_TRUE(testing::all_close(b.gradient(), reference.b_gradient));
}

TEST_F(EmulatedAutograd, FrozenSideOfAMetalMatmulStillGetsNoGradient) {
    Variable a(Tensor({2, 3, 4}, std::span<const float>(a_values), metal));
    Variable b(Tensor({2, 4, 5}, std::span<const float>(b_values), metal), false);
    Variable y = matmul(a, b);
    set_execution_backend(cpu);
    y.backward(Tensor({2, 3, 5}, std::span<const float>(w_values), metal));
    EXPECT_EQ(a.gradient().backend(), metal);
    EXPECT_TRUE(testing::all_close(a.gradient(), cpu_matmul_reference().a_gradient));
    EXPECT_THROW(static_cast<void>(b.gradient()), std::logic_error);
}

// ---------------------------------------------------------------------------------------------
// Mixed backends are std::invalid_argument and change nothing

TEST_F(EmulatedAutograd, SeedOnAnotherBackendIsInvalidArgumentAndPublishesNothing) {
    Variable a(Tensor({2, 3, 4}, std::span<const float>(a_values), metal));
    Variable b(Tensor({2, 4, 5}, std::span<const float>(b_values), metal));
    Variable fresh(Tensor({2, 3, 5}, 1.0F, metal));
    Variable y = matmul(a, b) + fresh;
    const Tensor metal_seed({2, 3, 5}, std::span<const float>(w_values), metal);
    const Tensor cpu_seed({2, 3, 5}, std::span<const float>(w_values), cpu);

    // Earlier gradients for a and b (fresh keeps none).
    Variable earlier = matmul(a, b);
    earlier.backward(Tensor({2, 3, 5}, 1.0F, metal));
    const std::vector<float> a_before = a.gradient().to_host();
    const std::vector<float> b_before = b.gradient().to_host();

    const std::uint64_t passes_before = autograd_counters().backward_passes;
    EXPECT_THROW(y.backward(cpu_seed), std::invalid_argument);
    EXPECT_THROW(y.backward(cpu_seed, {.accumulate = true}), std::invalid_argument);
    EXPECT_EQ(autograd_counters().backward_passes, passes_before);
    EXPECT_TRUE(testing::bit_identical(a.gradient().to_host(), a_before));
    EXPECT_TRUE(testing::bit_identical(b.gradient().to_host(), b_before));
    EXPECT_EQ(a.gradient().backend(), metal);
    EXPECT_FALSE(fresh.has_gradient());

    // The graph was not consumed: the right seed still works.
    y.backward(metal_seed);
    EXPECT_TRUE(fresh.has_gradient());
    EXPECT_TRUE(testing::all_close(a.gradient(), cpu_matmul_reference().a_gradient));
}

TEST_F(EmulatedAutograd, MetalSeedForACpuOutputIsInvalidArgument) {
    Variable x(Tensor({2}, {1.0F, 2.0F}, cpu));
    Variable y = x * 3.0F;
    EXPECT_THROW(y.backward(Tensor({2}, {1.0F, 1.0F}, metal)), std::invalid_argument);
    EXPECT_FALSE(x.has_gradient());
}

namespace {

// `operation` must throw std::invalid_argument without creating a node or touching an input.
void expect_mixed_backends_rejected(const std::function<Variable()>& operation,
                                    const std::vector<Variable>& inputs) {
    std::vector<std::vector<float>> values;
    for (const Variable& input : inputs)
        values.push_back(input.value().to_host());
    const std::uint64_t nodes_before = autograd_counters().nodes_created;
    EXPECT_THROW(static_cast<void>(operation()), std::invalid_argument);
    EXPECT_EQ(autograd_counters().nodes_created, nodes_before);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(inputs[i].value().to_host(), values[i]));
        if (inputs[i].requires_gradient()) {
            EXPECT_FALSE(inputs[i].has_gradient());
        }
    }
}

}  // namespace

TEST_F(EmulatedAutograd, CombiningACpuVariableAndAMetalVariableIsInvalidArgument) {
    Variable on_cpu(Tensor({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F}, cpu));
    Variable on_metal(Tensor({2, 2}, {5.0F, 6.0F, 7.0F, 8.0F}, metal));
    Variable constant_on_metal(Tensor({2, 2}, 1.0F, metal), false);
    Variable scale_on_metal(Tensor({2}, 1.0F, metal));
    Variable bias_on_cpu(Tensor({2}, 0.0F, cpu));
    expect_mixed_backends_rejected([&] { return on_cpu + on_metal; }, {on_cpu, on_metal});
    expect_mixed_backends_rejected([&] { return on_metal + on_cpu; }, {on_cpu, on_metal});
    expect_mixed_backends_rejected([&] { return on_cpu - on_metal; }, {on_cpu, on_metal});
    expect_mixed_backends_rejected([&] { return on_cpu * on_metal; }, {on_cpu, on_metal});
    expect_mixed_backends_rejected([&] { return on_cpu / on_metal; }, {on_cpu, on_metal});
    expect_mixed_backends_rejected([&] { return on_cpu * constant_on_metal; },
                                   {on_cpu, constant_on_metal});
    expect_mixed_backends_rejected([&] { return matmul(on_cpu, on_metal); }, {on_cpu, on_metal});
    expect_mixed_backends_rejected([&] { return concatenate_last_axis(on_cpu, on_metal); },
                                   {on_cpu, on_metal});
    expect_mixed_backends_rejected(
        [&] { return layer_norm(on_metal, scale_on_metal, bias_on_cpu); },
        {on_metal, scale_on_metal, bias_on_cpu});
    expect_mixed_backends_rejected([&] { return rms_norm(on_cpu, scale_on_metal); },
                                   {on_cpu, scale_on_metal});
}

// ---------------------------------------------------------------------------------------------
// custom_gradient across backends

TEST_F(EmulatedAutograd, CustomGradientWithAnInputOnAnotherBackendThanTheOutputIsInvalidArgument) {
    Variable x(Tensor({3}, {1.0F, 2.0F, 3.0F}, metal));
    Variable y(Tensor({3}, {4.0F, 5.0F, 6.0F}, cpu));
    bool vjp_called = false;
    const VectorJacobianProduct vjp = [&](const Tensor& g) {
        vjp_called = true;
        return std::vector<Tensor>{g, g};
    };
    const Variable mixed_inputs[] = {x, y};
    const std::uint64_t nodes_before = autograd_counters().nodes_created;
    EXPECT_THROW(static_cast<void>(custom_gradient(Tensor({3}, 1.0F, metal), mixed_inputs, vjp)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(custom_gradient(Tensor({3}, 1.0F, cpu), mixed_inputs, vjp)),
                 std::invalid_argument);
    const Variable metal_input[] = {x};
    EXPECT_THROW(static_cast<void>(custom_gradient(Tensor({3}, 1.0F, cpu), metal_input, vjp)),
                 std::invalid_argument);
    EXPECT_EQ(autograd_counters().nodes_created, nodes_before);
    EXPECT_FALSE(vjp_called);
    EXPECT_FALSE(x.has_gradient());
    EXPECT_FALSE(y.has_gradient());
}

TEST_F(EmulatedAutograd, CustomGradientOnMetalGivesMetalGradients) {
    Variable x(Tensor({3}, {1.0F, 2.0F, 3.0F}, metal));
    Variable y(Tensor({3}, {4.0F, 5.0F, 6.0F}, metal));
    const Tensor x_value = x.value();
    const Tensor y_value = y.value();
    const Variable inputs[] = {x, y};
    // out = x ⊙ y: d x = G ⊙ y, d y = G ⊙ x.
    Variable out = custom_gradient(
        ops::multiply(x_value, y_value), inputs, [x_value, y_value](const Tensor& g) {
            return std::vector<Tensor>{ops::multiply(g, y_value), ops::multiply(g, x_value)};
        });
    EXPECT_EQ(out.backend(), metal);
    set_execution_backend(cpu);
    out.backward(Tensor({3}, {1.0F, -1.0F, 2.0F}, metal));
    EXPECT_EQ(x.gradient().backend(), metal);
    EXPECT_EQ(y.gradient().backend(), metal);
    EXPECT_TRUE(testing::all_close(x.gradient(), {4.0, -5.0, 12.0}));
    EXPECT_TRUE(testing::all_close(y.gradient(), {1.0, -2.0, 6.0}));
}

TEST_F(EmulatedAutograd, CustomGradientVjpOnTheWrongBackendFailsBackwardWithGradientsUnchanged) {
    Variable x(Tensor({3}, {1.0F, 2.0F, 3.0F}, metal));
    Variable y(Tensor({3}, {4.0F, 5.0F, 6.0F}, metal));
    Variable fresh(Tensor({3}, {0.5F, 0.5F, 0.5F}, metal));
    // Earlier gradients for x and y.
    Variable earlier = sum(x * y);
    earlier.backward();
    const std::vector<float> x_before = x.gradient().to_host();
    const std::vector<float> y_before = y.gradient().to_host();

    const Tensor x_value = x.value();
    const Tensor y_value = y.value();
    const Variable inputs[] = {x, y, fresh};
    // Input 0's tensor is right; input 1's lives on the CPU: the whole result must be refused
    // before input 0's contribution is accumulated anywhere.
    Variable out =
        custom_gradient(ops::multiply(ops::multiply(x_value, y_value), fresh.value()), inputs,
                        [x_value, y_value](const Tensor& g) {
                            return std::vector<Tensor>{ops::multiply(g, y_value),
                                                       ops::multiply(g, x_value).to(cpu), g};
                        });
    Variable loss = sum(out) + sum(x);
    EXPECT_THROW(loss.backward({.accumulate = true}), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.gradient().to_host(), x_before));
    EXPECT_TRUE(testing::bit_identical(y.gradient().to_host(), y_before));
    EXPECT_EQ(x.gradient().backend(), metal);
    EXPECT_EQ(y.gradient().backend(), metal);
    EXPECT_FALSE(fresh.has_gradient());
}

TEST_F(EmulatedAutograd, BackwardThatFailedOnAWrongBackendVjpPublishesNothing) {
    // A failed pass publishes nothing (variable.hpp). Without retain_graph it has already
    // released the saved tensors of the nodes it processed, so the graph is consumed; with
    // retain_graph the same graph differentiates once the VJP behaves.
    Variable x(Tensor({3}, {1.0F, 2.0F, 3.0F}, metal));
    const Tensor x_value = x.value();
    bool answer_on_cpu = true;
    const Variable inputs[] = {x};
    // out = 2x, with a VJP that first answers on the wrong backend.
    const auto make_loss = [&] {
        Variable out =
            custom_gradient(ops::scale(x_value, 2.0F), inputs, [&answer_on_cpu](const Tensor& g) {
                const Tensor gradient = ops::scale(g, 2.0F);
                return std::vector<Tensor>{answer_on_cpu ? gradient.to(cpu) : gradient};
            });
        return sum(exp(out) * 0.5F);
    };
    Variable consumed_on_failure = make_loss();
    EXPECT_THROW(consumed_on_failure.backward(), std::invalid_argument);
    EXPECT_FALSE(x.has_gradient());
    EXPECT_THROW(consumed_on_failure.backward(), std::logic_error);

    Variable retained = make_loss();
    EXPECT_THROW(retained.backward({.retain_graph = true}), std::invalid_argument);
    EXPECT_FALSE(x.has_gradient());
    answer_on_cpu = false;
    ASSERT_NO_THROW(retained.backward());
    // d/dx Σ 0.5·e^{2x} = e^{2x}.
    EXPECT_TRUE(testing::all_close(x.gradient(), {std::exp(2.0), std::exp(4.0), std::exp(6.0)},
                                   1e-6, 1e-6));
    EXPECT_EQ(x.gradient().backend(), metal);
}

// ---------------------------------------------------------------------------------------------
// checkpoint across backends

TEST_F(EmulatedAutograd, CheckpointWithADependencyOnAnotherBackendIsInvalidArgument) {
    Variable metal_input(Tensor({2, 3}, 0.5F, metal));
    Variable cpu_weight(Tensor({3, 3}, 0.25F, cpu));
    Variable cpu_input(Tensor({2, 3}, 0.5F, cpu));
    Variable metal_weight(Tensor({3, 3}, 0.25F, metal));
    int recompute_calls = 0;
    const auto block = [&recompute_calls](const Variable& weight) {
        return [&recompute_calls, weight](const Variable& input) {
            ++recompute_calls;
            return matmul(input, weight);
        };
    };
    const Variable cpu_dependencies[] = {cpu_weight};
    const Variable metal_dependencies[] = {metal_weight};
    const std::uint64_t nodes_before = autograd_counters().nodes_created;
    EXPECT_THROW(static_cast<void>(checkpoint(metal_input, cpu_dependencies, block(cpu_weight))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(checkpoint(cpu_input, metal_dependencies, block(metal_weight))),
                 std::invalid_argument);
    EXPECT_EQ(recompute_calls, 0) << "validation comes before the first run";
    EXPECT_EQ(autograd_counters().nodes_created, nodes_before);
    EXPECT_FALSE(metal_input.has_gradient());
    EXPECT_FALSE(cpu_weight.has_gradient());
}

TEST_F(EmulatedAutograd, CheckpointOnMetalGivesMetalGradientsEqualToThePlainGraph) {
    const std::vector<float> x_values = testing::pseudo_random(6, -1.0F, 1.0F, 21U);
    const std::vector<float> w_values_3x3 = testing::pseudo_random(9, -1.0F, 1.0F, 22U);
    Variable x(Tensor({2, 3}, std::span<const float>(x_values), metal));
    Variable w(Tensor({3, 3}, std::span<const float>(w_values_3x3), metal));
    const auto block = [&w](const Variable& input) { return gelu(matmul(input, w)) + input; };
    const Variable dependencies[] = {w};
    Variable loss = sum(checkpoint(x, dependencies, block));
    set_execution_backend(cpu);
    loss.backward();
    EXPECT_EQ(x.gradient().backend(), metal);
    EXPECT_EQ(w.gradient().backend(), metal);

    Variable x_cpu(Tensor({2, 3}, std::span<const float>(x_values), cpu));
    Variable w_cpu(Tensor({3, 3}, std::span<const float>(w_values_3x3), cpu));
    Variable plain = sum(gelu(matmul(x_cpu, w_cpu)) + x_cpu);
    plain.backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), testing::to_double(x_cpu.gradient().to_host())));
    EXPECT_TRUE(testing::all_close(w.gradient(), testing::to_double(w_cpu.gradient().to_host())));
}

}  // namespace riftco_transformer
