// Fused softmax cross-entropy: hand-computed loss and base gradient, a double oracle over
// rank-3 and large-vocabulary logits, finite differences of the loss, thread-count
// independence, and every documented error rule (docs/ARCHITECTURE.md, 'Tensor operations').
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::all_close;
using testing::bit_identical;
using testing::finite_difference_gradient;
using testing::pseudo_random;

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr float quiet_nan = std::numeric_limits<float>::quiet_NaN();

struct CrossEntropyOracle {
    double loss = 0.0;
    std::vector<double> gradient;
};

// Double oracle: loss = −(1/N)·Σ_n (z_{n,y} − logsumexp(z_n)), gradient = (softmax − onehot)/N.
CrossEntropyOracle cross_entropy_oracle(const std::vector<float>& logits,
                                        const std::vector<std::uint32_t>& targets,
                                        std::size_t vocabulary) {
    const std::size_t positions = logits.size() / vocabulary;
    CrossEntropyOracle oracle{0.0, std::vector<double>(logits.size())};
    for (std::size_t n = 0; n < positions; ++n) {
        const float* z = logits.data() + n * vocabulary;
        double max = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < vocabulary; ++j)
            max = std::max(max, static_cast<double>(z[j]));
        double sum = 0.0;
        for (std::size_t j = 0; j < vocabulary; ++j)
            sum += std::exp(z[j] - max);
        const double log_sum_exp = max + std::log(sum);
        oracle.loss += log_sum_exp - z[targets[n]];
        for (std::size_t j = 0; j < vocabulary; ++j) {
            const double p = std::exp(z[j] - max) / sum;
            oracle.gradient[n * vocabulary + j] =
                (p - (j == targets[n] ? 1.0 : 0.0)) / static_cast<double>(positions);
        }
    }
    oracle.loss /= static_cast<double>(positions);
    return oracle;
}

std::vector<std::uint32_t> pseudo_random_targets(std::size_t count, std::uint32_t vocabulary,
                                                 std::uint32_t seed) {
    std::vector<std::uint32_t> targets(count);
    std::uint32_t state = seed;
    for (std::uint32_t& target : targets) {
        state = state * 1664525U + 1013904223U;
        target = (state >> 8U) % vocabulary;
    }
    return targets;
}

// Runs cross_entropy expecting `Error`, then checks the logits were left untouched.
template <typename Error>
::testing::AssertionResult rejects_without_changing_inputs(
    const std::vector<float>& values, const Shape& shape,
    const std::vector<std::uint32_t>& targets) {
    const Tensor logits(shape, values);
    const std::vector<std::uint32_t> targets_before = targets;
    try {
        static_cast<void>(tensor_ops::cross_entropy(logits, targets));
        return ::testing::AssertionFailure() << "no exception";
    } catch (const Error&) {
    } catch (const std::exception& other) {
        return ::testing::AssertionFailure() << "wrong exception: " << other.what();
    }
    if (!bit_identical(logits.to_host(), values)) {
        return ::testing::AssertionFailure() << "logits changed";
    }
    if (targets != targets_before)
        return ::testing::AssertionFailure() << "targets changed";
    return ::testing::AssertionSuccess();
}

}  // namespace

TEST(CrossEntropy, MatchesHandComputedLossAndGradientForTinyExample) {
    // logits [[1,2,3],[1,1,1]], targets [2,0]:
    // row 0: log(e + e² + e³) − 3 = log(1 + e⁻¹ + e⁻²) = 0.40760596444438...
    // row 1: log 3 = 1.09861228866810...; mean = 0.75310912655624...
    // gradient = (softmax − onehot)/2 with softmax(row 0) = [0.0900306, 0.2447285, 0.6652410].
    const Tensor logits({2, 3}, {1.0F, 2.0F, 3.0F, 1.0F, 1.0F, 1.0F});
    const std::vector<std::uint32_t> targets = {2, 0};
    const tensor_ops::CrossEntropyResult result = tensor_ops::cross_entropy(logits, targets);
    EXPECT_EQ(result.loss.shape(), Shape{});
    EXPECT_NEAR(result.loss.item(), 0.7531091265562451, 1e-6);
    EXPECT_EQ(result.gradient.shape(), (Shape{2, 3}));
    EXPECT_TRUE(all_close(result.gradient, {0.09003057317038046 / 2, 0.24472847105479767 / 2,
                                            (0.6652409557748219 - 1.0) / 2, (1.0 / 3.0 - 1.0) / 2,
                                            1.0 / 6.0, 1.0 / 6.0}));
}

TEST(CrossEntropy, UniformLogitsGiveLogVocabulary) {
    const Tensor logits({4, 5}, 0.25F);
    const std::vector<std::uint32_t> targets = {0, 4, 2, 2};
    const tensor_ops::CrossEntropyResult result = tensor_ops::cross_entropy(logits, targets);
    EXPECT_NEAR(result.loss.item(), std::log(5.0), 1e-6);
}

TEST(CrossEntropy, GradientEqualsSoftmaxMinusOneHotOverPositions) {
    constexpr std::size_t vocabulary = 9;
    const std::vector<float> values = pseudo_random(6 * vocabulary, -3.0F, 3.0F, 5U);
    const std::vector<std::uint32_t> targets = {8, 0, 3, 3, 5, 1};
    const tensor_ops::CrossEntropyResult result =
        tensor_ops::cross_entropy(Tensor({6, vocabulary}, values), targets);
    const CrossEntropyOracle oracle = cross_entropy_oracle(values, targets, vocabulary);
    EXPECT_NEAR(result.loss.item(), oracle.loss, 1e-6 * (1.0 + oracle.loss));
    EXPECT_TRUE(all_close(result.gradient, oracle.gradient));
}

TEST(CrossEntropy, GradientRowsSumToZero) {
    constexpr std::size_t vocabulary = 37;
    constexpr std::size_t positions = 10;
    const std::vector<float> values = pseudo_random(positions * vocabulary, -5.0F, 5.0F, 6U);
    const tensor_ops::CrossEntropyResult result = tensor_ops::cross_entropy(
        Tensor({positions, vocabulary}, values), pseudo_random_targets(positions, vocabulary, 7U));
    const std::vector<float> gradient = result.gradient.to_host();
    for (std::size_t n = 0; n < positions; ++n) {
        double sum = 0.0;
        for (std::size_t j = 0; j < vocabulary; ++j)
            sum += gradient[n * vocabulary + j];
        EXPECT_NEAR(sum, 0.0, 1e-7) << "row " << n;
    }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferencesOfLoss) {
    const Shape shape{3, 5};
    const std::vector<float> logits = pseudo_random(15, -2.0F, 2.0F, 8U);
    const std::vector<std::uint32_t> targets = {4, 0, 2};
    const auto loss = [&](const std::vector<float>& z) {
        return static_cast<double>(
            tensor_ops::cross_entropy(Tensor(shape, z), targets).loss.item());
    };
    const Tensor gradient = tensor_ops::cross_entropy(Tensor(shape, logits), targets).gradient;
    EXPECT_TRUE(all_close(gradient, finite_difference_gradient(loss, logits, 1e-2), 5e-3, 5e-3));
    EXPECT_TRUE(all_close(gradient, finite_difference_gradient(loss, logits, 1e-3), 2e-3, 2e-3));
}

TEST(CrossEntropy, AveragesOverPositionsOfRank3Logits) {
    // [B,T,V] = [2,3,7]: N = 6 positions, gradient keeps the logits' shape.
    const Shape shape{2, 3, 7};
    const std::vector<float> values = pseudo_random(42, -4.0F, 4.0F, 9U);
    const std::vector<std::uint32_t> targets = {6, 0, 3, 1, 6, 2};
    const tensor_ops::CrossEntropyResult result =
        tensor_ops::cross_entropy(Tensor(shape, values), targets);
    const CrossEntropyOracle oracle = cross_entropy_oracle(values, targets, 7);
    EXPECT_EQ(result.loss.shape(), Shape{});
    EXPECT_EQ(result.gradient.shape(), shape);
    EXPECT_NEAR(result.loss.item(), oracle.loss, 1e-6 * (1.0 + oracle.loss));
    EXPECT_TRUE(all_close(result.gradient, oracle.gradient));
}

TEST(CrossEntropy, RankOneLogitsAreOnePosition) {
    const std::vector<float> values = {0.5F, -1.0F, 2.0F, 0.0F};
    const std::vector<std::uint32_t> targets = {1};
    const tensor_ops::CrossEntropyResult result =
        tensor_ops::cross_entropy(Tensor({4}, values), targets);
    const CrossEntropyOracle oracle = cross_entropy_oracle(values, targets, 4);
    EXPECT_NEAR(result.loss.item(), oracle.loss, 1e-6);
    EXPECT_EQ(result.gradient.shape(), (Shape{4}));
    EXPECT_TRUE(all_close(result.gradient, oracle.gradient));
}

TEST(CrossEntropy, LargeVocabularyMatchesDoubleOracle) {
    constexpr std::size_t positions = 64;
    constexpr std::size_t vocabulary = 8192;
    const std::vector<float> values = pseudo_random(positions * vocabulary, -10.0F, 10.0F, 10U);
    const std::vector<std::uint32_t> targets = pseudo_random_targets(positions, vocabulary, 11U);
    const tensor_ops::CrossEntropyResult result =
        tensor_ops::cross_entropy(Tensor({positions, vocabulary}, values), targets);
    const CrossEntropyOracle oracle = cross_entropy_oracle(values, targets, vocabulary);
    EXPECT_NEAR(result.loss.item(), oracle.loss, 1e-5 * oracle.loss);
    EXPECT_TRUE(all_close(result.gradient, oracle.gradient, 1e-10, 1e-5));
    const std::vector<float> gradient = result.gradient.to_host();
    for (std::size_t n = 0; n < positions; ++n) {
        double sum = 0.0;
        for (std::size_t j = 0; j < vocabulary; ++j)
            sum += gradient[n * vocabulary + j];
        EXPECT_NEAR(sum, 0.0, 1e-7) << "row " << n;
    }
}

TEST(CrossEntropy, ResultIsIndependentOfThreadCount) {
    const testing::ThreadCountGuard guard;
    constexpr std::size_t positions = 64;
    constexpr std::size_t vocabulary = 8192;
    const Tensor logits({positions, vocabulary},
                        pseudo_random(positions * vocabulary, -10.0F, 10.0F, 12U));
    const std::vector<std::uint32_t> targets = pseudo_random_targets(positions, vocabulary, 13U);
    set_cpu_thread_count(1);
    const tensor_ops::CrossEntropyResult serial = tensor_ops::cross_entropy(logits, targets);
    for (const std::size_t threads : {2U, 3U}) {
        set_cpu_thread_count(threads);
        const tensor_ops::CrossEntropyResult threaded = tensor_ops::cross_entropy(logits, targets);
        EXPECT_TRUE(bit_identical(serial.loss.to_host(), threaded.loss.to_host()))
            << threads << " threads";
        EXPECT_TRUE(bit_identical(serial.gradient.to_host(), threaded.gradient.to_host()))
            << threads << " threads";
    }
}

TEST(CrossEntropy, StableForLargeMagnitudeLogits) {
    // Shifting every logit of a row by 1e4 (or −1e4) leaves loss and gradient unchanged.
    const std::vector<std::uint32_t> targets = {1};
    const CrossEntropyOracle base = cross_entropy_oracle({0.0F, 1.0F, 2.0F}, targets, 3);
    for (const float shift : {1e4F, -1e4F}) {
        const tensor_ops::CrossEntropyResult shifted =
            tensor_ops::cross_entropy(Tensor({1, 3}, {shift, shift + 1.0F, shift + 2.0F}), targets);
        EXPECT_TRUE(std::isfinite(shifted.loss.item()));
        EXPECT_NEAR(shifted.loss.item(), base.loss, 1e-6) << "shift " << shift;
        EXPECT_TRUE(all_close(shifted.gradient, base.gradient)) << "shift " << shift;
    }
    // A 2e4 spread with the target far below the max: loss ≈ 2e4, gradient (softmax − onehot).
    const tensor_ops::CrossEntropyResult spread =
        tensor_ops::cross_entropy(Tensor({1, 2}, {-1e4F, 1e4F}), std::vector<std::uint32_t>{0});
    EXPECT_NEAR(spread.loss.item(), 2e4, 1e-2);
    EXPECT_TRUE(all_close(spread.gradient, {-1.0, 1.0}));
}

TEST(CrossEntropy, NegativeInfinityNonTargetLogitHasZeroProbability) {
    // [0, −inf, 1], target 0: loss = log(1 + e) = 1.31326168751822...; gradient at −inf is 0.
    const std::vector<std::uint32_t> targets = {0};
    const tensor_ops::CrossEntropyResult result =
        tensor_ops::cross_entropy(Tensor({1, 3}, {0.0F, -infinity, 1.0F}), targets);
    EXPECT_NEAR(result.loss.item(), 1.3132616875182228, 1e-6);
    const std::vector<float> gradient = result.gradient.to_host();
    EXPECT_EQ(gradient[1], 0.0F);
    const double p0 = 1.0 / (1.0 + std::exp(1.0));
    EXPECT_TRUE(all_close(gradient, {p0 - 1.0, 0.0, 1.0 - p0}));
}

TEST(CrossEntropy, SingleClassVocabularyGivesZeroLossAndGradient) {
    // V = 1: softmax is 1 everywhere, so every position loses log 1 = 0 and the gradient is 0.
    const std::vector<std::uint32_t> targets = {0, 0, 0};
    const tensor_ops::CrossEntropyResult result =
        tensor_ops::cross_entropy(Tensor({3, 1}, {-5.0F, 0.0F, 1e4F}), targets);
    EXPECT_NEAR(result.loss.item(), 0.0, 1e-7);
    EXPECT_TRUE(all_close(result.gradient, {0.0, 0.0, 0.0}));
}

TEST(CrossEntropy, RejectsScalarLogits) {
    const std::vector<std::uint32_t> targets = {0};
    EXPECT_THROW(static_cast<void>(tensor_ops::cross_entropy(Tensor::scalar(1.0F), targets)),
                 std::invalid_argument);
}

TEST(CrossEntropy, RejectsTargetCountThatDiffersFromPositions) {
    const Tensor logits({2, 3, 4}, 0.0F);  // N = 6
    for (const std::size_t count : {0U, 1U, 5U, 7U, 24U}) {
        const std::vector<std::uint32_t> targets(count, 0);
        EXPECT_THROW(static_cast<void>(tensor_ops::cross_entropy(logits, targets)),
                     std::invalid_argument)
            << count << " targets";
    }
}

TEST(CrossEntropy, RejectsTargetAtOrBeyondVocabularyWithoutChangingInputs) {
    const std::vector<float> values = pseudo_random(6, -1.0F, 1.0F, 14U);
    EXPECT_TRUE(rejects_without_changing_inputs<std::out_of_range>(values, {2, 3}, {0, 3}));
    EXPECT_TRUE(rejects_without_changing_inputs<std::out_of_range>(values, {2, 3}, {7, 0}));
    EXPECT_TRUE(rejects_without_changing_inputs<std::out_of_range>(
        values, {2, 3}, {1, std::numeric_limits<std::uint32_t>::max()}));
}

TEST(CrossEntropy, RejectsNonFiniteTargetLogitWithoutChangingInputs) {
    for (const float bad : {quiet_nan, infinity, -infinity}) {
        std::vector<float> values = pseudo_random(6, -1.0F, 1.0F, 15U);
        values[3 + 2] = bad;  // position 1, target 2
        EXPECT_TRUE(rejects_without_changing_inputs<std::domain_error>(values, {2, 3}, {0, 2}))
            << "target logit " << bad;
    }
}

TEST(CrossEntropy, RejectsNonFiniteTargetLogitInLargeThreadedInput) {
    const testing::ThreadCountGuard guard;
    set_cpu_thread_count(2);
    constexpr std::size_t positions = 64;
    constexpr std::size_t vocabulary = 8192;
    std::vector<float> values = pseudo_random(positions * vocabulary, -1.0F, 1.0F, 16U);
    std::vector<std::uint32_t> targets = pseudo_random_targets(positions, vocabulary, 17U);
    values[50 * vocabulary + targets[50]] = quiet_nan;  // a position in the second half
    EXPECT_TRUE(rejects_without_changing_inputs<std::domain_error>(values, {positions, vocabulary},
                                                                   targets));
}

TEST(CrossEntropy, RejectsPositiveInfinityNonTargetLogitWithOverflowError) {
    // The true loss is +inf: a non-finite mean loss.
    EXPECT_TRUE(rejects_without_changing_inputs<std::overflow_error>(
        {0.0F, infinity, 1.0F, 0.5F, 0.5F, 0.5F}, {2, 3}, {0, 1}));
}

TEST(CrossEntropy, RejectsNaNNonTargetLogitWithOverflowError) {
    // A NaN logit makes the mean loss NaN: non-finite.
    EXPECT_TRUE(rejects_without_changing_inputs<std::overflow_error>(
        {0.0F, 1.0F, quiet_nan, 0.5F, 0.5F, 0.5F}, {2, 3}, {0, 1}));
}

TEST(CrossEntropy, RejectsMeanLossAboveFloatMaxWithOverflowError) {
    // Target logit −3e38 with another at +3e38: loss ≈ 6e38 > FLT_MAX, though every input is
    // finite.
    EXPECT_TRUE(rejects_without_changing_inputs<std::overflow_error>({-3e38F, 3e38F}, {1, 2}, {0}));
    EXPECT_TRUE(rejects_without_changing_inputs<std::overflow_error>({-3e38F, 3e38F, 3e38F, -3e38F},
                                                                     {2, 2}, {0, 1}));
}

TEST(CrossEntropy, AcceptsLargePositionLossWhenTheMeanFitsInFloat) {
    // Position 0 loses ≈ 6e38 (> FLT_MAX) but position 1 loses log 2: the mean ≈ 3e38 fits, and
    // only the mean is range-checked.
    const Tensor logits({2, 2}, {-3e38F, 3e38F, 0.0F, 0.0F});
    const std::vector<std::uint32_t> targets = {0, 0};
    tensor_ops::CrossEntropyResult result;
    ASSERT_NO_THROW(result = tensor_ops::cross_entropy(logits, targets));
    const double expected = (6e38 + std::log(2.0)) / 2.0;
    EXPECT_LE(static_cast<double>(result.loss.item()), static_cast<double>(FLT_MAX));
    EXPECT_NEAR(result.loss.item(), expected, 1e-6 * expected);
    EXPECT_TRUE(all_close(result.gradient, {-0.5, 0.5, -0.25, 0.25}));
}

TEST(CrossEntropy, RejectsSingularLogits) {
    const Tensor singular;
    const std::vector<std::uint32_t> targets = {0};
    EXPECT_THROW(static_cast<void>(tensor_ops::cross_entropy(singular, targets)), std::logic_error);
}

// ---- cross_entropy_masked (response-only loss) ----------------------------------------

TEST(CrossEntropyMasked, EqualsTheDoubleOracleOverTheSelectedPositionsOnly) {
    constexpr std::size_t positions = 12;
    constexpr std::uint32_t vocabulary = 7;
    const std::vector<float> values = pseudo_random(positions * vocabulary, -3.0F, 3.0F, 41);
    const std::vector<std::uint32_t> targets = pseudo_random_targets(positions, vocabulary, 5);
    const std::vector<std::uint8_t> mask = {0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0};
    // Oracle: the plain loss of the selected rows alone, scattered back with zero elsewhere.
    std::vector<float> selected_values;
    std::vector<std::uint32_t> selected_targets;
    for (std::size_t n = 0; n < positions; ++n) {
        if (mask[n] != 0) {
            selected_values.insert(selected_values.end(), values.begin() + n * vocabulary,
                                   values.begin() + (n + 1) * vocabulary);
            selected_targets.push_back(targets[n]);
        }
    }
    const CrossEntropyOracle oracle =
        cross_entropy_oracle(selected_values, selected_targets, vocabulary);
    const Tensor logits({3, 4, vocabulary}, values);
    const auto result = tensor_ops::cross_entropy_masked(logits, targets, mask);
    EXPECT_NEAR(result.loss.item(), oracle.loss, 1e-6);
    const std::vector<float> gradient = result.gradient.to_host();
    std::size_t selected_row = 0;
    for (std::size_t n = 0; n < positions; ++n) {
        for (std::size_t j = 0; j < vocabulary; ++j) {
            const float g = gradient[n * vocabulary + j];
            if (mask[n] == 0) {
                EXPECT_EQ(g, 0.0F) << "unselected position " << n;
            } else {
                EXPECT_NEAR(g, oracle.gradient[selected_row * vocabulary + j], 1e-6);
            }
        }
        selected_row += mask[n];
    }
}

TEST(CrossEntropyMasked, AnAllOnesMaskIsThePlainLossBitForBit) {
    const std::vector<float> values = pseudo_random(6 * 5, -2.0F, 2.0F, 3);
    const std::vector<std::uint32_t> targets = pseudo_random_targets(6, 5, 9);
    const Tensor logits({2, 3, 5}, values);
    const auto plain = tensor_ops::cross_entropy(logits, targets);
    const auto masked =
        tensor_ops::cross_entropy_masked(logits, targets, std::vector<std::uint8_t>(6, 1));
    EXPECT_TRUE(bit_identical(masked.loss.to_host(), plain.loss.to_host()));
    EXPECT_TRUE(bit_identical(masked.gradient.to_host(), plain.gradient.to_host()));
}

TEST(CrossEntropyMasked, UnselectedPositionsNeedNoFiniteLogits) {
    // Position 0 is unselected: its non-finite target logit is never read as a loss term.
    const Tensor logits({2, 2}, {quiet_nan, 1.0F, 0.0F, 0.0F});
    const std::vector<std::uint32_t> targets = {0, 1};
    const std::vector<std::uint8_t> mask = {0, 1};
    const auto result = tensor_ops::cross_entropy_masked(logits, targets, mask);
    EXPECT_NEAR(result.loss.item(), std::log(2.0), 1e-7);
}

TEST(CrossEntropyMasked, RejectsBadMasksNamingTheArgumentAndChangesNothing) {
    const std::vector<float> values = pseudo_random(3 * 4, -1.0F, 1.0F, 2);
    const Tensor logits({3, 4}, values);
    const std::vector<std::uint32_t> targets = {0, 1, 2};
    const auto message_of = [&](const std::vector<std::uint8_t>& mask) {
        try {
            static_cast<void>(tensor_ops::cross_entropy_masked(logits, targets, mask));
        } catch (const std::invalid_argument& error) {
            return std::string(error.what());
        }
        return std::string("no invalid_argument");
    };
    EXPECT_NE(message_of({1, 1}).find("2 mask flags given for 3 positions"), std::string::npos);
    EXPECT_NE(message_of({1, 2, 0}).find("mask[1] = 2 must be 0 or 1"), std::string::npos);
    EXPECT_NE(message_of({0, 0, 0}).find("selects no position"), std::string::npos);
    EXPECT_THROW(
        static_cast<void>(tensor_ops::cross_entropy_masked(
            logits, std::vector<std::uint32_t>{0, 4, 1}, std::vector<std::uint8_t>{1, 1, 1})),
        std::out_of_range);
    EXPECT_TRUE(bit_identical(logits.to_host(), values));
}

}  // namespace riftco_transformer
