// custom_gradient (docs/ARCHITECTURE.md, 'Custom gradients and recomputation'): construction
// errors, when and how often the vjp runs, the one-tensor-per-input contract, validation before
// anything is accumulated, and a correct custom op against finite differences. (Backend mismatches:
// test_emulated_backend.cpp.)
#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/autograd_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::GradientSnapshot;
using testing::snapshot;
using testing::unchanged;

// y = x³ elementwise, differentiated by the caller: d x = 3x² ⊙ g.
Variable cube(const Variable& x) {
    const Tensor input = x.value();
    const Tensor output = tensor_ops::multiply(tensor_ops::multiply(input, input), input);
    const Variable inputs[] = {x};
    return custom_gradient(output, inputs, [input](const Tensor& upstream) {
        const Tensor square = tensor_ops::multiply(input, input);
        return std::vector<Tensor>{tensor_ops::scale(tensor_ops::multiply(square, upstream), 3.0F)};
    });
}

// An exception type no library code throws, to see the vjp's own exception propagate.
struct VjpFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A fixture with two leaves that already carry gradients from an earlier pass, and a
// two-input custom op `left ⊙ right` whose vjp the test supplies; the graph also reaches a
// third leaf through a built-in op so that other nodes run before the custom one.
class CustomGradientFailure : public ::testing::Test {
  protected:
    void SetUp() override {
        (sum(left * right * 2.0F) + sum(bystander * 3.0F)).backward();
        left_before = snapshot(left);
        right_before = snapshot(right);
        bystander_before = snapshot(bystander);
    }

    void expect_backward_throws_invalid_argument(VectorJacobianProduct vjp) {
        const Variable inputs[] = {left, right};
        const Variable product = custom_gradient(tensor_ops::multiply(left.value(), right.value()),
                                                 inputs, std::move(vjp));
        Variable loss = sum(product) + sum(bystander * 5.0F);
        EXPECT_THROW(loss.backward(), std::invalid_argument);
        expect_unchanged();
    }

    void expect_unchanged() {
        EXPECT_TRUE(unchanged(left_before, left));
        EXPECT_TRUE(unchanged(right_before, right));
        EXPECT_TRUE(unchanged(bystander_before, bystander));
    }

    Variable left{Tensor({2, 3}, testing::pseudo_random(6, -1.0F, 1.0F, 71U))};
    Variable right{Tensor({2, 3}, testing::pseudo_random(6, -1.0F, 1.0F, 72U))};
    Variable bystander{Tensor({4}, testing::pseudo_random(4, -1.0F, 1.0F, 73U))};
    GradientSnapshot left_before;
    GradientSnapshot right_before;
    GradientSnapshot bystander_before;
};

}  // namespace

// --- construction -------------------------------------------------------------------------

TEST(CustomGradient, EmptyVjpIsInvalidArgument) {
    const Variable inputs[] = {Variable(Tensor({2}, 1.0F))};
    EXPECT_THROW(
        static_cast<void>(custom_gradient(Tensor({2}, 1.0F), inputs, VectorJacobianProduct{})),
        std::invalid_argument);
}

TEST(CustomGradient, EmptyInputListIsInvalidArgument) {
    EXPECT_THROW(
        static_cast<void>(custom_gradient(Tensor({2}, 1.0F), std::span<const Variable>{},
                                          [](const Tensor&) { return std::vector<Tensor>{}; })),
        std::invalid_argument);
}

TEST(CustomGradient, EmptyInputHandleIsLogicError) {
    const Variable inputs[] = {Variable(Tensor({2}, 1.0F)), Variable()};
    EXPECT_THROW(static_cast<void>(custom_gradient(Tensor({2}, 1.0F), inputs,
                                                   [](const Tensor& g) {
                                                       return std::vector<Tensor>{g, g};
                                                   })),
                 std::logic_error);
}

// --- when the vjp runs --------------------------------------------------------------------

TEST(CustomGradient, ResultIsDetachedAndVjpNeverRunsWhenNoInputRequiresGradients) {
    int calls = 0;
    const Variable constant(Tensor({3}, {1.0F, 2.0F, 3.0F}), false);
    const Variable inputs[] = {constant};
    reset_autograd_counters();
    Variable result =
        custom_gradient(Tensor({3}, {4.0F, 5.0F, 6.0F}), inputs, [&calls](const Tensor& g) {
            ++calls;
            return std::vector<Tensor>{g};
        });
    EXPECT_FALSE(result.requires_gradient());
    EXPECT_EQ(result.graph_statistics().node_count, 1U);  // no parents
    EXPECT_EQ(autograd_counters().nodes_created, 0U);
    EXPECT_TRUE(testing::bit_identical(result.value().to_host(), {4.0F, 5.0F, 6.0F}));
    EXPECT_THROW(result.backward(Tensor({3}, 1.0F)), std::logic_error);
    // Using the detached result in a graph with a differentiable leaf does not call it either.
    Variable w(Tensor({3}, 1.0F));
    sum(result * w).backward();
    EXPECT_EQ(calls, 0);
    EXPECT_TRUE(testing::all_close(w.gradient(), {4.0, 5.0, 6.0}));
}

TEST(CustomGradient, VjpRunsExactlyOncePerBackwardWithTheSummedUpstream) {
    int calls = 0;
    std::vector<float> seen_upstream;
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    const Variable inputs[] = {x};
    const Variable identity = custom_gradient(x.value(), inputs, [&](const Tensor& g) {
        ++calls;
        seen_upstream = g.to_host();
        return std::vector<Tensor>{g};
    });
    // Two consumers: the node runs once, after both contributions (1 and 2) arrived.
    Variable loss = sum(identity) + sum(identity * 2.0F);
    loss.backward({.retain_graph = true});
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(testing::bit_identical(seen_upstream, {3.0F, 3.0F}));
    loss.backward(Tensor::scalar(-1.0F));
    EXPECT_EQ(calls, 2);
    EXPECT_TRUE(testing::bit_identical(seen_upstream, {-3.0F, -3.0F}));
    EXPECT_TRUE(testing::all_close(x.gradient(), {-3.0, -3.0}));
}

TEST(CustomGradient, VjpReceivesTheUpstreamGradientOfTheOutputShape) {
    std::vector<float> seen_upstream;
    Shape seen_shape;
    Variable x(Tensor({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F}));
    const Variable inputs[] = {x};
    // Output [4] from input [2,2]: the upstream has the OUTPUT's shape.
    Variable flat = custom_gradient(x.value().reshape({4}), inputs, [&](const Tensor& g) {
        seen_upstream = g.to_host();
        seen_shape = g.shape();
        return std::vector<Tensor>{g.reshape({2, 2})};
    });
    flat.backward(Tensor({4}, {0.5F, -1.0F, 2.0F, 8.0F}));
    EXPECT_EQ(seen_shape, (Shape{4}));
    EXPECT_TRUE(testing::bit_identical(seen_upstream, {0.5F, -1.0F, 2.0F, 8.0F}));
    EXPECT_TRUE(testing::all_close(x.gradient(), {0.5, -1.0, 2.0, 8.0}));
}

// --- one tensor per input, in order -------------------------------------------------------

TEST(CustomGradient, VjpReturnsOneTensorPerInputInOrderIncludingNonDifferentiableInputs) {
    Variable first(Tensor({2}, {1.0F, 2.0F}));
    const Variable constant(Tensor({3}, 0.0F), false);
    Variable last(Tensor({1, 2}, {3.0F, 4.0F}));
    const Variable inputs[] = {first, constant, last};
    Variable result = custom_gradient(Tensor::scalar(0.0F), inputs, [](const Tensor& g) {
        const float seed = g.item();
        return std::vector<Tensor>{Tensor({2}, {seed * 10.0F, seed * 20.0F}),
                                   Tensor({3}, 99.0F),  // ignored, but must be well formed
                                   Tensor({1, 2}, {seed * 30.0F, seed * 40.0F})};
    });
    result.backward();
    EXPECT_TRUE(testing::all_close(first.gradient(), {10.0, 20.0}));
    EXPECT_TRUE(testing::all_close(last.gradient(), {30.0, 40.0}));
    EXPECT_THROW(static_cast<void>(constant.gradient()), std::logic_error);
}

TEST_F(CustomGradientFailure, TooFewTensorsIsInvalidArgumentAndChangesNothing) {
    expect_backward_throws_invalid_argument([](const Tensor& g) { return std::vector<Tensor>{g}; });
}

TEST_F(CustomGradientFailure, TooManyTensorsIsInvalidArgumentAndChangesNothing) {
    expect_backward_throws_invalid_argument([](const Tensor& g) {
        return std::vector<Tensor>{g, g, g};
    });
}

TEST_F(CustomGradientFailure, WrongShapeIsInvalidArgumentAndChangesNothing) {
    // The first tensor is fine: validation of the whole result precedes any accumulation.
    expect_backward_throws_invalid_argument([](const Tensor& g) {
        return std::vector<Tensor>{g, g.reshape({3, 2})};
    });
}

TEST_F(CustomGradientFailure, SingularTensorIsInvalidArgumentAndChangesNothing) {
    expect_backward_throws_invalid_argument([](const Tensor& g) {
        return std::vector<Tensor>{g, Tensor()};
    });
}

TEST_F(CustomGradientFailure, MalformedTensorForAnInputNotRequiringGradientsIsInvalidArgument) {
    right.set_requires_gradient(false);
    right_before = {};
    const Variable inputs[] = {left, right};
    for (int malformed = 0; malformed < 2; ++malformed) {
        const Variable product = custom_gradient(
            tensor_ops::multiply(left.value(), right.value()), inputs,
            [malformed](const Tensor& g) {
                return std::vector<Tensor>{g, malformed == 0 ? Tensor() : Tensor({6}, 0.0F)};
            });
        Variable loss = sum(product) + sum(bystander * 5.0F);
        EXPECT_THROW(loss.backward(), std::invalid_argument) << "case " << malformed;
        EXPECT_TRUE(unchanged(left_before, left));
        EXPECT_TRUE(unchanged(bystander_before, bystander));
    }
}

TEST_F(CustomGradientFailure, ThrowingVjpPropagatesItsExceptionAndChangesNothing) {
    const Variable inputs[] = {left, right};
    const Variable product =
        custom_gradient(tensor_ops::multiply(left.value(), right.value()), inputs,
                        [](const Tensor&) -> std::vector<Tensor> { throw VjpFailure("boom"); });
    Variable loss = sum(product) + sum(bystander * 5.0F);
    EXPECT_THROW(loss.backward(), VjpFailure);
    expect_unchanged();
}

TEST_F(CustomGradientFailure, FailureInAccumulateModeChangesNothing) {
    const Variable inputs[] = {left, right};
    const Variable product = custom_gradient(tensor_ops::multiply(left.value(), right.value()),
                                             inputs, [](const Tensor& g) {
                                                 return std::vector<Tensor>{g, g.reshape({6})};
                                             });
    Variable loss = sum(product) + sum(bystander * 5.0F);
    EXPECT_THROW(loss.backward({.accumulate = true}), std::invalid_argument);
    expect_unchanged();
}

// --- a correct custom op ------------------------------------------------------------------

TEST(CustomGradient, CubeMatchesFiniteDifferences) {
    const std::vector<float> x_values = testing::pseudo_random(6, -1.5F, 1.5F, 81U);
    const std::vector<float> weights = testing::pseudo_random(6, -1.0F, 1.0F, 82U);
    Variable x(Tensor({2, 3}, x_values));
    const Variable weight(Tensor({2, 3}, weights), false);
    sum(cube(x) * weight).backward();
    const auto objective = [&](const std::vector<float>& values) {
        const Variable probe(Tensor({2, 3}, values), false);
        return static_cast<double>(sum(cube(probe) * weight).value().item());
    };
    EXPECT_TRUE(testing::all_close(
        x.gradient(), testing::finite_difference_gradient(objective, x_values, 1e-2), 5e-3, 0));
    // And the closed form 3x²·w.
    std::vector<double> expected(6);
    for (std::size_t i = 0; i < 6; ++i) {
        expected[i] = 3.0 * x_values[i] * x_values[i] * weights[i];
    }
    EXPECT_TRUE(testing::all_close(x.gradient(), expected, 1e-6, 1e-5));
}

TEST(CustomGradient, CustomOpComposesWithBuiltInOperations) {
    // loss = Σ gelu(cube(x·W1)·W2): the custom node sits between two matmuls.
    const std::vector<float> x_values = testing::pseudo_random(2 * 3, -1.0F, 1.0F, 91U);
    const std::vector<float> w1_values = testing::pseudo_random(3 * 4, -0.8F, 0.8F, 92U);
    const std::vector<float> w2_values = testing::pseudo_random(4 * 2, -0.8F, 0.8F, 93U);
    const auto loss_of = [](const Variable& x, const Variable& w1, const Variable& w2,
                            bool use_custom) {
        const Variable hidden = matmul(x, w1);
        const Variable cubed = use_custom ? cube(hidden) : hidden * hidden * hidden;
        return sum(gelu(matmul(cubed, w2)));
    };
    Variable x(Tensor({2, 3}, x_values));
    Variable w1(Tensor({3, 4}, w1_values));
    Variable w2(Tensor({4, 2}, w2_values));
    loss_of(x, w1, w2, true).backward();
    const std::vector<float> custom_x = x.gradient().to_host();
    const std::vector<float> custom_w1 = w1.gradient().to_host();
    const std::vector<float> custom_w2 = w2.gradient().to_host();

    // Finite differences on W1, the parameter whose gradient crosses the custom node.
    const auto objective = [&](const std::vector<float>& values) {
        const Variable probe_x(Tensor({2, 3}, x_values), false);
        const Variable probe_w1(Tensor({3, 4}, values), false);
        const Variable probe_w2(Tensor({4, 2}, w2_values), false);
        return static_cast<double>(loss_of(probe_x, probe_w1, probe_w2, true).value().item());
    };
    EXPECT_TRUE(testing::all_close(
        custom_w1, testing::finite_difference_gradient(objective, w1_values, 1e-2), 5e-3, 0));

    // The same function built from multiplies gives the same gradients.
    loss_of(x, w1, w2, false).backward();
    EXPECT_TRUE(
        testing::all_close(custom_x, testing::to_double(x.gradient().to_host()), 1e-6, 1e-5));
    EXPECT_TRUE(
        testing::all_close(custom_w1, testing::to_double(w1.gradient().to_host()), 1e-6, 1e-5));
    EXPECT_TRUE(
        testing::all_close(custom_w2, testing::to_double(w2.gradient().to_host()), 1e-6, 1e-5));
}

}  // namespace riftco_transformer
