// Causal attention: materialized vs flash vs an independent double oracle; causality; errors.
#include <gtest/gtest.h>

#include <cmath>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "support/attention_reference.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

// Straightforward double-precision causal attention: O = softmax(mask(QKᵀ/√d))·V.
std::vector<double> oracle_attention(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, std::size_t items,
                                     std::size_t time, std::size_t width) {
    std::vector<double> out(items * time * width, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(width));
    for (std::size_t item = 0; item < items; ++item) {
        const std::size_t base = item * time * width;
        for (std::size_t i = 0; i < time; ++i) {
            std::vector<double> weights(i + 1);
            double max = -INFINITY;
            for (std::size_t j = 0; j <= i; ++j) {
                double dot = 0.0;
                for (std::size_t d = 0; d < width; ++d)
                    dot += static_cast<double>(q[base + i * width + d]) * k[base + j * width + d];
                weights[j] = dot * scale;
                max = std::max(max, weights[j]);
            }
            double total = 0.0;
            for (double& w : weights)
                total += (w = std::exp(w - max));
            for (std::size_t j = 0; j <= i; ++j) {
                for (std::size_t d = 0; d < width; ++d)
                    out[base + i * width + d] += weights[j] / total * v[base + j * width + d];
            }
        }
    }
    return out;
}

struct Inputs {
    std::vector<float> q, k, v;
    Shape shape;
};

Inputs make_inputs(std::size_t batch, std::size_t heads, std::size_t time, std::size_t width,
                   std::uint32_t seed) {
    const std::size_t count = batch * heads * time * width;
    return {testing::pseudo_random(count, -1.5F, 1.5F, seed),
            testing::pseudo_random(count, -1.5F, 1.5F, seed + 1),
            testing::pseudo_random(count, -1.0F, 1.0F, seed + 2), Shape{batch, heads, time, width}};
}

}  // namespace

TEST(Attention, BothKindsMatchTheDoubleOracleAcrossTileBoundaries) {
    for (const std::size_t time : {1U, 7U, 64U, 65U, 150U}) {
        const Inputs in = make_inputs(2, 3, time, 16, static_cast<std::uint32_t>(time));
        const Variable q(Tensor(in.shape, in.q)), k(Tensor(in.shape, in.k)),
            v(Tensor(in.shape, in.v));
        const std::vector<double> expected = oracle_attention(in.q, in.k, in.v, 6, time, 16);
        EXPECT_TRUE(testing::all_close(
            causal_attention(q, k, v, AttentionKind::Materialized).value(), expected, 1e-5, 1e-5))
            << time;
        EXPECT_TRUE(testing::all_close(causal_attention(q, k, v, AttentionKind::Flash).value(),
                                       expected, 1e-5, 1e-5))
            << time;
    }
}

TEST(Attention, FlashEqualsMaterializedWithinContractTolerancesForwardAndBackward) {
    const Inputs in = make_inputs(2, 2, 130, 32, 77);
    const std::vector<float> weights = testing::pseudo_random(in.q.size(), -1.0F, 1.0F, 99);
    std::vector<std::vector<float>> gradients[2];
    std::vector<float> outputs[2];
    for (int kind = 0; kind < 2; ++kind) {
        Variable q(Tensor(in.shape, in.q)), k(Tensor(in.shape, in.k)), v(Tensor(in.shape, in.v));
        const Variable out = causal_attention(q, k, v, static_cast<AttentionKind>(kind));
        outputs[kind] = out.value().to_host();
        sum(out * Variable(Tensor(in.shape, weights), false)).backward();
        gradients[kind] = {q.gradient().to_host(), k.gradient().to_host(), v.gradient().to_host()};
    }
    EXPECT_TRUE(testing::all_close(outputs[1], testing::to_double(outputs[0]), 3e-5, 0.0));
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(
            testing::all_close(gradients[1][i], testing::to_double(gradients[0][i]), 5e-5, 0.0))
            << i;
    }
}

TEST(Attention, FlashGradientsMatchFiniteDifferences) {
    const Inputs in = make_inputs(1, 1, 5, 4, 3);
    const std::vector<float> weights = testing::pseudo_random(in.q.size(), -1.0F, 1.0F, 8);
    Variable q(Tensor(in.shape, in.q)), k(Tensor(in.shape, in.k)), v(Tensor(in.shape, in.v));
    sum(flash_causal_attention(q, k, v) * Variable(Tensor(in.shape, weights), false)).backward();
    const auto objective = [&](int which) {
        return [&, which](const std::vector<float>& values) {
            const std::vector<float>& qq = which == 0 ? values : in.q;
            const std::vector<float>& kk = which == 1 ? values : in.k;
            const std::vector<float>& vv = which == 2 ? values : in.v;
            const std::vector<double> out = oracle_attention(qq, kk, vv, 1, 5, 4);
            double total = 0.0;
            for (std::size_t i = 0; i < out.size(); ++i)
                total += out[i] * weights[i];
            return total;
        };
    };
    EXPECT_TRUE(testing::all_close(
        q.gradient(), testing::finite_difference_gradient(objective(0), in.q, 1e-3), 2e-3, 0.0));
    EXPECT_TRUE(testing::all_close(
        k.gradient(), testing::finite_difference_gradient(objective(1), in.k, 1e-3), 2e-3, 0.0));
    EXPECT_TRUE(testing::all_close(
        v.gradient(), testing::finite_difference_gradient(objective(2), in.v, 1e-3), 2e-3, 0.0));
}

TEST(Attention, FlashKeepsNoQuadraticBuffer) {
    // T = 1024, one head of width 16: a [T,T] float buffer would be 4 MiB; Q, K, V and the
    // context are 64 KiB each.
    const Inputs in = make_inputs(1, 1, 1024, 16, 5);
    Variable q(Tensor(in.shape, in.q)), k(Tensor(in.shape, in.k)), v(Tensor(in.shape, in.v));
    reset_cpu_peak_memory();
    const std::size_t before = cpu_memory_statistics().live_bytes;
    Variable out = flash_causal_attention(q, k, v);
    sum(out).backward();
    const std::size_t peak_extra = cpu_memory_statistics().peak_live_bytes - before;
    EXPECT_LT(peak_extra, std::size_t{1} << 20U) << peak_extra;
}

TEST(Attention, ValidationIsSharedByBothKinds) {
    const Variable q(Tensor({1, 1, 4, 2}, 0.5F)), k(Tensor({1, 1, 4, 3}, 0.5F)),
        v(Tensor({1, 1, 4, 2}, 0.5F));
    for (const auto kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        EXPECT_THROW(static_cast<void>(causal_attention(q, k, v, kind)), std::invalid_argument);
        const Variable flat(Tensor({4, 2}, 0.5F));
        EXPECT_THROW(static_cast<void>(causal_attention(flat, flat, flat, kind)),
                     std::invalid_argument);
        Tensor bad({1, 1, 4, 2}, 0.5F);
        bad.set_flat(0, NAN);
        const Variable nan_query(bad);
        EXPECT_THROW(
            static_cast<void>(causal_attention(nan_query, Variable(bad), Variable(bad), kind)),
            std::domain_error);
    }
    EXPECT_THROW(static_cast<void>(causal_attention(q, q, q, static_cast<AttentionKind>(9))),
                 std::invalid_argument);
}

TEST(Attention, ProbabilitiesUpstreamReachesOnlyQueryAndKey) {
    const Inputs in = make_inputs(1, 2, 6, 4, 21);
    Variable q(Tensor(in.shape, in.q)), k(Tensor(in.shape, in.k)), v(Tensor(in.shape, in.v));
    const AttentionOutputs outputs = causal_scaled_dot_product_attention(q, k, v);
    sum(outputs.probabilities *
        Variable(Tensor(outputs.probabilities.shape(), testing::pseudo_random(72, -1.0F, 1.0F, 4)),
                 false))
        .backward();
    EXPECT_TRUE(q.has_gradient());
    EXPECT_TRUE(k.has_gradient());
    EXPECT_FALSE(v.has_gradient());
}

}  // namespace riftco_transformer

namespace riftco_transformer {

TEST(FlashAttention, FastTilesMatchTheReadableTile8ReferenceForwardAndBackward) {
    for (const std::size_t time : {1U, 8U, 9U, 63U, 64U, 65U, 129U}) {
        const std::size_t items = 3;
        const std::size_t width = 8;
        const Inputs in =
            make_inputs(1, items, time, width, static_cast<std::uint32_t>(time) + 40U);
        const Tensor q(in.shape, in.q), k(in.shape, in.k), v(in.shape, in.v);
        const tensor_ops::FlashAttentionResult fast = tensor_ops::flash_attention(q, k, v);
        const std::vector<float> g = testing::pseudo_random(in.q.size(), -1.0F, 1.0F, 3U);
        const tensor_ops::FlashAttentionGradients fast_gradients =
            tensor_ops::flash_attention_backward(q, k, v, fast, Tensor(in.shape, g));

        const float scale = 1.0F / std::sqrt(static_cast<float>(width));
        std::vector<float> context(in.q.size()), row_max(items * time), row_sum(items * time);
        detail::flash_attention_reference_forward(in.q.data(), in.k.data(), in.v.data(), items,
                                                  time, width, scale, context.data(),
                                                  row_max.data(), row_sum.data());
        std::vector<float> dq(in.q.size()), dk(in.q.size()), dv(in.q.size());
        detail::flash_attention_reference_backward(
            in.q.data(), in.k.data(), in.v.data(), context.data(), row_max.data(), row_sum.data(),
            g.data(), items, time, width, scale, dq.data(), dk.data(), dv.data());
        EXPECT_TRUE(testing::all_close(fast.context, testing::to_double(context), 1e-5, 1e-5))
            << time;
        EXPECT_TRUE(testing::all_close(fast.row_max, testing::to_double(row_max), 1e-5, 1e-5))
            << time;
        EXPECT_TRUE(testing::all_close(fast.row_sum, testing::to_double(row_sum), 1e-5, 1e-5))
            << time;
        EXPECT_TRUE(testing::all_close(fast_gradients.query, testing::to_double(dq), 2e-5, 1e-4))
            << time;
        EXPECT_TRUE(testing::all_close(fast_gradients.key, testing::to_double(dk), 2e-5, 1e-4))
            << time;
        EXPECT_TRUE(testing::all_close(fast_gradients.value, testing::to_double(dv), 2e-5, 1e-4))
            << time;
        // The reference itself against the straightforward double oracle.
        EXPECT_TRUE(testing::all_close(
            context, oracle_attention(in.q, in.k, in.v, items, time, width), 1e-6, 1e-5));
    }
}

}  // namespace riftco_transformer
