// Paged decode attention (tensor_ops/paged_attention.hpp): both CPU kernels against a
// double-precision oracle over contiguous K/V written here, page-layout independence (bit
// for bit), the batched form, and every argument rule (nothing written on an error).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/backend/cpu/paged_attention_kernels.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using tensor_ops::PagedAttentionRequest;
using tensor_ops::PagedSlot;

// A sequence's keys and values, contiguous: [T, H, d].
struct Sequence {
    std::size_t length;
    std::vector<float> keys;
    std::vector<float> values;
};

// softmax(q·Kᵀ/√d)·V per head, in double, from the contiguous sequence.
std::vector<double> oracle(const std::vector<float>& query, const Sequence& s, std::size_t heads,
                           std::size_t width, std::size_t length) {
    std::vector<double> out(heads * width, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(width)));
    for (std::size_t h = 0; h < heads; ++h) {
        std::vector<double> scores(length);
        double maximum = -INFINITY;
        for (std::size_t t = 0; t < length; ++t) {
            double dot = 0.0;
            for (std::size_t i = 0; i < width; ++i) {
                dot += double{query[h * width + i]} * s.keys[(t * heads + h) * width + i];
            }
            scores[t] = dot * static_cast<float>(scale);
            maximum = std::max(maximum, scores[t]);
        }
        double sum = 0.0;
        for (double& v : scores) {
            v = std::exp(v - maximum);
            sum += v;
        }
        for (std::size_t t = 0; t < length; ++t) {
            for (std::size_t i = 0; i < width; ++i) {
                out[h * width + i] += scores[t] / sum * s.values[(t * heads + h) * width + i];
            }
        }
    }
    return out;
}

// Pools of `pages` pages of `page_size`, with sequence `s` stored through `table`.
struct Pools {
    Tensor keys;
    Tensor values;
};

Pools pools_holding(const std::vector<const Sequence*>& sequences,
                    const std::vector<std::vector<std::uint32_t>>& tables, std::size_t pages,
                    std::size_t heads, std::size_t page_size, std::size_t width) {
    Pools pools{Tensor::zeros({pages, heads, page_size, width}),
                Tensor::zeros({pages, heads, page_size, width})};
    for (std::size_t n = 0; n < sequences.size(); ++n) {
        const Sequence& s = *sequences[n];
        std::vector<PagedSlot> slots;
        for (std::size_t t = 0; t < s.length; ++t) {
            slots.push_back({tables[n][t / page_size], static_cast<std::uint32_t>(t % page_size)});
        }
        const Tensor k({s.length, heads, 1, width}, s.keys);
        const Tensor v({s.length, heads, 1, width}, s.values);
        tensor_ops::write_paged_key_value(pools.keys, pools.values, k, v, slots);
    }
    return pools;
}

constexpr std::size_t heads = 3;
constexpr std::size_t width = 20;  // not a multiple of the 8 float lanes: tails are exercised

TEST(PagedAttention, BothKernelsMatchTheOracleOnScatteredPages) {
    const std::size_t page_size = 4;
    const Sequence s{11, testing::normal_values(11 * heads * width, 1),
                     testing::normal_values(11 * heads * width, 2)};
    const std::vector<std::uint32_t> table = {5, 0, 3};  // 11 positions over 3 scattered pages
    const Pools pools = pools_holding({&s}, {table}, 6, heads, page_size, width);
    const std::vector<float> query = testing::normal_values(heads * width, 3);
    for (const std::size_t length :
         {std::size_t{1}, std::size_t{4}, std::size_t{5}, std::size_t{11}}) {
        const std::vector<double> expected = oracle(query, s, heads, width, length);
        const PagedAttentionRequest request{table, length};
        const Tensor context = tensor_ops::paged_decode_attention(
            Tensor({1, heads, 1, width}, query), pools.keys, pools.values, {&request, 1});
        EXPECT_EQ(context.shape(), (Shape{1, heads, 1, width}));
        const std::vector<float> fast = context.to_host();
        std::vector<float> reference(heads * width);
        detail::paged_attention_reference({6, heads, page_size, width}, query.data(),
                                          pools.keys.to_host().data(),
                                          pools.values.to_host().data(), {&request, 1},
                                          1.0F / std::sqrt(float{width}), reference.data());
        for (std::size_t i = 0; i < expected.size(); ++i) {
            EXPECT_NEAR(fast[i], expected[i], 2e-6) << "fast, length " << length << ", " << i;
            EXPECT_NEAR(reference[i], expected[i], 1e-6) << "reference, length " << length;
        }
    }
}

TEST(PagedAttention, PageSizeAndPlacementDoNotChangeOneBit) {
    const std::size_t length = 37;
    const Sequence s{length, testing::normal_values(length * heads * width, 4),
                     testing::normal_values(length * heads * width, 5)};
    const std::vector<float> query = testing::normal_values(heads * width, 6);
    const Tensor q({1, heads, 1, width}, query);
    // Contiguous: one page of 40; paged: pages of 4 in reverse order; pages of 16.
    const Pools contiguous = pools_holding({&s}, {{0}}, 1, heads, 40, width);
    std::vector<std::uint32_t> reversed;
    for (std::uint32_t p = 10; p-- > 0;) {
        reversed.push_back(p);
    }
    const Pools small = pools_holding({&s}, {reversed}, 10, heads, 4, width);
    const Pools medium = pools_holding({&s}, {{2, 0, 1}}, 3, heads, 16, width);
    const std::vector<std::uint32_t> one = {0};
    const std::vector<std::uint32_t> table16 = {2, 0, 1};
    const PagedAttentionRequest r_contiguous{one, length};
    const PagedAttentionRequest r_small{reversed, length};
    const PagedAttentionRequest r_medium{table16, length};
    const auto a = tensor_ops::paged_decode_attention(q, contiguous.keys, contiguous.values,
                                                      {&r_contiguous, 1})
                       .to_host();
    const auto b =
        tensor_ops::paged_decode_attention(q, small.keys, small.values, {&r_small, 1}).to_host();
    const auto c =
        tensor_ops::paged_decode_attention(q, medium.keys, medium.values, {&r_medium, 1}).to_host();
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
}

TEST(PagedAttention, BatchedRequestsEqualSeparateCalls) {
    const std::size_t page_size = 8;
    const Sequence s1{13, testing::normal_values(13 * heads * width, 7),
                      testing::normal_values(13 * heads * width, 8)};
    const Sequence s2{3, testing::normal_values(3 * heads * width, 9),
                      testing::normal_values(3 * heads * width, 10)};
    const std::vector<std::vector<std::uint32_t>> tables = {{4, 1}, {2}};
    const Pools pools = pools_holding({&s1, &s2}, tables, 5, heads, page_size, width);
    const std::vector<float> queries = testing::normal_values(3 * heads * width, 11);
    // Three rows: request 1 at length 13, request 2 at length 3, request 1 again at length 6.
    const std::vector<PagedAttentionRequest> requests = {
        {tables[0], 13}, {tables[1], 3}, {tables[0], 6}};
    const auto batched = tensor_ops::paged_decode_attention(Tensor({3, heads, 1, width}, queries),
                                                            pools.keys, pools.values, requests)
                             .to_host();
    for (std::size_t r = 0; r < 3; ++r) {
        const std::vector<float> query(queries.begin() + r * heads * width,
                                       queries.begin() + (r + 1) * heads * width);
        const auto single =
            tensor_ops::paged_decode_attention(Tensor({1, heads, 1, width}, query), pools.keys,
                                               pools.values, {&requests[r], 1})
                .to_host();
        const std::vector<float> row(batched.begin() + r * heads * width,
                                     batched.begin() + (r + 1) * heads * width);
        EXPECT_EQ(row, single) << "row " << r;
    }
}

TEST(PagedAttention, LongSequencesStayAccurateAndThreadCountFree) {
    // 700 positions, 8 heads: enough work that the fast path threads over (request, head).
    const std::size_t length = 700;
    const std::size_t h = 8;
    const std::size_t d = 64;
    Sequence s{length, testing::normal_values(length * h * d, 12),
               testing::normal_values(length * h * d, 13)};
    std::vector<std::uint32_t> table;
    for (std::uint32_t p = 0; p < 44; ++p) {
        table.push_back((p * 7) % 44);
    }
    Pools pools{Tensor::zeros({44, h, 16, d}), Tensor::zeros({44, h, 16, d})};
    std::vector<PagedSlot> slots;
    for (std::size_t t = 0; t < length; ++t) {
        slots.push_back({table[t / 16], static_cast<std::uint32_t>(t % 16)});
    }
    tensor_ops::write_paged_key_value(pools.keys, pools.values, Tensor({length, h, 1, d}, s.keys),
                                      Tensor({length, h, 1, d}, s.values), slots);
    const std::vector<float> query = testing::normal_values(h * d, 14);
    const PagedAttentionRequest request{table, length};
    const auto fast = tensor_ops::paged_decode_attention(Tensor({1, h, 1, d}, query), pools.keys,
                                                         pools.values, {&request, 1})
                          .to_host();
    const auto expected = oracle(query, s, h, d, length);
    for (std::size_t i = 0; i < expected.size(); ++i) {
        EXPECT_NEAR(fast[i], expected[i], 2e-6) << i;
    }
}

TEST(PagedAttention, NonFiniteScoresAreDomainErrors) {
    Sequence s{2, testing::normal_values(2 * heads * width, 15),
               testing::normal_values(2 * heads * width, 16)};
    s.keys[heads * width + 3] = INFINITY;  // position 1, head 0
    const std::vector<std::uint32_t> table = {0};
    const Pools pools = pools_holding({&s}, {table}, 1, heads, 4, width);
    const PagedAttentionRequest request{table, 2};
    const Tensor q({1, heads, 1, width}, testing::normal_values(heads * width, 17));
    EXPECT_THROW(static_cast<void>(tensor_ops::paged_decode_attention(q, pools.keys, pools.values,
                                                                      {&request, 1})),
                 std::domain_error);
    // Position 0 alone is finite.
    const PagedAttentionRequest first{table, 1};
    EXPECT_NO_THROW(static_cast<void>(
        tensor_ops::paged_decode_attention(q, pools.keys, pools.values, {&first, 1})));
}

TEST(PagedAttention, ArgumentRulesNameTheArgument) {
    Tensor keys = Tensor::zeros({2, heads, 4, width});
    Tensor values = Tensor::zeros({2, heads, 4, width});
    const Tensor q = Tensor::zeros({1, heads, 1, width});
    const std::vector<std::uint32_t> table = {1};
    const auto attend = [&](const Tensor& query, const Tensor& k, const Tensor& v,
                            std::vector<PagedAttentionRequest> requests) {
        return testing::message_of<std::invalid_argument>(
            [&] { static_cast<void>(tensor_ops::paged_decode_attention(query, k, v, requests)); });
    };
    EXPECT_NE(attend(Tensor::zeros({1, heads, 2, width}), keys, values, {{table, 1}}).find("query"),
              std::string::npos);
    EXPECT_NE(
        attend(Tensor::zeros({1, heads + 1, 1, width}), keys, values, {{table, 1}}).find("query"),
        std::string::npos);
    EXPECT_NE(attend(q, keys, Tensor::zeros({3, heads, 4, width}), {{table, 1}}).find("value_pool"),
              std::string::npos);
    EXPECT_NE(attend(q, keys, values, {}).find("0 requests"), std::string::npos);
    EXPECT_NE(attend(q, keys, values, {{table, 0}}).find("requests[0].length 0"),
              std::string::npos);
    EXPECT_NE(attend(q, keys, values, {{table, 5}}).find("requests[0].length 5"),
              std::string::npos);
    // An explicit scale is used as given (here: twice the default changes the context), and
    // it must be finite and positive.
    {
        Tensor k = Tensor::zeros({1, 1, 2, 2});
        Tensor v = Tensor::zeros({1, 1, 2, 2});
        tensor_ops::write_paged_key_value(k, v, Tensor({2, 1, 1, 2}, {1.0F, 0.0F, 0.0F, 1.0F}),
                                          Tensor({2, 1, 1, 2}, {1.0F, 0.0F, 0.0F, 1.0F}),
                                          std::vector<PagedSlot>{{0, 0}, {0, 1}});
        const std::vector<std::uint32_t> one_page = {0};
        const PagedAttentionRequest both{one_page, 2};
        const Tensor unit_query({1, 1, 1, 2}, {1.0F, 0.0F});
        // scores (s, 0): p0 = 1 / (1 + e^-s); context = (p0, 1 - p0).
        for (const float scale : {0.5F, 2.0F}) {
            const auto context =
                tensor_ops::paged_decode_attention(unit_query, k, v, {&both, 1}, scale).to_host();
            const double p0 = 1.0 / (1.0 + std::exp(-double{scale}));
            EXPECT_NEAR(context[0], p0, 1e-6) << scale;
            EXPECT_NEAR(context[1], 1.0 - p0, 1e-6) << scale;
        }
        for (const float scale : {-1.0F, INFINITY, NAN}) {
            EXPECT_THROW(static_cast<void>(tensor_ops::paged_decode_attention(unit_query, k, v,
                                                                              {&both, 1}, scale)),
                         std::invalid_argument);
        }
    }
    const std::vector<std::uint32_t> bad = {2};
    EXPECT_NE(attend(q, keys, values, {{bad, 1}}).find("page_table[0] = 2"), std::string::npos);

    // Writes: every rule, and the pools unchanged afterwards.
    const auto before = keys.to_host();
    const Tensor row = Tensor::full({1, heads, 1, width}, 1.0F);
    const Tensor rows = Tensor::full({2, heads, 1, width}, 1.0F);
    const auto write = [&](const Tensor& k, const Tensor& v, std::vector<PagedSlot> slots) {
        return testing::message_of<std::invalid_argument>(
            [&] { tensor_ops::write_paged_key_value(keys, values, k, v, slots); });
    };
    EXPECT_NE(write(row, row, {{2, 0}}).find("slots[0] = (page 2"), std::string::npos);
    EXPECT_NE(write(row, row, {{0, 4}}).find("offset 4"), std::string::npos);
    EXPECT_NE(write(row, row, {}).find("0 slots"), std::string::npos);
    EXPECT_NE(write(rows, rows, {{1, 2}, {1, 2}}).find("repeats"), std::string::npos);
    EXPECT_NE(write(row, rows, {{0, 0}}).find("value"), std::string::npos);
    EXPECT_EQ(keys.to_host(), before);
    EXPECT_EQ(values.to_host(), before);
}

TEST(PagedAttention, WritesNeverReachACopyOfThePool) {
    Tensor keys = Tensor::zeros({1, 1, 2, 2});
    Tensor values = Tensor::zeros({1, 1, 2, 2});
    const Tensor snapshot = keys;  // shares the storage
    tensor_ops::write_paged_key_value(keys, values, Tensor({1, 1, 1, 2}, {1.0F, 2.0F}),
                                      Tensor({1, 1, 1, 2}, {3.0F, 4.0F}),
                                      std::vector<PagedSlot>{{0, 1}});
    EXPECT_EQ(keys.to_host(), (std::vector<float>{0, 0, 1, 2}));
    EXPECT_EQ(values.to_host(), (std::vector<float>{0, 0, 3, 4}));
    EXPECT_EQ(snapshot.to_host(), (std::vector<float>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace riftco_transformer
