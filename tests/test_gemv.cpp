// The few-row GEMV of the decode-shape projections (src/core/backend/cpu/gemv.hpp): every
// inner loop this processor runs, for every row count 1..8, against the portable blocked
// GEMM as the oracle, over k with vector tails and n with group remainders; the matmul
// capability routes exactly the decode shapes to it; results do not depend on the thread
// count.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/gemv.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "riftco_transformer/core/threading.hpp"

namespace riftco_transformer::detail {
namespace {

std::vector<float> random_values(std::size_t count, std::uint32_t seed) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
    std::vector<float> values(count);
    for (float& v : values) {
        v = uniform(generator);
    }
    return values;
}

GemmArguments arguments(std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b,
                        float* c) {
    GemmArguments g;
    g.transpose_a = false;
    g.transpose_b = true;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.lda = k;
    g.b = b;
    g.ldb = k;
    g.c = c;
    g.ldc = n;
    return g;
}

TEST(Gemv, EveryKernelMatchesTheBlockedGemm) {
    for (const GemvKernel kernel :
         {GemvKernel::Detected, GemvKernel::Portable, GemvKernel::Avx2, GemvKernel::Avx512}) {
        if (!gemv_kernel_supported(kernel)) {
            continue;
        }
        for (std::size_t m = 1; m <= gemv_max_rows; ++m) {
            for (const auto& [n, k] : {std::pair<std::size_t, std::size_t>{257, 777},
                                       {1027, 64},
                                       {66, 1000},
                                       {3, 32768}}) {
                const auto a = random_values(m * k, 1);
                const auto b = random_values(n * k, 2);
                std::vector<float> expected(m * n);
                std::vector<float> actual(m * n, NAN);
                const GemmArguments oracle =
                    arguments(m, n, k, a.data(), b.data(), expected.data());
                gemm_blocked(oracle);
                const GemmArguments g = arguments(m, n, k, a.data(), b.data(), actual.data());
                ASSERT_TRUE(gemv_applies(g));
                gemv_rows(g, kernel);
                for (std::size_t i = 0; i < expected.size(); ++i) {
                    ASSERT_NEAR(actual[i], expected[i], 2e-5 * std::sqrt(double(k)))
                        << "kernel " << static_cast<int>(kernel) << " m " << m << " n " << n
                        << " k " << k << " element " << i;
                }
            }
        }
    }
}

TEST(Gemv, OnlyDecodeShapesAreRouted) {
    std::vector<float> buffer(1);
    EXPECT_TRUE(gemv_applies(arguments(1, 4096, 768, buffer.data(), buffer.data(), buffer.data())));
    EXPECT_FALSE(
        gemv_applies(arguments(9, 4096, 768, buffer.data(), buffer.data(), buffer.data())));
    EXPECT_FALSE(gemv_applies(arguments(1, 16, 16, buffer.data(), buffer.data(), buffer.data())));
    GemmArguments no_transpose =
        arguments(1, 4096, 768, buffer.data(), buffer.data(), buffer.data());
    no_transpose.transpose_b = false;
    EXPECT_FALSE(gemv_applies(no_transpose));
}

TEST(Gemv, TheMatmulCapabilityAgreesAndIgnoresTheThreadCount) {
    const std::size_t n = 1500;
    const std::size_t k = 300;
    const Tensor weight({n, k}, random_values(n * k, 3));
    const Tensor x({3, k}, random_values(3 * k, 4));
    const std::size_t threads = cpu_thread_count();
    set_cpu_thread_count(1);
    const std::vector<float> one = tensor_ops::matmul(x, weight, false, true).to_host();
    set_cpu_thread_count(2);
    const std::vector<float> two = tensor_ops::matmul(x, weight, false, true).to_host();
    set_cpu_thread_count(threads);
    EXPECT_EQ(one, two);
    // Against x·(Wᵀ materialised) through the ordinary GEMM path.
    const std::vector<float> reference =
        tensor_ops::matmul(x, tensor_ops::transpose_2d(weight)).to_host();
    for (std::size_t i = 0; i < one.size(); ++i) {
        EXPECT_NEAR(one[i], reference[i], 1e-4) << i;
    }
}

// Several products in one pass give every output exactly gemv_rows' value, whatever the
// thread count, including problems with remainder rows and more problems than the pass keeps
// inline.
TEST(Gemv, ManyProblemsInOnePassEqualOneAtATimeBitForBit) {
    const std::size_t k = 576;
    const std::vector<std::size_t> widths = {576, 193, 192, 1537, 120, 130};
    for (std::size_t m : {std::size_t{1}, std::size_t{3}, std::size_t{8}}) {
        const auto a = random_values(m * k, 7);
        std::vector<std::vector<float>> weights;
        std::vector<std::vector<float>> single;
        std::vector<std::vector<float>> fused;
        std::vector<GemmArguments> problems;
        for (std::size_t i = 0; i < widths.size(); ++i) {
            weights.push_back(random_values(widths[i] * k, 10 + static_cast<std::uint32_t>(i)));
            single.emplace_back(m * widths[i], NAN);
            fused.emplace_back(m * widths[i], NAN);
        }
        for (std::size_t i = 0; i < widths.size(); ++i) {
            const GemmArguments g =
                arguments(m, widths[i], k, a.data(), weights[i].data(), single[i].data());
            ASSERT_TRUE(gemv_applies(g));
            gemv_rows(g);
            // gemv_rows is the one-problem pass itself: pin it to the blocked GEMM's values.
            std::vector<float> oracle(m * widths[i]);
            gemm_blocked(arguments(m, widths[i], k, a.data(), weights[i].data(), oracle.data()));
            for (std::size_t j = 0; j < oracle.size(); ++j)
                ASSERT_NEAR(single[i][j], oracle[j], 2e-5 * std::sqrt(double(k)))
                    << "m " << m << " problem " << i << " element " << j;
            problems.push_back(
                arguments(m, widths[i], k, a.data(), weights[i].data(), fused[i].data()));
        }
        const std::size_t threads = cpu_thread_count();
        for (const std::size_t count : {std::size_t{1}, std::size_t{2}}) {
            set_cpu_thread_count(count);
            for (auto& out : fused)
                std::fill(out.begin(), out.end(), NAN);
            gemv_rows_many(problems);
            for (std::size_t i = 0; i < widths.size(); ++i)
                EXPECT_EQ(fused[i], single[i]) << "m " << m << " problem " << i;
            // The first three alone: the inline (no heap) case.
            gemv_rows_many(std::span<const GemmArguments>(problems.data(), 3));
            for (std::size_t i = 0; i < 3; ++i)
                EXPECT_EQ(fused[i], single[i]) << "m " << m << " problem " << i;
        }
        set_cpu_thread_count(threads);
    }
}

TEST(Gemv, ProjectManyEqualsEachMatmulAndNamesABadWeight) {
    const std::size_t k = 300;
    const Tensor x({2, k}, random_values(2 * k, 20));
    const std::vector<Tensor> weights = {Tensor({700, k}, random_values(700 * k, 21)),
                                         Tensor({230, k}, random_values(230 * k, 22))};
    const std::vector<Tensor> outs = tensor_ops::project_many(x, weights);
    ASSERT_EQ(outs.size(), 2U);
    for (std::size_t i = 0; i < weights.size(); ++i) {
        EXPECT_EQ(outs[i].shape(), (Shape{2, weights[i].shape()[0]}));
        EXPECT_EQ(outs[i].to_host(), tensor_ops::matmul(x, weights[i], false, true).to_host());
    }
    // Forty rows: past the GEMV's row limit, one product after the other, the same values.
    const Tensor tall({40, k}, random_values(40 * k, 23));
    const std::vector<Tensor> tall_outs = tensor_ops::project_many(tall, weights);
    EXPECT_EQ(tall_outs[1].to_host(), tensor_ops::matmul(tall, weights[1], false, true).to_host());
    const std::vector<Tensor> bad = {weights[0], Tensor({5, k + 1})};
    try {
        (void)tensor_ops::project_many(x, bad);
        ADD_FAILURE() << "accepted a weight of the wrong width";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("project_many: weights[1] must be [N,300]"),
                  std::string::npos)
            << error.what();
    }
    EXPECT_THROW((void)tensor_ops::project_many(x, std::span<const Tensor>()),
                 std::invalid_argument);
    EXPECT_THROW((void)tensor_ops::project_many(Tensor({2, 3, k}), weights), std::invalid_argument);
}

TEST(Gemv, FewDozenRowProductsTakeTheFlippedPathAndMatchTheOracle) {
    // m in (8, 256]: the matmul capability computes (B·Aᵀ)ᵀ (see matmul.cpp); both the
    // threaded tile transposes and the GEMM must land every element where it belongs.
    for (const auto& [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{9, 700, 513},
                                  {64, 1030, 300},
                                  {128, 257, 1100},
                                  {200, 300, 3000}}) {
        const auto a = random_values(m * k, 5);
        const auto b = random_values(n * k, 6);
        std::vector<float> expected(m * n);
        gemm_blocked(arguments(m, n, k, a.data(), b.data(), expected.data()));
        // Rank 3 with a batch of 1 (the path only needs one product, whatever the rank).
        const std::vector<float> actual =
            tensor_ops::matmul(Tensor({1, m, k}, a), Tensor({1, n, k}, b), false, true).to_host();
        ASSERT_EQ(actual.size(), expected.size());
        for (std::size_t i = 0; i < expected.size(); ++i) {
            ASSERT_NEAR(actual[i], expected[i], 2e-5 * std::sqrt(double(k)))
                << "m " << m << " n " << n << " k " << k << " element " << i;
        }
    }
}

}  // namespace
}  // namespace riftco_transformer::detail
