// Flash attention with grouped-query heads (K, V [B,Hkv,T,d], Hq % Hkv == 0, never repeated)
// and a sliding window W (query t sees keys max(0, t−W+1)..t): forward and all three
// gradients against a double-precision loop reference, gradients by centred finite
// differences, bit-exact causality, the input rules, and no [T,T] buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "riftco_transformer/nn/grouped_query_attention.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using tensor_ops::FlashAttentionOptions;

struct Problem {
    std::size_t batch;
    std::size_t query_heads;      // Hq
    std::size_t key_value_heads;  // Hkv
    std::size_t time;             // T
    std::size_t width;            // d
    std::size_t window;           // W, 0: dense causal

    [[nodiscard]] Shape query_shape() const { return {batch, query_heads, time, width}; }
    [[nodiscard]] Shape key_shape() const { return {batch, key_value_heads, time, width}; }
    [[nodiscard]] std::size_t query_count() const { return batch * query_heads * time * width; }
    [[nodiscard]] std::size_t key_count() const { return batch * key_value_heads * time * width; }
};

struct Inputs {
    std::vector<float> q, k, v, upstream;
};

Inputs make_inputs(const Problem& p, std::uint32_t seed) {
    return {testing::pseudo_random(p.query_count(), -1.5F, 1.5F, seed),
            testing::pseudo_random(p.key_count(), -1.5F, 1.5F, seed + 1),
            testing::pseudo_random(p.key_count(), -1.0F, 1.0F, seed + 2),
            testing::pseudo_random(p.query_count(), -1.0F, 1.0F, seed + 3)};
}

struct Reference {
    std::vector<double> context, query_gradient, key_gradient, value_gradient;
};

// Straightforward double-precision attention, written from the definition: for query head h
// of batch b, key/value head h/(Hq/Hkv); P = softmax over the visible keys of
// S = QKᵀ/√d; O = PV; and, for the upstream G: dV_j = Σ_t P_tj·G_t; dP_tj = G_t·V_j;
// dS = P ⊙ (dP − rowsum(P ⊙ dP)); dQ_t = Σ_j dS_tj·K_j/√d; dK_j = Σ_t dS_tj·Q_t/√d.
// Under a soft cap c > 0 (Gemma 2) the scores are c·tanh(s/c) and dS is multiplied by the
// cap's derivative 1 − tanh²(s/c), written here from the chain rule.
Reference reference_attention(const Problem& p, const Inputs& in, double softcap = 0.0) {
    const std::size_t T = p.time;
    const std::size_t d = p.width;
    const std::size_t group = p.query_heads / p.key_value_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    Reference out{std::vector<double>(p.query_count(), 0.0),
                  std::vector<double>(p.query_count(), 0.0),
                  std::vector<double>(p.key_count(), 0.0), std::vector<double>(p.key_count(), 0.0)};
    for (std::size_t b = 0; b < p.batch; ++b) {
        for (std::size_t h = 0; h < p.query_heads; ++h) {
            const std::size_t qbase = (b * p.query_heads + h) * T * d;
            const std::size_t kbase = (b * p.key_value_heads + h / group) * T * d;
            for (std::size_t t = 0; t < T; ++t) {
                const std::size_t first = p.window == 0 || t < p.window ? 0 : t + 1 - p.window;
                const std::size_t count = t + 1 - first;
                std::vector<double> probability(count);
                std::vector<double> cap_slope(count, 1.0);
                double max = -std::numeric_limits<double>::infinity();
                for (std::size_t j = first; j <= t; ++j) {
                    double dot = 0.0;
                    for (std::size_t i = 0; i < d; ++i)
                        dot +=
                            static_cast<double>(in.q[qbase + t * d + i]) * in.k[kbase + j * d + i];
                    double score = dot * scale;
                    if (softcap > 0.0) {
                        const double tanh_value = std::tanh(score / softcap);
                        score = softcap * tanh_value;
                        cap_slope[j - first] = 1.0 - tanh_value * tanh_value;
                    }
                    probability[j - first] = score;
                    max = std::max(max, score);
                }
                double total = 0.0;
                for (double& value : probability)
                    total += (value = std::exp(value - max));
                for (double& value : probability)
                    value /= total;
                std::vector<double> d_probability(count, 0.0);
                double row_dot = 0.0;
                for (std::size_t j = first; j <= t; ++j) {
                    const double pj = probability[j - first];
                    double dp = 0.0;
                    for (std::size_t i = 0; i < d; ++i) {
                        const double g = in.upstream[qbase + t * d + i];
                        out.context[qbase + t * d + i] += pj * in.v[kbase + j * d + i];
                        out.value_gradient[kbase + j * d + i] += pj * g;
                        dp += g * in.v[kbase + j * d + i];
                    }
                    d_probability[j - first] = dp;
                    row_dot += pj * dp;
                }
                for (std::size_t j = first; j <= t; ++j) {
                    const double ds = probability[j - first] *
                                      (d_probability[j - first] - row_dot) * scale *
                                      cap_slope[j - first];
                    for (std::size_t i = 0; i < d; ++i) {
                        out.query_gradient[qbase + t * d + i] += ds * in.k[kbase + j * d + i];
                        out.key_gradient[kbase + j * d + i] += ds * in.q[qbase + t * d + i];
                    }
                }
            }
        }
    }
    return out;
}

std::string describe(const Problem& p) {
    return "B=" + std::to_string(p.batch) + " Hq=" + std::to_string(p.query_heads) +
           " Hkv=" + std::to_string(p.key_value_heads) + " T=" + std::to_string(p.time) +
           " d=" + std::to_string(p.width) + " W=" + std::to_string(p.window);
}

// Every GQA ratio × window of the contract, at a T that spans three tiles of 64 (the last
// one partial), so that key tiles before the window are skipped and partial tiles masked.
std::vector<Problem> contract_problems() {
    std::vector<Problem> problems;
    for (const std::size_t kv_heads : {std::size_t{2}, std::size_t{1}, std::size_t{6}}) {
        for (const std::size_t window : {std::size_t{0}, std::size_t{1}, std::size_t{3},
                                         std::size_t{70}, std::size_t{150}, std::size_t{500}}) {
            problems.push_back({2, 6, kv_heads, 150, 16, window});
        }
    }
    problems.push_back({1, 6, 2, 5, 8, 3});  // a single partial tile
    return problems;
}

}  // namespace

TEST(FlashGroupedWindowedAttention, ForwardAndAllGradientsMatchTheDoubleReference) {
    std::uint32_t seed = 100;
    for (const Problem& p : contract_problems()) {
        SCOPED_TRACE(describe(p));
        const Inputs in = make_inputs(p, seed += 7);
        const Tensor q(p.query_shape(), in.q), k(p.key_shape(), in.k), v(p.key_shape(), in.v);
        const tensor_ops::FlashAttentionResult forward =
            tensor_ops::flash_attention(q, k, v, {.window = p.window});
        const tensor_ops::FlashAttentionGradients gradients = tensor_ops::flash_attention_backward(
            q, k, v, forward, Tensor(p.query_shape(), in.upstream));
        const Reference expected = reference_attention(p, in);
        EXPECT_EQ(forward.row_max.shape(), (Shape{p.batch, p.query_heads, p.time}));
        EXPECT_EQ(forward.row_sum.shape(), (Shape{p.batch, p.query_heads, p.time}));
        EXPECT_EQ(gradients.key.shape(), p.key_shape());
        EXPECT_EQ(gradients.value.shape(), p.key_shape());
        EXPECT_TRUE(testing::all_close(forward.context, expected.context, 3e-5, 0.0));
        EXPECT_TRUE(testing::all_close(gradients.query, expected.query_gradient, 5e-5, 0.0));
        EXPECT_TRUE(testing::all_close(gradients.key, expected.key_gradient, 5e-5, 0.0));
        EXPECT_TRUE(testing::all_close(gradients.value, expected.value_gradient, 5e-5, 0.0));
    }
}

TEST(FlashGroupedWindowedAttention, AutogradGradientsHaveTheKeyValueShapeAndMatchTheReference) {
    const Problem p{2, 6, 2, 150, 16, 40};
    const Inputs in = make_inputs(p, 11);
    Variable q(Tensor(p.query_shape(), in.q)), k(Tensor(p.key_shape(), in.k)),
        v(Tensor(p.key_shape(), in.v));
    const Variable context = flash_attention(q, k, v, {.window = p.window});
    ASSERT_EQ(context.shape(), p.query_shape());
    sum(context * Variable(Tensor(p.query_shape(), in.upstream), false)).backward();
    const Reference expected = reference_attention(p, in);
    EXPECT_TRUE(testing::all_close(context.value(), expected.context, 3e-5, 0.0));
    ASSERT_EQ(k.gradient().shape(), p.key_shape());
    ASSERT_EQ(v.gradient().shape(), p.key_shape());
    EXPECT_TRUE(testing::all_close(q.gradient(), expected.query_gradient, 5e-5, 0.0));
    EXPECT_TRUE(testing::all_close(k.gradient(), expected.key_gradient, 5e-5, 0.0));
    EXPECT_TRUE(testing::all_close(v.gradient(), expected.value_gradient, 5e-5, 0.0));
}

// Without and with Gemma 2's soft cap (0.8, far from the identity on these scores).
TEST(FlashGroupedWindowedAttention, GradientsMatchCentredFiniteDifferencesOfTheFlashForward) {
    const Problem p{1, 4, 2, 7, 4, 3};
    for (const float cap : {0.0F, 0.8F}) {
        SCOPED_TRACE("cap " + std::to_string(cap));
        const Inputs in = make_inputs(p, cap == 0.0F ? 31 : 61);
        const FlashAttentionOptions options{.window = p.window, .softcap = cap};
        Variable q(Tensor(p.query_shape(), in.q)), k(Tensor(p.key_shape(), in.k)),
            v(Tensor(p.key_shape(), in.v));
        sum(flash_attention(q, k, v, options) *
            Variable(Tensor(p.query_shape(), in.upstream), false))
            .backward();
        // objective(x) = Σ flash(Q, K, V)·G with one of Q, K, V replaced by x (float forward).
        const auto objective = [&](int which) {
            return [&, which](const std::vector<float>& values) {
                const Tensor qq(p.query_shape(), which == 0 ? values : in.q);
                const Tensor kk(p.key_shape(), which == 1 ? values : in.k);
                const Tensor vv(p.key_shape(), which == 2 ? values : in.v);
                const std::vector<float> out =
                    tensor_ops::flash_attention(qq, kk, vv, options).context.to_host();
                return testing::inner_product(out, in.upstream);
            };
        };
        EXPECT_TRUE(testing::all_close(
            q.gradient(), testing::finite_difference_gradient(objective(0), in.q, 1e-2), 5e-3,
            0.0));
        EXPECT_TRUE(testing::all_close(
            k.gradient(), testing::finite_difference_gradient(objective(1), in.k, 1e-2), 5e-3,
            0.0));
        EXPECT_TRUE(testing::all_close(
            v.gradient(), testing::finite_difference_gradient(objective(2), in.v, 1e-2), 5e-3,
            0.0));
    }
}

TEST(FlashGroupedWindowedAttention, GradientsAreBitIdenticalWhateverTheThreadCount) {
    // One thread: one work item per (batch, key/value head). More threads than groups: one
    // item per query head and a reduction of the shares. Both add the shares in head order.
    const testing::ThreadCountGuard guard;
    for (const std::size_t kv_heads : {std::size_t{2}, std::size_t{1}}) {
        const Problem p{1, 6, kv_heads, 150, 16, 40};
        SCOPED_TRACE(describe(p));
        const Inputs in = make_inputs(p, 21);
        const Tensor q(p.query_shape(), in.q), k(p.key_shape(), in.k), v(p.key_shape(), in.v);
        const auto gradients_with = [&](std::size_t threads) {
            set_cpu_thread_count(threads);
            const auto forward = tensor_ops::flash_attention(q, k, v, {.window = p.window});
            return tensor_ops::flash_attention_backward(q, k, v, forward,
                                                        Tensor(p.query_shape(), in.upstream));
        };
        const tensor_ops::FlashAttentionGradients one = gradients_with(1);
        for (const std::size_t threads : {std::size_t{2}, std::size_t{3}, std::size_t{8}}) {
            SCOPED_TRACE("threads " + std::to_string(threads));
            const tensor_ops::FlashAttentionGradients many = gradients_with(threads);
            EXPECT_TRUE(testing::bit_identical(many.query.to_host(), one.query.to_host()));
            EXPECT_TRUE(testing::bit_identical(many.key.to_host(), one.key.to_host()));
            EXPECT_TRUE(testing::bit_identical(many.value.to_host(), one.value.to_host()));
        }
    }
}

TEST(FlashGroupedWindowedAttention, LaterTokensLeaveEarlierRowsBitIdentical) {
    for (const std::size_t window : {std::size_t{0}, std::size_t{3}, std::size_t{70}}) {
        const Problem p{1, 6, 2, 150, 16, window};
        SCOPED_TRACE(describe(p));
        const Inputs in = make_inputs(p, 41);
        Inputs changed = in;
        const std::size_t first_changed = 100;  // inside the middle tile (64..127)
        const Inputs noise = make_inputs(p, 97);
        for (std::size_t head = 0; head < p.query_heads; ++head) {
            for (std::size_t i = (head * p.time + first_changed) * p.width;
                 i < (head + 1) * p.time * p.width; ++i)
                changed.q[i] = noise.q[i];
        }
        for (std::size_t head = 0; head < p.key_value_heads; ++head) {
            for (std::size_t i = (head * p.time + first_changed) * p.width;
                 i < (head + 1) * p.time * p.width; ++i) {
                changed.k[i] = noise.k[i];
                changed.v[i] = noise.v[i];
            }
        }
        const auto run = [&](const Inputs& x) {
            return tensor_ops::flash_attention(Tensor(p.query_shape(), x.q),
                                               Tensor(p.key_shape(), x.k),
                                               Tensor(p.key_shape(), x.v), {.window = window});
        };
        const tensor_ops::FlashAttentionResult a = run(in);
        const tensor_ops::FlashAttentionResult b = run(changed);
        const std::vector<float> ca = a.context.to_host(), cb = b.context.to_host();
        const std::vector<float> ma = a.row_max.to_host(), mb = b.row_max.to_host();
        const std::vector<float> la = a.row_sum.to_host(), lb = b.row_sum.to_host();
        bool later_rows_differ = false;
        for (std::size_t head = 0; head < p.query_heads; ++head) {
            const std::size_t row0 = head * p.time;
            const auto rows = [&](const std::vector<float>& x, std::size_t per_row) {
                return std::vector<float>(
                    x.begin() + static_cast<std::ptrdiff_t>(row0 * per_row),
                    x.begin() + static_cast<std::ptrdiff_t>((row0 + first_changed) * per_row));
            };
            EXPECT_TRUE(testing::bit_identical(rows(ca, p.width), rows(cb, p.width)));
            EXPECT_TRUE(testing::bit_identical(rows(ma, 1), rows(mb, 1)));
            EXPECT_TRUE(testing::bit_identical(rows(la, 1), rows(lb, 1)));
            later_rows_differ = later_rows_differ || ca[(row0 + first_changed) * p.width] !=
                                                         cb[(row0 + first_changed) * p.width];
        }
        EXPECT_TRUE(later_rows_differ);
    }
}

TEST(FlashGroupedWindowedAttention, AWindowCoveringTheSequenceIsDenseAttentionBitForBit) {
    const Problem p{1, 6, 2, 150, 16, 0};
    const Inputs in = make_inputs(p, 51);
    const Tensor q(p.query_shape(), in.q), k(p.key_shape(), in.k), v(p.key_shape(), in.v);
    const Tensor g(p.query_shape(), in.upstream);
    const auto dense = tensor_ops::flash_attention(q, k, v);
    const auto dense_gradients = tensor_ops::flash_attention_backward(q, k, v, dense, g);
    for (const std::size_t window : {std::size_t{150}, std::size_t{151}, std::size_t{1} << 40U}) {
        const auto windowed = tensor_ops::flash_attention(q, k, v, {.window = window});
        const auto windowed_gradients = tensor_ops::flash_attention_backward(q, k, v, windowed, g);
        EXPECT_TRUE(testing::bit_identical(windowed.context.to_host(), dense.context.to_host()));
        EXPECT_TRUE(testing::bit_identical(windowed_gradients.key.to_host(),
                                           dense_gradients.key.to_host()));
        EXPECT_TRUE(testing::bit_identical(windowed_gradients.query.to_host(),
                                           dense_gradients.query.to_host()));
        EXPECT_TRUE(testing::bit_identical(windowed_gradients.value.to_host(),
                                           dense_gradients.value.to_host()));
    }
}

TEST(FlashGroupedWindowedAttention, GroupedForwardEqualsFlashOnRepeatedHeadsBitForBit) {
    // The kernel reads key/value head h/r in place; the old path copied it r times first.
    const Problem p{2, 6, 2, 150, 16, 30};
    const Inputs in = make_inputs(p, 61);
    const Variable q(Tensor(p.query_shape(), in.q), false), k(Tensor(p.key_shape(), in.k), false),
        v(Tensor(p.key_shape(), in.v), false);
    const Variable grouped = flash_attention(q, k, v, {.window = p.window});
    const Variable repeated = flash_attention(q, repeat_key_value_heads(k, 3),
                                              repeat_key_value_heads(v, 3), {.window = p.window});
    EXPECT_TRUE(testing::bit_identical(grouped.value().to_host(), repeated.value().to_host()));
}

TEST(FlashGroupedWindowedAttention, ANanScoreInsideTheWindowIsADomainError) {
    const Problem p{1, 4, 2, 80, 8, 5};
    Inputs in = make_inputs(p, 71);
    in.k[70 * p.width] = std::numeric_limits<float>::quiet_NaN();  // key 70 of kv head 0
    const std::string message = testing::message_of<std::domain_error>([&] {
        static_cast<void>(
            tensor_ops::flash_attention(Tensor(p.query_shape(), in.q), Tensor(p.key_shape(), in.k),
                                        Tensor(p.key_shape(), in.v), {.window = p.window}));
    });
    EXPECT_NE(message.find("NaN or +inf"), std::string::npos) << message;
}

TEST(FlashGroupedWindowedAttention, EveryInputRuleIsRejectedNamingTheShapesAndChangesNothing) {
    struct Case {
        Shape query, key, value;
        std::string expected;  // a fragment of the message
    };
    const std::vector<Case> cases = {
        // Hq not a multiple of Hkv (and Hkv > Hq)
        {{1, 6, 8, 4}, {1, 4, 8, 4}, {1, 4, 8, 4}, "query [1,6,8,4] and key/value [1,4,8,4]"},
        {{1, 2, 8, 4}, {1, 4, 8, 4}, {1, 4, 8, 4}, "query [1,2,8,4] and key/value [1,4,8,4]"},
        // K and V differ
        {{1, 6, 8, 4},
         {1, 2, 8, 4},
         {1, 3, 8, 4},
         "shapes differ (key [1,2,8,4], value [1,3,8,4])"},
        {{1, 6, 8, 4},
         {1, 2, 8, 4},
         {1, 2, 7, 4},
         "shapes differ (key [1,2,8,4], value [1,2,7,4])"},
        // B, T or d_h differ between Q and K/V
        {{2, 6, 8, 4}, {1, 2, 8, 4}, {1, 2, 8, 4}, "query [2,6,8,4] and key/value [1,2,8,4]"},
        {{1, 6, 9, 4}, {1, 2, 8, 4}, {1, 2, 8, 4}, "query [1,6,9,4] and key/value [1,2,8,4]"},
        {{1, 6, 8, 4}, {1, 2, 8, 2}, {1, 2, 8, 2}, "query [1,6,8,4] and key/value [1,2,8,2]"},
        // rank
        {{1, 6, 8, 4}, {2, 8, 4}, {2, 8, 4}, "key must have rank 4 (got [2,8,4])"},
        {{6, 8, 4}, {1, 2, 8, 4}, {1, 2, 8, 4}, "query must have rank 4 (got [6,8,4])"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.expected);
        const auto values = [](const Shape& shape, std::uint32_t seed) {
            std::size_t count = 1;
            for (const std::size_t extent : shape)
                count *= extent;
            return testing::pseudo_random(count, -1.0F, 1.0F, seed);
        };
        const std::vector<float> qv = values(c.query, 1), kv = values(c.key, 2),
                                 vv = values(c.value, 3);
        Variable q(Tensor(c.query, qv)), k(Tensor(c.key, kv)), v(Tensor(c.value, vv));
        const std::string message = testing::message_of<std::invalid_argument>(
            [&] { static_cast<void>(flash_attention(q, k, v, {.window = 3})); });
        EXPECT_NE(message.find("flash_attention: "), std::string::npos) << message;
        EXPECT_NE(message.find(c.expected), std::string::npos) << message;
        // The raw op applies the same rules.
        EXPECT_THROW(
            static_cast<void>(tensor_ops::flash_attention(q.value(), k.value(), v.value())),
            std::invalid_argument);
        // Nothing changed: inputs as they were, no gradient anywhere.
        EXPECT_TRUE(testing::bit_identical(q.value().to_host(), qv));
        EXPECT_TRUE(testing::bit_identical(k.value().to_host(), kv));
        EXPECT_TRUE(testing::bit_identical(v.value().to_host(), vv));
        EXPECT_FALSE(q.has_gradient() || k.has_gradient() || v.has_gradient());
    }
}

TEST(FlashGroupedWindowedAttention, BackwardRejectsKeyValueHeadsThatDoNotFitTheQuery) {
    const Problem p{1, 6, 2, 8, 4, 0};
    const Inputs in = make_inputs(p, 81);
    const Tensor q(p.query_shape(), in.q), k(p.key_shape(), in.k), v(p.key_shape(), in.v);
    const auto forward = tensor_ops::flash_attention(q, k, v);
    const Tensor wrong_heads({1, 4, 8, 4}, 0.5F);
    const std::string message = testing::message_of<std::invalid_argument>([&] {
        static_cast<void>(tensor_ops::flash_attention_backward(
            q, wrong_heads, wrong_heads, forward, Tensor(p.query_shape(), in.upstream)));
    });
    EXPECT_NE(message.find("flash_attention_backward: query [1,6,8,4] and key/value [1,4,8,4]"),
              std::string::npos)
        << message;
}

TEST(FlashGroupedWindowedAttention, MaterializedAttentionStillRequiresIdenticalShapes) {
    // Only flash reads grouped heads in place; the materialized reference repeats them first.
    const Tensor q({1, 6, 8, 4}, 0.5F), kv({1, 2, 8, 4}, 0.5F);
    const std::string message = testing::message_of<std::invalid_argument>(
        [&] { static_cast<void>(tensor_ops::attention_scale("causal attention", q, kv, kv)); });
    EXPECT_NE(message.find("shapes differ (query [1,6,8,4], key [1,2,8,4])"), std::string::npos)
        << message;
    EXPECT_FLOAT_EQ(tensor_ops::grouped_attention_scale("flash_attention", q, kv, kv), 0.5F);
}

TEST(FlashGroupedWindowedAttention, WindowedGroupedFlashKeepsNoQuadraticBuffer) {
    // T = 1024, width 16: a [T,T] float buffer would be 4 MiB per head; Q, K, V and the context
    // are 64 KiB per head.
    const Problem p{1, 2, 1, 1024, 16, 32};
    const Inputs in = make_inputs(p, 91);
    Variable q(Tensor(p.query_shape(), in.q)), k(Tensor(p.key_shape(), in.k)),
        v(Tensor(p.key_shape(), in.v));
    reset_cpu_peak_memory();
    const std::size_t before = cpu_memory_statistics().live_bytes;
    Variable out = flash_attention(q, k, v, {.window = p.window});
    sum(out).backward();
    const std::size_t peak_extra = cpu_memory_statistics().peak_live_bytes - before;
    EXPECT_LT(peak_extra, std::size_t{1} << 20U) << peak_extra;
}

// Gemma 2's attention-logit soft cap: scores c·tanh(s/c) in the forward, the cap's derivative in
// the VJP, on every GQA ratio and window, against the double reference; a cap of 1 with scores
// of several units makes the cap far from the identity.
TEST(FlashGroupedWindowedAttention, SoftCappedForwardAndGradientsMatchTheDoubleReference) {
    std::uint32_t seed = 500;
    for (const std::size_t kv_heads : {std::size_t{2}, std::size_t{6}}) {
        for (const std::size_t window : {std::size_t{0}, std::size_t{3}, std::size_t{70}}) {
            for (const float cap : {1.0F, 50.0F}) {
                const Problem p{2, 6, kv_heads, 150, 16, window};
                SCOPED_TRACE(describe(p) + " cap=" + std::to_string(cap));
                const Inputs in = make_inputs(p, seed += 7);
                const Tensor q(p.query_shape(), in.q), k(p.key_shape(), in.k),
                    v(p.key_shape(), in.v);
                const tensor_ops::FlashAttentionResult forward =
                    tensor_ops::flash_attention(q, k, v, {.window = p.window, .softcap = cap});
                EXPECT_EQ(forward.options.softcap, cap);
                const tensor_ops::FlashAttentionGradients gradients =
                    tensor_ops::flash_attention_backward(q, k, v, forward,
                                                         Tensor(p.query_shape(), in.upstream));
                const Reference expected = reference_attention(p, in, cap);
                EXPECT_TRUE(testing::all_close(forward.context, expected.context, 3e-5, 0.0));
                EXPECT_TRUE(
                    testing::all_close(gradients.query, expected.query_gradient, 5e-5, 0.0));
                EXPECT_TRUE(testing::all_close(gradients.key, expected.key_gradient, 5e-5, 0.0));
                EXPECT_TRUE(
                    testing::all_close(gradients.value, expected.value_gradient, 5e-5, 0.0));
                if (cap == 1.0F) {
                    // The cap bites: the uncapped reference is far away.
                    const Reference uncapped = reference_attention(p, in);
                    EXPECT_FALSE(testing::all_close(forward.context, uncapped.context, 1e-2, 0.0));
                }
            }
        }
    }
}

// The materialized form (soft_capped_causal_attention on repeated heads) against the same
// reference, context and every gradient.
TEST(FlashGroupedWindowedAttention, SoftCappedMaterializedAttentionMatchesTheDoubleReference) {
    for (const std::size_t window : {std::size_t{0}, std::size_t{3}, std::size_t{500}}) {
        const Problem p{2, 3, 3, 20, 8, window};
        SCOPED_TRACE(describe(p));
        const Inputs in = make_inputs(p, 71);
        Variable q(Tensor(p.query_shape(), in.q)), k(Tensor(p.key_shape(), in.k)),
            v(Tensor(p.key_shape(), in.v));
        const Variable context = soft_capped_causal_attention(q, k, v, p.window, 1.0F);
        sum(context * Variable(Tensor(p.query_shape(), in.upstream), false)).backward();
        const Reference expected = reference_attention(p, in, 1.0);
        EXPECT_TRUE(testing::all_close(context.value(), expected.context, 3e-5, 0.0));
        EXPECT_TRUE(testing::all_close(q.gradient(), expected.query_gradient, 5e-5, 0.0));
        EXPECT_TRUE(testing::all_close(k.gradient(), expected.key_gradient, 5e-5, 0.0));
        EXPECT_TRUE(testing::all_close(v.gradient(), expected.value_gradient, 5e-5, 0.0));
    }
}

// A soft cap that is negative or not finite names the argument and the value, and nothing is
// computed; a NaN score is still a domain error under a cap (checked before the cap, which
// would otherwise turn an overflowing +inf into c).
TEST(FlashGroupedWindowedAttention, SoftCapRulesNameTheArgumentAndTheValue) {
    const Problem p{1, 2, 1, 5, 4, 0};
    const Inputs in = make_inputs(p, 81);
    const Tensor q(p.query_shape(), in.q), k(p.key_shape(), in.k), v(p.key_shape(), in.v);
    for (const float bad :
         {-1.0F, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        EXPECT_TRUE(testing::throws<std::invalid_argument>(
            [&] { (void)tensor_ops::flash_attention(q, k, v, {.softcap = bad}); },
            "flash_attention: options.softcap must be finite and >= 0"));
        EXPECT_TRUE(testing::throws<std::invalid_argument>(
            [&] {
                (void)soft_capped_causal_attention(Variable(k), Variable(k), Variable(v), 0, bad);
            },
            "soft_capped_causal_attention: cap must be finite and > 0"));
    }
    tensor_ops::FlashAttentionResult forward =
        tensor_ops::flash_attention(q, k, v, {.softcap = 2.0F});
    forward.options.softcap = -2.0F;
    EXPECT_TRUE(testing::throws<std::invalid_argument>(
        [&] {
            (void)tensor_ops::flash_attention_backward(q, k, v, forward,
                                                       Tensor(p.query_shape(), in.upstream));
        },
        "flash_attention_backward: forward.options.softcap must be finite and >= 0 (0: no soft "
        "cap; got -2)"));
    // Row 1 of head 0 against key 0 scores +inf (q = +inf, k = 1): an overflow the cap must not
    // hide. A raw −inf is capped to −c like any other visible score.
    std::vector<float> poisoned = in.q;
    poisoned[4] = std::numeric_limits<float>::infinity();
    std::vector<float> keys = in.k;
    keys[0] = keys[4] = 1.0F;  // keys 0 and 1 (the ones row 1 sees) start with 1
    keys[1] = keys[2] = keys[3] = 0.0F;
    EXPECT_THROW(
        (void)tensor_ops::flash_attention(Tensor(p.query_shape(), poisoned),
                                          Tensor(p.key_shape(), keys), v, {.softcap = 2.0F})
            .context.to_host(),
        std::domain_error);
    poisoned[4] = -std::numeric_limits<float>::infinity();  // scores −inf at keys 0 and 1
    const std::vector<float> capped =
        tensor_ops::flash_attention(Tensor(p.query_shape(), poisoned), Tensor(p.key_shape(), keys),
                                    v, {.softcap = 2.0F})
            .context.to_host();
    for (const float value : capped)
        EXPECT_TRUE(std::isfinite(value));
}

// tanh and soft_cap against std::tanh, and their VJPs against finite differences.
TEST(SoftCap, TanhAndSoftCapMatchStdTanhAndTheirGradientsFiniteDifferences) {
    const std::vector<float> x = {-30.0F, -2.0F, -0.5F, 0.0F,
                                  0.25F,  1.5F,  40.0F, std::numeric_limits<float>::infinity()};
    const std::vector<float> t = tensor_ops::tanh(Tensor({x.size()}, x)).to_host();
    const std::vector<float> capped = tensor_ops::soft_cap(Tensor({x.size()}, x), 3.0F).to_host();
    for (std::size_t i = 0; i < x.size(); ++i) {
        EXPECT_FLOAT_EQ(t[i], std::tanh(x[i])) << x[i];
        EXPECT_NEAR(capped[i], 3.0 * std::tanh(static_cast<double>(x[i]) / 3.0), 1e-6) << x[i];
    }
    EXPECT_TRUE(testing::throws<std::invalid_argument>(
        [&] { (void)tensor_ops::soft_cap(Tensor({x.size()}, x), 0.0F); },
        "soft_cap: cap must be finite and > 0 (got 0)"));
    const std::vector<float> values = testing::pseudo_random(12, -3.0F, 3.0F, 5);
    const std::vector<float> weights = testing::pseudo_random(12, -1.0F, 1.0F, 6);
    for (const bool use_cap : {false, true}) {
        Variable input(Tensor({12}, values));
        const Variable y = use_cap ? soft_cap(input, 1.7F) : tanh(input);
        sum(y * Variable(Tensor({12}, weights), false)).backward();
        const auto objective = [&](const std::vector<float>& v) {
            const Tensor in({12}, v);
            return testing::inner_product(
                (use_cap ? tensor_ops::soft_cap(in, 1.7F) : tensor_ops::tanh(in)).to_host(),
                weights);
        };
        EXPECT_TRUE(testing::all_close(input.gradient(),
                                       testing::finite_difference_gradient(objective, values, 1e-2),
                                       2e-3, 0.0));
    }
}

}  // namespace riftco_transformer
