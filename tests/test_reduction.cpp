// Reductions (docs/ARCHITECTURE.md, 'Tensor operations'): sum and mean over everything or one axis,
// keep_dims, the axis rule, double accumulation, and results that do not depend on the CPU thread
// count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/tensor_ops/reduction.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using tensor_ops::mean;
using tensor_ops::sum;

std::vector<float> iota_values(std::size_t count) {
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i)
        values[i] = static_cast<float>(i);
    return values;
}

Tensor tensor_of(const Shape& shape, const std::vector<float>& values) {
    return Tensor(shape, std::span<const float>(values));
}

// Runs `compute` with the CPU pool at `thread_count` threads, then restores the pool size.
template <typename Compute>
std::vector<float> with_threads(std::size_t thread_count, Compute compute) {
    const std::size_t before = cpu_thread_count();
    set_cpu_thread_count(thread_count);
    std::vector<float> result = compute();
    set_cpu_thread_count(before);
    return result;
}

// Oracle: Σ over `axis` of x viewed as [outer, extent, inner], in double.
std::vector<double> axis_sum_oracle(const std::vector<float>& x, std::size_t outer,
                                    std::size_t extent, std::size_t inner) {
    std::vector<double> out(outer * inner, 0.0);
    for (std::size_t o = 0; o < outer; ++o) {
        for (std::size_t e = 0; e < extent; ++e) {
            for (std::size_t i = 0; i < inner; ++i)
                out[o * inner + i] += x[(o * extent + e) * inner + i];
        }
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reducing everything

TEST(SumAll, GivesAScalarOfTheTotal) {
    const Tensor total = sum(tensor_of({2, 3}, {1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(total.shape(), Shape{});
    EXPECT_EQ(total.numel(), 1U);
    EXPECT_EQ(total.item(), 21.0F);
}

TEST(SumAll, OfAScalarIsTheScalar) {
    const Tensor total = sum(Tensor::scalar(-2.5F));
    EXPECT_EQ(total.shape(), Shape{});
    EXPECT_EQ(total.item(), -2.5F);
}

TEST(MeanAll, DividesByTheElementCount) {
    const Tensor average = mean(tensor_of({2, 2}, {1, 2, 3, 4}));
    EXPECT_EQ(average.shape(), Shape{});
    EXPECT_EQ(average.item(), 2.5F);
    EXPECT_TRUE(testing::all_close(mean(tensor_of({3}, {1, 1, 2})), {4.0 / 3.0}));
}

TEST(SumAll, AccumulatesInDouble) {
    // In float, 1e8 + 1 rounds back to 1e8 and the total would be 0.
    EXPECT_EQ(sum(tensor_of({3}, {1e8F, 1.0F, -1e8F})).item(), 1.0F);
}

TEST(SumAll, MillionTenthsAreAccurateToOnePartPerMillion) {
    const std::size_t count = 1'000'000;
    const std::vector<float> values(count, 0.1F);
    const Tensor x = tensor_of({count}, values);
    const double exact = static_cast<double>(count) * static_cast<double>(0.1F);
    EXPECT_TRUE(testing::all_close(sum(x), {exact}, 0.0, 1e-6));
    EXPECT_TRUE(testing::all_close(mean(x), {static_cast<double>(0.1F)}, 0.0, 1e-6));
    EXPECT_TRUE(testing::all_close(sum(tensor_of({1000, 1000}, values)), {exact}, 0.0, 1e-6));
}

TEST(SumAll, LargeRandomInputMatchesTheDoubleOracle) {
    const std::vector<float> values = testing::pseudo_random(1'234'567, -1.0F, 1.0F, 21U);
    double exact = 0.0;
    for (const float value : values)
        exact += value;
    EXPECT_TRUE(testing::all_close(sum(tensor_of({values.size()}, values)), {exact}, 1e-6, 1e-6));
}

TEST(SumAll, InfinityAndNaNPropagate) {
    const float infinity = std::numeric_limits<float>::infinity();
    EXPECT_EQ(sum(tensor_of({3}, {1.0F, infinity, 2.0F})).item(), infinity);
    EXPECT_TRUE(
        std::isnan(sum(tensor_of({2}, {1.0F, std::numeric_limits<float>::quiet_NaN()})).item()));
}

// ---------------------------------------------------------------------------------------------
// Reducing one axis

TEST(SumAxis, ReducesRowsOrColumnsOfAMatrix) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    const Tensor columns = sum(x, 0);
    EXPECT_EQ(columns.shape(), (Shape{3}));
    EXPECT_TRUE(testing::all_close(columns, {5, 7, 9}));
    const Tensor rows = sum(x, 1);
    EXPECT_EQ(rows.shape(), (Shape{2}));
    EXPECT_TRUE(testing::all_close(rows, {6, 15}));
}

TEST(SumAxis, KeepDimsLeavesAUnitAxis) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    const Tensor columns = sum(x, 0, true);
    EXPECT_EQ(columns.shape(), (Shape{1, 3}));
    EXPECT_TRUE(testing::all_close(columns, {5, 7, 9}));
    const Tensor rows = sum(x, 1, true);
    EXPECT_EQ(rows.shape(), (Shape{2, 1}));
    EXPECT_TRUE(testing::all_close(rows, {6, 15}));
}

TEST(SumAxis, OnlyAxisOfARank1TensorGivesAScalar) {
    const Tensor x = tensor_of({4}, {1, 2, 3, 4});
    const Tensor total = sum(x, 0);
    EXPECT_EQ(total.shape(), Shape{});
    EXPECT_EQ(total.item(), 10.0F);
    const Tensor kept = sum(x, 0, true);
    EXPECT_EQ(kept.shape(), (Shape{1}));
    EXPECT_EQ(kept.item(), 10.0F);
}

TEST(SumAxis, EachAxisOfARank3TensorMatchesHandValues) {
    // x[a,b,c] = 12a + 4b + c over [2,3,4].
    const Tensor x = tensor_of({2, 3, 4}, iota_values(24));
    // Σ_a: 12 + 2(4b + c)
    const Tensor over_a = sum(x, 0);
    EXPECT_EQ(over_a.shape(), (Shape{3, 4}));
    EXPECT_TRUE(testing::all_close(over_a, {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34}));
    // Σ_b: 3(12a + c) + 12
    const Tensor over_b = sum(x, 1, true);
    EXPECT_EQ(over_b.shape(), (Shape{2, 1, 4}));
    EXPECT_TRUE(testing::all_close(over_b, {12, 15, 18, 21, 48, 51, 54, 57}));
    // Σ_c: 4(12a + 4b) + 6
    const Tensor over_c = sum(x, 2);
    EXPECT_EQ(over_c.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::all_close(over_c, {6, 22, 38, 54, 70, 86}));
}

TEST(MeanAxis, DividesByTheReducedExtent) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_TRUE(testing::all_close(mean(x, 0), {2.5, 3.5, 4.5}));
    EXPECT_TRUE(testing::all_close(mean(x, 1), {2.0, 5.0}));
    const Tensor kept = mean(x, 1, true);
    EXPECT_EQ(kept.shape(), (Shape{2, 1}));
    EXPECT_TRUE(testing::all_close(kept, {2.0, 5.0}));
    const Tensor scalar = mean(tensor_of({3}, {1, 2, 6}), 0);
    EXPECT_EQ(scalar.shape(), Shape{});
    EXPECT_EQ(scalar.item(), 3.0F);
}

TEST(SumAxis, AccumulatesInDouble) {
    // Columns [1e8, 1, -1e8] sum to exactly 1 only with a wider accumulator.
    const Tensor x = tensor_of({3, 2}, {1e8F, 2.0F, 1.0F, 3.0F, -1e8F, 4.0F});
    EXPECT_TRUE(testing::all_close(sum(x, 0), {1.0, 9.0}, 0.0, 0.0));
}

TEST(SumAxis, LongAxisOfTenthsIsAccurateToOnePartPerMillion) {
    const std::size_t extent = 1'000'000;
    const Tensor x = tensor_of({extent, 2}, std::vector<float>(2 * extent, 0.1F));
    const double exact = static_cast<double>(extent) * static_cast<double>(0.1F);
    EXPECT_TRUE(testing::all_close(sum(x, 0), {exact, exact}, 0.0, 1e-6));
    EXPECT_TRUE(testing::all_close(mean(x, 0), {0.1F, 0.1F}, 0.0, 1e-6));
}

TEST(SumAxis, LargeRank4InputMatchesTheDoubleOracleOnEveryAxis) {
    const Shape shape = {6, 40, 33, 17};
    const std::vector<float> values = testing::pseudo_random(6 * 40 * 33 * 17, -1.0F, 1.0F, 22U);
    const Tensor x = tensor_of(shape, values);
    for (std::size_t axis = 0; axis < 4; ++axis) {
        SCOPED_TRACE(axis);
        std::size_t outer = 1;
        std::size_t inner = 1;
        for (std::size_t d = 0; d < axis; ++d)
            outer *= shape[d];
        for (std::size_t d = axis + 1; d < 4; ++d)
            inner *= shape[d];
        const std::vector<double> expected = axis_sum_oracle(values, outer, shape[axis], inner);
        EXPECT_TRUE(testing::all_close(sum(x, axis), expected, 1e-6, 1e-6));
        std::vector<double> expected_mean(expected);
        for (double& value : expected_mean)
            value /= static_cast<double>(shape[axis]);
        EXPECT_TRUE(testing::all_close(mean(x, axis, true), expected_mean, 1e-6, 1e-6));
    }
}

TEST(SumAxis, AxisPastTheRankIsOutOfRangeWithoutChangingInput) {
    const std::vector<float> values = {1, 2, 3, 4, 5, 6};
    const Tensor x = tensor_of({2, 3}, values);
    EXPECT_THROW(static_cast<void>(sum(x, 2)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(sum(x, 2, true)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(mean(x, 5)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(mean(x, std::numeric_limits<std::size_t>::max(), true)),
                 std::out_of_range);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
}

TEST(SumAxis, ScalarHasNoAxisToReduce) {
    EXPECT_THROW(static_cast<void>(sum(Tensor::scalar(1.0F), 0)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(mean(Tensor::scalar(1.0F), 0, true)), std::out_of_range);
}

TEST(Reduction, InputIsUnchangedAfterEveryReduction) {
    const std::vector<float> values = testing::pseudo_random(60, -1.0F, 1.0F, 23U);
    const Tensor x = tensor_of({3, 4, 5}, values);
    static_cast<void>(sum(x));
    static_cast<void>(mean(x));
    static_cast<void>(sum(x, 1));
    static_cast<void>(mean(x, 2, true));
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
}

// ---------------------------------------------------------------------------------------------
// Determinism across thread counts

TEST(ReductionDeterminism, SumAllIsBitIdenticalForOneAndSeveralThreads) {
    const std::vector<float> values = testing::pseudo_random(1'000'003, -1.0F, 1.0F, 24U);
    const Tensor x = tensor_of({values.size()}, values);
    const auto compute = [&] { return std::vector<float>{sum(x).item(), mean(x).item()}; };
    const std::vector<float> one = with_threads(1, compute);
    EXPECT_TRUE(testing::bit_identical(one, with_threads(2, compute)));
    EXPECT_TRUE(testing::bit_identical(one, with_threads(3, compute)));
    EXPECT_TRUE(testing::bit_identical(one, with_threads(8, compute)));
}

TEST(ReductionDeterminism, SumAxisIsBitIdenticalForOneAndSeveralThreads) {
    const Shape shape = {64, 129, 130};
    const std::vector<float> values = testing::pseudo_random(64 * 129 * 130, -1.0F, 1.0F, 25U);
    const Tensor x = tensor_of(shape, values);
    for (std::size_t axis = 0; axis < 3; ++axis) {
        SCOPED_TRACE(axis);
        const auto compute = [&] {
            std::vector<float> out = sum(x, axis).to_host();
            const std::vector<float> averaged = mean(x, axis, true).to_host();
            out.insert(out.end(), averaged.begin(), averaged.end());
            return out;
        };
        const std::vector<float> one = with_threads(1, compute);
        EXPECT_TRUE(testing::bit_identical(one, with_threads(2, compute)));
        EXPECT_TRUE(testing::bit_identical(one, with_threads(5, compute)));
    }
}

}  // namespace riftco_transformer
