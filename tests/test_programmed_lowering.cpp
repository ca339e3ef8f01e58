// Multilinear maps and their neural lowering (docs/ARCHITECTURE.md, 'Programmed models'): import
// rules, the reference evaluation, every strategy against that evaluation (1e-6 exact, the recorded
// error rounded), gradients against finite differences, and every configuration rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/nn/initialization.hpp"
#include "riftco_transformer/programmed/multilinear_map.hpp"
#include "riftco_transformer/programmed/neural_lowering.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;

// Dyadic values (k/64), exact in float.
std::vector<double> dyadic_values(std::size_t count, std::uint32_t seed) {
    std::mt19937 generator(seed);
    std::vector<double> values(count);
    for (double& value : values)
        value = static_cast<double>(static_cast<int>(generator() % 129) - 64) / 64.0;
    return values;
}

MultilinearMap dyadic_map(std::size_t out, std::vector<std::size_t> dims, std::uint32_t seed) {
    std::size_t count = out;
    for (std::size_t d : dims)
        count *= d;
    return MultilinearMap::from_dense(out, std::move(dims), dyadic_values(count, seed));
}

// Random inputs [R, d_i], the lowered output [R, O] and the map's own evaluation per row.
struct Evaluation {
    std::vector<float> lowered;
    std::vector<double> reference;
    std::vector<double> magnitude;  // Σ |Π x| per output row, for the rounded bound
};

Evaluation evaluate_both(const MultilinearMap& map, const LoweredMultilinearMap& lowered,
                         std::size_t rows, std::uint32_t seed) {
    std::vector<Variable> inputs;
    std::vector<std::vector<float>> host;
    for (std::size_t i = 0; i < map.arity(); ++i) {
        host.push_back(testing::pseudo_random(rows * map.input_dimensions()[i], -1.0F, 1.0F,
                                              seed + static_cast<std::uint32_t>(i)));
        inputs.emplace_back(Tensor({rows, map.input_dimensions()[i]}, host.back()), false);
    }
    Evaluation result;
    result.lowered = lowered.forward(inputs, {rows}).value().to_host();
    for (std::size_t r = 0; r < rows; ++r) {
        std::vector<std::vector<double>> row_inputs;
        std::vector<std::vector<double>> absolute;
        for (std::size_t i = 0; i < map.arity(); ++i) {
            const std::size_t d = map.input_dimensions()[i];
            row_inputs.emplace_back(host[i].begin() + static_cast<std::ptrdiff_t>(r * d),
                                    host[i].begin() + static_cast<std::ptrdiff_t>((r + 1) * d));
            absolute.push_back(row_inputs.back());
            for (double& v : absolute.back())
                v = std::fabs(v);
        }
        const std::vector<double> y = map.evaluate(row_inputs);
        result.reference.insert(result.reference.end(), y.begin(), y.end());
        // Σ_j Π|x| is the same for every output: the map of all ones evaluated on |x|.
        std::vector<double> ones(map.element_count(), 1.0);
        const MultilinearMap all_ones =
            MultilinearMap::from_dense(map.output_dimension(), map.input_dimensions(), ones);
        const std::vector<double> bound = all_ones.evaluate(absolute);
        result.magnitude.insert(result.magnitude.end(), bound.begin(), bound.end());
    }
    return result;
}

}  // namespace

// ---- import ---------------------------------------------------------------------------------

TEST(MultilinearMap, DenseImportKeepsOutputMajorValuesAndEvaluatesTheContraction) {
    // T [2, 2, 3]: y_o = Σ_{i,j} T[o,i,j] x_i z_j, checked by hand.
    const std::vector<double> values = {1, 2, 3, 4, 5, 6, -1, 0, 0, 0, 0, 2};
    const MultilinearMap map = MultilinearMap::from_dense(2, {2, 3}, values);
    EXPECT_EQ(map.arity(), 2U);
    EXPECT_EQ(map.element_count(), 12U);
    EXPECT_EQ(map.nonzero_count(), 8U);
    const std::vector<std::vector<double>> inputs = {{1.0, 2.0}, {1.0, 0.0, -1.0}};
    // o=0: x0(1·1 + 3·(−1)) + x1(4·1 + 6·(−1)) = −2 − 4 = −6; o=1: 1·(−1) + 2·(2·(−1)) = −5
    EXPECT_EQ(map.evaluate(inputs), (std::vector<double>{-6.0, -5.0}));
    EXPECT_THROW((void)map.evaluate(std::vector<std::vector<double>>{{1.0, 2.0}}),
                 std::invalid_argument);
    // Arity 0: the constant.
    const MultilinearMap constant = MultilinearMap::from_dense(3, {}, std::vector<double>{1, 2, 3});
    EXPECT_EQ(constant.evaluate({}), (std::vector<double>{1, 2, 3}));
}

TEST(MultilinearMap, SparseImportEqualsTheDenseMapAndAnEmptyOneIsZero) {
    const std::vector<std::uint64_t> indices = {11, 0, 4};
    const std::vector<double> values = {2.0, 1.0, 5.0};
    const MultilinearMap sparse = MultilinearMap::from_sparse(2, {2, 3}, indices, values);
    std::vector<double> dense(12, 0.0);
    dense[11] = 2.0;
    dense[0] = 1.0;
    dense[4] = 5.0;
    EXPECT_TRUE(std::equal(sparse.values().begin(), sparse.values().end(), dense.begin()));
    const MultilinearMap zero = MultilinearMap::from_sparse(4, {3}, {}, {});
    EXPECT_EQ(zero.nonzero_count(), 0U);
    EXPECT_EQ(zero.evaluate(std::vector<std::vector<double>>{{1.0, 2.0, 3.0}}),
              (std::vector<double>(4, 0.0)));
}

TEST(MultilinearMap, ImportRejectionsNameTheProblem) {
    const auto invalid = [](auto action, const std::string& fragment) {
        const std::string message = testing::message_of<std::invalid_argument>(action);
        EXPECT_NE(message.find(fragment), std::string::npos) << message;
    };
    invalid([] { (void)MultilinearMap::from_dense(0, {2}, std::vector<double>{}); },
            "output_dimension");
    invalid(
        [] {
            (void)MultilinearMap::from_dense(2, {3, 0}, std::vector<double>{});
        },
        "input_dimensions[1]");
    invalid([] { (void)MultilinearMap::from_dense(2, {3}, std::vector<double>(5, 1.0)); },
            "5 values given for 6");
    invalid(
        [] {
            std::vector<double> values(6, 1.0);
            values[4] = std::numeric_limits<double>::quiet_NaN();
            (void)MultilinearMap::from_dense(2, {3}, values);
        },
        "values[4]");
    invalid(
        [] {
            (void)MultilinearMap::from_sparse(2, {3}, std::vector<std::uint64_t>{1, 4, 1},
                                              std::vector<double>{1, 2, 3});
        },
        "index 1 appears twice");
    invalid(
        [] {
            (void)MultilinearMap::from_sparse(2, {3}, std::vector<std::uint64_t>{1},
                                              std::vector<double>{0.0});
        },
        "explicit zero");
    invalid(
        [] {
            (void)MultilinearMap::from_sparse(2, {3}, std::vector<std::uint64_t>{1, 2},
                                              std::vector<double>{1.0});
        },
        "2 indices but 1 values");
    EXPECT_THROW((void)MultilinearMap::from_sparse(2, {3}, std::vector<std::uint64_t>{6},
                                                   std::vector<double>{1.0}),
                 std::out_of_range);
    // The limit is checked before anything is allocated (no 2^40-element vector exists).
    EXPECT_THROW((void)MultilinearMap::from_dense(1 << 20, {1 << 20}, std::vector<double>{}),
                 std::overflow_error);
    EXPECT_THROW((void)MultilinearMap::from_sparse(
                     2, {std::numeric_limits<std::size_t>::max() / 2, 4}, {}, {}),
                 std::overflow_error);
}

// ---- lowering -------------------------------------------------------------------------------

TEST(NeuralLowering, DefaultsAreTheSpecs) {
    const NeuralLoweringConfig config;
    EXPECT_EQ(config.strategy, LoweringStrategy::Auto);
    EXPECT_EQ(config.unsupported, UnsupportedLoweringPolicy::Reject);
    EXPECT_EQ(config.precision, CoefficientPrecision::ExactFloat32);
    EXPECT_EQ(config.initialization, CoefficientInitialization::Compiled);
    EXPECT_EQ(config.random_scale, 0.02F);
    EXPECT_EQ(config.random_seed, 42U);
    EXPECT_FALSE(config.trainable);
    EXPECT_EQ(config.max_coefficient_elements, std::size_t{1} << 24);
    EXPECT_FALSE(config.attention_query_axis.has_value());
}

TEST(NeuralLowering, AutoPicksLinearLinearAttentionOrDenseByArity) {
    const auto strategy_for = [](std::vector<std::size_t> dims) {
        return LoweredMultilinearMap(dyadic_map(3, std::move(dims), 1), {}, cpu).strategy();
    };
    EXPECT_EQ(strategy_for({4}), LoweringStrategy::Linear);
    EXPECT_EQ(strategy_for({4, 5}), LoweringStrategy::LinearAttention);
    EXPECT_EQ(strategy_for({2, 3, 2}), LoweringStrategy::Dense);
    EXPECT_EQ(strategy_for({}), LoweringStrategy::Dense);
}

TEST(NeuralLowering, EveryStrategyMatchesTheMapWithin1e6WhenExact) {
    struct Case {
        std::vector<std::size_t> dims;
        LoweringStrategy strategy;
        std::optional<std::size_t> query_axis;
    };
    const std::vector<Case> cases = {
        {{5}, LoweringStrategy::Linear, {}},
        {{5}, LoweringStrategy::Dense, {}},
        {{4, 3}, LoweringStrategy::LinearAttention, {}},
        {{4, 3}, LoweringStrategy::LinearAttention, 2},
        {{4, 3}, LoweringStrategy::Dense, {}},
        {{2, 3, 4}, LoweringStrategy::Dense, {}},
        {{2, 2, 2, 3}, LoweringStrategy::Dense, {}},
    };
    for (const Case& c : cases) {
        const MultilinearMap map = dyadic_map(3, c.dims, 7);
        NeuralLoweringConfig config;
        config.strategy = c.strategy;
        config.attention_query_axis = c.query_axis;
        const LoweredMultilinearMap lowered(map, config, cpu);
        EXPECT_EQ(lowered.max_rounding_error(), 0.0);
        const Evaluation e = evaluate_both(map, lowered, 6, 3);
        EXPECT_TRUE(testing::all_close(e.lowered, e.reference, 1e-6, 0.0))
            << lowering_strategy_name(c.strategy) << " arity " << c.dims.size();
    }
    // Arity 0: the constant over any leading shape.
    const MultilinearMap constant = MultilinearMap::from_dense(2, {}, std::vector<double>{0.5, -2});
    const LoweredMultilinearMap lowered(constant, {}, cpu);
    EXPECT_EQ(lowered.forward({}, {2, 3}).shape(), (Shape{2, 3, 2}));
    EXPECT_TRUE(testing::all_close(lowered.forward({}, {1}).value().to_host(), {0.5, -2.0}));
}

TEST(NeuralLowering, RoundedPrecisionRecordsTheLargestErrorAndStaysWithinIt) {
    std::vector<double> values = dyadic_values(3 * 4 * 2, 5);
    values[3] = 0.1;        // not a float: error ~1.5e-9
    values[7] = 1.0 / 3.0;  // ~9.9e-9
    const MultilinearMap map = MultilinearMap::from_dense(3, {4, 2}, values);
    const std::string exact = testing::message_of<std::invalid_argument>(
        [&] { LoweredMultilinearMap(map, NeuralLoweringConfig{}, cpu); });
    EXPECT_NE(exact.find("coefficient 3"), std::string::npos) << exact;
    NeuralLoweringConfig rounded;
    rounded.precision = CoefficientPrecision::Rounded;
    const LoweredMultilinearMap lowered(map, rounded, cpu);
    const double expected_error =
        std::max(std::fabs(static_cast<double>(static_cast<float>(0.1)) - 0.1),
                 std::fabs(static_cast<double>(static_cast<float>(1.0 / 3.0)) - 1.0 / 3.0));
    EXPECT_EQ(lowered.max_rounding_error(), expected_error);
    const Evaluation e = evaluate_both(map, lowered, 5, 9);
    for (std::size_t i = 0; i < e.lowered.size(); ++i) {
        const double bound = lowered.max_rounding_error() * e.magnitude[i] + 1e-6;
        EXPECT_LE(std::fabs(e.lowered[i] - e.reference[i]), bound) << i;
    }
    // A value beyond float range is rejected under both precisions.
    values[0] = 1e300;
    const MultilinearMap huge = MultilinearMap::from_dense(3, {4, 2}, values);
    EXPECT_THROW(LoweredMultilinearMap(huge, rounded, cpu), std::invalid_argument);
}

TEST(NeuralLowering, SeededRandomInitialisationAndTrainableCoefficients) {
    const MultilinearMap map = dyadic_map(2, {3}, 1);
    NeuralLoweringConfig config;
    config.initialization = CoefficientInitialization::RandomUniform;
    const LoweredMultilinearMap first(map, config, cpu);
    const LoweredMultilinearMap second(map, config, cpu);
    const std::vector<float> values = first.coefficients().value().to_host();
    EXPECT_EQ(values, second.coefficients().value().to_host());
    for (float v : values)
        EXPECT_LE(std::fabs(v), 0.02F);
    std::mt19937 replay(42);
    EXPECT_EQ(values, uniform_tensor({2, 3}, -0.02F, 0.02F, replay, cpu).to_host());
    // Frozen by default: a leaf without gradient, not a parameter.
    EXPECT_FALSE(first.coefficients().requires_gradient());
    EXPECT_TRUE(first.parameters().empty());
    config.trainable = true;
    const LoweredMultilinearMap trainable(map, config, cpu);
    ASSERT_EQ(trainable.parameters().size(), 1U);
    EXPECT_EQ(trainable.parameters()[0].name, "coefficients");
    EXPECT_TRUE(trainable.coefficients().requires_gradient());
}

TEST(NeuralLowering, GradientsOfInputsAndCoefficientsMatchFiniteDifferences) {
    for (const LoweringStrategy strategy :
         {LoweringStrategy::Linear, LoweringStrategy::LinearAttention, LoweringStrategy::Dense}) {
        const std::vector<std::size_t> dims = strategy == LoweringStrategy::Linear
                                                  ? std::vector<std::size_t>{4}
                                                  : std::vector<std::size_t>{3, 2};
        const MultilinearMap map = dyadic_map(2, dims, 11);
        NeuralLoweringConfig config;
        config.strategy = strategy;
        config.trainable = true;
        const LoweredMultilinearMap lowered(map, config, cpu);
        std::vector<Variable> inputs;
        for (std::size_t i = 0; i < dims.size(); ++i) {
            inputs.emplace_back(
                Tensor({3, dims[i]}, testing::pseudo_random(3 * dims[i], -1.0F, 1.0F,
                                                            20 + static_cast<std::uint32_t>(i))),
                true);
        }
        const std::vector<float> weights = testing::pseudo_random(3 * 2, -1.0F, 1.0F, 40);
        const auto loss = [&] {
            return sum(lowered.forward(inputs, {3}) * Variable(Tensor({3, 2}, weights), false));
        };
        loss().backward();
        std::vector<Variable> leaves = inputs;
        leaves.push_back(lowered.coefficients());
        for (Variable& leaf : leaves) {
            const std::vector<float> analytic = leaf.gradient().to_host();
            std::vector<float> values = leaf.value().to_host();
            for (std::size_t i = 0; i < values.size(); ++i) {
                const float original = values[i];
                const auto at = [&](float v) {
                    values[i] = v;
                    leaf.set_value(Tensor(leaf.shape(), values));
                    return static_cast<double>(loss().value().item());
                };
                const double numeric = (at(original + 1e-2F) - at(original - 1e-2F)) / 2e-2;
                at(original);
                EXPECT_NEAR(analytic[i], numeric, 1e-3 + 1e-3 * std::fabs(numeric))
                    << lowering_strategy_name(strategy) << " [" << i << "]";
            }
        }
    }
}

TEST(NeuralLowering, ConfigurationRejections) {
    const MultilinearMap unary = dyadic_map(2, {3}, 1);
    const MultilinearMap binary = dyadic_map(2, {3, 2}, 1);
    const auto rejects = [](const MultilinearMap& map, NeuralLoweringConfig config,
                            const std::string& fragment) {
        const std::string message = testing::message_of<std::invalid_argument>(
            [&] { LoweredMultilinearMap(map, config, cpu); });
        EXPECT_NE(message.find(fragment), std::string::npos) << message;
    };
    rejects(binary, {.strategy = LoweringStrategy::Linear}, "cannot lower a map of arity 2");
    rejects(unary, {.strategy = LoweringStrategy::LinearAttention}, "arity 1");
    rejects(unary, {.strategy = static_cast<LoweringStrategy>(9)}, "unknown strategy");
    rejects(unary, {.precision = static_cast<CoefficientPrecision>(5)}, "unknown precision");
    rejects(unary, {.attention_query_axis = 1}, "attention_query_axis");
    rejects(binary, {.attention_query_axis = 3}, "must be 1 or 2");
    rejects(unary,
            {.initialization = CoefficientInitialization::RandomUniform, .random_scale = 0.0F},
            "random_scale");
    rejects(unary, {.max_coefficient_elements = 0}, "max_coefficient_elements");
    EXPECT_THROW(LoweredMultilinearMap(binary, {.max_coefficient_elements = 5}, cpu),
                 std::overflow_error);
    // The dense fallback lowers what the explicit strategy cannot.
    const LoweredMultilinearMap fallback(binary,
                                         {.strategy = LoweringStrategy::Linear,
                                          .unsupported = UnsupportedLoweringPolicy::DenseFallback},
                                         cpu);
    EXPECT_EQ(fallback.strategy(), LoweringStrategy::Dense);
    // Forward shape rules.
    const LoweredMultilinearMap lowered(binary, {}, cpu);
    const Variable a(Tensor::zeros({4, 3}), false);
    const Variable b(Tensor::zeros({4, 2}), false);
    const Variable wrong(Tensor::zeros({5, 2}), false);
    EXPECT_THROW((void)lowered.forward(std::vector<Variable>{a}, {4}), std::invalid_argument);
    EXPECT_THROW((void)lowered.forward(std::vector<Variable>{a, wrong}, {4}),
                 std::invalid_argument);
    EXPECT_THROW((void)lowered.forward(std::vector<Variable>{a, b}, {}), std::invalid_argument);
    EXPECT_EQ(lowered.forward(std::vector<Variable>{a, b}, {4}).shape(), (Shape{4, 2}));
}

}  // namespace riftco_transformer
