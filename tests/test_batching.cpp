// Next-token windows and batch sources (docs/ARCHITECTURE.md, 'Training windows').
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "riftco_transformer/data/batching.hpp"

namespace riftco_transformer {

TEST(Batching, TargetsAreInputsShiftedByOneInsideTheSequence) {
    std::vector<std::uint32_t> tokens(50);
    for (std::uint32_t i = 0; i < 50; ++i)
        tokens[i] = 100 + i;
    WindowBatchSource source(tokens, 8, 5, 1);
    EXPECT_EQ(source.window_count(), 45U);
    for (int repeat = 0; repeat < 20; ++repeat) {
        const TrainingBatch batch = source.next();
        ASSERT_EQ(batch.inputs.size(), 40U);
        for (std::size_t row = 0; row < 8; ++row) {
            const std::uint32_t first = batch.inputs[row * 5];
            EXPECT_GE(first, 100U);
            EXPECT_LE(first, 144U);  // starts 0..N-T-1 = 0..44
            for (std::size_t t = 0; t < 5; ++t) {
                EXPECT_EQ(batch.inputs[row * 5 + t], first + t);
                EXPECT_EQ(batch.targets[row * 5 + t], first + t + 1);
            }
        }
    }
}

TEST(Batching, SameSeedGivesTheSameBatchesAndDifferentSeedsDiffer) {
    std::vector<std::uint32_t> tokens(1000);
    for (std::uint32_t i = 0; i < 1000; ++i)
        tokens[i] = i;
    WindowBatchSource a(tokens, 4, 16, 99);
    WindowBatchSource b(tokens, 4, 16, 99);
    WindowBatchSource c(tokens, 4, 16, 100);
    bool any_difference = false;
    for (int i = 0; i < 10; ++i) {
        const TrainingBatch x = a.next();
        EXPECT_EQ(x.inputs, b.next().inputs);
        any_difference = any_difference || x.inputs != c.next().inputs;
    }
    EXPECT_TRUE(any_difference);
    EXPECT_EQ(a.batches_emitted(), 10U);
}

TEST(Batching, ExactlyContextPlusOneTokensGiveOneWindowSampledRepeatedly) {
    WindowBatchSource source(std::vector<std::uint32_t>{1, 2, 3, 4}, 6, 3, 5);
    const TrainingBatch batch = source.next();
    for (std::size_t row = 0; row < 6; ++row) {
        EXPECT_EQ(batch.inputs[row * 3], 1U);
        EXPECT_EQ(batch.targets[row * 3 + 2], 4U);
    }
}

TEST(Batching, RejectsTooShortInputsAndZeroSizes) {
    EXPECT_THROW(WindowBatchSource(std::vector<std::uint32_t>{1, 2, 3}, 2, 3, 0),
                 std::invalid_argument);
    EXPECT_THROW(WindowBatchSource(std::vector<std::uint32_t>{1, 2, 3, 4}, 0, 3, 0),
                 std::invalid_argument);
    EXPECT_THROW(WindowBatchSource(std::vector<std::uint32_t>{1, 2, 3, 4}, 2, 0, 0),
                 std::invalid_argument);
    EXPECT_THROW(WindowBatchSource({{1, 2}, {3}}, 2, 3, 0, WindowSampling::WindowUniform),
                 std::invalid_argument);
    EXPECT_THROW(WindowBatchSource({{1, 2, 3, 4}}, 2, 3, 0, static_cast<WindowSampling>(7)),
                 std::invalid_argument);
}

TEST(Batching, WindowsNeverCrossSequencesAndShortSequencesAreDropped) {
    const std::vector<std::vector<std::uint32_t>> sequences = {
        {10, 11, 12, 13, 14}, {20, 21}, {30, 31, 32, 33}};
    WindowBatchSource source(sequences, 64, 3, 3);
    EXPECT_EQ(source.window_count(), 2U + 1U);
    const TrainingBatch batch = source.next();
    for (std::size_t row = 0; row < 64; ++row) {
        const std::uint32_t first = batch.inputs[row * 3];
        EXPECT_TRUE(first == 10 || first == 11 || first == 30) << first;
        EXPECT_EQ(batch.targets[row * 3 + 2] / 10, first / 10);  // same sequence
    }
}

TEST(Batching, WindowUniformWeighsLongSequencesMoreThanExampleUniform) {
    // One long sequence (101 windows) and one short (1 window).
    std::vector<std::uint32_t> long_sequence(104);
    for (std::uint32_t i = 0; i < 104; ++i)
        long_sequence[i] = i;
    const std::vector<std::vector<std::uint32_t>> sequences = {long_sequence,
                                                               {1000, 1001, 1002, 1003}};
    const auto short_share = [&](WindowSampling sampling) {
        WindowBatchSource source(sequences, 1000, 3, 17, sampling);
        const TrainingBatch batch = source.next();
        std::size_t short_rows = 0;
        for (std::size_t row = 0; row < 1000; ++row)
            short_rows += batch.inputs[row * 3] >= 1000 ? 1 : 0;
        return static_cast<double>(short_rows) / 1000.0;
    };
    EXPECT_LT(short_share(WindowSampling::WindowUniform), 0.05);   // expected 1/102
    EXPECT_GT(short_share(WindowSampling::ExampleUniform), 0.40);  // expected 1/2
}

TEST(Batching, UniformIndexIsUnbiasedAndInRange) {
    std::mt19937_64 generator(123);
    std::map<std::uint64_t, int> counts;
    for (int i = 0; i < 60000; ++i)
        ++counts[uniform_index(generator, 6)];
    EXPECT_EQ(counts.size(), 6U);
    for (const auto& [value, count] : counts) {
        EXPECT_LT(value, 6U);
        EXPECT_NEAR(count, 10000, 500);
    }
    EXPECT_THROW(static_cast<void>(uniform_index(generator, 0)), std::invalid_argument);
}

TEST(Batching, FixedBatchesMaterialiseADeterministicSet) {
    std::vector<std::uint32_t> tokens(200);
    for (std::uint32_t i = 0; i < 200; ++i)
        tokens[i] = i;
    WindowBatchSource first(tokens, 3, 8, 7);
    WindowBatchSource second(tokens, 3, 8, 7);
    const auto a = fixed_batches(first, 4);
    const auto b = fixed_batches(second, 4);
    ASSERT_EQ(a.size(), 4U);
    for (std::size_t i = 0; i < 4; ++i)
        EXPECT_EQ(a[i].inputs, b[i].inputs);
}

}  // namespace riftco_transformer
