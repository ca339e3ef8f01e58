// Cross-entropy over a time slice of logits [B,T,V] (docs/ARCHITECTURE.md, 'Tensor operations' and
// 'Programmed models'): a double oracle of the loss and gradient, equality with cross_entropy on
// the sliced logits and on the whole range, finite differences through autograd, exact zeros
// outside the slice, and every error rule with its category, its message and nothing changed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::all_close;
using testing::bit_identical;
using testing::pseudo_random;

constexpr std::size_t batch = 3;
constexpr std::size_t time = 5;
constexpr std::size_t vocabulary = 7;
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();

struct Oracle {
    double loss = 0.0;
    std::vector<double> gradient;  // [B,T,V], 0 outside the slice
};

// Double oracle over logits [B,T,V] and the slice [offset, offset+count):
// loss = −(1/(B·count))·Σ_{b, t in slice} log softmax(z_bt)[y_bt],
// gradient = (softmax − onehot)/(B·count) on the slice, 0 elsewhere.
Oracle time_range_oracle(const std::vector<double>& logits,
                         const std::vector<std::uint32_t>& targets, std::size_t rows,
                         std::size_t extent, std::size_t vocab, std::size_t offset,
                         std::size_t count) {
    Oracle oracle{0.0, std::vector<double>(logits.size(), 0.0)};
    const auto positions = static_cast<double>(rows * count);
    for (std::size_t b = 0; b < rows; ++b) {
        for (std::size_t t = offset; t < offset + count; ++t) {
            const std::size_t r = b * extent + t;
            const double* z = logits.data() + r * vocab;
            double peak = -std::numeric_limits<double>::infinity();
            for (std::size_t j = 0; j < vocab; ++j)
                peak = std::max(peak, z[j]);
            double sum = 0.0;
            for (std::size_t j = 0; j < vocab; ++j)
                sum += std::exp(z[j] - peak);
            oracle.loss += peak + std::log(sum) - z[targets[r]];
            for (std::size_t j = 0; j < vocab; ++j) {
                const double p = std::exp(z[j] - peak) / sum;
                oracle.gradient[r * vocab + j] = (p - (j == targets[r] ? 1.0 : 0.0)) / positions;
            }
        }
    }
    oracle.loss /= positions;
    return oracle;
}

std::vector<double> as_double(const std::vector<float>& values) {
    return {values.begin(), values.end()};
}

std::vector<std::uint32_t> pseudo_random_targets(std::size_t count, std::uint32_t vocab,
                                                 std::uint32_t seed) {
    std::vector<std::uint32_t> targets(count);
    std::uint32_t state = seed;
    for (std::uint32_t& target : targets) {
        state = state * 1664525U + 1013904223U;
        target = (state >> 8U) % vocab;
    }
    return targets;
}

// The targets of positions t in [offset, offset+count) of every row, row-major.
std::vector<std::uint32_t> slice_targets(const std::vector<std::uint32_t>& targets,
                                         std::size_t extent, std::size_t offset,
                                         std::size_t count) {
    std::vector<std::uint32_t> sliced;
    for (std::size_t b = 0; b < targets.size() / extent; ++b) {
        for (std::size_t t = offset; t < offset + count; ++t)
            sliced.push_back(targets[b * extent + t]);
    }
    return sliced;
}

// True when every gradient value of a row outside [offset, offset+count) is exactly +0.
bool zero_outside_slice(const std::vector<float>& gradient, std::size_t extent, std::size_t vocab,
                        std::size_t offset, std::size_t count) {
    for (std::size_t i = 0; i < gradient.size(); ++i) {
        const std::size_t t = i / vocab % extent;
        const bool inside = t >= offset && t < offset + count;
        if (!inside && (gradient[i] != 0.0F || std::signbit(gradient[i])))
            return false;
    }
    return true;
}

// Runs `operation` expecting `Error` whose message contains every one of `fragments`; the
// logits and targets must be unchanged afterwards.
template <typename Error>
::testing::AssertionResult rejects(const std::function<void()>& operation, const Tensor& logits,
                                   const std::vector<float>& logits_before,
                                   const std::vector<std::string>& fragments) {
    try {
        operation();
        return ::testing::AssertionFailure() << "no exception";
    } catch (const Error& error) {
        const std::string message = error.what();
        for (const std::string& fragment : fragments) {
            if (message.find(fragment) == std::string::npos) {
                return ::testing::AssertionFailure()
                       << "message \"" << message << "\" lacks \"" << fragment << "\"";
            }
        }
    } catch (const std::exception& other) {
        return ::testing::AssertionFailure() << "wrong exception: " << other.what();
    }
    if (!bit_identical(logits.to_host(), logits_before))
        return ::testing::AssertionFailure() << "logits changed";
    return ::testing::AssertionSuccess();
}

struct Fixture {
    std::vector<float> values = pseudo_random(batch * time * vocabulary, -2.0F, 2.0F, 301U);
    std::vector<std::uint32_t> targets = pseudo_random_targets(batch * time, vocabulary, 302U);
    Tensor logits{{batch, time, vocabulary}, values};
};

}  // namespace

TEST(CrossEntropyTimeRange, MatchesTheDoubleOracleOverTheSlice) {
    const Fixture f;
    for (const auto& [offset, count] : std::vector<std::pair<std::size_t, std::size_t>>{
             {0, 1}, {1, 3}, {2, 3}, {4, 1}, {0, time}}) {
        SCOPED_TRACE("offset " + std::to_string(offset) + " count " + std::to_string(count));
        const tensor_ops::CrossEntropyResult result =
            tensor_ops::cross_entropy_time_range(f.logits, f.targets, offset, count);
        const Oracle oracle = time_range_oracle(as_double(f.values), f.targets, batch, time,
                                                vocabulary, offset, count);
        EXPECT_EQ(result.loss.shape(), Shape{});
        EXPECT_NEAR(result.loss.item(), oracle.loss, 1e-6 * std::max(1.0, oracle.loss));
        EXPECT_EQ(result.gradient.shape(), (Shape{batch, time, vocabulary}));
        EXPECT_TRUE(all_close(result.gradient, oracle.gradient, 1e-7, 1e-5));
        EXPECT_TRUE(zero_outside_slice(result.gradient.to_host(), time, vocabulary, offset, count));
    }
}

TEST(CrossEntropyTimeRange, EqualsCrossEntropyOfTheSlicedLogitsAndTargets) {
    const Fixture f;
    constexpr std::size_t offset = 1;
    constexpr std::size_t count = 3;
    const tensor_ops::CrossEntropyResult ranged =
        tensor_ops::cross_entropy_time_range(f.logits, f.targets, offset, count);
    const tensor_ops::CrossEntropyResult sliced =
        tensor_ops::cross_entropy(tensor_ops::slice(f.logits, 1, offset, count),
                                  slice_targets(f.targets, time, offset, count));
    EXPECT_NEAR(ranged.loss.item(), sliced.loss.item(), 1e-6);
    EXPECT_TRUE(all_close(tensor_ops::slice(ranged.gradient, 1, offset, count),
                          as_double(sliced.gradient.to_host()), 1e-8, 1e-6));
}

TEST(CrossEntropyTimeRange, TheWholeTimeRangeEqualsCrossEntropy) {
    const Fixture f;
    const tensor_ops::CrossEntropyResult ranged =
        tensor_ops::cross_entropy_time_range(f.logits, f.targets, 0, time);
    const tensor_ops::CrossEntropyResult whole = tensor_ops::cross_entropy(f.logits, f.targets);
    EXPECT_NEAR(ranged.loss.item(), whole.loss.item(), 1e-7);
    EXPECT_TRUE(all_close(ranged.gradient, as_double(whole.gradient.to_host()), 1e-9, 1e-7));
}

TEST(CrossEntropyTimeRange, TargetsAndLogitsOutsideTheSliceDoNotContribute) {
    const Fixture f;
    const tensor_ops::CrossEntropyResult reference =
        tensor_ops::cross_entropy_time_range(f.logits, f.targets, 2, 2);
    std::vector<float> values = f.values;
    std::vector<std::uint32_t> targets = f.targets;
    for (std::size_t b = 0; b < batch; ++b) {
        for (const std::size_t t : {0U, 1U, 4U}) {
            targets[b * time + t] = (targets[b * time + t] + 1U) % std::uint32_t{vocabulary};
            values[(b * time + t) * vocabulary] = std::numeric_limits<float>::quiet_NaN();
        }
    }
    const tensor_ops::CrossEntropyResult changed = tensor_ops::cross_entropy_time_range(
        Tensor({batch, time, vocabulary}, values), targets, 2, 2);
    EXPECT_TRUE(bit_identical({changed.loss.item()}, {reference.loss.item()}));
    EXPECT_TRUE(bit_identical(changed.gradient.to_host(), reference.gradient.to_host()));
}

TEST(CrossEntropyTimeRange, IndexTensorTargetsGiveTheSameResultAsHostTargets) {
    const Fixture f;
    const IndexTensor uploaded({batch, time}, f.targets, f.logits.backend());
    const tensor_ops::CrossEntropyResult from_tensor =
        tensor_ops::cross_entropy_time_range(f.logits, uploaded, 1, 2);
    const tensor_ops::CrossEntropyResult from_host =
        tensor_ops::cross_entropy_time_range(f.logits, f.targets, 1, 2);
    EXPECT_TRUE(bit_identical({from_tensor.loss.item()}, {from_host.loss.item()}));
    EXPECT_TRUE(bit_identical(from_tensor.gradient.to_host(), from_host.gradient.to_host()));
}

TEST(CrossEntropyTimeRange, GradientMatchesFiniteDifferencesAndIsExactlyZeroOutsideTheSlice) {
    const Fixture f;
    constexpr std::size_t offset = 1;
    constexpr std::size_t count = 2;
    constexpr float upstream = 0.75F;
    Variable logits(Tensor({batch, time, vocabulary}, f.values));
    Variable loss = cross_entropy_time_range(logits, f.targets, offset, count) * upstream;
    loss.backward();
    const std::vector<float> gradient = logits.gradient().to_host();
    EXPECT_TRUE(zero_outside_slice(gradient, time, vocabulary, offset, count));
    // Central differences of the double oracle's loss, step h = 1e-4.
    std::vector<double> x = as_double(f.values);
    std::vector<double> numeric(x.size());
    constexpr double h = 1e-4;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double original = x[i];
        x[i] = original + h;
        const double up =
            time_range_oracle(x, f.targets, batch, time, vocabulary, offset, count).loss;
        x[i] = original - h;
        const double down =
            time_range_oracle(x, f.targets, batch, time, vocabulary, offset, count).loss;
        x[i] = original;
        numeric[i] = upstream * (up - down) / (2.0 * h);
    }
    EXPECT_TRUE(all_close(gradient, numeric, 1e-6, 1e-4));
}

TEST(CrossEntropyTimeRange, IndexTensorFormOfTheVariableOperationBackpropagates) {
    const Fixture f;
    Variable logits(Tensor({batch, time, vocabulary}, f.values));
    cross_entropy_time_range(logits, IndexTensor({batch * time}, f.targets), 3, 2).backward();
    const Oracle oracle =
        time_range_oracle(as_double(f.values), f.targets, batch, time, vocabulary, 3, 2);
    EXPECT_TRUE(all_close(logits.gradient(), oracle.gradient, 1e-7, 1e-5));
    EXPECT_TRUE(zero_outside_slice(logits.gradient().to_host(), time, vocabulary, 3, 2));
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(CrossEntropyTimeRange, RejectsLogitsOfAnotherRankAsInvalidArgument) {
    const std::vector<float> values = pseudo_random(2 * 12, -1.0F, 1.0F, 303U);
    for (const Shape& shape : {Shape{24}, Shape{6, 4}, Shape{2, 3, 2, 2}}) {
        const Tensor logits(shape, values);
        const std::vector<std::uint32_t> targets(24 / shape.back(), 0);
        EXPECT_TRUE(rejects<std::invalid_argument>(
            [&] { static_cast<void>(tensor_ops::cross_entropy_time_range(logits, targets, 0, 1)); },
            logits, values,
            {"cross_entropy_time_range", "logits must have rank 3", shape_to_string(shape)}));
    }
    const Tensor scalar = Tensor::scalar(1.0F);
    EXPECT_TRUE(rejects<std::invalid_argument>(
        [&] {
            static_cast<void>(
                tensor_ops::cross_entropy_time_range(scalar, std::vector<std::uint32_t>{0}, 0, 1));
        },
        scalar, {1.0F}, {"logits must have rank 3"}));
}

TEST(CrossEntropyTimeRange, ZeroDimensionLogitsCannotBeBuilt) {
    // The zero-dimension rule holds by construction: no tensor has a zero dimension.
    EXPECT_THROW(Tensor({2, 0, 3}, 0.0F), std::invalid_argument);
    EXPECT_THROW(Tensor({0, 2, 3}, 0.0F), std::invalid_argument);
    EXPECT_THROW(Tensor({2, 3, 0}, 0.0F), std::invalid_argument);
}

TEST(CrossEntropyTimeRange, RejectsAnEmptyCountAsInvalidArgument) {
    const Fixture f;
    for (const std::size_t offset : {0U, 2U, 5U}) {
        EXPECT_TRUE(rejects<std::invalid_argument>(
            [&] {
                static_cast<void>(
                    tensor_ops::cross_entropy_time_range(f.logits, f.targets, offset, 0));
            },
            f.logits, f.values, {"cross_entropy_time_range", "count must be > 0 (got 0)"}));
    }
}

TEST(CrossEntropyTimeRange, RejectsARangePastTheEndAsOutOfRangeWithoutWrappingAround) {
    const Fixture f;
    for (const auto& window :
         std::vector<std::pair<std::size_t, std::size_t>>{{0, time + 1},
                                                          {3, 3},
                                                          {5, 1},
                                                          {6, 1},
                                                          {size_max, 2},
                                                          {1, size_max},
                                                          {size_max, size_max}}) {
        const std::size_t offset = window.first;  // plain locals: the lambda captures them
        const std::size_t count = window.second;
        SCOPED_TRACE("offset " + std::to_string(offset) + " count " + std::to_string(count));
        EXPECT_TRUE(rejects<std::out_of_range>(
            [&] {
                static_cast<void>(
                    tensor_ops::cross_entropy_time_range(f.logits, f.targets, offset, count));
            },
            f.logits, f.values,
            {"cross_entropy_time_range", "offset " + std::to_string(offset),
             "count " + std::to_string(count), "T = 5"}));
    }
}

TEST(CrossEntropyTimeRange, RejectsATargetCountOtherThanBatchTimesTimeAsInvalidArgument) {
    const Fixture f;
    // B·count (the slice's targets only) is the likely mistake; every count but B·T fails.
    for (const std::size_t given : {0U, 1U, 6U, 14U, 16U, 105U}) {
        const std::vector<std::uint32_t> targets(given, 0);
        EXPECT_TRUE(rejects<std::invalid_argument>(
            [&] {
                static_cast<void>(tensor_ops::cross_entropy_time_range(f.logits, targets, 1, 2));
            },
            f.logits, f.values,
            {"cross_entropy_time_range", std::to_string(given) + " targets given",
             "15 positions"}));
        if (given != 0) {  // an index tensor has at least one id
            const IndexTensor uploaded({given}, targets, f.logits.backend());
            EXPECT_TRUE(rejects<std::invalid_argument>(
                [&] {
                    static_cast<void>(
                        tensor_ops::cross_entropy_time_range(f.logits, uploaded, 1, 2));
                },
                f.logits, f.values, {std::to_string(given) + " targets given"}));
        }
    }
}

TEST(CrossEntropyTimeRange, RejectsATargetAtOrBeyondTheVocabularyInsideOrOutsideTheSlice) {
    const Fixture f;
    for (const std::size_t position : {0U, 7U, 14U}) {  // t = 0 (outside), 2 (inside), 4
        for (const std::uint32_t id : {7U, std::numeric_limits<std::uint32_t>::max()}) {
            std::vector<std::uint32_t> targets = f.targets;
            targets[position] = id;
            const std::vector<std::uint32_t> targets_before = targets;
            const std::string named =
                "targets[" + std::to_string(position) + "] = " + std::to_string(id);
            EXPECT_TRUE(rejects<std::out_of_range>(
                [&] {
                    static_cast<void>(
                        tensor_ops::cross_entropy_time_range(f.logits, targets, 1, 3));
                },
                f.logits, f.values, {"cross_entropy_time_range", named, "7"}));
            EXPECT_EQ(targets, targets_before);
            const IndexTensor uploaded({batch, time}, targets, f.logits.backend());
            EXPECT_TRUE(rejects<std::out_of_range>(
                [&] {
                    static_cast<void>(
                        tensor_ops::cross_entropy_time_range(f.logits, uploaded, 1, 3));
                },
                f.logits, f.values, {"cross_entropy_time_range", named}));
        }
    }
}

TEST(CrossEntropyTimeRange, RejectsANonFiniteTargetLogitInsideTheSliceAsDomainError) {
    const Fixture f;
    std::vector<float> values = f.values;
    const std::size_t row = 1 * time + 2;  // b = 1, t = 2
    values[row * vocabulary + f.targets[row]] = std::numeric_limits<float>::infinity();
    const Tensor logits({batch, time, vocabulary}, values);
    EXPECT_TRUE(rejects<std::domain_error>(
        [&] { static_cast<void>(tensor_ops::cross_entropy_time_range(logits, f.targets, 1, 3)); },
        logits, values, {"position " + std::to_string(row)}));
    EXPECT_NO_THROW(
        static_cast<void>(tensor_ops::cross_entropy_time_range(logits, f.targets, 3, 2)));
}

TEST(CrossEntropyTimeRange, RejectsSingularLogitsAndAnEmptyVariableAsLogicError) {
    const std::vector<std::uint32_t> targets = {0};
    EXPECT_THROW(static_cast<void>(tensor_ops::cross_entropy_time_range(Tensor(), targets, 0, 1)),
                 std::logic_error);
    EXPECT_THROW(static_cast<void>(cross_entropy_time_range(Variable(), targets, 0, 1)),
                 std::logic_error);
}

TEST(CrossEntropyTimeRange, AFailedVariableOperationCreatesNoNodeAndPublishesNoGradient) {
    const Fixture f;
    Variable logits(Tensor({batch, time, vocabulary}, f.values));
    std::vector<std::uint32_t> out_of_vocabulary = f.targets;
    out_of_vocabulary[0] = vocabulary;
    const std::vector<std::function<Variable()>> failing = {
        [&] { return cross_entropy_time_range(logits, f.targets, 0, 0); },
        [&] { return cross_entropy_time_range(logits, f.targets, 4, 2); },
        [&] { return cross_entropy_time_range(logits, std::vector<std::uint32_t>(6, 0), 1, 2); },
        [&] { return cross_entropy_time_range(logits, out_of_vocabulary, 1, 2); },
    };
    for (std::size_t i = 0; i < failing.size(); ++i) {
        SCOPED_TRACE("case " + std::to_string(i));
        const std::uint64_t nodes_before = autograd_counters().nodes_created;
        const std::uint64_t version_before = logits.version();
        EXPECT_ANY_THROW(static_cast<void>(failing[i]()));
        EXPECT_EQ(autograd_counters().nodes_created, nodes_before);
        EXPECT_EQ(logits.version(), version_before);
        EXPECT_FALSE(logits.has_gradient());
        EXPECT_TRUE(bit_identical(logits.value().to_host(), f.values));
    }
}

}  // namespace riftco_transformer
