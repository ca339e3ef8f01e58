// Paged decode attention with grouped-query pools and a sliding window
// (tensor_ops/paged_attention.hpp): pools of Hkv heads read by Hq = 6 query heads (Hkv = 2, 1)
// and windows 1, 3 and longer than any request, against a double-precision oracle over
// contiguous K/V written here; both CPU kernels; pages of 4 in scrambled order bit-identical
// to one contiguous page; the grouped pool bit-identical to the same heads stored repeated;
// every new argument rule, with nothing written.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/cpu/paged_attention_kernels.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using tensor_ops::PagedAttentionOptions;
using tensor_ops::PagedAttentionRequest;
using tensor_ops::PagedSlot;

constexpr std::size_t query_heads = 6;
constexpr std::size_t width = 12;  // not a multiple of the 8 float lanes: tails are exercised

// One request's keys and values, contiguous [T, Hkv, d].
struct Sequence {
    std::size_t length;
    std::vector<float> keys;
    std::vector<float> values;
};

Sequence random_sequence(std::size_t length, std::size_t kv_heads, std::uint32_t seed) {
    return {length, testing::normal_values(length * kv_heads * width, seed),
            testing::normal_values(length * kv_heads * width, seed + 1000)};
}

// Query [Hq, d] against `s` at `length` under `window`, in double: query head h reads key/value
// head ⌊h / (Hq/Hkv)⌋ at positions max(0, length − W)..length − 1 (all when W is 0).
std::vector<double> oracle(const std::vector<float>& query, const Sequence& s, std::size_t kv_heads,
                           std::size_t length, std::size_t window, double softcap = 0.0) {
    const std::size_t group = query_heads / kv_heads;
    const std::size_t first = window == 0 || window >= length ? 0 : length - window;
    const double scale = 1.0F / std::sqrt(static_cast<float>(width));
    std::vector<double> out(query_heads * width, 0.0);
    for (std::size_t h = 0; h < query_heads; ++h) {
        const std::size_t kv = h / group;
        std::vector<double> scores;
        for (std::size_t t = first; t < length; ++t) {
            double dot = 0.0;
            for (std::size_t i = 0; i < width; ++i) {
                dot += double{query[h * width + i]} * s.keys[(t * kv_heads + kv) * width + i];
            }
            // Gemma 2's soft cap c: c·tanh(s/c).
            scores.push_back(softcap > 0.0 ? softcap * std::tanh(dot * scale / softcap)
                                           : dot * scale);
        }
        const double maximum = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& score : scores) {
            score = std::exp(score - maximum);
            sum += score;
        }
        for (std::size_t t = first; t < length; ++t) {
            for (std::size_t i = 0; i < width; ++i) {
                out[h * width + i] +=
                    scores[t - first] / sum * s.values[(t * kv_heads + kv) * width + i];
            }
        }
    }
    return out;
}

struct Pools {
    Tensor keys;
    Tensor values;
};

// Pools [pages, heads, page_size, d] holding each sequence through its page table; `repeat`
// stores every key/value head that many times in a row (the layout that repeated heads).
Pools pools_holding(const std::vector<const Sequence*>& sequences,
                    const std::vector<std::vector<std::uint32_t>>& tables, std::size_t pages,
                    std::size_t kv_heads, std::size_t page_size, std::size_t repeat = 1) {
    const std::size_t heads = kv_heads * repeat;
    Pools pools{Tensor::zeros({pages, heads, page_size, width}),
                Tensor::zeros({pages, heads, page_size, width})};
    for (std::size_t n = 0; n < sequences.size(); ++n) {
        const Sequence& s = *sequences[n];
        std::vector<PagedSlot> slots;
        std::vector<float> keys;
        std::vector<float> values;
        for (std::size_t t = 0; t < s.length; ++t) {
            slots.push_back({tables[n][t / page_size], static_cast<std::uint32_t>(t % page_size)});
            for (std::size_t h = 0; h < heads; ++h) {
                const std::size_t source = (t * kv_heads + h / repeat) * width;
                keys.insert(keys.end(), s.keys.begin() + source, s.keys.begin() + source + width);
                values.insert(values.end(), s.values.begin() + source,
                              s.values.begin() + source + width);
            }
        }
        tensor_ops::write_paged_key_value(pools.keys, pools.values,
                                          Tensor({s.length, heads, 1, width}, keys),
                                          Tensor({s.length, heads, 1, width}, values), slots);
    }
    return pools;
}

// Three requests of different lengths in one pool of pages of 4, their pages interleaved and
// out of order.
struct Batch {
    std::vector<Sequence> sequences;
    std::vector<std::vector<std::uint32_t>> tables;
    std::vector<std::uint32_t> contiguous_table = {0};
};

Batch scrambled_batch(std::size_t kv_heads) {
    Batch batch;
    batch.sequences = {random_sequence(11, kv_heads, 1), random_sequence(5, kv_heads, 2),
                       random_sequence(2, kv_heads, 3)};
    batch.tables = {{6, 0, 3}, {5, 1}, {4}};  // pages 2 and 7 unused
    return batch;
}

constexpr std::size_t scrambled_pages = 8;
constexpr std::size_t page_size = 4;

std::vector<float> row_of(const std::vector<float>& rows, std::size_t r) {
    return {rows.begin() + static_cast<std::ptrdiff_t>(r * query_heads * width),
            rows.begin() + static_cast<std::ptrdiff_t>((r + 1) * query_heads * width)};
}

TEST(PagedAttentionGqaWindow, BothKernelsMatchTheOracleForEveryGroupAndWindow) {
    for (const std::size_t kv_heads : {std::size_t{2}, std::size_t{1}}) {
        const Batch batch = scrambled_batch(kv_heads);
        const Pools pools =
            pools_holding({&batch.sequences[0], &batch.sequences[1], &batch.sequences[2]},
                          batch.tables, scrambled_pages, kv_heads, page_size);
        const std::vector<PagedAttentionRequest> requests = {
            {batch.tables[0], 11}, {batch.tables[1], 5}, {batch.tables[2], 2}};
        const std::vector<float> queries = testing::normal_values(3 * query_heads * width, 4);
        const Tensor query({3, query_heads, 1, width}, queries);
        const detail::PagedAttentionGeometry geometry{scrambled_pages, kv_heads, page_size, width,
                                                      query_heads / kv_heads};
        const auto keys = pools.keys.to_host();
        const auto values = pools.values.to_host();
        for (const std::size_t window :
             {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{12}}) {
            for (const float cap : {0.0F, 0.8F}) {
                const PagedAttentionOptions options{.window = window, .softcap = cap};
                const Tensor context = tensor_ops::paged_decode_attention(
                    query, pools.keys, pools.values, requests, 0.0F, options);
                ASSERT_EQ(context.shape(), (Shape{3, query_heads, 1, width}));
                const auto fast = context.to_host();
                std::vector<float> reference(fast.size());
                detail::paged_attention_reference(
                    geometry, queries.data(), keys.data(), values.data(), requests,
                    1.0F / std::sqrt(float{width}), reference.data(), options);
                for (std::size_t r = 0; r < 3; ++r) {
                    const std::vector<double> expected =
                        oracle(row_of(queries, r), batch.sequences[r], kv_heads, requests[r].length,
                               window, cap);
                    for (std::size_t i = 0; i < expected.size(); ++i) {
                        const std::size_t at = r * query_heads * width + i;
                        EXPECT_NEAR(fast[at], expected[i], 2e-6)
                            << "fast, Hkv " << kv_heads << ", W " << window << ", cap " << cap
                            << ", request " << r;
                        EXPECT_NEAR(reference[at], expected[i], 1e-6)
                            << "reference, Hkv " << kv_heads << ", W " << window << ", cap " << cap
                            << ", request " << r;
                    }
                }
                if (cap != 0.0F && window != 1) {
                    // The cap bites (one visible position has probability 1 either way).
                    const std::vector<double> uncapped =
                        oracle(row_of(queries, 0), batch.sequences[0], kv_heads, requests[0].length,
                               window);
                    double largest = 0.0;
                    for (std::size_t i = 0; i < uncapped.size(); ++i)
                        largest = std::max(largest, std::abs(uncapped[i] - fast[i]));
                    EXPECT_GT(largest, 1e-2) << "Hkv " << kv_heads << ", W " << window;
                }
            }
        }
    }
}

TEST(PagedAttentionGqaWindow, ScrambledPagesOfFourEqualOneContiguousPageBitForBit) {
    for (const std::size_t kv_heads : {std::size_t{2}, std::size_t{1}}) {
        const Batch batch = scrambled_batch(kv_heads);
        const Pools paged =
            pools_holding({&batch.sequences[0], &batch.sequences[1], &batch.sequences[2]},
                          batch.tables, scrambled_pages, kv_heads, page_size);
        const std::vector<float> queries = testing::normal_values(3 * query_heads * width, 5);
        const auto keys = paged.keys.to_host();
        const auto values = paged.values.to_host();
        for (std::size_t r = 0; r < 3; ++r) {
            // The same sequence alone in one page of 12 positions.
            const Pools contiguous =
                pools_holding({&batch.sequences[r]}, {batch.contiguous_table}, 1, kv_heads, 12);
            const auto contiguous_keys = contiguous.keys.to_host();
            const auto contiguous_values = contiguous.values.to_host();
            const std::vector<float> query = row_of(queries, r);
            const Tensor q({1, query_heads, 1, width}, query);
            for (std::size_t length = 1; length <= batch.sequences[r].length; ++length) {
                const PagedAttentionRequest scattered{batch.tables[r], length};
                const PagedAttentionRequest whole{batch.contiguous_table, length};
                for (const std::size_t window :
                     {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{5}}) {
                    const PagedAttentionOptions options{.window = window};
                    EXPECT_TRUE(testing::bit_identical(
                        tensor_ops::paged_decode_attention(q, paged.keys, paged.values,
                                                           {&scattered, 1}, 0.0F, options)
                            .to_host(),
                        tensor_ops::paged_decode_attention(q, contiguous.keys, contiguous.values,
                                                           {&whole, 1}, 0.0F, options)
                            .to_host()))
                        << "fast, Hkv " << kv_heads << ", request " << r << ", length " << length
                        << ", W " << window;
                    const float scale = 1.0F / std::sqrt(float{width});
                    std::vector<float> a(query_heads * width);
                    std::vector<float> b(query_heads * width);
                    detail::paged_attention_reference(
                        {scrambled_pages, kv_heads, page_size, width, query_heads / kv_heads},
                        query.data(), keys.data(), values.data(), {&scattered, 1}, scale, a.data(),
                        options);
                    detail::paged_attention_reference(
                        {1, kv_heads, 12, width, query_heads / kv_heads}, query.data(),
                        contiguous_keys.data(), contiguous_values.data(), {&whole, 1}, scale,
                        b.data(), options);
                    EXPECT_TRUE(testing::bit_identical(a, b))
                        << "reference, Hkv " << kv_heads << ", request " << r << ", length "
                        << length << ", W " << window;
                }
            }
        }
    }
}

TEST(PagedAttentionGqaWindow, SharedHeadsEqualTheSameHeadsStoredRepeatedBitForBit) {
    const std::size_t kv_heads = 2;
    const Batch batch = scrambled_batch(kv_heads);
    const std::vector<const Sequence*> sequences = {&batch.sequences[0], &batch.sequences[1],
                                                    &batch.sequences[2]};
    const Pools grouped =
        pools_holding(sequences, batch.tables, scrambled_pages, kv_heads, page_size);
    const Pools repeated = pools_holding(sequences, batch.tables, scrambled_pages, kv_heads,
                                         page_size, query_heads / kv_heads);
    EXPECT_EQ(grouped.keys.shape(), (Shape{scrambled_pages, kv_heads, page_size, width}));
    EXPECT_EQ(repeated.keys.shape(), (Shape{scrambled_pages, query_heads, page_size, width}));
    const std::vector<PagedAttentionRequest> requests = {
        {batch.tables[0], 9}, {batch.tables[1], 5}, {batch.tables[2], 1}};
    const Tensor query({3, query_heads, 1, width},
                       testing::normal_values(3 * query_heads * width, 6));
    for (const std::size_t window : {std::size_t{0}, std::size_t{2}}) {
        const PagedAttentionOptions options{.window = window};
        EXPECT_TRUE(testing::bit_identical(
            tensor_ops::paged_decode_attention(query, grouped.keys, grouped.values, requests, 0.0F,
                                               options)
                .to_host(),
            tensor_ops::paged_decode_attention(query, repeated.keys, repeated.values, requests,
                                               0.0F, options)
                .to_host()))
            << "W " << window;
    }
}

TEST(PagedAttentionGqaWindow, AWindowAtLeastTheLengthIsNoWindow) {
    const Batch batch = scrambled_batch(1);
    const Pools pools =
        pools_holding({&batch.sequences[0]}, {batch.tables[0]}, scrambled_pages, 1, page_size);
    const PagedAttentionRequest request{batch.tables[0], 7};
    const Tensor query({1, query_heads, 1, width}, testing::normal_values(query_heads * width, 7));
    const auto dense =
        tensor_ops::paged_decode_attention(query, pools.keys, pools.values, {&request, 1})
            .to_host();
    for (const std::size_t window : {std::size_t{7}, std::size_t{8}, std::size_t{1} << 40}) {
        EXPECT_TRUE(testing::bit_identical(
            tensor_ops::paged_decode_attention(query, pools.keys, pools.values, {&request, 1}, 0.0F,
                                               {.window = window})
                .to_host(),
            dense))
            << "W " << window;
    }
}

TEST(PagedAttentionGqaWindow, OnlyVisibleScoresAreCheckedForNonFiniteValues) {
    Sequence s = random_sequence(6, 2, 8);
    s.keys[(0 * 2 + 1) * width + 4] = INFINITY;  // position 0, key/value head 1
    const std::vector<std::uint32_t> table = {1, 0};
    const Pools pools = pools_holding({&s}, {table}, 2, 2, page_size);
    const PagedAttentionRequest request{table, 6};
    const Tensor query({1, query_heads, 1, width}, testing::normal_values(query_heads * width, 9));
    // Query heads 3..5 read key/value head 1: position 0 is visible without a window...
    const std::string message = testing::message_of<std::domain_error>([&] {
        static_cast<void>(
            tensor_ops::paged_decode_attention(query, pools.keys, pools.values, {&request, 1}));
    });
    // (which of heads 3..5 is named depends on the thread that meets it first)
    EXPECT_NE(message.find(", position 0 is inf"), std::string::npos) << message;
    EXPECT_TRUE(message.find("head 3,") != std::string::npos ||
                message.find("head 4,") != std::string::npos ||
                message.find("head 5,") != std::string::npos)
        << message;
    // ...and outside a window of 5.
    EXPECT_NO_THROW(static_cast<void>(tensor_ops::paged_decode_attention(
        query, pools.keys, pools.values, {&request, 1}, 0.0F, {.window = 5})));
}

TEST(PagedAttentionGqaWindow, GroupRulesAreCheckedWithNothingWritten) {
    // Pools [2, Hkv=2, 4, d]; key/value rows must carry the pools' 2 heads.
    Tensor keys = Tensor::full({2, 2, page_size, width}, 0.5F);
    Tensor values = Tensor::full({2, 2, page_size, width}, -0.5F);
    const auto keys_before = keys.to_host();
    const auto values_before = values.to_host();
    const std::vector<std::uint32_t> table = {1};
    const PagedAttentionRequest request{table, 3};
    const auto attend = [&](const Shape& query_shape) {
        return testing::message_of<std::invalid_argument>([&] {
            static_cast<void>(tensor_ops::paged_decode_attention(
                Tensor::zeros(query_shape), keys, values, {&request, 1}, 0.0F, {.window = 2}));
        });
    };
    // Hq not a multiple of Hkv, Hq below Hkv (a zero extent is no tensor at all): each message
    // names the query's shape and the pools'.
    for (const Shape& shape : {Shape{1, 5, 1, width}, Shape{1, 1, 1, width}}) {
        const std::string message = attend(shape);
        EXPECT_NE(message.find("query " + shape_to_string(shape)), std::string::npos) << message;
        EXPECT_NE(message.find("multiple of the pools' 2 heads"), std::string::npos) << message;
        EXPECT_NE(message.find(shape_to_string(keys.shape())), std::string::npos) << message;
    }
    // The query's head width must still be the pools'.
    EXPECT_NE(attend(Shape{1, 4, 1, width + 1}).find("query"), std::string::npos);
    // A soft cap that is negative or not finite names the option and the value.
    for (const float bad : {-0.5F, std::numeric_limits<float>::infinity()}) {
        const std::string message = testing::message_of<std::invalid_argument>([&] {
            static_cast<void>(tensor_ops::paged_decode_attention(
                Tensor::zeros({1, query_heads, 1, width}), keys, values, {&request, 1}, 0.0F,
                {.window = 2, .softcap = bad}));
        });
        EXPECT_NE(message.find("paged_decode_attention: options.softcap must be finite and >= 0"),
                  std::string::npos)
            << message;
    }
    // Writes take rows of the pools' Hkv heads, never Hq (repeated) rows.
    const auto write = [&](const Tensor& k, const Tensor& v) {
        return testing::message_of<std::invalid_argument>([&] {
            tensor_ops::write_paged_key_value(keys, values, k, v, std::vector<PagedSlot>{{0, 1}});
        });
    };
    const Tensor query_rows = Tensor::full({1, query_heads, 1, width}, 1.0F);
    const Tensor pool_rows = Tensor::full({1, 2, 1, width}, 1.0F);
    const std::string repeated = write(query_rows, query_rows);
    EXPECT_NE(repeated.find("key " + shape_to_string(query_rows.shape())), std::string::npos)
        << repeated;
    EXPECT_NE(write(pool_rows, query_rows).find("value"), std::string::npos);
    EXPECT_NE(write(query_rows, pool_rows).find("key"), std::string::npos);
    EXPECT_EQ(keys.to_host(), keys_before);
    EXPECT_EQ(values.to_host(), values_before);
    // The same pools serve a valid grouped call afterwards.
    EXPECT_NO_THROW(static_cast<void>(
        tensor_ops::paged_decode_attention(Tensor::zeros({1, query_heads, 1, width}), keys, values,
                                           {&request, 1}, 0.0F, {.window = 2})));
}

}  // namespace
}  // namespace riftco_transformer
