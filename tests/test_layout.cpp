// Layout operations (docs/ARCHITECTURE.md, 'Tensor operations'): permute, transpose_2d, reshape,
// broadcast_to, sum_to_shape, concatenate_last_axis, slice. Expected values are written by hand or
// produced by index-arithmetic oracles in this file; every error rule is triggered and the inputs
// are shown unchanged afterwards.
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using tensor_ops::broadcast_to;
using tensor_ops::concatenate_last_axis;
using tensor_ops::permute;
using tensor_ops::slice;
using tensor_ops::sum_to_shape;
using tensor_ops::transpose_2d;

// 0, 1, 2, ... as floats (exact for the sizes used here).
std::vector<float> iota_values(std::size_t count) {
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i)
        values[i] = static_cast<float>(i);
    return values;
}

Tensor tensor_of(const Shape& shape, const std::vector<float>& values) {
    return Tensor(shape, std::span<const float>(values));
}

std::size_t element_count(const Shape& shape) {
    return std::accumulate(shape.begin(), shape.end(), std::size_t{1},
                           [](std::size_t a, std::size_t b) { return a * b; });
}

// Row-major multi-index of a flat index.
std::vector<std::size_t> unravel(std::size_t flat, const Shape& shape) {
    std::vector<std::size_t> index(shape.size());
    for (std::size_t axis = shape.size(); axis-- > 0;) {
        index[axis] = flat % shape[axis];
        flat /= shape[axis];
    }
    return index;
}

std::size_t ravel(const std::vector<std::size_t>& index, const Shape& shape) {
    std::size_t flat = 0;
    for (std::size_t axis = 0; axis < shape.size(); ++axis)
        flat = flat * shape[axis] + index[axis];
    return flat;
}

// Oracle: out[o] = x[i] where o[d] = i[axes[d]].
std::vector<double> permute_oracle(const std::vector<float>& x, const Shape& shape,
                                   const std::vector<std::size_t>& axes) {
    Shape out_shape(axes.size());
    for (std::size_t d = 0; d < axes.size(); ++d)
        out_shape[d] = shape[axes[d]];
    std::vector<double> out(x.size());
    for (std::size_t o = 0; o < out.size(); ++o) {
        const std::vector<std::size_t> out_index = unravel(o, out_shape);
        std::vector<std::size_t> in_index(shape.size());
        for (std::size_t d = 0; d < axes.size(); ++d)
            in_index[axes[d]] = out_index[d];
        out[o] = x[ravel(in_index, shape)];
    }
    return out;
}

// Oracle: the element of x that position `out_index` of the broadcast reads.
std::size_t broadcast_source(const std::vector<std::size_t>& out_index, const Shape& from) {
    const std::size_t offset = out_index.size() - from.size();
    std::vector<std::size_t> in_index(from.size());
    for (std::size_t axis = 0; axis < from.size(); ++axis) {
        in_index[axis] = from[axis] == 1 ? 0 : out_index[offset + axis];
    }
    return ravel(in_index, from);
}

std::vector<double> sum_to_shape_oracle(const std::vector<float>& x, const Shape& x_shape,
                                        const Shape& target) {
    std::vector<double> out(element_count(target), 0.0);
    for (std::size_t i = 0; i < x.size(); ++i) {
        out[broadcast_source(unravel(i, x_shape), target)] += x[i];
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// permute

TEST(Permute, SwapsTheLeadingAxesOfARank3Tensor) {
    // x[a,b,c] = 6a + 2b + c, shape [2,3,2]; out[b,a,c] = x[a,b,c].
    const Tensor x = tensor_of({2, 3, 2}, iota_values(12));
    const Tensor out = permute(x, {1, 0, 2});
    EXPECT_EQ(out.shape(), (Shape{3, 2, 2}));
    EXPECT_TRUE(testing::all_close(out, {0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
}

TEST(Permute, RotatesTheAxesOfARank3Tensor) {
    // x shape [2,1,3] = [[[0,1,2]],[[3,4,5]]]; out[c,a,b] = x[a,b,c], shape [3,2,1].
    const Tensor x = tensor_of({2, 1, 3}, iota_values(6));
    const Tensor out = permute(x, {2, 0, 1});
    EXPECT_EQ(out.shape(), (Shape{3, 2, 1}));
    EXPECT_TRUE(testing::all_close(out, {0, 3, 1, 4, 2, 5}));
}

TEST(Permute, MovesHeadsBeforeTimeForAttentionLayout) {
    // [B,T,H,d] -> [B,H,T,d]
    const Shape shape = {2, 3, 4, 5};
    const std::vector<float> values = iota_values(120);
    const Tensor out = permute(tensor_of(shape, values), {0, 2, 1, 3});
    EXPECT_EQ(out.shape(), (Shape{2, 4, 3, 5}));
    // Spot checks by hand: out[b,h,t,e] = x[b,t,h,e] = ((b·3 + t)·4 + h)·5 + e.
    EXPECT_EQ(out.at({0, 0, 1, 0}), 20.0F);   // x[0,1,0,0]
    EXPECT_EQ(out.at({0, 1, 0, 0}), 5.0F);    // x[0,0,1,0]
    EXPECT_EQ(out.at({1, 3, 2, 4}), 119.0F);  // x[1,2,3,4]
    EXPECT_EQ(out.at({1, 2, 1, 3}), 93.0F);   // x[1,1,2,3]
    EXPECT_TRUE(testing::all_close(out, permute_oracle(values, shape, {0, 2, 1, 3})));
}

TEST(Permute, ArbitraryRank4PermutationMatchesTheIndexOracle) {
    const Shape shape = {3, 2, 5, 4};
    const std::vector<float> values = testing::pseudo_random(120);
    for (const std::vector<std::size_t>& axes : std::vector<std::vector<std::size_t>>{
             {3, 1, 0, 2}, {3, 2, 1, 0}, {1, 3, 2, 0}, {0, 1, 3, 2}}) {
        const Tensor out = permute(tensor_of(shape, values), axes);
        EXPECT_TRUE(testing::all_close(out, permute_oracle(values, shape, axes), 0.0, 0.0));
    }
}

TEST(Permute, LargeAttentionLayoutSpanningSeveralThreadsMatchesTheOracle) {
    const Shape shape = {2, 256, 8, 16};  // [B,T,H,d]: 65536 elements, 4096 rows of 16
    const std::vector<float> values = testing::pseudo_random(element_count(shape));
    const Tensor out = permute(tensor_of(shape, values), {0, 2, 1, 3});
    EXPECT_EQ(out.shape(), (Shape{2, 8, 256, 16}));
    EXPECT_TRUE(testing::all_close(out, permute_oracle(values, shape, {0, 2, 1, 3}), 0.0, 0.0));
}

TEST(Permute, IdentityPermutationCopiesValues) {
    const std::vector<float> values = testing::pseudo_random(24);
    const Tensor out = permute(tensor_of({2, 3, 4}, values), {0, 1, 2});
    EXPECT_EQ(out.shape(), (Shape{2, 3, 4}));
    EXPECT_TRUE(testing::bit_identical(out.to_host(), values));
}

TEST(Permute, ScalarAndRank1AreCopies) {
    const Tensor scalar_out = permute(Tensor::scalar(4.5F), {});
    EXPECT_EQ(scalar_out.shape(), Shape{});
    EXPECT_EQ(scalar_out.item(), 4.5F);
    EXPECT_TRUE(testing::bit_identical(permute(tensor_of({3}, {1, 2, 3}), {0}).to_host(),
                                       {1.0F, 2.0F, 3.0F}));
}

TEST(Permute, InversePermutationRestoresTheInputExactly) {
    const Shape shape = {2, 3, 4, 5};
    const std::vector<float> values = testing::pseudo_random(120);
    const Tensor x = tensor_of(shape, values);
    const std::vector<std::size_t> axes = {2, 0, 3, 1};
    std::vector<std::size_t> inverse(axes.size());
    for (std::size_t d = 0; d < axes.size(); ++d)
        inverse[axes[d]] = d;  // {1, 3, 0, 2}
    const Tensor round_trip = permute(permute(x, axes), inverse);
    EXPECT_EQ(round_trip.shape(), shape);
    EXPECT_TRUE(testing::bit_identical(round_trip.to_host(), values));
}

TEST(Permute, AxisCountMismatchIsInvalidArgumentWithoutChangingInput) {
    const std::vector<float> values = iota_values(24);
    const Tensor x = tensor_of({2, 3, 4}, values);
    EXPECT_THROW(static_cast<void>(permute(x, {0, 1})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(permute(x, {0, 1, 2, 3})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(permute(x, {})), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
    EXPECT_EQ(x.shape(), (Shape{2, 3, 4}));
}

TEST(Permute, AxisPastTheRankIsOutOfRange) {
    const std::vector<float> values = iota_values(24);
    const Tensor x = tensor_of({2, 3, 4}, values);
    EXPECT_THROW(static_cast<void>(permute(x, {0, 1, 3})), std::out_of_range);
    EXPECT_THROW(static_cast<void>(permute(x, {7, 0, 1})), std::out_of_range);
    EXPECT_THROW(static_cast<void>(permute(x, {0, std::numeric_limits<std::size_t>::max(), 1})),
                 std::out_of_range);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
}

TEST(Permute, RepeatedAxisIsInvalidArgument) {
    const std::vector<float> values = iota_values(24);
    const Tensor x = tensor_of({2, 3, 4}, values);
    EXPECT_THROW(static_cast<void>(permute(x, {0, 0, 1})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(permute(x, {2, 1, 2})), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
}

TEST(Permute, SpanOverloadMatchesInitializerList) {
    const std::vector<float> values = iota_values(24);
    const std::vector<std::size_t> axes = {2, 1, 0};
    const Tensor x = tensor_of({2, 3, 4}, values);
    EXPECT_TRUE(testing::bit_identical(permute(x, std::span<const std::size_t>(axes)).to_host(),
                                       permute(x, {2, 1, 0}).to_host()));
}

// ---------------------------------------------------------------------------------------------
// transpose_2d

TEST(Transpose2d, SwapsRowsAndColumns) {
    // [[1,2,3],[4,5,6]] -> [[1,4],[2,5],[3,6]]
    const Tensor out = transpose_2d(tensor_of({2, 3}, {1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(out.shape(), (Shape{3, 2}));
    EXPECT_TRUE(testing::all_close(out, {1, 4, 2, 5, 3, 6}));
}

TEST(Transpose2d, TransposingTwiceRestoresTheInput) {
    const std::vector<float> values = testing::pseudo_random(35);
    const Tensor twice = transpose_2d(transpose_2d(tensor_of({5, 7}, values)));
    EXPECT_EQ(twice.shape(), (Shape{5, 7}));
    EXPECT_TRUE(testing::bit_identical(twice.to_host(), values));
}

TEST(Transpose2d, RankOtherThanTwoIsInvalidArgument) {
    const Tensor rank1 = tensor_of({3}, {1, 2, 3});
    const Tensor rank3 = tensor_of({1, 2, 3}, iota_values(6));
    EXPECT_THROW(static_cast<void>(transpose_2d(rank1)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(transpose_2d(rank3)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(transpose_2d(Tensor::scalar(1.0F))), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(rank1.to_host(), {1.0F, 2.0F, 3.0F}));
    EXPECT_TRUE(testing::bit_identical(rank3.to_host(), iota_values(6)));
}

// ---------------------------------------------------------------------------------------------
// reshape

TEST(Reshape, KeepsFlatOrderUnderANewShape) {
    const Tensor out = tensor_ops::reshape(tensor_of({2, 3}, iota_values(6)), {3, 1, 2});
    EXPECT_EQ(out.shape(), (Shape{3, 1, 2}));
    EXPECT_TRUE(testing::bit_identical(out.to_host(), iota_values(6)));
    EXPECT_EQ(out.at({2, 0, 1}), 5.0F);
}

TEST(Reshape, DifferentElementCountIsInvalidArgument) {
    const Tensor x = tensor_of({2, 3}, iota_values(6));
    EXPECT_THROW(static_cast<void>(tensor_ops::reshape(x, {7})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::reshape(x, {2, 0, 3})), std::invalid_argument);
    EXPECT_EQ(x.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::bit_identical(x.to_host(), iota_values(6)));
}

// ---------------------------------------------------------------------------------------------
// broadcast_to

TEST(BroadcastTo, ScalarBroadcastsToAnyShape) {
    const Tensor out = broadcast_to(Tensor::scalar(2.5F), {2, 3});
    EXPECT_EQ(out.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::all_close(out, {2.5, 2.5, 2.5, 2.5, 2.5, 2.5}));
    EXPECT_EQ(broadcast_to(Tensor::scalar(1.0F), {}).shape(), Shape{});
    EXPECT_EQ(broadcast_to(Tensor::scalar(1.0F), {2, 1, 4, 3}).numel(), 24U);
}

TEST(BroadcastTo, RowVectorRepeatsOverNewLeadingAxis) {
    // [3] -> [2,3]
    const Tensor out = broadcast_to(tensor_of({3}, {1, 2, 3}), {2, 3});
    EXPECT_EQ(out.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::all_close(out, {1, 2, 3, 1, 2, 3}));
}

TEST(BroadcastTo, ColumnVectorRepeatsAlongUnitAxis) {
    // [2,1] -> [2,3]
    const Tensor out = broadcast_to(tensor_of({2, 1}, {1, 2}), {2, 3});
    EXPECT_TRUE(testing::all_close(out, {1, 1, 1, 2, 2, 2}));
}

TEST(BroadcastTo, InnerUnitAxisAndNewLeadingAxis) {
    // [2,1,2] -> [2,2,3,2]: x[a,0,c] = 2a + c appears at every (lead, a, *, c).
    const Tensor out = broadcast_to(tensor_of({2, 1, 2}, {0, 1, 2, 3}), {2, 2, 3, 2});
    EXPECT_TRUE(testing::all_close(
        out, {0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3}));
}

TEST(BroadcastTo, SameShapeIsACopy) {
    const std::vector<float> values = testing::pseudo_random(6);
    const Tensor out = broadcast_to(tensor_of({2, 3}, values), {2, 3});
    EXPECT_TRUE(testing::bit_identical(out.to_host(), values));
}

TEST(BroadcastTo, LargeBroadcastMatchesTheIndexOracle) {
    const Shape from = {1, 64, 1, 16};
    const Shape to = {4, 64, 32, 16};  // 131072 elements: several threads
    const std::vector<float> values = testing::pseudo_random(element_count(from));
    const Tensor out = broadcast_to(tensor_of(from, values), to);
    std::vector<double> expected(element_count(to));
    for (std::size_t o = 0; o < expected.size(); ++o) {
        expected[o] = values[broadcast_source(unravel(o, to), from)];
    }
    EXPECT_TRUE(testing::all_close(out, expected, 0.0, 0.0));
}

TEST(BroadcastTo, IncompatibleDimensionIsInvalidArgumentWithoutChangingInput) {
    const Tensor x = tensor_of({2}, {1, 2});
    EXPECT_THROW(static_cast<void>(broadcast_to(x, {3})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(broadcast_to(x, {2, 3})), std::invalid_argument);
    const Tensor column = tensor_of({3}, {1, 2, 3});
    EXPECT_THROW(static_cast<void>(broadcast_to(column, {3, 2})), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1.0F, 2.0F}));
    EXPECT_TRUE(testing::bit_identical(column.to_host(), {1.0F, 2.0F, 3.0F}));
}

TEST(BroadcastTo, RankDecreaseIsInvalidArgument) {
    const Tensor x = tensor_of({1, 3}, {1, 2, 3});
    EXPECT_THROW(static_cast<void>(broadcast_to(x, {3})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(broadcast_to(tensor_of({2, 3}, iota_values(6)), {3})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(broadcast_to(tensor_of({1}, {1}), {})), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1.0F, 2.0F, 3.0F}));
}

TEST(BroadcastTo, OverflowingTargetShapeIsOverflowError) {
    const std::size_t big = std::size_t{1} << 33U;  // 2^66 elements
    EXPECT_THROW(static_cast<void>(broadcast_to(Tensor::scalar(1.0F), {big, big})),
                 std::overflow_error);
}

TEST(BroadcastTo, ZeroDimensionTargetIsInvalidArgument) {
    EXPECT_THROW(static_cast<void>(broadcast_to(Tensor::scalar(1.0F), {2, 0})),
                 std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// sum_to_shape (adjoint of broadcast_to)

TEST(SumToShape, SumsOverANewLeadingAxis) {
    // [[1,2,3],[4,5,6]] -> [3]: column sums.
    const Tensor out = sum_to_shape(tensor_of({2, 3}, {1, 2, 3, 4, 5, 6}), {3});
    EXPECT_EQ(out.shape(), (Shape{3}));
    EXPECT_TRUE(testing::all_close(out, {5, 7, 9}));
}

TEST(SumToShape, SumsAlongAUnitAxis) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_TRUE(testing::all_close(sum_to_shape(x, {2, 1}), {6, 15}));
    EXPECT_TRUE(testing::all_close(sum_to_shape(x, {1, 3}), {5, 7, 9}));
}

TEST(SumToShape, SumsEverythingToAScalar) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    const Tensor out = sum_to_shape(x, {});
    EXPECT_EQ(out.shape(), Shape{});
    EXPECT_EQ(out.item(), 21.0F);
    EXPECT_EQ(sum_to_shape(x, {1, 1}).item(), 21.0F);
    EXPECT_EQ(sum_to_shape(x, {1}).item(), 21.0F);
}

TEST(SumToShape, SameShapeIsACopy) {
    const std::vector<float> values = testing::pseudo_random(6);
    EXPECT_TRUE(
        testing::bit_identical(sum_to_shape(tensor_of({2, 3}, values), {2, 3}).to_host(), values));
    EXPECT_EQ(sum_to_shape(Tensor::scalar(3.0F), {}).item(), 3.0F);
}

TEST(SumToShape, MixedReductionMatchesHandValues) {
    // x[a,b,c] = 6a + 2b + c over [2,3,2] summed to [3,1] (over a and c):
    // b=0: 0+1+6+7 = 14; b=1: 2+3+8+9 = 22; b=2: 4+5+10+11 = 30.
    const Tensor out = sum_to_shape(tensor_of({2, 3, 2}, iota_values(12)), {3, 1});
    EXPECT_EQ(out.shape(), (Shape{3, 1}));
    EXPECT_TRUE(testing::all_close(out, {14, 22, 30}));
}

TEST(SumToShape, LargeInputMatchesTheIndexOracle) {
    const Shape x_shape = {4, 33, 7, 10};
    const Shape target = {33, 1, 10};
    const std::vector<float> values = testing::pseudo_random(element_count(x_shape));
    const Tensor out = sum_to_shape(tensor_of(x_shape, values), target);
    EXPECT_EQ(out.shape(), target);
    EXPECT_TRUE(testing::all_close(out, sum_to_shape_oracle(values, x_shape, target), 1e-6, 1e-6));
}

TEST(SumToShape, IsTheAdjointOfBroadcastTo) {
    // <broadcast_to(x, S), y> == <x, sum_to_shape(y, shape(x))>
    const std::vector<std::pair<Shape, Shape>> cases = {
        {{3}, {4, 3}}, {{2, 1, 5}, {3, 2, 4, 5}}, {{}, {2, 3}}, {{1, 1}, {6, 7}}, {{5, 1}, {5, 9}}};
    std::uint32_t seed = 7;
    for (const auto& [small, large] : cases) {
        SCOPED_TRACE(shape_to_string(small) + " -> " + shape_to_string(large));
        const std::vector<float> x = testing::pseudo_random(element_count(small), -1, 1, ++seed);
        const std::vector<float> y = testing::pseudo_random(element_count(large), -1, 1, ++seed);
        const double left =
            testing::inner_product(broadcast_to(tensor_of(small, x), large).to_host(), y);
        const double right =
            testing::inner_product(x, sum_to_shape(tensor_of(large, y), small).to_host());
        EXPECT_NEAR(left, right, 1e-5 * (1.0 + std::fabs(left)));
    }
}

TEST(SumToShape, IncompatibleTargetIsInvalidArgumentWithoutChangingInput) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_THROW(static_cast<void>(sum_to_shape(x, {2})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(sum_to_shape(x, {3, 3})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(sum_to_shape(x, {4, 2, 3})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(sum_to_shape(x, {1, 2, 3})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(sum_to_shape(x, {2, 0})), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(sum_to_shape(Tensor::scalar(1.0F), {1})), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1, 2, 3, 4, 5, 6}));
}

// ---------------------------------------------------------------------------------------------
// concatenate_last_axis

TEST(ConcatenateLastAxis, JoinsTwoMatricesRowByRow) {
    // [[1],[2]] ++ [[3,4],[5,6]] -> [[1,3,4],[2,5,6]]
    const Tensor out =
        concatenate_last_axis(tensor_of({2, 1}, {1, 2}), tensor_of({2, 2}, {3, 4, 5, 6}));
    EXPECT_EQ(out.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::all_close(out, {1, 3, 4, 2, 5, 6}));
}

TEST(ConcatenateLastAxis, JoinsThreeRank3Inputs) {
    const Tensor a = tensor_of({2, 2, 1}, {1, 2, 3, 4});
    const Tensor b = tensor_of({2, 2, 2}, {10, 11, 12, 13, 14, 15, 16, 17});
    const Tensor c = tensor_of({2, 2, 1}, {-1, -2, -3, -4});
    const std::vector<Tensor> inputs = {a, b, c};
    const Tensor out = concatenate_last_axis(inputs);
    EXPECT_EQ(out.shape(), (Shape{2, 2, 4}));
    EXPECT_TRUE(
        testing::all_close(out, {1, 10, 11, -1, 2, 12, 13, -2, 3, 14, 15, -3, 4, 16, 17, -4}));
}

TEST(ConcatenateLastAxis, JoinsRank1InputsAndASingleInput) {
    EXPECT_TRUE(testing::all_close(
        concatenate_last_axis(tensor_of({2}, {1, 2}), tensor_of({3}, {3, 4, 5})), {1, 2, 3, 4, 5}));
    const std::vector<Tensor> single = {tensor_of({2, 2}, {1, 2, 3, 4})};
    const Tensor out = concatenate_last_axis(single);
    EXPECT_EQ(out.shape(), (Shape{2, 2}));
    EXPECT_TRUE(testing::all_close(out, {1, 2, 3, 4}));
}

TEST(ConcatenateLastAxis, ManyRowsMatchTheIndexOracle) {
    const std::vector<float> a = testing::pseudo_random(4096 * 3, -1, 1, 1);
    const std::vector<float> b = testing::pseudo_random(4096 * 5, -1, 1, 2);
    const Tensor out = concatenate_last_axis(tensor_of({64, 64, 3}, a), tensor_of({64, 64, 5}, b));
    std::vector<double> expected;
    for (std::size_t row = 0; row < 4096; ++row) {
        for (std::size_t j = 0; j < 3; ++j)
            expected.push_back(a[row * 3 + j]);
        for (std::size_t j = 0; j < 5; ++j)
            expected.push_back(b[row * 5 + j]);
    }
    EXPECT_TRUE(testing::all_close(out, expected, 0.0, 0.0));
}

TEST(ConcatenateLastAxis, EmptyListIsInvalidArgument) {
    const std::vector<Tensor> none;
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(none)), std::invalid_argument);
}

TEST(ConcatenateLastAxis, ScalarInputIsInvalidArgument) {
    const Tensor scalar = Tensor::scalar(1.0F);
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(scalar, scalar)), std::invalid_argument);
    const std::vector<Tensor> one_scalar = {scalar};
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(one_scalar)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(tensor_of({1}, {1}), scalar)),
                 std::invalid_argument);
}

TEST(ConcatenateLastAxis, RankMismatchIsInvalidArgumentWithoutChangingInputs) {
    const Tensor a = tensor_of({2, 2}, {1, 2, 3, 4});
    const Tensor b = tensor_of({2, 2, 1}, {5, 6, 7, 8});
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(a, b)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(tensor_of({4}, {1, 2, 3, 4}), a)),
                 std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(a.to_host(), {1, 2, 3, 4}));
    EXPECT_TRUE(testing::bit_identical(b.to_host(), {5, 6, 7, 8}));
}

TEST(ConcatenateLastAxis, PrefixMismatchIsInvalidArgumentWithoutChangingInputs) {
    const Tensor a = tensor_of({2, 3, 1}, iota_values(6));
    const Tensor b = tensor_of({2, 2, 1}, iota_values(4));
    const Tensor c = tensor_of({3, 3, 1}, iota_values(9));
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(a, b)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(a, c)), std::invalid_argument);
    const std::vector<Tensor> later_mismatch = {a, a, b};
    EXPECT_THROW(static_cast<void>(concatenate_last_axis(later_mismatch)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(a.to_host(), iota_values(6)));
    EXPECT_TRUE(testing::bit_identical(b.to_host(), iota_values(4)));
}

// ---------------------------------------------------------------------------------------------
// slice

TEST(Slice, TakesAWindowOfColumns) {
    // [[1,2,3],[4,5,6]][:, 1:3] = [[2,3],[5,6]]
    const Tensor out = slice(tensor_of({2, 3}, {1, 2, 3, 4, 5, 6}), 1, 1, 2);
    EXPECT_EQ(out.shape(), (Shape{2, 2}));
    EXPECT_TRUE(testing::all_close(out, {2, 3, 5, 6}));
}

TEST(Slice, TakesAWindowOfRows) {
    const Tensor out = slice(tensor_of({2, 3}, {1, 2, 3, 4, 5, 6}), 0, 1, 1);
    EXPECT_EQ(out.shape(), (Shape{1, 3}));
    EXPECT_TRUE(testing::all_close(out, {4, 5, 6}));
}

TEST(Slice, EachAxisOfARank3TensorMatchesHandValues) {
    // x[a,b,c] = 12a + 4b + c over [2,3,4].
    const Tensor x = tensor_of({2, 3, 4}, iota_values(24));
    const Tensor axis0 = slice(x, 0, 1, 1);
    EXPECT_EQ(axis0.shape(), (Shape{1, 3, 4}));
    EXPECT_TRUE(testing::all_close(axis0, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}));
    const Tensor axis1 = slice(x, 1, 1, 2);
    EXPECT_EQ(axis1.shape(), (Shape{2, 2, 4}));
    EXPECT_TRUE(
        testing::all_close(axis1, {4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23}));
    const Tensor axis2 = slice(x, 2, 3, 1);
    EXPECT_EQ(axis2.shape(), (Shape{2, 3, 1}));
    EXPECT_TRUE(testing::all_close(axis2, {3, 7, 11, 15, 19, 23}));
}

TEST(Slice, FullWindowIsACopyAndRank1Works) {
    const std::vector<float> values = testing::pseudo_random(12);
    EXPECT_TRUE(
        testing::bit_identical(slice(tensor_of({3, 4}, values), 0, 0, 3).to_host(), values));
    EXPECT_TRUE(testing::all_close(slice(tensor_of({5}, {1, 2, 3, 4, 5}), 0, 2, 3), {3, 4, 5}));
}

TEST(Slice, LargeWindowsOnEveryAxisMatchTheIndexOracle) {
    const Shape shape = {64, 48, 24};  // 73728 elements: several threads
    const std::vector<float> values = testing::pseudo_random(element_count(shape));
    const Tensor x = tensor_of(shape, values);
    const std::size_t starts[] = {5, 7, 3};
    const std::size_t lengths[] = {50, 30, 17};
    for (std::size_t axis = 0; axis < 3; ++axis) {
        SCOPED_TRACE(axis);
        Shape out_shape = shape;
        out_shape[axis] = lengths[axis];
        std::vector<double> expected(element_count(out_shape));
        for (std::size_t o = 0; o < expected.size(); ++o) {
            std::vector<std::size_t> index = unravel(o, out_shape);
            index[axis] += starts[axis];
            expected[o] = values[ravel(index, shape)];
        }
        const Tensor out = slice(x, axis, starts[axis], lengths[axis]);
        EXPECT_EQ(out.shape(), out_shape);
        EXPECT_TRUE(testing::all_close(out, expected, 0.0, 0.0));
    }
}

TEST(Slice, AxisPastTheRankIsOutOfRange) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_THROW(static_cast<void>(slice(x, 2, 0, 1)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(slice(Tensor::scalar(1.0F), 0, 0, 1)), std::out_of_range);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1, 2, 3, 4, 5, 6}));
}

TEST(Slice, ZeroLengthIsInvalidArgument) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_THROW(static_cast<void>(slice(x, 1, 0, 0)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(slice(x, 0, 1, 0)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1, 2, 3, 4, 5, 6}));
}

TEST(Slice, WindowPastTheEndIsOutOfRange) {
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    EXPECT_THROW(static_cast<void>(slice(x, 1, 3, 1)), std::out_of_range);  // start == extent
    EXPECT_THROW(static_cast<void>(slice(x, 1, 2, 2)), std::out_of_range);  // end past extent
    EXPECT_THROW(static_cast<void>(slice(x, 0, 0, 3)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(slice(x, 0, 5, 1)), std::out_of_range);
    // start + length wraps around size_t: still a window past the end, not a huge copy.
    EXPECT_THROW(static_cast<void>(slice(x, 1, 1, std::numeric_limits<std::size_t>::max())),
                 std::out_of_range);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1, 2, 3, 4, 5, 6}));
}

}  // namespace riftco_transformer
