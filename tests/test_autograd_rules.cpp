// Graph rules of the autograd layer (docs/ARCHITECTURE.md, 'Autograd'): seeds,
// replace vs accumulate, single-use graphs, version checks, leaf-only gradients, frozen
// leaves, transactional failure, graph statistics, counters and deep graphs.
// Every failure test checks that the visible gradients are bit-identical afterwards.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "support/autograd_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::GradientSnapshot;
using testing::snapshot;
using testing::unchanged;

// A custom op y = x (identity) whose vjp throws `Exception`: a failure placed anywhere in a
// graph.
template <typename Exception>
Variable throwing_identity(const Variable& x) {
    const Variable inputs[] = {x};
    return custom_gradient(x.value(), inputs, [](const Tensor&) -> std::vector<Tensor> {
        throw Exception("vjp failed on purpose");
    });
}

}  // namespace

// --- seeds --------------------------------------------------------------------------------

TEST(AutogradRules, BackwardWithoutSeedOnNonScalarOutputIsInvalidArgument) {
    Variable x(Tensor({3}, {1.0F, 2.0F, 3.0F}));
    sum(x * 4.0F).backward();
    const GradientSnapshot before = snapshot(x);
    Variable y = x * 2.0F;  // shape [3]
    EXPECT_THROW(y.backward(), std::invalid_argument);
    EXPECT_THROW(y.backward({.accumulate = true}), std::invalid_argument);
    EXPECT_TRUE(unchanged(before, x));
}

TEST(AutogradRules, SeedOfWrongShapeIsInvalidArgumentAndChangesNothing) {
    Variable x(Tensor({2, 3}, testing::pseudo_random(6)));
    sum(x * 4.0F).backward();
    const GradientSnapshot before = snapshot(x);
    Variable y = x * 2.0F;
    EXPECT_THROW(y.backward(Tensor({3, 2}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(y.backward(Tensor({6}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(y.backward(Tensor::scalar(1.0F)), std::invalid_argument);
    EXPECT_TRUE(unchanged(before, x));
    // The failed calls did not consume the graph: a correct seed still works.
    y.backward(Tensor({2, 3}, 1.0F));
    EXPECT_TRUE(testing::all_close(x.gradient(), std::vector<double>(6, 2.0)));
}

TEST(AutogradRules, SingularSeedIsInvalidArgumentAndChangesNothing) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    sum(x * 4.0F).backward();
    const GradientSnapshot before = snapshot(x);
    Variable y = x * 2.0F;
    EXPECT_THROW(y.backward(Tensor()), std::invalid_argument);
    Variable scalar_output = sum(x);
    EXPECT_THROW(scalar_output.backward(Tensor()), std::invalid_argument);
    EXPECT_TRUE(unchanged(before, x));
}

TEST(AutogradRules, BackwardOnVariableNotRequiringGradientsIsLogicError) {
    Variable constant(Tensor({2}, {1.0F, 2.0F}), false);
    Variable detached = sum(constant * 3.0F);
    ASSERT_FALSE(detached.requires_gradient());
    EXPECT_THROW(detached.backward(), std::logic_error);
    EXPECT_THROW(detached.backward(Tensor::scalar(1.0F)), std::logic_error);
    Variable constant_scalar = Variable::scalar(2.0F, false);
    EXPECT_THROW(constant_scalar.backward(), std::logic_error);
    // A frozen leaf is also a variable that does not require gradients.
    Variable frozen = Variable::scalar(2.0F);
    frozen.set_requires_gradient(false);
    EXPECT_THROW(frozen.backward(), std::logic_error);
}

TEST(AutogradRules, EveryOperationOnAnEmptyVariableIsLogicError) {
    Variable empty;
    EXPECT_FALSE(empty.defined());
    const Variable x(Tensor({2, 2}, 1.0F));
    EXPECT_THROW(static_cast<void>(empty.value()), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.shape()), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.backend()), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.requires_gradient()), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.is_leaf()), std::logic_error);
    EXPECT_THROW(empty.set_requires_gradient(true), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.has_gradient()), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.gradient()), std::logic_error);
    EXPECT_THROW(empty.zero_gradient(), std::logic_error);
    EXPECT_THROW(empty.set_value(Tensor({2, 2}, 0.0F)), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.version()), std::logic_error);
    EXPECT_THROW(empty.backward(), std::logic_error);
    EXPECT_THROW(empty.backward(Tensor::scalar(1.0F)), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty.graph_statistics()), std::logic_error);
    // Differentiable operations reject an empty operand before doing any work.
    EXPECT_THROW(static_cast<void>(empty + x), std::logic_error);
    EXPECT_THROW(static_cast<void>(x * empty), std::logic_error);
    EXPECT_THROW(static_cast<void>(-empty), std::logic_error);
    EXPECT_THROW(static_cast<void>(empty * 2.0F), std::logic_error);
    EXPECT_THROW(static_cast<void>(matmul(empty, x)), std::logic_error);
    EXPECT_THROW(static_cast<void>(matmul(x, empty)), std::logic_error);
    EXPECT_THROW(static_cast<void>(sum(empty)), std::logic_error);
    EXPECT_THROW(static_cast<void>(gelu(empty)), std::logic_error);
    EXPECT_THROW(static_cast<void>(reshape(empty, {4})), std::logic_error);
    const Variable with_empty[] = {x, empty};
    EXPECT_THROW(static_cast<void>(custom_gradient(Tensor({2, 2}, 0.0F), with_empty,
                                                   [](const Tensor& g) {
                                                       return std::vector<Tensor>{g, g};
                                                   })),
                 std::logic_error);
    EXPECT_THROW(static_cast<void>(
                     checkpoint(empty, {}, [](const Variable& input) { return input * 2.0F; })),
                 std::logic_error);
}

TEST(AutogradRules, ImplicitSeedIsOne) {
    Variable x(Tensor({3}, {1.0F, -2.0F, 3.0F}));
    sum(x * x).backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {2.0, -4.0, 6.0}));
    // A one-element output of rank > 0 also takes the implicit seed.
    Variable w(Tensor({1, 1}, {5.0F}));
    (w * w).backward();
    EXPECT_TRUE(testing::all_close(w.gradient(), {10.0}));
}

TEST(AutogradRules, ExplicitSeedScalesTheGradient) {
    Variable x(Tensor({3}, {1.0F, -2.0F, 3.0F}));
    Variable squared = x * x;  // d/dx = 2x ⊙ seed
    squared.backward(Tensor({3}, {1.0F, 0.5F, -2.0F}));
    EXPECT_TRUE(testing::all_close(x.gradient(), {2.0, -2.0, -12.0}));
    Variable y(Tensor({2}, {1.0F, 2.0F}));
    sum(y * y).backward(Tensor::scalar(2.5F));
    EXPECT_TRUE(testing::all_close(y.gradient(), {5.0, 10.0}));
}

// --- replace vs accumulate ----------------------------------------------------------------

TEST(AutogradRules, DefaultBackwardReplacesGradientsFromAnEarlierGraph) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable other(Tensor({2}, {3.0F, 4.0F}));
    sum(x * 3.0F + other * 7.0F).backward();
    sum(x * 5.0F).backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {5.0, 5.0}));  // replaced, not 8
    // A leaf the second graph did not reach keeps its gradient.
    EXPECT_TRUE(testing::all_close(other.gradient(), {7.0, 7.0}));
}

TEST(AutogradRules, AccumulateModeAddsToExistingGradients) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable fresh(Tensor({2}, {0.0F, 0.0F}));
    sum(x * 3.0F).backward();
    sum(x * 5.0F + fresh * 2.0F).backward({.accumulate = true});
    EXPECT_TRUE(testing::all_close(x.gradient(), {8.0, 8.0}));
    // A leaf without a gradient starts from zero.
    EXPECT_TRUE(testing::all_close(fresh.gradient(), {2.0, 2.0}));
}

TEST(AutogradRules, TwoAccumulatedHalfBatchPassesEqualOneFullBatchPass) {
    constexpr std::size_t batch = 8;
    constexpr std::size_t in = 3;
    constexpr std::size_t out = 4;
    const std::vector<float> x_values = testing::pseudo_random(batch * in, -1.0F, 1.0F, 11U);
    Variable w(Tensor({in, out}, testing::pseudo_random(in * out, -1.0F, 1.0F, 12U)));
    Variable b(Tensor({out}, testing::pseudo_random(out, -0.5F, 0.5F, 13U)));
    // loss(batch) = Σ_rows Σ_cols gelu(x·W + b): a sum over samples, so it splits exactly.
    const auto loss = [&](const std::vector<float>& rows, std::size_t count) {
        const Variable x(Tensor({count, in}, rows), false);
        return sum(gelu(matmul(x, w) + broadcast_to(b, {count, out})));
    };
    loss(x_values, batch).backward();
    const std::vector<float> full_w = w.gradient().to_host();
    const std::vector<float> full_b = b.gradient().to_host();

    const std::size_t half = batch / 2;
    const std::vector<float> first(x_values.begin(), x_values.begin() + half * in);
    const std::vector<float> second(x_values.begin() + half * in, x_values.end());
    w.zero_gradient();
    b.zero_gradient();
    loss(first, half).backward({.accumulate = true});
    loss(second, half).backward({.accumulate = true});
    EXPECT_TRUE(testing::all_close(w.gradient(), testing::to_double(full_w), 1e-6, 1e-5));
    EXPECT_TRUE(testing::all_close(b.gradient(), testing::to_double(full_b), 1e-6, 1e-5));
}

// --- single-use graphs --------------------------------------------------------------------

TEST(AutogradRules, RetainedGraphGivesTheSameGradientsAgain) {
    Variable x(Tensor({3}, testing::pseudo_random(3)));
    Variable y = sum(gelu(x) * x);
    y.backward({.retain_graph = true});
    const std::vector<float> first = x.gradient().to_host();
    y.backward({.retain_graph = true});
    EXPECT_TRUE(testing::bit_identical(x.gradient().to_host(), first));  // replaced, not doubled
    y.backward();
    EXPECT_TRUE(testing::bit_identical(x.gradient().to_host(), first));
}

TEST(AutogradRules, DefaultBackwardConsumesTheGraphAndALaterPassChangesNothing) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, -1.0F}));
    Variable y = sum(x * w);
    y.backward();
    const GradientSnapshot x_before = snapshot(x);
    const GradientSnapshot w_before = snapshot(w);
    EXPECT_THROW(y.backward(), std::logic_error);
    EXPECT_THROW(y.backward({.accumulate = true}), std::logic_error);
    EXPECT_THROW(y.backward({.retain_graph = true}), std::logic_error);
    EXPECT_TRUE(unchanged(x_before, x));
    EXPECT_TRUE(unchanged(w_before, w));
}

TEST(AutogradRules, ConsumingOneGraphMakesAnotherGraphSharingANodeFail) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, -1.0F}));
    const Variable shared = x * w;
    Variable first = sum(shared);
    Variable second = sum(shared * 2.0F);
    first.backward();  // consumes `shared` as well
    const GradientSnapshot x_before = snapshot(x);
    const GradientSnapshot w_before = snapshot(w);
    EXPECT_THROW(second.backward(), std::logic_error);
    EXPECT_TRUE(unchanged(x_before, x));
    EXPECT_TRUE(unchanged(w_before, w));
}

TEST(AutogradRules, RetainingTheFirstGraphKeepsASharedNodeUsableByAnother) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, -1.0F}));
    const Variable shared = x * w;
    Variable first = sum(shared);
    Variable second = sum(shared * 2.0F);
    first.backward({.retain_graph = true});
    second.backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {6.0, -2.0}));
    EXPECT_TRUE(testing::all_close(w.gradient(), {2.0, 4.0}));
}

// --- version checks -----------------------------------------------------------------------

TEST(AutogradRules, SetValueOnALeafMakesAGraphThatReadItFailBeforeAnythingChanges) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    Variable a(Tensor({2}, {-1.0F, 5.0F}));
    sum(x * w + a * 2.0F).backward();
    const GradientSnapshot x_before = snapshot(x);
    const GradientSnapshot a_before = snapshot(a);

    // `branch` is shared with a second graph: if the stale pass touched (consumed) anything
    // before failing, the second graph could not be differentiated any more.
    const Variable branch = a * 3.0F;
    Variable stale = sum(branch) + sum(x * w);
    Variable untouched = sum(branch);
    w.set_value(Tensor({2}, {5.0F, 6.0F}));
    EXPECT_THROW(stale.backward(), std::logic_error);
    EXPECT_THROW(stale.backward({.retain_graph = true}), std::logic_error);
    EXPECT_TRUE(unchanged(x_before, x));
    EXPECT_TRUE(unchanged(a_before, a));
    EXPECT_FALSE(w.has_gradient());  // cleared by set_value, nothing published since

    untouched.backward();
    EXPECT_TRUE(testing::all_close(a.gradient(), {3.0, 3.0}));
}

TEST(AutogradRules, SetValueBumpsTheVersionAndClearsTheGradient) {
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    EXPECT_EQ(w.version(), 0U);
    sum(w * w).backward();
    ASSERT_TRUE(w.has_gradient());
    w.set_value(Tensor({2}, {5.0F, 6.0F}));
    EXPECT_EQ(w.version(), 1U);
    EXPECT_FALSE(w.has_gradient());
    EXPECT_TRUE(testing::all_close(w.gradient(), {0.0, 0.0}));
    EXPECT_TRUE(testing::all_close(w.value(), {5.0, 6.0}));
    w.set_value(Tensor({2}, {7.0F, 8.0F}));
    EXPECT_EQ(w.version(), 2U);
    // A graph built after the change uses the new value and is not stale.
    sum(w * w).backward();
    EXPECT_TRUE(testing::all_close(w.gradient(), {14.0, 16.0}));
}

TEST(AutogradRules, SetValueWithAnotherShapeIsInvalidArgumentAndChangesNothing) {
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    sum(w * w).backward();
    const GradientSnapshot before = snapshot(w);
    EXPECT_THROW(w.set_value(Tensor({3}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(w.set_value(Tensor({2, 1}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(w.set_value(Tensor::scalar(1.0F)), std::invalid_argument);
    EXPECT_EQ(w.version(), 0U);
    EXPECT_TRUE(testing::bit_identical(w.value().to_host(), {3.0F, 4.0F}));
    EXPECT_TRUE(unchanged(before, w));
}

TEST(AutogradRules, SetValueOnANonLeafIsLogicError) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable y = x * 2.0F;
    EXPECT_THROW(y.set_value(Tensor({2}, 0.0F)), std::logic_error);
    EXPECT_TRUE(testing::bit_identical(y.value().to_host(), {2.0F, 4.0F}));
    EXPECT_EQ(x.version(), 0U);
}

// --- gradients only on leaves -------------------------------------------------------------

TEST(AutogradRules, InteriorNodesHaveNoGradientAccessors) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable hidden = x * x;
    Variable y = sum(hidden);
    y.backward({.retain_graph = true});
    EXPECT_FALSE(hidden.is_leaf());
    EXPECT_THROW(static_cast<void>(hidden.gradient()), std::logic_error);
    EXPECT_THROW(static_cast<void>(hidden.has_gradient()), std::logic_error);
    EXPECT_THROW(hidden.zero_gradient(), std::logic_error);
    EXPECT_THROW(static_cast<void>(y.gradient()), std::logic_error);
}

TEST(AutogradRules, BackwardStoresGradientsOnlyOnLeaves) {
    // node_tensor_elements counts values and gradient buffers: after a retained pass the
    // only new elements are the two leaf gradients, none for the three interior nodes.
    Variable x(Tensor({4}, testing::pseudo_random(4, -1.0F, 1.0F, 21U)));
    Variable w(Tensor({4}, testing::pseudo_random(4, -1.0F, 1.0F, 22U)));
    Variable y = sum(gelu(x * w));
    const GraphStatistics before = y.graph_statistics();
    EXPECT_EQ(before.node_count, 5U);                    // sum, gelu, multiply, x, w
    EXPECT_EQ(before.node_tensor_elements, 1U + 4 * 4);  // values only
    y.backward({.retain_graph = true});
    EXPECT_EQ(y.graph_statistics().node_tensor_elements, before.node_tensor_elements + 2 * 4);
}

TEST(AutogradRules, LeafHasNoGradientBeforeBackwardAndReadsZeros) {
    Variable w(Tensor({2, 3}, 7.0F));
    EXPECT_TRUE(w.is_leaf());
    EXPECT_FALSE(w.has_gradient());
    const Tensor gradient = w.gradient();
    EXPECT_EQ(gradient.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::bit_identical(gradient.to_host(), std::vector<float>(6, 0.0F)));
    EXPECT_FALSE(w.has_gradient());  // reading zeros does not allocate a buffer
}

TEST(AutogradRules, LeafNotRequiringGradientsHasNoGradientAccessors) {
    Variable constant(Tensor({2}, 1.0F), false);
    EXPECT_THROW(static_cast<void>(constant.has_gradient()), std::logic_error);
    EXPECT_THROW(static_cast<void>(constant.gradient()), std::logic_error);
    EXPECT_THROW(constant.zero_gradient(), std::logic_error);
}

TEST(AutogradRules, ZeroGradientClearsTheBufferAndAccumulationRestartsFromZero) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    sum(x * 3.0F).backward();
    ASSERT_TRUE(x.has_gradient());
    x.zero_gradient();
    EXPECT_FALSE(x.has_gradient());
    EXPECT_TRUE(testing::bit_identical(x.gradient().to_host(), {0.0F, 0.0F}));
    sum(x * 5.0F).backward({.accumulate = true});
    EXPECT_TRUE(testing::all_close(x.gradient(), {5.0, 5.0}));
}

TEST(AutogradRules, ZeroGradientAffectsOnlyThatLeaf) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    sum(x * w).backward();
    x.zero_gradient();
    EXPECT_FALSE(x.has_gradient());
    EXPECT_TRUE(testing::all_close(w.gradient(), {1.0, 2.0}));
}

// --- frozen leaves ------------------------------------------------------------------------

TEST(AutogradRules, FrozenWeightGetsNoGradientAndMatmulSkipsTheWeightProduct) {
    Variable x(Tensor({2, 3}, testing::pseudo_random(6, -1.0F, 1.0F, 31U)));
    Variable w1(Tensor({3, 4}, testing::pseudo_random(12, -1.0F, 1.0F, 32U)));
    Variable w2(Tensor({4, 2}, testing::pseudo_random(8, -1.0F, 1.0F, 33U)));
    w1.set_requires_gradient(false);
    w2.set_requires_gradient(false);
    reset_autograd_counters();
    sum(matmul(matmul(x, w1), w2)).backward();
    EXPECT_EQ(autograd_counters().matmul_right_gradients, 0U);
    EXPECT_EQ(autograd_counters().matmul_left_gradients, 2U);
    EXPECT_FALSE(w1.requires_gradient());
    EXPECT_THROW(static_cast<void>(w1.gradient()), std::logic_error);
    EXPECT_TRUE(x.has_gradient());
}

TEST(AutogradRules, FreezingAfterTheForwardPassStillSkipsTheWeightProduct) {
    const std::vector<float> x_values = testing::pseudo_random(6, -1.0F, 1.0F, 41U);
    const std::vector<float> w_values = testing::pseudo_random(12, -1.0F, 1.0F, 42U);
    Variable x(Tensor({2, 3}, x_values));
    Variable w(Tensor({3, 4}, w_values));
    Variable y = sum(matmul(x, w));
    w.set_requires_gradient(false);
    reset_autograd_counters();
    y.backward();
    EXPECT_EQ(autograd_counters().matmul_right_gradients, 0U);
    EXPECT_EQ(autograd_counters().matmul_left_gradients, 1U);
    EXPECT_FALSE(w.requires_gradient());
    // d x[i,k] = Σ_j W[k,j]
    std::vector<double> expected(6);
    for (std::size_t i = 0; i < 2; ++i) {
        for (std::size_t k = 0; k < 3; ++k) {
            double row_sum = 0.0;
            for (std::size_t j = 0; j < 4; ++j)
                row_sum += w_values[k * 4 + j];
            expected[i * 3 + k] = row_sum;
        }
    }
    EXPECT_TRUE(testing::all_close(x.gradient(), expected, 1e-6, 1e-5));
    // Unfreezing afterwards shows that no buffer was published while frozen.
    w.set_requires_gradient(true);
    EXPECT_FALSE(w.has_gradient());
}

TEST(AutogradRules, FreezingALeafFreesItsGradientBuffer) {
    Variable w(Tensor({2}, {1.0F, 2.0F}));
    sum(w * w).backward();
    ASSERT_TRUE(w.has_gradient());
    w.set_requires_gradient(false);
    w.set_requires_gradient(true);
    EXPECT_FALSE(w.has_gradient());
}

TEST(AutogradRules, UnfreezingAfterTheForwardPassDoesNotAddTheLeafToThatGraph) {
    // The result requires gradients iff an input did when it was computed: the edge to a
    // leaf frozen at forward time is absent, so thawing it later gives it no gradient.
    Variable x(Tensor({2, 3}, 1.0F));
    Variable w(Tensor({3, 4}, 0.5F));
    w.set_requires_gradient(false);
    Variable y = sum(matmul(x, w));
    w.set_requires_gradient(true);
    reset_autograd_counters();
    y.backward();
    EXPECT_EQ(autograd_counters().matmul_right_gradients, 0U);
    EXPECT_FALSE(w.has_gradient());
    EXPECT_TRUE(testing::all_close(x.gradient(), std::vector<double>(6, 2.0)));
}

TEST(AutogradRules, SetRequiresGradientOnANonLeafIsLogicError) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable y = x * 2.0F;
    EXPECT_THROW(y.set_requires_gradient(false), std::logic_error);
    EXPECT_THROW(y.set_requires_gradient(true), std::logic_error);
    EXPECT_TRUE(y.requires_gradient());
}

// --- transactional failure ----------------------------------------------------------------

TEST(AutogradRules, PassFailingMidwayPublishesNothing) {
    Variable a(Tensor({2}, {1.0F, 2.0F}));
    Variable b(Tensor({2}, {3.0F, 4.0F}));
    Variable c(Tensor({2}, {5.0F, 6.0F}));
    sum(a * 2.0F + b * 3.0F + c * 4.0F).backward();
    const GradientSnapshot a_before = snapshot(a);
    const GradientSnapshot b_before = snapshot(b);
    const GradientSnapshot c_before = snapshot(c);

    // Reverse postorder from the root visits the right operand's branch (a's) first: the
    // root, a's sum and multiply and the leaf a are processed (a's new gradient sits in the
    // private context) before the failing vjp on b's branch runs.
    Variable y = sum(throwing_identity<std::runtime_error>(b * 10.0F) * c) + sum(a * 7.0F);
    const std::uint64_t passes = autograd_counters().backward_passes;
    EXPECT_THROW(y.backward(), std::runtime_error);
    EXPECT_TRUE(unchanged(a_before, a));
    EXPECT_TRUE(unchanged(b_before, b));
    EXPECT_TRUE(unchanged(c_before, c));
    EXPECT_EQ(autograd_counters().backward_passes, passes);  // not a completed pass
}

TEST(AutogradRules, PassFailingMidwayInAccumulateModePublishesNothing) {
    Variable a(Tensor({2}, {1.0F, 2.0F}));
    Variable b(Tensor({2}, {3.0F, 4.0F}));
    sum(a * 2.0F + b * 3.0F).backward();
    const GradientSnapshot a_before = snapshot(a);
    const GradientSnapshot b_before = snapshot(b);
    Variable y = sum(throwing_identity<std::domain_error>(b)) + sum(a * 7.0F);
    EXPECT_THROW(y.backward({.accumulate = true}), std::domain_error);
    EXPECT_TRUE(unchanged(a_before, a));
    EXPECT_TRUE(unchanged(b_before, b));
}

TEST(AutogradRules, FailedRetainedPassLeavesTheGraphUsable) {
    Variable a(Tensor({2}, {1.0F, 2.0F}));
    Variable b(Tensor({2}, {3.0F, 4.0F}));
    int calls = 0;
    const Variable b_inputs[] = {b};
    // Identity whose vjp fails on its first call only (a transient failure).
    const Variable flaky = custom_gradient(b.value(), b_inputs, [&calls](const Tensor& g) {
        if (++calls == 1)
            throw std::runtime_error("transient");
        return std::vector<Tensor>{g};
    });
    Variable y = sum(flaky * 2.0F) + sum(a * 3.0F);
    EXPECT_THROW(y.backward({.retain_graph = true}), std::runtime_error);
    EXPECT_FALSE(a.has_gradient());
    EXPECT_FALSE(b.has_gradient());
    y.backward();
    EXPECT_EQ(calls, 2);
    EXPECT_TRUE(testing::all_close(a.gradient(), {3.0, 3.0}));
    EXPECT_TRUE(testing::all_close(b.gradient(), {2.0, 2.0}));
}

// --- graph statistics and counters --------------------------------------------------------

TEST(AutogradRules, GraphStatisticsCountTheReachableNodesOfASmallGraph) {
    Variable x(Tensor({2, 3}, 1.0F));
    Variable w(Tensor({2, 3}, 2.0F));
    Variable constant(Tensor({2, 3}, 3.0F), false);
    const Variable product = x * w;               // interior
    const Variable shifted = product + constant;  // constant: no edge (does not require)
    Variable y = sum(shifted) + sum(product);     // product shared: counted once
    const GraphStatistics statistics = y.graph_statistics();
    // add, sum(shifted), sum(product), shifted, product, x, w
    EXPECT_EQ(statistics.node_count, 7U);
    EXPECT_EQ(statistics.node_tensor_elements, 1U + 1U + 1U + 6U + 6U + 6U + 6U);
    // Leaves alone, and a detached result alone.
    EXPECT_EQ(x.graph_statistics().node_count, 1U);
    EXPECT_EQ(x.graph_statistics().node_tensor_elements, 6U);
    const Variable detached = constant * 2.0F;
    EXPECT_EQ(detached.graph_statistics().node_count, 1U);
    // Gradients add their elements to the leaves' counts.
    y.backward({.retain_graph = true});
    EXPECT_EQ(y.graph_statistics().node_tensor_elements, statistics.node_tensor_elements + 12U);
    EXPECT_EQ(x.graph_statistics().node_tensor_elements, 12U);
}

TEST(AutogradRules, DetachedResultsDoNotCountAsCreatedNodes) {
    const Variable a(Tensor({2, 2}, 1.0F), false);
    const Variable b(Tensor({2, 2}, 2.0F), false);
    reset_autograd_counters();
    const Variable detached = sum(gelu(matmul(a, b) + a) * 3.0F);
    EXPECT_FALSE(detached.requires_gradient());
    EXPECT_TRUE(detached.is_leaf());
    EXPECT_EQ(detached.graph_statistics().node_count, 1U);
    EXPECT_EQ(autograd_counters().nodes_created, 0U);
    // The same five operations with one differentiable input create five interior nodes.
    const Variable w(Tensor({2, 2}, 2.0F));
    const Variable attached = sum(gelu(matmul(a, w) + a) * 3.0F);
    EXPECT_EQ(autograd_counters().nodes_created, 5U);
    EXPECT_FALSE(attached.is_leaf());
}

TEST(AutogradRules, BackwardPassCounterCountsCompletedPasses) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    reset_autograd_counters();
    Variable y = sum(x * x);
    y.backward({.retain_graph = true});
    y.backward();
    EXPECT_EQ(autograd_counters().backward_passes, 2U);
    EXPECT_THROW(y.backward(), std::logic_error);
    EXPECT_EQ(autograd_counters().backward_passes, 2U);
}

// --- depth --------------------------------------------------------------------------------

TEST(AutogradRules, TenThousandOpChainBackwardDoesNotOverflowTheStack) {
    Variable x(Tensor({2}, {1.0F, -2.0F}));
    Variable y = x;
    for (int i = 0; i < 10000; ++i)
        y = -(y * 1.0F);  // 20,000 interior nodes, net sign +1
    EXPECT_EQ(y.graph_statistics().node_count, 20001U);
    sum(y * 3.0F).backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {3.0, 3.0}));
}

TEST(AutogradRules, HundredThousandNodeChainIsDestroyedWithoutRecursion) {
    Variable x(Tensor({1}, {1.0F}));
    {
        Variable z = x;
        for (int i = 0; i < 100000; ++i)
            z = -z;
        EXPECT_EQ(z.graph_statistics().node_count, 100001U);
    }  // the last handle on the chain drops here
    // A consumed chain, freed while its loss handle is reassigned.
    Variable z = x;
    for (int i = 0; i < 100000; ++i)
        z = z + 0.0F;
    Variable loss = sum(z);
    loss.backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {1.0}));
    z = Variable();
    loss = Variable();
    EXPECT_TRUE(x.has_gradient());  // the leaf outlives the chain
}

}  // namespace riftco_transformer
