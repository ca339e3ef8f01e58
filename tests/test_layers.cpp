// Layers (docs/ARCHITECTURE.md, 'Building blocks' and 'Attention'): every module's forward
// equals the functional composition it documents (3e-6) and so do its gradients (2e-5, see
// docs/ARCHITECTURE.md, 'Numeric parity'); parameter names, shapes and
// initial values; validation errors; a frozen Linear weight costs no weight-gradient product;
// attention gradients against centred finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "riftco_transformer/nn/initialization.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {
namespace ops = tensor_ops;

// Module against functional (docs/ARCHITECTURE.md, 'Numeric parity').
constexpr double forward_tolerance = 3e-6;
constexpr double gradient_tolerance = 2e-5;

Tensor random_tensor(const Shape& shape, std::uint32_t seed, float lo = -1.0F, float hi = 1.0F) {
    const std::vector<float> values =
        testing::pseudo_random(checked_element_count(shape), lo, hi, seed);
    return Tensor(shape, std::span<const float>(values));
}

// Gives every parameter non-trivial values (biases non-zero, norm scales away from 1).
void randomize_parameters(const Module& module, std::uint32_t seed) {
    for (const NamedParameter& named : module.parameters()) {
        Variable handle = named.parameter;
        handle.set_value(random_tensor(handle.shape(), seed++, -0.6F, 0.6F));
    }
}

// Independent leaves holding copies of a module's parameter values (same order).
std::vector<Variable> functional_leaves(const Module& module) {
    std::vector<Variable> leaves;
    for (const NamedParameter& named : module.parameters()) {
        leaves.emplace_back(named.parameter.value(), true);
    }
    return leaves;
}

// Σ y ⊙ w for a fixed pseudo-random w: a scalar whose upstream into y is w.
Variable weighted_sum(const Variable& y, std::uint32_t seed) {
    return sum(y * Variable(random_tensor(y.shape(), seed), false));
}

// x·Wᵀ + b written with generic Variable operations: flatten the leading axes, matmul with the
// explicit transpose, broadcast the bias, restore the leading axes.
Variable affine_composition(const Variable& x, const Variable& weight, const Variable& bias) {
    const std::size_t in = weight.shape()[1];
    const std::size_t out = weight.shape()[0];
    const std::size_t rows = x.value().numel() / in;
    Variable y = matmul(reshape(x, {rows, in}), transpose_2d(weight));
    if (bias.defined())
        y = y + broadcast_to(bias, {rows, out});
    Shape shape = x.shape();
    shape.back() = out;
    return reshape(y, shape);
}

std::vector<std::string> names_of(const Module& module) {
    std::vector<std::string> names;
    for (const NamedParameter& named : module.parameters())
        names.push_back(named.name);
    return names;
}

std::vector<Shape> shapes_of(const Module& module) {
    std::vector<Shape> shapes;
    for (const NamedParameter& named : module.parameters())
        shapes.push_back(named.parameter.shape());
    return shapes;
}

// The module's parameter gradients equal those of the functional leaves, in order.
void expect_parameter_gradients_close(const Module& module, const std::vector<Variable>& leaves) {
    const ParameterList list = module.parameters();
    ASSERT_EQ(list.size(), leaves.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
        ASSERT_TRUE(list[i].parameter.has_gradient()) << list[i].name;
        EXPECT_TRUE(testing::all_close(list[i].parameter.gradient(),
                                       testing::to_double(leaves[i].gradient().to_host()),
                                       gradient_tolerance, 0.0))
            << list[i].name;
    }
}

// Runs module_forward and functional_forward on equal copies of x, backpropagates the same
// weighted sum through both, and compares outputs (3e-6) and every gradient (2e-5).
template <typename ModuleForward, typename FunctionalForward>
void expect_module_matches_functional(const Module& module, const Shape& input_shape,
                                      ModuleForward module_forward,
                                      FunctionalForward functional_forward) {
    const Tensor input = random_tensor(input_shape, 1234U, -1.5F, 1.5F);
    Variable module_x(input, true);
    Variable functional_x(input, true);
    const std::vector<Variable> leaves = functional_leaves(module);

    const Variable module_y = module_forward(module_x);
    const Variable functional_y = functional_forward(functional_x, leaves);
    ASSERT_EQ(module_y.shape(), functional_y.shape());
    EXPECT_TRUE(testing::all_close(module_y.value(),
                                   testing::to_double(functional_y.value().to_host()),
                                   forward_tolerance, 0.0));

    weighted_sum(module_y, 77U).backward();
    weighted_sum(functional_y, 77U).backward();
    EXPECT_TRUE(testing::all_close(module_x.gradient(),
                                   testing::to_double(functional_x.gradient().to_host()),
                                   gradient_tolerance, 0.0))
        << "input gradient";
    expect_parameter_gradients_close(module, leaves);
}

// Population statistics in double: the hand-computed layer norm / RMS norm of one row layout.
std::vector<double> reference_layer_norm(const std::vector<float>& x, std::size_t width,
                                         double epsilon) {
    std::vector<double> y(x.size());
    for (std::size_t row = 0; row < x.size() / width; ++row) {
        double mean = 0.0;
        for (std::size_t i = 0; i < width; ++i)
            mean += x[row * width + i];
        mean /= static_cast<double>(width);
        double variance = 0.0;
        for (std::size_t i = 0; i < width; ++i) {
            variance += (x[row * width + i] - mean) * (x[row * width + i] - mean);
        }
        variance /= static_cast<double>(width);
        for (std::size_t i = 0; i < width; ++i) {
            y[row * width + i] = (x[row * width + i] - mean) / std::sqrt(variance + epsilon);
        }
    }
    return y;
}

std::vector<double> reference_rms_norm(const std::vector<float>& x, std::size_t width,
                                       double epsilon) {
    std::vector<double> y(x.size());
    for (std::size_t row = 0; row < x.size() / width; ++row) {
        double square = 0.0;
        for (std::size_t i = 0; i < width; ++i) {
            square += static_cast<double>(x[row * width + i]) * x[row * width + i];
        }
        const double inverse = 1.0 / std::sqrt(square / static_cast<double>(width) + epsilon);
        for (std::size_t i = 0; i < width; ++i)
            y[row * width + i] = x[row * width + i] * inverse;
    }
    return y;
}

}  // namespace

// ---- Linear -------------------------------------------------------------------------------------

TEST(Linear, ParametersAreWeightOutByInAndZeroBias) {
    std::mt19937 generator(1U);
    const Linear layer(4, 3, generator);
    EXPECT_EQ(names_of(layer), (std::vector<std::string>{"weight", "bias"}));
    EXPECT_EQ(shapes_of(layer), (std::vector<Shape>{{3, 4}, {3}}));
    EXPECT_EQ(layer.parameter_count(), 15U);
    EXPECT_EQ(layer.in_features(), 4U);
    EXPECT_EQ(layer.out_features(), 3U);
    EXPECT_TRUE(layer.has_bias());
    EXPECT_EQ(layer.weight().node().get(), layer.parameters()[0].parameter.node().get());
    EXPECT_TRUE(testing::all_close(layer.parameters()[1].parameter.value(), {0.0, 0.0, 0.0}));
    const auto limit = static_cast<float>(std::sqrt(6.0 / 7.0));
    for (const float w : layer.weight().value().to_host()) {
        EXPECT_GE(w, -limit);
        EXPECT_LT(w, limit);
    }
}

TEST(Linear, ForwardIsXTimesWTransposedPlusBiasByHand) {
    std::mt19937 generator(1U);
    const Linear layer(2, 2, generator);
    const ParameterList list = layer.parameters();
    Variable weight = list[0].parameter;
    Variable bias = list[1].parameter;
    weight.set_value(Tensor({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F}));
    bias.set_value(Tensor({2}, {0.5F, -1.0F}));
    // [1,1]·Wᵀ = [1+2, 3+4]; [2,-1]·Wᵀ = [0, 2]; plus the bias.
    const Variable y = layer.forward(Variable(Tensor({2, 2}, {1.0F, 1.0F, 2.0F, -1.0F}), false));
    EXPECT_TRUE(testing::all_close(y.value(), {3.5, 6.0, 0.5, 1.0}));
}

TEST(Linear, ForwardEqualsRawTensorComposition) {
    std::mt19937 generator(2U);
    const Linear layer(4, 3, generator);
    randomize_parameters(layer, 10U);
    const Tensor x = random_tensor({5, 4}, 3U);
    const Variable y = layer.forward(Variable(x, false));
    const ParameterList list = layer.parameters();
    const Tensor product = ops::matmul(x, list[0].parameter.value(), false, true);
    const Tensor expected =
        ops::add(product, ops::broadcast_to(list[1].parameter.value(), product.shape()));
    EXPECT_EQ(y.shape(), (Shape{5, 3}));
    EXPECT_TRUE(testing::all_close(y.value(), testing::to_double(expected.to_host()),
                                   forward_tolerance, 0.0));
}

TEST(Linear, GradientsEqualTheFunctionalVariableComposition) {
    std::mt19937 generator(3U);
    const Linear layer(4, 3, generator);
    randomize_parameters(layer, 20U);
    expect_module_matches_functional(
        layer, {6, 4}, [&](const Variable& x) { return layer.forward(x); },
        [](const Variable& x, const std::vector<Variable>& p) {
            return matmul(x, transpose_2d(p[0])) + broadcast_to(p[1], {6, 3});
        });
}

TEST(Linear, AcceptsRank3AndRank1InputsOverTheLastAxis) {
    std::mt19937 generator(4U);
    const Linear layer(4, 5, generator);
    randomize_parameters(layer, 30U);
    // [2,3,4] -> [2,3,5]: forward against raw ops on the flattened rows, then gradients.
    const Tensor x = random_tensor({2, 3, 4}, 5U);
    const Variable y = layer.forward(Variable(x, false));
    EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
    const Tensor rows =
        ops::matmul(ops::reshape(x, {6, 4}), layer.parameters()[0].parameter.value(), false, true);
    const Tensor expected = ops::reshape(
        ops::add(rows, ops::broadcast_to(layer.parameters()[1].parameter.value(), {6, 5})),
        {2, 3, 5});
    EXPECT_TRUE(testing::all_close(y.value(), testing::to_double(expected.to_host()),
                                   forward_tolerance, 0.0));
    expect_module_matches_functional(
        layer, {2, 3, 4}, [&](const Variable& input) { return layer.forward(input); },
        [](const Variable& input, const std::vector<Variable>& p) {
            return affine_composition(input, p[0], p[1]);
        });
    // [4] -> [5]
    EXPECT_EQ(layer.forward(Variable(random_tensor({4}, 6U), false)).shape(), (Shape{5}));
    expect_module_matches_functional(
        layer, {4}, [&](const Variable& input) { return layer.forward(input); },
        [](const Variable& input, const std::vector<Variable>& p) {
            return affine_composition(input, p[0], p[1]);
        });
}

TEST(Linear, WithoutBiasHasOnlyAWeightAndAddsNothing) {
    std::mt19937 generator(5U);
    const Linear layer(3, 2, generator, false);
    EXPECT_FALSE(layer.has_bias());
    EXPECT_EQ(names_of(layer), (std::vector<std::string>{"weight"}));
    EXPECT_EQ(layer.parameter_count(), 6U);
    randomize_parameters(layer, 40U);
    const Tensor x = random_tensor({4, 3}, 7U);
    const Tensor expected = ops::matmul(x, layer.weight().value(), false, true);
    EXPECT_TRUE(testing::all_close(layer.forward(Variable(x, false)).value(),
                                   testing::to_double(expected.to_host()), forward_tolerance, 0.0));
    expect_module_matches_functional(
        layer, {2, 2, 3}, [&](const Variable& input) { return layer.forward(input); },
        [](const Variable& input, const std::vector<Variable>& p) {
            return affine_composition(input, p[0], Variable());
        });
}

TEST(Linear, RejectsZeroWidths) {
    std::mt19937 generator(6U);
    const std::mt19937 untouched(6U);
    EXPECT_THROW(Linear(0, 3, generator), std::invalid_argument);
    EXPECT_THROW(Linear(3, 0, generator), std::invalid_argument);
    EXPECT_THROW(Linear(0, 0, generator, false), std::invalid_argument);
    EXPECT_TRUE(generator == untouched) << "validation precedes any draw";
}

TEST(Linear, RejectsARank0InputAndAWrongLastDimension) {
    std::mt19937 generator(7U);
    const Linear layer(3, 2, generator);
    EXPECT_THROW(static_cast<void>(layer.forward(Variable::scalar(1.0F))), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(layer.forward(Variable(Tensor({4, 2}, 1.0F)))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(layer.forward(Variable(Tensor({2, 3, 4}, 1.0F)))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(layer.forward(Variable(Tensor({3, 1}, 1.0F)))),
                 std::invalid_argument);
}

TEST(Linear, AFrozenWeightCostsNoWeightGradientProduct) {
    std::mt19937 generator(8U);
    const Linear layer(4, 3, generator);
    randomize_parameters(layer, 50U);
    Variable weight = layer.weight();
    weight.set_requires_gradient(false);

    Variable x(random_tensor({5, 4}, 9U), true);
    const AutogradCounters before = autograd_counters();
    Variable total = sum(layer.forward(x));
    total.backward();
    const AutogradCounters after = autograd_counters();
    EXPECT_EQ(after.matmul_right_gradients, before.matmul_right_gradients);
    EXPECT_EQ(after.matmul_left_gradients, before.matmul_left_gradients + 1);

    // d(Σ y)/dx[r][i] = Σ_o W[o][i]: every row of dx is the column sums of W.
    const std::vector<float> w = weight.value().to_host();
    std::vector<double> expected;
    for (std::size_t r = 0; r < 5; ++r) {
        for (std::size_t i = 0; i < 4; ++i) {
            expected.push_back(static_cast<double>(w[i]) + w[4 + i] + w[8 + i]);
        }
    }
    EXPECT_TRUE(testing::all_close(x.gradient(), expected, 1e-6, 1e-6));
    EXPECT_TRUE(testing::all_close(layer.parameters()[1].parameter.gradient(), {5.0, 5.0, 5.0}));
    EXPECT_THROW(static_cast<void>(weight.gradient()), std::logic_error);

    // Unfrozen, the same pass computes exactly one weight-gradient product.
    weight.set_requires_gradient(true);
    const AutogradCounters unfrozen_before = autograd_counters();
    Variable again = sum(layer.forward(x));
    again.backward();
    EXPECT_EQ(autograd_counters().matmul_right_gradients,
              unfrozen_before.matmul_right_gradients + 1);
    EXPECT_TRUE(weight.has_gradient());
}

// ---- Embedding ----------------------------------------------------------------------------------

TEST(Embedding, ForwardGathersRowsOfTheWeight) {
    std::mt19937 generator(9U);
    const Embedding embedding(5, 4, generator);
    EXPECT_EQ(names_of(embedding), (std::vector<std::string>{"weight"}));
    EXPECT_EQ(shapes_of(embedding), (std::vector<Shape>{{5, 4}}));
    const std::vector<std::size_t> ids = {3, 0, 3, 1, 4, 2};
    const Variable y = embedding.forward(ids, {2, 3});
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
    const Tensor expected = ops::gather_rows(embedding.weight().value(), ids, {2, 3});
    EXPECT_TRUE(testing::bit_identical(y.value().to_host(), expected.to_host()));
    // And by hand: output row k is weight row ids[k].
    const std::vector<float> table = embedding.weight().value().to_host();
    const std::vector<float> out = y.value().to_host();
    for (std::size_t k = 0; k < ids.size(); ++k) {
        for (std::size_t d = 0; d < 4; ++d)
            EXPECT_EQ(out[k * 4 + d], table[ids[k] * 4 + d]);
    }
}

TEST(Embedding, BackwardScatterAddsRepeatedIds) {
    std::mt19937 generator(10U);
    const Embedding embedding(4, 2, generator);
    const std::vector<std::size_t> ids = {2, 0, 2};
    const Variable y = embedding.forward(ids, {3});
    const Variable upstream(Tensor({3, 2}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F}), false);
    sum(y * upstream).backward();
    // Row 0 gets upstream row 1; row 2 gets rows 0 + 2; rows 1 and 3 nothing.
    EXPECT_TRUE(testing::all_close(embedding.weight().gradient(),
                                   {3.0, 4.0, 0.0, 0.0, 6.0, 8.0, 0.0, 0.0}));
}

TEST(Embedding, IsInitialisedUniformWithinInverseSqrtWidth) {
    std::mt19937 generator(11U);
    const Embedding embedding(64, 16, generator);
    const float limit = 0.25F;  // 1/√16
    float low = 0.0F;
    float high = 0.0F;
    for (const float w : embedding.weight().value().to_host()) {
        EXPECT_GE(w, -limit);
        EXPECT_LT(w, limit);
        low = std::min(low, w);
        high = std::max(high, w);
    }
    EXPECT_LT(low, -0.98F * limit);
    EXPECT_GT(high, 0.98F * limit);
    // Exactly the uniform draws of the documented range from the same seed.
    std::mt19937 reference(11U);
    const Tensor expected = uniform_tensor({64, 16}, -limit, limit, reference);
    EXPECT_TRUE(testing::bit_identical(embedding.weight().value().to_host(), expected.to_host()));
    EXPECT_TRUE(generator == reference);
}

TEST(Embedding, RejectsOutOfRangeIdsAndBadSizes) {
    std::mt19937 generator(12U);
    const Embedding embedding(5, 3, generator);
    const std::vector<std::size_t> bad = {1, 5};
    EXPECT_THROW(static_cast<void>(embedding.forward(bad, {2})), std::out_of_range);
    const std::vector<std::size_t> ids = {1, 2, 3};
    EXPECT_THROW(static_cast<void>(embedding.forward(ids, {2})), std::invalid_argument);
    EXPECT_THROW(Embedding(0, 3, generator), std::invalid_argument);
    EXPECT_THROW(Embedding(5, 0, generator), std::invalid_argument);
}

// ---- LayerNorm and RMSNorm --------------------------------------------------------------------

TEST(LayerNorm, DefaultsAreUnitScaleZeroBiasAndEpsilon1em5) {
    const LayerNorm norm(6);
    EXPECT_EQ(names_of(norm), (std::vector<std::string>{"scale", "bias"}));
    EXPECT_EQ(shapes_of(norm), (std::vector<Shape>{{6}, {6}}));
    EXPECT_TRUE(
        testing::all_close(norm.parameters()[0].parameter.value(), std::vector<double>(6, 1.0)));
    EXPECT_TRUE(
        testing::all_close(norm.parameters()[1].parameter.value(), std::vector<double>(6, 0.0)));
    // Rows with a variance (~1e-6) comparable to eps make the epsilon observable.
    const Tensor x = random_tensor({3, 6}, 13U, -2e-3F, 2e-3F);
    const Variable y = norm.forward(Variable(x, false));
    EXPECT_TRUE(
        testing::all_close(y.value(), reference_layer_norm(x.to_host(), 6, 1e-5), 1e-5, 1e-5));
    EXPECT_FALSE(
        testing::all_close(y.value(), reference_layer_norm(x.to_host(), 6, 1e-6), 1e-3, 0.0));
    const Variable functional = layer_norm(Variable(x, false), Variable(Tensor({6}, 1.0F), false),
                                           Variable(Tensor({6}, 0.0F), false), 1e-5F);
    EXPECT_TRUE(testing::all_close(y.value(), testing::to_double(functional.value().to_host()),
                                   forward_tolerance, 0.0));
}

TEST(LayerNorm, UsesTheEpsilonItWasGiven) {
    const LayerNorm norm(6, 1e-3F);
    const Tensor x = random_tensor({3, 6}, 14U, -2e-2F, 2e-2F);
    EXPECT_TRUE(testing::all_close(norm.forward(Variable(x, false)).value(),
                                   reference_layer_norm(x.to_host(), 6, 1e-3), 1e-5, 1e-5));
}

TEST(LayerNorm, ModuleEqualsFunctionalForwardAndGradients) {
    const LayerNorm norm(8);
    randomize_parameters(norm, 60U);
    expect_module_matches_functional(
        norm, {2, 3, 8}, [&](const Variable& x) { return norm.forward(x); },
        [](const Variable& x, const std::vector<Variable>& p) {
            return layer_norm(x, p[0], p[1], 1e-5F);
        });
}

TEST(LayerNorm, RejectsBadEpsilonAndZeroWidth) {
    for (const float epsilon : {0.0F, -1e-5F, std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity()}) {
        EXPECT_THROW(LayerNorm(4, epsilon), std::invalid_argument) << epsilon;
    }
    EXPECT_THROW(LayerNorm(0), std::invalid_argument);
    const LayerNorm norm(4);
    EXPECT_THROW(static_cast<void>(norm.forward(Variable(Tensor({2, 3}, 1.0F)))),
                 std::invalid_argument);
}

TEST(RMSNorm, DefaultsAreUnitScaleAndEpsilon1em5) {
    const RMSNorm norm(5);
    EXPECT_EQ(names_of(norm), (std::vector<std::string>{"scale"}));
    EXPECT_EQ(shapes_of(norm), (std::vector<Shape>{{5}}));
    EXPECT_TRUE(
        testing::all_close(norm.parameters()[0].parameter.value(), std::vector<double>(5, 1.0)));
    const Tensor x = random_tensor({4, 5}, 15U, -3e-3F, 3e-3F);
    const Variable y = norm.forward(Variable(x, false));
    EXPECT_TRUE(
        testing::all_close(y.value(), reference_rms_norm(x.to_host(), 5, 1e-5), 1e-5, 1e-5));
    EXPECT_FALSE(
        testing::all_close(y.value(), reference_rms_norm(x.to_host(), 5, 1e-6), 1e-3, 0.0));
    const Variable functional =
        rms_norm(Variable(x, false), Variable(Tensor({5}, 1.0F), false), 1e-5F);
    EXPECT_TRUE(testing::all_close(y.value(), testing::to_double(functional.value().to_host()),
                                   forward_tolerance, 0.0));
}

TEST(RMSNorm, UsesTheEpsilonItWasGiven) {
    const RMSNorm norm(5, 1e-2F);
    const Tensor x = random_tensor({4, 5}, 16U, -0.1F, 0.1F);
    EXPECT_TRUE(testing::all_close(norm.forward(Variable(x, false)).value(),
                                   reference_rms_norm(x.to_host(), 5, 1e-2), 1e-5, 1e-5));
}

TEST(RMSNorm, ModuleEqualsFunctionalForwardAndGradients) {
    const RMSNorm norm(8);
    randomize_parameters(norm, 70U);
    expect_module_matches_functional(
        norm, {3, 2, 8}, [&](const Variable& x) { return norm.forward(x); },
        [](const Variable& x, const std::vector<Variable>& p) { return rms_norm(x, p[0], 1e-5F); });
}

TEST(RMSNorm, RejectsBadEpsilonAndZeroWidth) {
    for (const float epsilon : {0.0F, -1.0F, std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::infinity()}) {
        EXPECT_THROW(RMSNorm(4, epsilon), std::invalid_argument) << epsilon;
    }
    EXPECT_THROW(RMSNorm(0), std::invalid_argument);
}

// ---- FeedForward and SwiGLU -------------------------------------------------------------------

TEST(FeedForward, ParametersAreExpandThenProject) {
    std::mt19937 generator(17U);
    const FeedForward block(4, 10, generator);
    EXPECT_EQ(names_of(block), (std::vector<std::string>{"expand.weight", "expand.bias",
                                                         "project.weight", "project.bias"}));
    EXPECT_EQ(shapes_of(block), (std::vector<Shape>{{10, 4}, {10}, {4, 10}, {4}}));
    EXPECT_EQ(block.parameter_count(), 4U * 10U + 10U + 10U * 4U + 4U);
}

TEST(FeedForward, EqualsExpandActivateProjectForEveryActivation) {
    for (const Activation activation : {Activation::Gelu, Activation::Relu, Activation::GeluTanh}) {
        SCOPED_TRACE(static_cast<int>(activation));
        std::mt19937 generator(18U);
        const FeedForward block(6, 9, generator, activation);
        randomize_parameters(block, 80U);
        expect_module_matches_functional(
            block, {2, 4, 6}, [&](const Variable& x) { return block.forward(x); },
            [activation](const Variable& x, const std::vector<Variable>& p) {
                const Variable hidden = affine_composition(x, p[0], p[1]);
                const Variable active = activation == Activation::Gelu       ? gelu(hidden)
                                        : activation == Activation::GeluTanh ? gelu_tanh(hidden)
                                                                             : relu(hidden);
                return affine_composition(active, p[2], p[3]);
            });
    }
}

TEST(FeedForward, DefaultsToGelu) {
    std::mt19937 generator(19U);
    const FeedForward block(3, 5, generator);
    randomize_parameters(block, 90U);
    const Variable x(random_tensor({4, 3}, 20U, -2.0F, 2.0F), false);
    const ParameterList p = block.parameters();
    const Variable expected =
        affine_composition(gelu(affine_composition(x, p[0].parameter, p[1].parameter)),
                           p[2].parameter, p[3].parameter);
    EXPECT_TRUE(testing::all_close(block.forward(x).value(),
                                   testing::to_double(expected.value().to_host()),
                                   forward_tolerance, 0.0));
}

TEST(FeedForward, RejectsAnUnknownActivationAndZeroWidths) {
    std::mt19937 generator(21U);
    EXPECT_THROW(FeedForward(4, 8, generator, static_cast<Activation>(3)), std::invalid_argument);
    EXPECT_THROW(FeedForward(0, 8, generator), std::invalid_argument);
    EXPECT_THROW(FeedForward(4, 0, generator), std::invalid_argument);
}

TEST(SwiGLU, HasThreeBiasFreeProjections) {
    std::mt19937 generator(22U);
    const SwiGLU block(4, 6, generator);
    EXPECT_EQ(names_of(block),
              (std::vector<std::string>{"gate.weight", "up.weight", "down.weight"}));
    EXPECT_EQ(shapes_of(block), (std::vector<Shape>{{6, 4}, {6, 4}, {4, 6}}));
    EXPECT_EQ(block.parameter_count(), 3U * 4U * 6U);
}

TEST(SwiGLU, EqualsDownOfSiluGateTimesUp) {
    std::mt19937 generator(23U);
    const SwiGLU block(5, 7, generator);
    randomize_parameters(block, 100U);
    expect_module_matches_functional(
        block, {3, 2, 5}, [&](const Variable& x) { return block.forward(x); },
        [](const Variable& x, const std::vector<Variable>& p) {
            const Variable gate = affine_composition(x, p[0], Variable());
            const Variable up = affine_composition(x, p[1], Variable());
            return affine_composition(silu(gate) * up, p[2], Variable());
        });
}

// ---- CausalSelfAttention ----------------------------------------------------------------------

namespace {

// The attention data flow (docs/ARCHITECTURE.md, 'Attention') written out with Variable operations
// on the leaves {query, key, value, output} × {weight, bias}.
Variable attention_composition(const Variable& x, const std::vector<Variable>& p, std::size_t heads,
                               AttentionKind kind) {
    const std::size_t batch = x.shape()[0];
    const std::size_t time = x.shape()[1];
    const std::size_t width = x.shape()[2];
    const std::size_t head_width = width / heads;
    const auto split = [&](const Variable& projected) {
        return permute(reshape(projected, {batch, time, heads, head_width}), {0, 2, 1, 3});
    };
    const Variable q = split(linear(x, p[0], p[1]));
    const Variable k = split(linear(x, p[2], p[3]));
    const Variable v = split(linear(x, p[4], p[5]));
    const Variable context = kind == AttentionKind::Flash
                                 ? flash_causal_attention(q, k, v)
                                 : causal_scaled_dot_product_attention(q, k, v).context;
    return linear(reshape(permute(context, {0, 2, 1, 3}), {batch, time, width}), p[6], p[7]);
}

}  // namespace

TEST(CausalSelfAttention, HasFourBiasedProjectionsInOrder) {
    std::mt19937 generator(24U);
    const CausalSelfAttention attention(8, 2, generator);
    EXPECT_EQ(
        names_of(attention),
        (std::vector<std::string>{"query.weight", "query.bias", "key.weight", "key.bias",
                                  "value.weight", "value.bias", "output.weight", "output.bias"}));
    for (std::size_t i = 0; i < 8; i += 2) {
        EXPECT_EQ(shapes_of(attention)[i], (Shape{8, 8}));
        EXPECT_EQ(shapes_of(attention)[i + 1], (Shape{8}));
    }
    EXPECT_EQ(attention.parameter_count(), 4U * 64U + 4U * 8U);
    EXPECT_EQ(attention.head_count(), 2U);
    EXPECT_EQ(attention.kind(), AttentionKind::Materialized);
}

TEST(CausalSelfAttention, ModuleEqualsTheFunctionalDataFlowForBothKinds) {
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        SCOPED_TRACE(kind == AttentionKind::Flash ? "flash" : "materialized");
        std::mt19937 generator(25U);
        const CausalSelfAttention attention(8, 2, generator, kind);
        EXPECT_EQ(attention.kind(), kind);
        randomize_parameters(attention, 110U);
        expect_module_matches_functional(
            attention, {2, 5, 8}, [&](const Variable& x) { return attention.forward(x); },
            [kind](const Variable& x, const std::vector<Variable>& p) {
                return attention_composition(x, p, 2, kind);
            });
    }
}

TEST(CausalSelfAttention, SetKindSwitchesTheAlgorithmAndRejectsUnknownValues) {
    std::mt19937 generator(26U);
    CausalSelfAttention attention(4, 1, generator);
    randomize_parameters(attention, 120U);
    attention.set_kind(AttentionKind::Flash);
    EXPECT_EQ(attention.kind(), AttentionKind::Flash);
    expect_module_matches_functional(
        attention, {1, 6, 4}, [&](const Variable& x) { return attention.forward(x); },
        [](const Variable& x, const std::vector<Variable>& p) {
            return attention_composition(x, p, 1, AttentionKind::Flash);
        });
    EXPECT_THROW(attention.set_kind(static_cast<AttentionKind>(7)), std::invalid_argument);
    EXPECT_EQ(attention.kind(), AttentionKind::Flash);
}

TEST(CausalSelfAttention, LaterPositionsLeaveEarlierOutputsBitIdentical) {
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        std::mt19937 generator(27U);
        const CausalSelfAttention attention(6, 3, generator, kind);
        randomize_parameters(attention, 130U);
        std::vector<float> x = testing::pseudo_random(1 * 7 * 6, -1.0F, 1.0F, 5U);
        const std::vector<float> before =
            attention.forward(Variable(Tensor({1, 7, 6}, x), false)).value().to_host();
        for (std::size_t i = 4 * 6; i < x.size(); ++i)
            x[i] += 0.75F;  // positions 4..6
        const std::vector<float> after =
            attention.forward(Variable(Tensor({1, 7, 6}, x), false)).value().to_host();
        const std::vector<float> early_before(before.begin(), before.begin() + 4 * 6);
        const std::vector<float> early_after(after.begin(), after.begin() + 4 * 6);
        EXPECT_TRUE(testing::bit_identical(early_before, early_after));
        EXPECT_FALSE(testing::bit_identical(before, after));
    }
}

TEST(CausalSelfAttention, RejectsBadWidthsAndHeadCounts) {
    std::mt19937 generator(28U);
    EXPECT_THROW(CausalSelfAttention(0, 1, generator), std::invalid_argument);
    EXPECT_THROW(CausalSelfAttention(0, 0, generator), std::invalid_argument);
    EXPECT_THROW(CausalSelfAttention(8, 0, generator), std::invalid_argument);
    EXPECT_THROW(CausalSelfAttention(8, 3, generator), std::invalid_argument);
    EXPECT_THROW(CausalSelfAttention(8, 16, generator), std::invalid_argument);
    EXPECT_THROW(CausalSelfAttention(8, 2, generator, static_cast<AttentionKind>(3)),
                 std::invalid_argument);
}

TEST(CausalSelfAttention, RejectsInputsThatAreNotBTD) {
    std::mt19937 generator(29U);
    const CausalSelfAttention attention(4, 2, generator);
    for (const Shape& shape : std::vector<Shape>{{3, 4}, {4}, {1, 2, 3, 4}, {1, 3, 5}, {2, 3, 2}}) {
        EXPECT_THROW(static_cast<void>(attention.forward(Variable(Tensor(shape, 0.5F)))),
                     std::invalid_argument)
            << shape_to_string(shape);
    }
    EXPECT_THROW(static_cast<void>(attention.forward(Variable::scalar(1.0F))),
                 std::invalid_argument);
}

TEST(CausalSelfAttention, GradientsMatchCentredFiniteDifferences) {
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        SCOPED_TRACE(kind == AttentionKind::Flash ? "flash" : "materialized");
        std::mt19937 generator(30U);
        const CausalSelfAttention attention(4, 2, generator, kind);
        randomize_parameters(attention, 140U);
        const Shape shape{1, 3, 4};
        const std::vector<float> input = testing::pseudo_random(12, -1.0F, 1.0F, 31U);
        const std::vector<float> weights = testing::pseudo_random(12, -1.0F, 1.0F, 32U);
        const auto objective_at = [&](const std::vector<float>& x_values) {
            const NoGradientGuard guard;
            const Variable y = attention.forward(Variable(Tensor(shape, x_values), false));
            return testing::inner_product(y.value().to_host(), weights);
        };

        Variable x(Tensor(shape, input), true);
        sum(attention.forward(x) * Variable(Tensor(shape, weights), false)).backward();
        EXPECT_TRUE(testing::all_close(
            x.gradient(), testing::finite_difference_gradient(objective_at, input, 1e-2), 5e-3,
            5e-3))
            << "input";

        for (const NamedParameter& named : attention.parameters()) {
            Variable parameter = named.parameter;
            const std::vector<float> analytic = parameter.gradient().to_host();
            const std::vector<float> original = parameter.value().to_host();
            const auto objective = [&](const std::vector<float>& values) {
                parameter.set_value(Tensor(parameter.shape(), values));
                return objective_at(input);
            };
            const std::vector<double> numeric =
                testing::finite_difference_gradient(objective, original, 1e-2);
            parameter.set_value(Tensor(parameter.shape(), original));
            EXPECT_TRUE(testing::all_close(analytic, numeric, 5e-3, 5e-3)) << named.name;
        }
    }
}

}  // namespace riftco_transformer
