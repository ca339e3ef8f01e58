// Row gather (embedding lookup) and its adjoint scatter-add: hand-computed values, the adjoint
// identity, a threaded case against a serial double oracle, thread-count independence, and
// every documented error rule (docs/ARCHITECTURE.md, 'Tensor operations').
#include <gtest/gtest.h>

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
using testing::pseudo_random;

constexpr std::size_t uint32_max = std::numeric_limits<std::uint32_t>::max();

// Deterministic indices in [0, row_count) with plenty of repeats.
std::vector<std::size_t> pseudo_random_indices(std::size_t count, std::size_t row_count,
                                               std::uint32_t seed) {
    std::vector<std::size_t> indices(count);
    std::uint32_t state = seed;
    for (std::size_t& index : indices) {
        state = state * 1664525U + 1013904223U;
        index = static_cast<std::size_t>(state >> 8U) % row_count;
    }
    return indices;
}

// Serial double oracle: out[r] = Σ_{i: indices[i] = r} upstream[i].
std::vector<double> scatter_add_oracle(const std::vector<float>& upstream,
                                       const std::vector<std::size_t>& indices,
                                       std::size_t row_count, std::size_t width) {
    std::vector<double> out(row_count * width, 0.0);
    for (std::size_t i = 0; i < indices.size(); ++i) {
        for (std::size_t j = 0; j < width; ++j) {
            out[indices[i] * width + j] += upstream[i * width + j];
        }
    }
    return out;
}

std::vector<double> gather_oracle(const std::vector<float>& table,
                                  const std::vector<std::size_t>& indices, std::size_t width) {
    std::vector<double> out;
    out.reserve(indices.size() * width);
    for (const std::size_t index : indices) {
        for (std::size_t j = 0; j < width; ++j)
            out.push_back(table[index * width + j]);
    }
    return out;
}

// table [4,3] = rows (0,1,2), (10,11,12), (20,21,22), (30,31,32).
Tensor small_table() {
    return Tensor(
        {4, 3}, {0.0F, 1.0F, 2.0F, 10.0F, 11.0F, 12.0F, 20.0F, 21.0F, 22.0F, 30.0F, 31.0F, 32.0F});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// gather_rows

TEST(GatherRows, CopiesIndexedRowsIntoIndexShapePlusWidth) {
    const std::vector<std::size_t> indices = {3, 0, 3, 1, 2, 2};
    const Tensor out = tensor_ops::gather_rows(small_table(), indices, {2, 3});
    EXPECT_EQ(out.shape(), (Shape{2, 3, 3}));
    EXPECT_TRUE(bit_identical(out.to_host(), {30, 31, 32, 0, 1, 2, 30, 31, 32,  //
                                              10, 11, 12, 20, 21, 22, 20, 21, 22}));
}

TEST(GatherRows, FlatIndexShapeGivesMatrix) {
    const std::vector<std::size_t> indices = {1, 1};
    const Tensor out = tensor_ops::gather_rows(small_table(), indices, {2});
    EXPECT_EQ(out.shape(), (Shape{2, 3}));
    EXPECT_TRUE(bit_identical(out.to_host(), {10, 11, 12, 10, 11, 12}));
}

TEST(GatherRows, ScalarIndexShapeGivesOneRow) {
    // prod([]) = 1 position, so the result is just [W].
    const std::vector<std::size_t> indices = {2};
    const Tensor out = tensor_ops::gather_rows(small_table(), indices, {});
    EXPECT_EQ(out.shape(), (Shape{3}));
    EXPECT_TRUE(bit_identical(out.to_host(), {20, 21, 22}));
}

TEST(GatherRows, CopiesSpecialValuesBitForBit) {
    const std::vector<float> values = {std::numeric_limits<float>::quiet_NaN(), -0.0F,
                                       std::numeric_limits<float>::infinity(),
                                       std::numeric_limits<float>::denorm_min()};
    const Tensor table({2, 2}, values);
    const std::vector<std::size_t> indices = {1, 0};
    const Tensor out = tensor_ops::gather_rows(table, indices, {2});
    EXPECT_TRUE(bit_identical(out.to_host(), {values[2], values[3], values[0], values[1]}));
}

TEST(GatherRows, LeavesTableUnchanged) {
    const Tensor table = small_table();
    const std::vector<float> before = table.to_host();
    const std::vector<std::size_t> indices = {0, 3};
    static_cast<void>(tensor_ops::gather_rows(table, indices, {2}));
    EXPECT_TRUE(bit_identical(table.to_host(), before));
}

TEST(GatherRows, RejectsTableRankOtherThanTwo) {
    const std::vector<std::size_t> indices = {0};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(Tensor({4}, 1.0F), indices, {1})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(Tensor({2, 2, 2}, 1.0F), indices, {1})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(Tensor::scalar(1.0F), indices, {1})),
                 std::invalid_argument);
}

TEST(GatherRows, RejectsIndexCountThatDiffersFromIndexShape) {
    const std::vector<std::size_t> three = {0, 1, 2};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), three, {2, 2})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), three, {2})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), three, {})),
                 std::invalid_argument);
    const std::vector<std::size_t> none;
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), none, {1})),
                 std::invalid_argument);
}

TEST(GatherRows, RejectsIndexShapeWithZeroDimension) {
    // Zero-size dimensions are rejected everywhere (checked_element_count).
    const std::vector<std::size_t> none;
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), none, {0})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), none, {2, 0})),
                 std::invalid_argument);
}

TEST(GatherRows, RejectsIndexAtOrBeyondRowCount) {
    const std::vector<std::size_t> at_end = {0, 4};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), at_end, {2})),
                 std::out_of_range);
    const std::vector<std::size_t> far = {1000, 0};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), far, {2})),
                 std::out_of_range);
    // The largest uint32 id is in the id range, so it is simply out of range for 4 rows.
    const std::vector<std::size_t> largest_id = {uint32_max};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), largest_id, {1})),
                 std::out_of_range);
}

TEST(GatherRows, RejectsIndexAboveUint32RangeWithOverflowError) {
    const std::vector<std::size_t> huge = {0, std::size_t{1} << 33U};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), huge, {2})),
                 std::overflow_error);
    const std::vector<std::size_t> just_above = {uint32_max + 1};
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(small_table(), just_above, {1})),
                 std::overflow_error);
}

TEST(GatherRows, LargeThreadedCaseCopiesEveryRow) {
    const testing::ThreadCountGuard guard;
    constexpr std::size_t rows = 300;
    constexpr std::size_t width = 64;
    const std::vector<float> table_values = pseudo_random(rows * width, -1.0F, 1.0F, 5U);
    const Tensor table({rows, width}, table_values);
    const std::vector<std::size_t> indices = pseudo_random_indices(50000, rows, 17U);
    set_cpu_thread_count(2);
    const Tensor out = tensor_ops::gather_rows(table, indices, {250, 200});
    EXPECT_EQ(out.shape(), (Shape{250, 200, width}));
    EXPECT_TRUE(all_close(out, gather_oracle(table_values, indices, width), 0.0, 0.0));
}

// ---------------------------------------------------------------------------------------------
// scatter_add_rows

TEST(ScatterAddRows, AccumulatesRepeatedIndices) {
    // upstream rows u0..u3, indices {1, 0, 1, 1}, 3 rows:
    // out[0] = u1, out[1] = u0 + u2 + u3, out[2] = 0.
    const Tensor upstream({4, 2}, {1.0F, 2.0F, 10.0F, 20.0F, 100.0F, 200.0F, 1000.0F, 2000.0F});
    const std::vector<std::size_t> indices = {1, 0, 1, 1};
    const Tensor out = tensor_ops::scatter_add_rows(upstream, indices, 3);
    EXPECT_EQ(out.shape(), (Shape{3, 2}));
    EXPECT_TRUE(bit_identical(out.to_host(), {10.0F, 20.0F, 1101.0F, 2202.0F, 0.0F, 0.0F}));
}

TEST(ScatterAddRows, AcceptsUpstreamWithLeadingDimensions) {
    // upstream [2,2,3] holds 4 rows of width 3.
    const Tensor upstream({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    const std::vector<std::size_t> indices = {4, 0, 4, 2};
    const Tensor out = tensor_ops::scatter_add_rows(upstream, indices, 5);
    EXPECT_EQ(out.shape(), (Shape{5, 3}));
    EXPECT_TRUE(bit_identical(out.to_host(), {4, 5, 6, 0, 0, 0, 10, 11, 12, 0, 0, 0, 8, 10, 12}));
}

TEST(ScatterAddRows, RankOneUpstreamIsOneRow) {
    const Tensor upstream({3}, {1.5F, -2.0F, 4.0F});
    const std::vector<std::size_t> indices = {1};
    const Tensor out = tensor_ops::scatter_add_rows(upstream, indices, 2);
    EXPECT_EQ(out.shape(), (Shape{2, 3}));
    EXPECT_TRUE(bit_identical(out.to_host(), {0.0F, 0.0F, 0.0F, 1.5F, -2.0F, 4.0F}));
}

TEST(ScatterAddRows, LeavesUpstreamUnchanged) {
    const Tensor upstream({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F});
    const std::vector<std::size_t> indices = {0, 0};
    const Tensor out = tensor_ops::scatter_add_rows(upstream, indices, 1);
    EXPECT_TRUE(bit_identical(out.to_host(), {4.0F, 6.0F}));
    EXPECT_TRUE(bit_identical(upstream.to_host(), {1.0F, 2.0F, 3.0F, 4.0F}));
}

TEST(ScatterAddRows, RejectsZeroRowCount) {
    const Tensor upstream({1, 2}, 1.0F);
    const std::vector<std::size_t> indices = {0};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, indices, 0)),
                 std::invalid_argument);
}

TEST(ScatterAddRows, RejectsUpstreamRowCountThatDiffersFromIndexCount) {
    const Tensor upstream({3, 2}, 1.0F);
    const std::vector<std::size_t> two = {0, 1};
    const std::vector<std::size_t> four = {0, 1, 1, 0};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, two, 2)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, four, 2)),
                 std::invalid_argument);
    const std::vector<std::size_t> none;
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, none, 2)),
                 std::invalid_argument);
}

TEST(ScatterAddRows, RejectsScalarUpstream) {
    const std::vector<std::size_t> indices = {0};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(Tensor::scalar(1.0F), indices, 1)),
                 std::invalid_argument);
}

TEST(ScatterAddRows, RejectsIndexAtOrBeyondRowCount) {
    const Tensor upstream({2, 2}, 1.0F);
    const std::vector<std::size_t> at_end = {0, 3};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, at_end, 3)),
                 std::out_of_range);
    const std::vector<std::size_t> largest_id = {uint32_max, 0};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, largest_id, 3)),
                 std::out_of_range);
}

TEST(ScatterAddRows, RejectsIndexAboveUint32RangeWithOverflowError) {
    const Tensor upstream({2, 2}, 1.0F);
    const std::vector<std::size_t> huge = {std::size_t{1} << 33U, 0};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, huge, 3)),
                 std::overflow_error);
    const std::vector<std::size_t> just_above = {0, uint32_max + 1};
    EXPECT_THROW(static_cast<void>(tensor_ops::scatter_add_rows(upstream, just_above, 3)),
                 std::overflow_error);
}

TEST(ScatterAddRows, LargeThreadedCaseMatchesSerialDoubleOracle) {
    const testing::ThreadCountGuard guard;
    set_cpu_thread_count(2);
    constexpr std::size_t rows = 300;
    constexpr std::size_t width = 64;
    constexpr std::size_t count = 50000;
    const std::vector<float> upstream = pseudo_random(count * width, -1.0F, 1.0F, 23U);
    const std::vector<std::size_t> indices = pseudo_random_indices(count, rows, 29U);
    const Tensor out =
        tensor_ops::scatter_add_rows(Tensor({count, width}, upstream), indices, rows);
    EXPECT_EQ(out.shape(), (Shape{rows, width}));
    // ~167 terms of size <= 1 per element: rounding stays far below 1e-4 (absolute floor for
    // sums that cancel to near 0).
    EXPECT_TRUE(all_close(out, scatter_add_oracle(upstream, indices, rows, width), 1e-4, 1e-4));
}

TEST(ScatterAddRows, ResultIsIndependentOfThreadCount) {
    // Every destination row is accumulated in index order whatever the thread count.
    const testing::ThreadCountGuard guard;
    constexpr std::size_t rows = 300;
    constexpr std::size_t width = 64;
    constexpr std::size_t count = 50000;
    const Tensor upstream({count, width}, pseudo_random(count * width, -1.0F, 1.0F, 31U));
    const std::vector<std::size_t> indices = pseudo_random_indices(count, rows, 37U);
    set_cpu_thread_count(1);
    const std::vector<float> serial =
        tensor_ops::scatter_add_rows(upstream, indices, rows).to_host();
    set_cpu_thread_count(2);
    const std::vector<float> two = tensor_ops::scatter_add_rows(upstream, indices, rows).to_host();
    set_cpu_thread_count(3);
    const std::vector<float> three =
        tensor_ops::scatter_add_rows(upstream, indices, rows).to_host();
    EXPECT_TRUE(bit_identical(serial, two));
    EXPECT_TRUE(bit_identical(serial, three));
}

TEST(ScatterAddRows, ThreadedCaseWithFewerRowsThanThreadsCoversEveryRow) {
    // Row bands computed from row_count · band / bands: with 1 destination row and 3 threads,
    // two bands are empty and the row must still get every contribution.
    const testing::ThreadCountGuard guard;
    set_cpu_thread_count(3);
    constexpr std::size_t count = 2048;
    constexpr std::size_t width = 64;
    const std::vector<float> upstream = pseudo_random(count * width, -1.0F, 1.0F, 41U);
    const std::vector<std::size_t> indices(count, 0);
    const Tensor out = tensor_ops::scatter_add_rows(Tensor({count, width}, upstream), indices, 1);
    EXPECT_TRUE(all_close(out, scatter_add_oracle(upstream, indices, 1, width), 1e-4, 1e-4));
}

// ---------------------------------------------------------------------------------------------
// Adjoint identity

TEST(Indexing, ScatterAddIsTheAdjointOfGather) {
    // <gather(T, idx), U> == <T, scatter_add(U, idx, R)> for every T, U.
    constexpr std::size_t rows = 7;
    constexpr std::size_t width = 5;
    const std::vector<std::size_t> indices = {3, 0, 6, 3, 3, 1, 6, 2, 0, 4, 3};
    const std::vector<float> table = pseudo_random(rows * width, -2.0F, 2.0F, 43U);
    const std::vector<float> upstream = pseudo_random(indices.size() * width, -2.0F, 2.0F, 47U);
    const std::vector<float> gathered =
        tensor_ops::gather_rows(Tensor({rows, width}, table), indices, {indices.size()}).to_host();
    const std::vector<float> scattered =
        tensor_ops::scatter_add_rows(Tensor({indices.size(), width}, upstream), indices, rows)
            .to_host();
    const double left = testing::inner_product(gathered, upstream);
    const double right = testing::inner_product(table, scattered);
    EXPECT_NEAR(left, right, 1e-5 * (1.0 + std::fabs(left)));
}

TEST(Indexing, ScatterAddIsTheAdjointOfGatherOnLargeThreadedCase) {
    const testing::ThreadCountGuard guard;
    set_cpu_thread_count(2);
    constexpr std::size_t rows = 300;
    constexpr std::size_t width = 64;
    constexpr std::size_t count = 50000;
    const std::vector<std::size_t> indices = pseudo_random_indices(count, rows, 53U);
    const std::vector<float> table = pseudo_random(rows * width, -1.0F, 1.0F, 59U);
    const std::vector<float> upstream = pseudo_random(count * width, -1.0F, 1.0F, 61U);
    const std::vector<float> gathered =
        tensor_ops::gather_rows(Tensor({rows, width}, table), indices, {count}).to_host();
    const std::vector<float> scattered =
        tensor_ops::scatter_add_rows(Tensor({count, width}, upstream), indices, rows).to_host();
    const double left = testing::inner_product(gathered, upstream);
    const double right = testing::inner_product(table, scattered);
    EXPECT_NEAR(left, right, 1e-4 * (1.0 + std::fabs(left)));
}

}  // namespace riftco_transformer
