// KV-cached decoding (serving/decode_session.hpp, serving/kv_cache.hpp): decode logits
// against the full-sequence forward at every position, batched prefill against
// token-at-a-time, paged against contiguous, batched sessions against separate ones, suffix
// replay against a fresh forward over the cropped window, and the transaction rules
// (exhaustion, full sessions, staleness) leaving every state unchanged.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::message_of;

// logits [T, V] of a full forward over `tokens`.

void expect_near(const std::vector<float>& actual, const float* expected, std::size_t count,
                 double tolerance, const std::string& what) {
    ASSERT_GE(actual.size(), count) << what;
    double worst = 0.0;
    for (std::size_t i = 0; i < count; ++i) {
        worst = std::max(worst, std::fabs(double{actual[i]} - expected[i]));
    }
    EXPECT_LE(worst, tolerance) << what;
}

constexpr std::size_t V = 27;

TEST(DecodeSession, DecodeLogitsEqualTheFullForwardAtEveryPosition) {
    const auto model = testing::reference_tiny_model();
    const auto tokens = testing::reference_tokens(16, 1);
    const auto expected = testing::full_forward_logits(model, tokens);
    for (const auto kind : {KeyValueCacheKind::Paged, KeyValueCacheKind::Contiguous}) {
        DecodeSession session(model, kind, 4);
        for (std::size_t t = 0; t < tokens.size(); ++t) {
            const Tensor logits = session.decode_token(tokens[t]);
            EXPECT_EQ(logits.shape(), (Shape{1, 1, V}));
            expect_near(
                logits.to_host(), expected.data() + t * V, V, 1e-5,
                std::string(key_value_cache_kind_name(kind)) + " position " + std::to_string(t));
            EXPECT_EQ(session.size(), t + 1);
        }
    }
}

TEST(DecodeSession, PagedAndContiguousCachesGiveIdenticalLogits) {
    const auto model = testing::reference_tiny_model();
    const auto tokens = testing::reference_tokens(16, 2);
    DecodeSession paged(model, KeyValueCacheKind::Paged, 3);
    DecodeSession contiguous(model, KeyValueCacheKind::Contiguous);
    EXPECT_EQ(contiguous.block_size(), 16U);
    EXPECT_EQ(paged.block_size(), 3U);
    EXPECT_EQ(paged.cache().pool()->block_count(), 6U);  // ceil(16 / 3)
    for (const std::uint32_t token : tokens) {
        EXPECT_EQ(paged.decode_token(token).to_host(), contiguous.decode_token(token).to_host());
    }
    // Prefill too: a whole prompt (the flash path) and then a chunk (the paged path).
    paged.reset();
    contiguous.reset();
    EXPECT_EQ(paged.prefill({tokens.data(), 9}, PrefillLogits::All).to_host(),
              contiguous.prefill({tokens.data(), 9}, PrefillLogits::All).to_host());
    EXPECT_EQ(paged.prefill({tokens.data() + 9, 7}, PrefillLogits::All).to_host(),
              contiguous.prefill({tokens.data() + 9, 7}, PrefillLogits::All).to_host());
}

TEST(DecodeSession, BatchedPrefillEqualsTokenAtATime) {
    const auto model = testing::reference_tiny_model();
    const auto prompt = testing::reference_tokens(13, 3);
    DecodeSession one_by_one(model);
    std::vector<float> stepped;
    for (const std::uint32_t token : prompt) {
        const auto logits = one_by_one.decode_token(token).to_host();
        stepped.insert(stepped.end(), logits.begin(), logits.end());
    }
    DecodeSession batched(model);
    const Tensor all = batched.prefill(prompt, PrefillLogits::All);
    EXPECT_EQ(all.shape(), (Shape{1, prompt.size(), V}));
    expect_near(all.to_host(), stepped.data(), stepped.size(), 1e-5, "all positions");
    DecodeSession last(model);
    const Tensor final_logits = last.prefill(prompt);
    EXPECT_EQ(final_logits.shape(), (Shape{1, 1, V}));
    expect_near(final_logits.to_host(), stepped.data() + (prompt.size() - 1) * V, V, 1e-5, "last");
    // The caches hold the same keys: the next decode steps agree too.
    const auto a = one_by_one.decode_token(5).to_host();
    const auto b = batched.decode_token(5).to_host();
    expect_near(a, b.data(), V, 1e-5, "decode after prefill");
    // Chunked prefill (7 + 6 tokens) continues where the first chunk stopped.
    DecodeSession chunked(model);
    static_cast<void>(chunked.prefill({prompt.data(), 7}));
    const auto rest = chunked.prefill({prompt.data() + 7, 6}, PrefillLogits::All).to_host();
    expect_near(rest, stepped.data() + 7 * V, 6 * V, 1e-5, "second chunk");
}

TEST(DecodeSession, BatchedSessionsEqualSeparateSessions) {
    const auto model = testing::reference_tiny_model();
    auto pool = make_key_value_cache_pool(model, 4, 12);
    const std::vector<std::vector<std::uint32_t>> prompts = {testing::reference_tokens(9, 4),
                                                             testing::reference_tokens(2, 5),
                                                             testing::reference_tokens(5, 6)};
    std::vector<DecodeSession> batched;
    std::vector<DecodeSession> separate;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        batched.emplace_back(model, pool);
        separate.emplace_back(model);
    }
    // Step 1: all three prompts prefilled in one pass; then four decode steps of all three.
    std::vector<DecodeWork> work;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        work.push_back({&batched[i], prompts[i]});
    }
    auto logits = decode_batch(work).to_host();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        const auto single = separate[i].prefill(prompts[i]).to_host();
        expect_near(single, logits.data() + i * V, V, 1e-5, "prefill " + std::to_string(i));
    }
    for (std::uint32_t step = 0; step < 4; ++step) {
        std::vector<std::uint32_t> next = {step, step + 3, step + 7};
        work.clear();
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            work.push_back({&batched[i], {&next[i], 1}});
        }
        logits = decode_batch(work).to_host();
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            const auto single = separate[i].decode_token(next[i]).to_host();
            expect_near(single, logits.data() + i * V, V, 1e-5,
                        "step " + std::to_string(step) + " session " + std::to_string(i));
            EXPECT_EQ(batched[i].size(), separate[i].size());
        }
    }
    // 9+4=13 -> 4 pages, 2+4=6 -> 2 pages, 5+4=9 -> 3 pages.
    EXPECT_EQ(pool->leased_block_count(), 9U);
    batched.clear();
    EXPECT_EQ(pool->leased_block_count(), 0U);
}

TEST(DecodeSession, SuffixReplayEqualsAFreshForwardOverTheCroppedWindow) {
    const auto model = testing::reference_tiny_model();
    const auto history = testing::reference_tokens(23, 7);
    DecodeSession session(model);
    static_cast<void>(session.prefill({history.data(), 16}));
    EXPECT_EQ(session.size(), session.capacity());
    // Raw sessions never roll over.
    const auto full = message_of<std::out_of_range>(
        [&] { static_cast<void>(session.decode_token(history[16])); });
    EXPECT_NE(full.find("never rolls over"), std::string::npos) << full;
    EXPECT_EQ(session.size(), 16U);
    // Rollover: reset, replay the newest C tokens from position 0.
    session.reset();
    const std::vector<std::uint32_t> window(history.end() - 16, history.end());
    const auto replayed = session.prefill(window, PrefillLogits::All).to_host();
    const auto fresh = testing::full_forward_logits(model, window);
    expect_near(replayed, fresh.data(), fresh.size(), 1e-5, "replayed window");
}

TEST(DecodeSession, SessionsOfSeveralPoolsBatchToo) {
    // Contiguous caches (one private pool each), a private paged cache and two sessions of a
    // shared pool, all in one pass: the same logits as stepping each alone.
    const auto model = testing::reference_tiny_model();
    auto pool = make_key_value_cache_pool(model, 4, 8);
    std::vector<DecodeSession> batched;
    std::vector<DecodeSession> alone;
    batched.emplace_back(model, KeyValueCacheKind::Contiguous);
    batched.emplace_back(model, KeyValueCacheKind::Contiguous);
    batched.emplace_back(model, KeyValueCacheKind::Paged, 3);
    batched.emplace_back(model, pool);
    batched.emplace_back(model, pool);
    for (std::size_t i = 0; i < batched.size(); ++i) {
        alone.emplace_back(model);
    }
    const auto prompt = testing::reference_tokens(6, 20);
    std::vector<DecodeWork> work;
    for (std::size_t i = 0; i < batched.size(); ++i) {
        work.push_back({&batched[i], {prompt.data(), i + 1}});  // prompts of 1..5 tokens
    }
    auto logits = decode_batch(work).to_host();
    for (std::size_t i = 0; i < batched.size(); ++i) {
        const auto single = alone[i].prefill({prompt.data(), i + 1}).to_host();
        expect_near(single, logits.data() + i * V, V, 1e-5, "prefill " + std::to_string(i));
    }
    for (std::uint32_t step = 0; step < 3; ++step) {
        std::vector<std::uint32_t> next(batched.size());
        work.clear();
        for (std::size_t i = 0; i < batched.size(); ++i) {
            next[i] = static_cast<std::uint32_t>((step * 5 + i) % V);
            work.push_back({&batched[i], {&next[i], 1}});
        }
        logits = decode_batch(work).to_host();
        for (std::size_t i = 0; i < batched.size(); ++i) {
            expect_near(alone[i].decode_token(next[i]).to_host(), logits.data() + i * V, V, 1e-5,
                        "step " + std::to_string(step) + " session " + std::to_string(i));
        }
    }
}

TEST(DecodeSession, PoolExhaustionLeavesEverySessionUnchanged) {
    const auto model = testing::reference_tiny_model();
    auto pool = make_key_value_cache_pool(model, 4, 5);  // 4 pages make one full context
    DecodeSession a(model, pool);
    DecodeSession b(model, pool);
    static_cast<void>(a.prefill(testing::reference_tokens(12, 8)));  // 3 pages
    static_cast<void>(b.prefill(testing::reference_tokens(4, 9)));   // 1 page
    EXPECT_EQ(pool->free_block_count(), 1U);
    const auto a_next = testing::reference_tokens(4, 10);  // needs 1 more page
    const auto b_next =
        testing::reference_tokens(1, 11);  // needs 1 more page (b leases the last free one)
    std::vector<DecodeWork> work = {{&b, b_next}, {&a, a_next}};
    const auto message =
        message_of<std::runtime_error>([&] { static_cast<void>(decode_batch(work)); });
    EXPECT_NE(message.find("pool exhausted"), std::string::npos) << message;
    EXPECT_EQ(a.size(), 12U);
    EXPECT_EQ(b.size(), 4U);
    EXPECT_EQ(pool->free_block_count(), 1U);
    EXPECT_EQ(a.cache().page_table().size(), 3U);
    EXPECT_EQ(b.cache().page_table().size(), 1U);
    // The same sessions still decode correctly afterwards.
    std::vector<std::uint32_t> b_all = testing::reference_tokens(4, 9);
    b_all.push_back(b_next[0]);
    const auto expected = testing::full_forward_logits(model, b_all);
    expect_near(b.decode_token(b_next[0]).to_host(), expected.data() + 4 * V, V, 1e-5,
                "after the failed step");
    // Reset returns the pages.
    a.reset();
    EXPECT_EQ(pool->free_block_count(), 3U);
}

TEST(DecodeSession, BadTokensAndBadBatchesChangeNothing) {
    const auto model = testing::reference_tiny_model();
    auto pool = make_key_value_cache_pool(model, 4, 8);
    DecodeSession a(model, pool);
    DecodeSession b(model, pool);
    static_cast<void>(a.prefill(testing::reference_tokens(5, 12)));
    const std::size_t leased = pool->leased_block_count();
    EXPECT_THROW(static_cast<void>(a.decode_token(27)), std::out_of_range);
    const std::vector<std::uint32_t> mixed = {1, 2, 99};
    EXPECT_THROW(static_cast<void>(a.prefill(mixed)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(a.prefill({})), std::invalid_argument);
    const std::uint32_t one = 1;
    std::vector<DecodeWork> repeated = {{&a, {&one, 1}}, {&a, {&one, 1}}};
    EXPECT_NE(message_of<std::invalid_argument>([&] {
                  static_cast<void>(decode_batch(repeated));
              }).find("repeats"),
              std::string::npos);
    const auto second = testing::reference_tiny_model(12);
    DecodeSession foreign(second, pool);
    std::vector<DecodeWork> models = {{&a, {&one, 1}}, {&foreign, {&one, 1}}};
    EXPECT_NE(message_of<std::invalid_argument>([&] {
                  static_cast<void>(decode_batch(models));
              }).find("another model"),
              std::string::npos);
    EXPECT_THROW(static_cast<void>(decode_batch({})), std::invalid_argument);
    std::vector<DecodeWork> empty_tokens = {{&a, {}}};
    EXPECT_NE(message_of<std::invalid_argument>([&] {
                  static_cast<void>(decode_batch(empty_tokens));
              }).find("work[0].tokens is empty"),
              std::string::npos);
    std::vector<DecodeWork> null_session = {{nullptr, {&one, 1}}};
    EXPECT_THROW(static_cast<void>(decode_batch(null_session)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(a.prefill(mixed, static_cast<PrefillLogits>(5))),
                 std::invalid_argument);
    EXPECT_EQ(a.size(), 5U);
    EXPECT_EQ(b.size(), 0U);
    EXPECT_EQ(pool->leased_block_count(), leased);
}

TEST(DecodeSession, PoolsAndCachesCheckTheirArguments) {
    const auto model = testing::reference_tiny_model();
    EXPECT_THROW(static_cast<void>(make_key_value_cache_pool(model, 0)), std::invalid_argument);
    const auto small = message_of<std::invalid_argument>(
        [&] { static_cast<void>(make_key_value_cache_pool(model, 4, 3)); });
    EXPECT_NE(small.find("block_count 3"), std::string::npos) << small;
    EXPECT_THROW(static_cast<void>(DecodeSession(model, KeyValueCacheKind::Paged, 0)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(DecodeSession(model, static_cast<KeyValueCacheKind>(7))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(DecodeSession(model, nullptr)), std::invalid_argument);
    // A pool made for another geometry.
    auto wrong = KeyValueCachePool::create({2, 2, 16, 16}, ExecutionBackend::Cpu);
    EXPECT_NE(message_of<std::invalid_argument>([&] {
                  DecodeSession s(model, wrong);
              }).find("does not fit the model"),
              std::string::npos);
    // Page ids must fit uint32, and the pools' size must be addressable: overflow_error,
    // before anything is allocated.
    const std::size_t huge = std::size_t{1} << 33U;
    EXPECT_NE(
        message_of<std::overflow_error>([&] {
            static_cast<void>(KeyValueCachePool::create({1, 1, 1, huge}, ExecutionBackend::Cpu, 1));
        }).find("uint32 page ids"),
        std::string::npos);
    EXPECT_NE(message_of<std::overflow_error>([&] {
                  static_cast<void>(KeyValueCachePool::create({1 << 20, 1 << 20, 1 << 20, 16},
                                                              ExecutionBackend::Cpu, 16));
              }).find("overflow the addressable size"),
              std::string::npos);
    EXPECT_NE(message_of<std::invalid_argument>([&] {
                  static_cast<void>(KeyValueCache::with_private_pool(
                      {2, 4, 8, 0}, ExecutionBackend::Cpu, KeyValueCacheKind::Contiguous));
              }).find("maximum_context 0"),
              std::string::npos);
    auto pool = make_key_value_cache_pool(model, 16, 0);
    EXPECT_EQ(pool->block_count(), 1U);
    EXPECT_EQ(pool->blocks_per_full_cache(), 1U);
    EXPECT_EQ(pool->storage_bytes(), 2U * 2 * 1 * 4 * 16 * 8 * sizeof(float));
    // Transactions: one at a time, lazily leased pages, abort gives them back.
    KeyValueCache cache(make_key_value_cache_pool(model, 4, 0));
    cache.begin(5);
    EXPECT_EQ(cache.page_table().size(), 2U);
    EXPECT_THROW(cache.begin(1), std::logic_error);
    EXPECT_EQ(cache.slot(4).page, cache.page_table()[1]);
    EXPECT_EQ(cache.slot(4).offset, 0U);
    EXPECT_THROW(static_cast<void>(cache.slot(5)), std::out_of_range);
    cache.abort();
    EXPECT_EQ(cache.size(), 0U);
    EXPECT_EQ(cache.pool()->free_block_count(), 4U);
    cache.begin(16);
    cache.commit();
    EXPECT_THROW(cache.begin(1), std::length_error);
    EXPECT_EQ(cache.size(), 16U);
}

TEST(DecodeSession, StructureChangesMakeSessionsStale) {
    auto model = testing::reference_tiny_model();
    DecodeSession session(model);
    static_cast<void>(session.decode_token(3));
    model.attach_lora({});
    EXPECT_TRUE(session.stale());
    const auto message =
        message_of<std::logic_error>([&] { static_cast<void>(session.decode_token(4)); });
    EXPECT_NE(message.find("stale session"), std::string::npos) << message;
    EXPECT_EQ(session.size(), 1U);
    session.reset();
    EXPECT_FALSE(session.stale());
    EXPECT_NO_THROW(static_cast<void>(session.decode_token(4)));
}

TEST(DecodeSession, LoraAndPackedNf4WeightsDecodeLikeTheirFullForward) {
    auto model = testing::reference_tiny_model();
    model.attach_lora({.rank = 2, .alpha = 4.0F, .random_seed = 3, .targets = 0x7F});
    // B starts at zero: give the adapters a visible effect.
    for (const NamedParameter& named : model.lora_parameters()) {
        Variable parameter = named.parameter;
        std::vector<float> values = parameter.value().to_host();
        for (std::size_t i = 0; i < values.size(); ++i) {
            values[i] = 0.05F * std::sin(static_cast<float>(i + 1));
        }
        parameter.set_value(Tensor(parameter.shape(), values));
    }
    const auto tokens = testing::reference_tokens(10, 13);
    const auto adapted = testing::full_forward_logits(model, tokens);
    DecodeSession lora(model);
    expect_near(lora.prefill(tokens, PrefillLogits::All).to_host(), adapted.data(), adapted.size(),
                1e-5, "LoRA");

    auto packed = testing::reference_tiny_model(14);
    packed.quantize_nf4({.block_size = 32, .double_quantization = true, .scale_block_size = 256});
    const auto usage = packed.quantized_memory_usage();
    const auto expected = testing::full_forward_logits(packed, tokens);
    DecodeSession session(packed);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
        expect_near(session.decode_token(tokens[t]).to_host(), expected.data() + t * V, V, 1e-5,
                    "NF4 position " + std::to_string(t));
    }
    // Decoding expanded nothing: the packed weights are all the model holds.
    EXPECT_EQ(packed.quantized_memory_usage().resident_payload_bytes, usage.resident_payload_bytes);
    EXPECT_TRUE(packed.projections()[0].linear->is_quantized());
    EXPECT_FALSE(packed.projections()[0].linear->weight().defined());
}

}  // namespace
}  // namespace riftco_transformer
