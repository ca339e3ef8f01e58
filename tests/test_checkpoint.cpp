// checkpoint (docs/ARCHITECTURE.md, 'Custom gradients and recomputation' and 'Activation
// checkpointing'): construction errors, the checks of the first run and of the replay, equality
// with the plain computation, nesting, shared parameters, failure isolation, staleness, and the
// structure the forward result keeps.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "support/autograd_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::GradientSnapshot;
using testing::snapshot;
using testing::unchanged;

::testing::AssertionResult gradients_match(const Variable& leaf, const std::vector<float>& plain) {
    return testing::all_close(leaf.gradient(), testing::to_double(plain), 1e-6, 1e-5);
}

// One transformer-like layer: layer_norm(gelu(h·W + b), γ, β), h [rows, width].
struct Layer {
    Variable weight;
    Variable bias;
    Variable scale;
    Variable shift;

    Layer(std::size_t width, std::uint32_t seed)
        : weight(Tensor({width, width}, testing::pseudo_random(width * width, -0.6F, 0.6F, seed))),
          bias(Tensor({width}, testing::pseudo_random(width, -0.2F, 0.2F, seed + 1))),
          scale(Tensor({width}, testing::pseudo_random(width, 0.5F, 1.5F, seed + 2))),
          shift(Tensor({width}, testing::pseudo_random(width, -0.2F, 0.2F, seed + 3))) {}

    [[nodiscard]] Variable operator()(const Variable& h) const {
        const Shape shape = h.shape();
        return layer_norm(gelu(matmul(h, weight) + broadcast_to(bias, shape)), scale, shift);
    }

    [[nodiscard]] std::vector<Variable> parameters() const { return {weight, bias, scale, shift}; }
};

std::vector<std::vector<float>> gradients_of(const std::vector<Variable>& leaves) {
    std::vector<std::vector<float>> result;
    for (const Variable& leaf : leaves)
        result.push_back(leaf.gradient().to_host());
    return result;
}

}  // namespace

// --- construction (std::invalid_argument) -------------------------------------------------

TEST(Checkpoint, EmptyCallableIsInvalidArgument) {
    const Variable x(Tensor({2}, 1.0F));
    EXPECT_THROW(static_cast<void>(checkpoint(x, {}, Recompute{})), std::invalid_argument);
}

TEST(Checkpoint, NothingDifferentiableIsInvalidArgument) {
    int calls = 0;
    const Variable constant(Tensor({2}, 1.0F), false);
    EXPECT_THROW(static_cast<void>(checkpoint(constant, {},
                                              [&calls](const Variable& input) {
                                                  ++calls;
                                                  return input * 2.0F;
                                              })),
                 std::invalid_argument);
    EXPECT_EQ(calls, 0);  // rejected before running anything
}

TEST(Checkpoint, DependencyThatIsNotALeafIsInvalidArgument) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable w(Tensor({2}, 2.0F));
    const Variable interior = w * 2.0F;
    const Variable dependencies[] = {interior};
    EXPECT_THROW(
        static_cast<void>(checkpoint(
            x, dependencies, [&interior](const Variable& input) { return input * interior; })),
        std::invalid_argument);
}

TEST(Checkpoint, DependencyNotRequiringGradientsIsInvalidArgument) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable constant(Tensor({2}, 2.0F), false);
    Variable frozen(Tensor({2}, 3.0F));
    frozen.set_requires_gradient(false);
    for (const Variable& dependency : {constant, frozen}) {
        const Variable dependencies[] = {dependency};
        EXPECT_THROW(static_cast<void>(checkpoint(
                         x, dependencies,
                         [&dependency](const Variable& input) { return input * dependency; })),
                     std::invalid_argument);
    }
}

TEST(Checkpoint, RepeatedDependencyIsInvalidArgument) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable w(Tensor({2}, 2.0F));
    const Variable copy_of_handle = w;  // the same node through another handle
    const Variable dependencies[] = {w, copy_of_handle};
    EXPECT_THROW(static_cast<void>(checkpoint(x, dependencies,
                                              [&w](const Variable& input) { return input * w; })),
                 std::invalid_argument);
}

// --- first run (std::logic_error) ---------------------------------------------------------

TEST(Checkpoint, OutputNotRequiringGradientsIsLogicError) {
    const Variable x(Tensor({2}, 1.0F));
    EXPECT_THROW(static_cast<void>(checkpoint(
                     x, {}, [](const Variable&) { return Variable(Tensor({2}, 5.0F), false); })),
                 std::logic_error);
}

TEST(Checkpoint, ReadingAnUndeclaredDifferentiableLeafIsLogicError) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable declared(Tensor({2}, 2.0F));
    const Variable undeclared(Tensor({2}, 3.0F));
    const Variable dependencies[] = {declared};
    EXPECT_THROW(
        static_cast<void>(checkpoint(
            x, dependencies, [&](const Variable& input) { return input * declared + undeclared; })),
        std::logic_error);
}

TEST(Checkpoint, ReadingAnInteriorNodeCreatedOutsideIsLogicError) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable w(Tensor({2}, 2.0F));
    const Variable outside = w * x;  // built before the checkpoint
    const Variable dependencies[] = {w};
    EXPECT_THROW(static_cast<void>(checkpoint(
                     x, dependencies, [&](const Variable& input) { return input * w + outside; })),
                 std::logic_error);
}

TEST(Checkpoint, CreatingItsOwnDifferentiableLeafIsLogicError) {
    const Variable x(Tensor({2}, 1.0F));
    EXPECT_THROW(static_cast<void>(checkpoint(x, {},
                                              [](const Variable& input) {
                                                  const Variable own(Tensor({2}, 4.0F));
                                                  return input * own;
                                              })),
                 std::logic_error);
}

TEST(Checkpoint, ConstantsCreatedInsideAreAllowed) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable y = checkpoint(x, {}, [](const Variable& input) {
        const Variable constant(Tensor({2}, {4.0F, 5.0F}), false);
        return input * constant;
    });
    sum(y).backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {4.0, 5.0}));
}

TEST(Checkpoint, NotUsingAnInputThatRequiresGradientsIsLogicError) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable w(Tensor({2}, 2.0F));
    const Variable dependencies[] = {w};
    EXPECT_THROW(
        static_cast<void>(checkpoint(x, dependencies, [&w](const Variable&) { return w * 2.0F; })),
        std::logic_error);
}

TEST(Checkpoint, InputNotRequiringGradientsNeedNotBeUsed) {
    const Variable x(Tensor({2}, 1.0F), false);
    Variable w(Tensor({2}, {2.0F, 3.0F}));
    const Variable dependencies[] = {w};
    Variable y = checkpoint(x, dependencies, [&w](const Variable&) { return w * w; });
    sum(y).backward();
    EXPECT_TRUE(testing::all_close(w.gradient(), {4.0, 6.0}));
}

TEST(Checkpoint, SkippingADeclaredDependencyIsLogicError) {
    const Variable x(Tensor({2}, 1.0F));
    const Variable used(Tensor({2}, 2.0F));
    const Variable skipped(Tensor({2}, 3.0F));
    const Variable dependencies[] = {used, skipped};
    EXPECT_THROW(static_cast<void>(checkpoint(
                     x, dependencies, [&used](const Variable& input) { return input * used; })),
                 std::logic_error);
}

// --- replay (std::logic_error) ------------------------------------------------------------

TEST(Checkpoint, ReplayWithAnotherOutputShapeIsLogicErrorAndChangesNothing) {
    Variable x(Tensor({2, 3}, testing::pseudo_random(6)));
    Variable w(Tensor({2, 3}, testing::pseudo_random(6, -1.0F, 1.0F, 2U)));
    sum(x * w).backward();
    const GradientSnapshot x_before = snapshot(x);
    const GradientSnapshot w_before = snapshot(w);
    int calls = 0;
    const Variable dependencies[] = {w};
    Variable y = checkpoint(x, dependencies, [&](const Variable& input) {
        ++calls;
        const Variable product = input * w;
        return calls == 1 ? sum(product, 1) : sum(product, 0);  // [2] then [3]
    });
    Variable loss = sum(y);
    EXPECT_THROW(loss.backward(), std::logic_error);
    EXPECT_EQ(calls, 2);
    EXPECT_TRUE(unchanged(x_before, x));
    EXPECT_TRUE(unchanged(w_before, w));
}

TEST(Checkpoint, ReplaySkippingADependencyIsLogicErrorAndChangesNothing) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    Variable v(Tensor({2}, {5.0F, 6.0F}));
    sum(x * w * v).backward();
    const GradientSnapshot before[] = {snapshot(x), snapshot(w), snapshot(v)};
    int calls = 0;
    const Variable dependencies[] = {w, v};
    Variable y = checkpoint(x, dependencies, [&](const Variable& input) {
        ++calls;
        return calls == 1 ? input * w * v : input * w;
    });
    EXPECT_THROW(sum(y).backward(), std::logic_error);
    EXPECT_TRUE(unchanged(before[0], x));
    EXPECT_TRUE(unchanged(before[1], w));
    EXPECT_TRUE(unchanged(before[2], v));
}

TEST(Checkpoint, ReplayReadingAnUndeclaredLeafIsLogicErrorAndChangesNothing) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    Variable undeclared(Tensor({2}, {5.0F, 6.0F}));
    sum(x * w * undeclared).backward();
    const GradientSnapshot before[] = {snapshot(x), snapshot(w), snapshot(undeclared)};
    int calls = 0;
    const Variable dependencies[] = {w};
    Variable y = checkpoint(x, dependencies, [&](const Variable& input) {
        ++calls;
        return calls == 1 ? input * w : input * w * undeclared;
    });
    EXPECT_THROW(sum(y).backward(), std::logic_error);
    EXPECT_TRUE(unchanged(before[0], x));
    EXPECT_TRUE(unchanged(before[1], w));
    EXPECT_TRUE(unchanged(before[2], undeclared));
}

TEST(Checkpoint, ExceptionDuringReplayPropagatesAndLeavesGradientsIntact) {
    Layer layer(4, 100U);
    Variable x(Tensor({3, 4}, testing::pseudo_random(12, -1.0F, 1.0F, 5U)));
    const std::vector<Variable> parameters = layer.parameters();
    sum(layer(x)).backward();
    std::vector<GradientSnapshot> before;
    for (const Variable& leaf : parameters)
        before.push_back(snapshot(leaf));
    const GradientSnapshot x_before = snapshot(x);

    int calls = 0;
    Variable y = checkpoint(x, parameters, [&](const Variable& input) {
        if (++calls == 2)
            throw std::runtime_error("replay failed");
        return layer(input);
    });
    // A second path to x outside the checkpoint gets processed too before the failure.
    Variable loss = sum(y) + sum(x * 3.0F);
    EXPECT_THROW(loss.backward(), std::runtime_error);
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(unchanged(before[i], parameters[i])) << "parameter " << i;
    }
    EXPECT_TRUE(unchanged(x_before, x));
}

// --- gradients equal the plain computation ------------------------------------------------

TEST(Checkpoint, SingleBlockGradientsEqualThePlainComputation) {
    Layer layer(5, 200U);
    Variable x(Tensor({3, 5}, testing::pseudo_random(15, -1.0F, 1.0F, 7U)));
    const std::vector<Variable> parameters = layer.parameters();
    const Variable readout(Tensor({3, 5}, testing::pseudo_random(15, -1.0F, 1.0F, 8U)), false);

    Variable plain = sum(layer(x) * readout);
    plain.backward();
    const std::vector<float> plain_x = x.gradient().to_host();
    const std::vector<std::vector<float>> plain_parameters = gradients_of(parameters);
    const std::vector<float> plain_value = plain.value().to_host();

    Variable checkpointed = sum(checkpoint(x, parameters, layer) * readout);
    EXPECT_TRUE(testing::bit_identical(checkpointed.value().to_host(), plain_value));
    checkpointed.backward();
    EXPECT_TRUE(gradients_match(x, plain_x));
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(gradients_match(parameters[i], plain_parameters[i])) << "parameter " << i;
    }
}

TEST(Checkpoint, TwoLayerBlockGradientsEqualThePlainComputation) {
    Layer first(6, 300U);
    Layer second(6, 400U);
    Variable x(Tensor({4, 6}, testing::pseudo_random(24, -1.0F, 1.0F, 9U)));
    std::vector<Variable> parameters = first.parameters();
    for (const Variable& p : second.parameters())
        parameters.push_back(p);
    const std::vector<std::uint32_t> targets = {0, 5, 2, 3};
    const auto block = [&](const Variable& h) { return second(first(h)); };

    cross_entropy(block(x), targets).backward();
    const std::vector<float> plain_x = x.gradient().to_host();
    const std::vector<std::vector<float>> plain_parameters = gradients_of(parameters);

    cross_entropy(checkpoint(x, parameters, block), targets).backward();
    EXPECT_TRUE(gradients_match(x, plain_x));
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(gradients_match(parameters[i], plain_parameters[i])) << "parameter " << i;
    }
}

TEST(Checkpoint, InputNotRequiringGradientsStillGivesDependencyGradients) {
    Layer layer(4, 500U);
    const Variable data(Tensor({3, 4}, testing::pseudo_random(12, -1.0F, 1.0F, 10U)), false);
    const std::vector<Variable> parameters = layer.parameters();
    sum(layer(data)).backward();
    const std::vector<std::vector<float>> plain = gradients_of(parameters);
    sum(checkpoint(data, parameters, layer)).backward();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(gradients_match(parameters[i], plain[i])) << "parameter " << i;
    }
}

TEST(Checkpoint, InteriorInputReceivesItsGradientThroughTheCheckpoint) {
    Layer layer(4, 600U);
    Variable x(Tensor({2, 4}, testing::pseudo_random(8, -1.0F, 1.0F, 11U)));
    Variable embed(Tensor({4, 4}, testing::pseudo_random(16, -1.0F, 1.0F, 12U)));
    const std::vector<Variable> parameters = layer.parameters();
    sum(layer(matmul(x, embed))).backward();
    const std::vector<float> plain_x = x.gradient().to_host();
    const std::vector<float> plain_embed = embed.gradient().to_host();
    sum(checkpoint(matmul(x, embed), parameters, layer)).backward();
    EXPECT_TRUE(gradients_match(x, plain_x));
    EXPECT_TRUE(gradients_match(embed, plain_embed));
}

TEST(Checkpoint, NestedCheckpointsEqualThePlainComputation) {
    Layer first(4, 700U);
    Layer second(4, 800U);
    Variable x(Tensor({3, 4}, testing::pseudo_random(12, -1.0F, 1.0F, 13U)));
    std::vector<Variable> parameters = first.parameters();
    for (const Variable& p : second.parameters())
        parameters.push_back(p);
    const std::vector<Variable> first_parameters = first.parameters();

    sum(second(first(x))).backward();
    const std::vector<float> plain_x = x.gradient().to_host();
    const std::vector<std::vector<float>> plain_parameters = gradients_of(parameters);

    int outer_calls = 0;
    int inner_calls = 0;
    const auto inner = [&](const Variable& h) {
        ++inner_calls;
        return first(h);
    };
    // The outer block checkpoints its first layer again; it declares every leaf it reads.
    const auto outer = [&](const Variable& h) {
        ++outer_calls;
        return second(checkpoint(h, first_parameters, inner));
    };
    reset_autograd_counters();
    Variable loss = sum(checkpoint(x, parameters, outer));
    EXPECT_EQ(outer_calls, 1);
    EXPECT_EQ(inner_calls, 1);
    loss.backward();
    // Backward replays the outer block (which runs the inner forward again) and, inside that
    // nested pass, replays the inner block: three passes in all.
    EXPECT_EQ(outer_calls, 2);
    EXPECT_EQ(inner_calls, 3);
    EXPECT_EQ(autograd_counters().backward_passes, 3U);
    EXPECT_TRUE(gradients_match(x, plain_x));
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(gradients_match(parameters[i], plain_parameters[i])) << "parameter " << i;
    }
}

TEST(Checkpoint, CheckpointsSharingAParameterEachContributeExactlyOnce) {
    // The same layer applied three times, each application checkpointed: the shared
    // parameters' gradients are the sum of three contributions, as in the plain graph.
    Layer shared(4, 900U);
    Variable x(Tensor({2, 4}, testing::pseudo_random(8, -1.0F, 1.0F, 14U)));
    const std::vector<Variable> parameters = shared.parameters();
    sum(shared(shared(shared(x)))).backward();
    const std::vector<float> plain_x = x.gradient().to_host();
    const std::vector<std::vector<float>> plain_parameters = gradients_of(parameters);

    Variable h = x;
    for (int i = 0; i < 3; ++i)
        h = checkpoint(h, parameters, shared);
    sum(h).backward();
    EXPECT_TRUE(gradients_match(x, plain_x));
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(gradients_match(parameters[i], plain_parameters[i])) << "parameter " << i;
    }
}

TEST(Checkpoint, ParameterUsedInsideAndOutsideACheckpointGetsBothContributions) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, -4.0F}));
    const Variable dependencies[] = {w};
    // loss = Σ (x⊙w)⊙w + Σ 5w: d w = 2 x⊙w + 5, d x = w².
    sum(checkpoint(x, dependencies, [&w](const Variable& input) { return input * w * w; }) +
        w * 5.0F)
        .backward();
    EXPECT_TRUE(testing::all_close(w.gradient(), {11.0, -11.0}));
    EXPECT_TRUE(testing::all_close(x.gradient(), {9.0, 16.0}));
}

TEST(Checkpoint, BackwardRunsOneReplayAndOneNestedPass) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    int calls = 0;
    Variable y = checkpoint(x, {}, [&calls](const Variable& input) {
        ++calls;
        return input * input;
    });
    Variable loss = sum(y) + sum(y * 2.0F);  // two consumers: still one replay
    EXPECT_EQ(calls, 1);
    reset_autograd_counters();
    loss.backward({.retain_graph = true});
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(autograd_counters().backward_passes, 2U);  // outer + nested
    EXPECT_TRUE(testing::all_close(x.gradient(), {6.0, 12.0}));
    // A retained outer graph replays again and gives the same gradients.
    loss.backward();
    EXPECT_EQ(calls, 3);
    EXPECT_TRUE(testing::all_close(x.gradient(), {6.0, 12.0}));
    EXPECT_THROW(loss.backward(), std::logic_error);
    EXPECT_EQ(calls, 3);
}

TEST(Checkpoint, AccumulateModeAddsTheCheckpointedContributions) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    const Variable dependencies[] = {w};
    const auto block = [&w](const Variable& input) { return input * w; };
    sum(checkpoint(x, dependencies, block)).backward();
    sum(checkpoint(x, dependencies, block)).backward({.accumulate = true});
    EXPECT_TRUE(testing::all_close(w.gradient(), {2.0, 4.0}));
    EXPECT_TRUE(testing::all_close(x.gradient(), {6.0, 8.0}));
}

// --- staleness and freezing ---------------------------------------------------------------

TEST(Checkpoint, ChangingADependencyAfterForwardMakesBackwardFail) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    sum(x * w).backward();
    const GradientSnapshot x_before = snapshot(x);
    int calls = 0;
    const Variable dependencies[] = {w};
    Variable y = sum(checkpoint(x, dependencies, [&](const Variable& input) {
        ++calls;
        return input * w;
    }));
    w.set_value(Tensor({2}, {5.0F, 6.0F}));
    EXPECT_THROW(y.backward(), std::logic_error);
    EXPECT_EQ(calls, 1);  // detected before any replay
    EXPECT_TRUE(unchanged(x_before, x));
    EXPECT_FALSE(w.has_gradient());
}

TEST(Checkpoint, ChangingTheInputLeafAfterForwardMakesBackwardFail) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    sum(x * w).backward();
    const GradientSnapshot w_before = snapshot(w);
    const Variable dependencies[] = {w};
    Variable y =
        sum(checkpoint(x, dependencies, [&w](const Variable& input) { return input * w; }));
    x.set_value(Tensor({2}, {7.0F, 8.0F}));
    EXPECT_THROW(y.backward(), std::logic_error);
    EXPECT_TRUE(unchanged(w_before, w));
}

TEST(Checkpoint, FreezingADependencyAfterForwardSkipsOnlyItsGradient) {
    // As in a plain graph (AutogradRules.FreezingAfterTheForwardPassStillSkipsTheWeightProduct)
    // a leaf frozen between forward and backward gets no gradient; the others still do.
    Variable x(Tensor({2, 3}, testing::pseudo_random(6, -1.0F, 1.0F, 15U)));
    Variable w(Tensor({3, 3}, testing::pseudo_random(9, -1.0F, 1.0F, 16U)));
    const auto block = [&w](const Variable& input) { return gelu(matmul(input, w)); };
    Variable plain = sum(block(x));
    w.set_requires_gradient(false);
    plain.backward();
    const std::vector<float> plain_x = x.gradient().to_host();
    w.set_requires_gradient(true);

    const Variable dependencies[] = {w};
    Variable checkpointed = sum(checkpoint(x, dependencies, block));
    w.set_requires_gradient(false);
    reset_autograd_counters();
    EXPECT_NO_THROW(checkpointed.backward());
    EXPECT_EQ(autograd_counters().matmul_right_gradients, 0U);
    EXPECT_TRUE(gradients_match(x, plain_x));
    EXPECT_FALSE(w.requires_gradient());
}

// --- structure of the forward result ------------------------------------------------------

TEST(Checkpoint, ForwardResultKeepsOnlyTheOutputAndItsEdges) {
    Layer layer(4, 1000U);
    Variable x(Tensor({3, 4}, testing::pseudo_random(12, -1.0F, 1.0F, 17U)));
    const std::vector<Variable> parameters = layer.parameters();
    const Variable plain = layer(x);
    // matmul, broadcast_to, add, gelu, layer_norm + x + 4 parameters
    EXPECT_EQ(plain.graph_statistics().node_count, 10U);
    const Variable checkpointed = checkpoint(x, parameters, layer);
    const GraphStatistics statistics = checkpointed.graph_statistics();
    EXPECT_EQ(statistics.node_count, 6U);  // the output, x and the 4 dependencies
    // Values of the output (12), x (12), W (16), b, γ, β (4 each): no internal activations.
    EXPECT_EQ(statistics.node_tensor_elements, 12U + 12U + 16U + 3U * 4U);
    EXPECT_FALSE(checkpointed.is_leaf());
    EXPECT_TRUE(checkpointed.requires_gradient());
}

TEST(Checkpoint, ForwardResultOfAnInteriorInputKeepsTheInputsGraph) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    const Variable h = x * 2.0F;
    const Variable dependencies[] = {w};
    const Variable y = checkpoint(
        h, dependencies, [&w](const Variable& input) { return gelu(input * w) * w + input; });
    EXPECT_EQ(y.graph_statistics().node_count, 4U);  // y, h, x, w
}

}  // namespace riftco_transformer
