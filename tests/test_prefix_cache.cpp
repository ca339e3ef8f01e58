// Prefix caching in the KV pool (docs/ARCHITECTURE.md, 'Prefix caching'): full pages published
// under the exact identity of their tokens, adopted by reference, refcounted, evicted least
// recently released first (deepest page first), and never shared across model versions. The
// oracle for every warm run is the full forward of the same tokens.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::message_of;

constexpr std::size_t V = 27;

double worst_difference(const std::vector<float>& actual, const float* expected,
                        std::size_t count) {
    double worst = 0.0;
    for (std::size_t i = 0; i < count; ++i) {
        worst = std::max(worst, std::fabs(double{actual[i]} - expected[i]));
    }
    return worst;
}

std::shared_ptr<KeyValueCachePool> prefix_pool(const DecoderOnlyTransformer& model,
                                               std::size_t block_count) {
    return make_key_value_cache_pool(model, 4, block_count, true);
}

// Feeds `prompt[reused..]` to a session that adopted `reused` positions and checks the logits
// of every fed position against the full forward over the prompt.
void expect_prompt_logits(const DecoderOnlyTransformer& model, DecodeSession& session,
                          const std::vector<std::uint32_t>& prompt, std::size_t reused) {
    ASSERT_LT(reused, prompt.size());
    const auto expected = testing::full_forward_logits(model, prompt);
    const auto fed =
        session.prefill({prompt.data() + reused, prompt.size() - reused}, PrefillLogits::All)
            .to_host();
    EXPECT_LE(worst_difference(fed, expected.data() + reused * V, (prompt.size() - reused) * V),
              1e-5)
        << "reused " << reused;
    EXPECT_EQ(session.size(), prompt.size());
}

TEST(PrefixCache, AWarmSessionSharesTheColdOnesPagesAndGivesTheSameLogits) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 12);
    const auto cold_prompt = testing::reference_tokens(13, 1);
    DecodeSession cold(model, pool);
    static_cast<void>(cold.prefill(cold_prompt));  // pages 0..2 full and published, page 3 not
    EXPECT_EQ(pool->leased_block_count(), 4U);

    // A prompt that agrees on the first 10 tokens: pages 0 and 1 (tokens 0..7) match.
    auto warm_prompt = cold_prompt;
    warm_prompt[10] = static_cast<std::uint32_t>((warm_prompt[10] + 1) % V);
    DecodeSession warm(model, pool);
    EXPECT_EQ(warm.reuse_prefix(warm_prompt), 8U);
    EXPECT_EQ(warm.size(), 8U);
    ASSERT_EQ(warm.cache().page_table().size(), 2U);
    EXPECT_EQ(warm.cache().page_table()[0], cold.cache().page_table()[0]);  // by reference
    EXPECT_EQ(warm.cache().page_table()[1], cold.cache().page_table()[1]);
    EXPECT_EQ(pool->leased_block_count(), 4U);  // a shared page counts once
    expect_prompt_logits(model, warm, warm_prompt, 8);

    // The whole cold prompt plus a continuation: three pages.
    auto longer = cold_prompt;
    longer.push_back(5);
    DecodeSession third(model, pool);
    EXPECT_EQ(third.reuse_prefix(longer), 12U);
    expect_prompt_logits(model, third, longer, 12);
    // Decoding on continues to agree with the full forward.
    longer.push_back(7);
    const auto expected = testing::full_forward_logits(model, longer);
    EXPECT_LE(worst_difference(third.decode_token(7).to_host(),
                               expected.data() + (longer.size() - 1) * V, V),
              1e-5);
}

TEST(PrefixCache, TheLastPromptTokenIsAlwaysFedAndOnlyWholePagesAreAdopted) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    const auto prompt = testing::reference_tokens(8, 2);
    DecodeSession first(model, pool);
    static_cast<void>(first.prefill(prompt));  // pages 0 and 1 published
    DecodeSession second(model, pool);
    EXPECT_EQ(second.reuse_prefix(prompt), 4U);  // prompt[0, 7) holds one whole page
    expect_prompt_logits(model, second, prompt, 4);
    DecodeSession short_prompt(model, pool);
    EXPECT_EQ(short_prompt.reuse_prefix({prompt.data(), 1}), 0U);
    EXPECT_EQ(short_prompt.reuse_prefix({prompt.data(), 4}), 0U);  // [0, 3): no whole page
    EXPECT_EQ(short_prompt.reuse_prefix({prompt.data(), 5}), 4U);
}

TEST(PrefixCache, IdentityIsExactTokensPositionsVersionAndNamespace) {
    auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 12);
    const auto prompt = testing::reference_tokens(12, 3);
    DecodeSession source(model, pool);
    static_cast<void>(source.prefill(prompt));
    {  // One token differing in the first page: nothing matches (later pages extend it).
        auto other = prompt;
        other[1] = static_cast<std::uint32_t>((other[1] + 1) % V);
        DecodeSession session(model, pool);
        EXPECT_EQ(session.reuse_prefix(other), 0U);
    }
    {  // The second page's tokens at another position (a shifted prompt): no match.
        std::vector<std::uint32_t> shifted(prompt.begin() + 4, prompt.end());
        shifted.push_back(1);
        DecodeSession session(model, pool);
        EXPECT_EQ(session.reuse_prefix(shifted), 0U);
    }
    {  // Another namespace (the C ABI's parameter epoch): no match, then its own pages.
        DecodeSession session(model, pool);
        session.set_prefix_namespace(1);
        EXPECT_EQ(session.reuse_prefix(prompt), 0U);
        DecodeSession same(model, pool);
        EXPECT_EQ(same.reuse_prefix(prompt), 8U);
    }
    source.reset();
    model.attach_lora({});  // a new structure version: the old pages must not be adopted
    DecodeSession after(model, pool);
    EXPECT_EQ(after.reuse_prefix(prompt), 0U);
    expect_prompt_logits(model, after, prompt, 0);
    DecodeSession again(model, pool);
    EXPECT_EQ(again.reuse_prefix(prompt), 8U);
    expect_prompt_logits(model, again, prompt, 8);
}

TEST(PrefixCache, CachedPagesAreEvictedLeastRecentlyReleasedDeepestFirst) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 6);
    const auto prompt = testing::reference_tokens(12, 4);
    {
        DecodeSession first(model, pool);
        static_cast<void>(first.prefill(prompt));  // pages 0, 1, 2: all full, all published
        EXPECT_EQ(pool->cached_block_count(), 0U);
    }
    EXPECT_EQ(pool->cached_block_count(), 3U);
    EXPECT_EQ(pool->free_block_count(), 6U);  // cached pages count as free: lease may take them
    EXPECT_EQ(pool->leased_block_count(), 0U);
    // 16 unrelated tokens need 4 pages: the 3 never-used ones, then one evicted: the deepest.
    {
        DecodeSession other(model, pool);
        static_cast<void>(other.prefill(testing::reference_tokens(16, 5)));
        EXPECT_EQ(pool->cached_block_count(), 2U);
        EXPECT_EQ(pool->free_block_count(), 2U);
    }  // other's 4 pages are cached now, after pages 1 and 0
    EXPECT_EQ(pool->cached_block_count(), 6U);
    auto longer = prompt;
    longer.push_back(3);
    DecodeSession warm(model, pool);
    EXPECT_EQ(warm.reuse_prefix(longer), 8U);      // pages 0 and 1 survived, page 2 did not
    EXPECT_EQ(pool->cached_block_count(), 4U);     // 0 and 1 are held now
    expect_prompt_logits(model, warm, longer, 8);  // evicts two of other's pages
    EXPECT_EQ(pool->cached_block_count(), 2U);
}

TEST(PrefixCache, ASharedPageLivesUntilItsLastHolderLetsGo) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 7);
    auto prompt = testing::reference_tokens(9, 6);
    DecodeSession a(model, pool);
    static_cast<void>(a.prefill(prompt));
    DecodeSession b(model, pool);
    ASSERT_EQ(b.reuse_prefix(prompt), 8U);
    a.reset();  // b still holds pages 0 and 1: they are neither free nor cached
    EXPECT_EQ(pool->cached_block_count(), 0U);
    EXPECT_EQ(pool->leased_block_count(), 2U);
    // Another sequence takes 4 of the 5 other pages, never b's: b then takes the last one.
    DecodeSession c(model, pool);
    static_cast<void>(c.prefill(testing::reference_tokens(16, 7)));
    EXPECT_EQ(pool->free_block_count(), 1U);
    expect_prompt_logits(model, b, prompt, 8);
    EXPECT_EQ(pool->free_block_count(), 0U);
}

TEST(PrefixCache, ConcurrentColdTwinsPublishOnceAndChainsContinueThroughTheTwin) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 12);
    const auto prompt = testing::reference_tokens(6, 8);
    DecodeSession a(model, pool);
    DecodeSession b(model, pool);
    std::vector<DecodeWork> work = {{&a, prompt}, {&b, prompt}};
    static_cast<void>(decode_batch(work));  // both complete page 0; only a's is published
    // b goes on alone and completes page 1, published as an extension of a's page 0.
    auto longer = prompt;
    for (const std::uint32_t token : {1U, 2U, 3U}) {
        longer.push_back(token);
        static_cast<void>(b.decode_token(token));
    }
    b.reset();
    a.reset();
    DecodeSession warm(model, pool);
    longer.push_back(4);
    EXPECT_EQ(warm.reuse_prefix(longer), 8U);
    expect_prompt_logits(model, warm, longer, 8);
}

TEST(PrefixCache, ClearingForgetsEveryPrefixAndFreesTheCachedPages) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    const auto prompt = testing::reference_tokens(13, 9);
    DecodeSession holder(model, pool);
    static_cast<void>(holder.prefill(prompt));
    {
        DecodeSession released(model, pool);
        static_cast<void>(released.prefill(testing::reference_tokens(8, 10)));
    }
    EXPECT_EQ(pool->cached_block_count(), 2U);
    pool->clear_prefix_cache();
    EXPECT_EQ(pool->cached_block_count(), 0U);
    EXPECT_EQ(pool->free_block_count(), 4U);
    DecodeSession session(model, pool);
    EXPECT_EQ(session.reuse_prefix(prompt), 0U);
    holder.reset();  // its formerly published pages go straight back to the free list
    EXPECT_EQ(pool->cached_block_count(), 0U);
    EXPECT_EQ(pool->free_block_count(), 8U);
}

TEST(PrefixCache, WithoutPrefixCachingNothingIsPublishedOrAdopted) {
    const auto model = testing::reference_tiny_model();
    auto pool = make_key_value_cache_pool(model, 4, 8);
    EXPECT_FALSE(pool->prefix_caching());
    const auto prompt = testing::reference_tokens(9, 11);
    {
        DecodeSession a(model, pool);
        static_cast<void>(a.prefill(prompt));
    }
    EXPECT_EQ(pool->cached_block_count(), 0U);
    EXPECT_EQ(pool->free_block_count(), 8U);
    DecodeSession b(model, pool);
    EXPECT_EQ(b.reuse_prefix(prompt), 0U);
    DecodeSession private_cache(model);
    EXPECT_EQ(private_cache.reuse_prefix(prompt), 0U);
}

TEST(PrefixCache, BadCallsChangeNothing) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    const auto prompt = testing::reference_tokens(9, 12);
    DecodeSession a(model, pool);
    static_cast<void>(a.prefill(prompt));
    const std::size_t leased = pool->leased_block_count();
    // Only an empty session adopts.
    auto message = message_of<std::logic_error>([&] { static_cast<void>(a.reuse_prefix(prompt)); });
    EXPECT_NE(message.find("only by an empty session"), std::string::npos) << message;
    EXPECT_EQ(a.size(), 9U);
    EXPECT_THROW(a.set_prefix_namespace(3), std::logic_error);
    // An id outside the vocabulary is named.
    auto bad = prompt;
    bad[2] = static_cast<std::uint32_t>(V);
    DecodeSession b(model, pool);
    message = message_of<std::out_of_range>([&] { static_cast<void>(b.reuse_prefix(bad)); });
    EXPECT_NE(message.find("prompt[2] = 27"), std::string::npos) << message;
    EXPECT_EQ(b.size(), 0U);
    EXPECT_EQ(pool->leased_block_count(), leased);
    // A transaction's token ids must cover its positions.
    KeyValueCache cache(pool);
    const std::vector<std::uint32_t> three = {1, 2, 3};
    message = message_of<std::invalid_argument>([&] { cache.begin(2, three); });
    EXPECT_NE(message.find("3 token ids given for 2 positions"), std::string::npos) << message;
    EXPECT_FALSE(cache.in_transaction());
    EXPECT_EQ(pool->leased_block_count(), leased);
    // A cache stepped without its token ids publishes nothing afterwards.
    cache.begin(4);
    cache.commit();
    cache.begin(4, std::vector<std::uint32_t>{1, 2, 3, 4});
    cache.commit();
    cache.reset();
    EXPECT_EQ(pool->cached_block_count(), 0U);
}

}  // namespace
}  // namespace riftco_transformer

namespace riftco_transformer {
namespace {

// The pool as the serving engine's one page ledger (docs/ARCHITECTURE.md, 'Admission').
TEST(PoolReservations, AdmissionCountsPagesAvailableNowAndBudgetsCapAtTheContext) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);  // 4 positions a page, 16 a context
    EXPECT_EQ(pool->blocks_for(1), 1U);
    EXPECT_EQ(pool->blocks_for(5), 2U);
    EXPECT_EQ(pool->blocks_for(1000), 4U);
    EXPECT_THROW(static_cast<void>(pool->blocks_for(0)), std::invalid_argument);
    using Admission = KeyValueCachePool::Admission;
    EXPECT_EQ(pool->admission(8), Admission::Admit);
    EXPECT_EQ(pool->admission(9), Admission::Reject);
    DecodeSession a(model, pool, 16);
    DecodeSession b(model, pool, 13);
    EXPECT_EQ(a.cache().reserved_pages(), 4U);
    EXPECT_EQ(pool->reserved_block_count(), 8U);
    EXPECT_EQ(pool->available_block_count(), 0U);
    EXPECT_EQ(pool->admission(1), Admission::Wait);
    const auto message = message_of<std::runtime_error>([&] { DecodeSession c(model, pool, 1); });
    EXPECT_NE(message.find("pool full: a reservation of 1 pages, only 0 of 8 are available"),
              std::string::npos)
        << message;
    EXPECT_EQ(pool->reserved_block_count(), 8U);
    EXPECT_THROW(DecodeSession(model, pool, 0), std::invalid_argument);
    {
        DecodeSession moved = std::move(b);  // the reservation moves with the cache
        EXPECT_EQ(pool->reserved_block_count(), 8U);
    }
    EXPECT_EQ(pool->reserved_block_count(), 4U);
    EXPECT_EQ(pool->available_block_count(), 4U);
}

TEST(PoolReservations, AReservedSessionNeverMeetsAnExhaustedPool) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    DecodeSession reserved(model, pool, 16);
    DecodeSession plain(model, pool);  // no reservation: only pages nobody was promised
    static_cast<void>(plain.prefill(testing::reference_tokens(16, 20)));
    EXPECT_EQ(pool->free_block_count(), 4U);
    DecodeSession other(model, pool);
    const auto message =
        message_of<std::runtime_error>([&] { static_cast<void>(other.decode_token(1)); });
    EXPECT_NE(message.find("promised to sessions with reservations"), std::string::npos) << message;
    EXPECT_EQ(other.size(), 0U);
    const auto prompt = testing::reference_tokens(16, 21);
    const auto expected = testing::full_forward_logits(model, prompt);
    EXPECT_LE(worst_difference(reserved.prefill(prompt).to_host(), expected.data() + 15 * V, V),
              1e-5);
}

TEST(PoolReservations, AStepPastTheReservationChangesNothing) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    DecodeSession session(model, pool, 5);  // 2 pages
    static_cast<void>(session.prefill(testing::reference_tokens(8, 22)));
    const auto message =
        message_of<std::length_error>([&] { static_cast<void>(session.decode_token(1)); });
    EXPECT_NE(message.find("9 positions need 3 pages, more than the cache's reservation of 2"),
              std::string::npos)
        << message;
    EXPECT_EQ(session.size(), 8U);
    EXPECT_EQ(pool->leased_block_count(), 2U);
    EXPECT_EQ(pool->available_block_count(), 6U);
}

TEST(PoolReservations, SharingSavesPagesAndComputeButNotReservations) {
    // A session sharing pages may later need all of its reservation on its own (when it resets,
    // or the others let the shared pages go), so sharing admits no extra reservation.
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    const auto prompt = testing::reference_tokens(16, 23);
    DecodeSession a(model, pool, 16);
    static_cast<void>(a.prefill(prompt));
    DecodeSession b(model, pool, 16);
    EXPECT_EQ(b.reuse_prefix(prompt), 12U);  // 3 of a's pages, by reference
    expect_prompt_logits(model, b, prompt, 12);
    EXPECT_EQ(pool->leased_block_count(), 5U);  // 4 + 1 of b's own: 3 pages saved
    EXPECT_EQ(pool->available_block_count(), 0U);
    EXPECT_EQ(pool->admission(1), KeyValueCachePool::Admission::Wait);
    a.reset();  // b still holds the shared pages; then b needs its whole reservation again
    b.reset();
    static_cast<void>(b.prefill(testing::reference_tokens(16, 24)));
    static_cast<void>(a.prefill(testing::reference_tokens(16, 25)));
    EXPECT_EQ(pool->leased_block_count(), 8U);
}

TEST(PoolReservations, CachedPagesPromisedToReservationsAreNotAdoptedWithoutOne) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 8);
    const auto prompt = testing::reference_tokens(16, 25);
    {
        DecodeSession a(model, pool);
        static_cast<void>(a.prefill(prompt));
    }
    EXPECT_EQ(pool->cached_block_count(), 4U);
    DecodeSession r1(model, pool, 16);
    DecodeSession r2(model, pool, 16);  // every free page (cached ones too) is promised
    DecodeSession plain(model, pool);
    EXPECT_EQ(plain.reuse_prefix(prompt), 0U);
    EXPECT_EQ(pool->available_block_count(), 0U);
    EXPECT_EQ(r1.reuse_prefix(prompt), 12U);  // a reserved session may take them
    EXPECT_EQ(pool->available_block_count(), 0U);
}

}  // namespace
}  // namespace riftco_transformer

namespace riftco_transformer {
namespace {

// Random reserved sessions (and a few without reservations) sharing a prefix-caching pool:
// whatever they do (prefill, decode, adopt a prefix, reset, end), no reserved session ever
// meets an exhausted pool, and the pages available for new reservations are always free.
// (Admitting reservations against pages saved by sharing failed this within 500 rounds.)
TEST(PoolReservations, RandomWorkloadsNeverExhaustAReservedSession) {
    const auto model = testing::reference_tiny_model();
    auto pool = prefix_pool(model, 10);
    std::mt19937 generator(123);
    const auto pick = [&](std::size_t bound) { return generator() % bound; };
    const std::vector<std::uint32_t> shared = testing::reference_tokens(16, 40);
    std::vector<std::unique_ptr<DecodeSession>> sessions;
    std::vector<std::size_t> budgets;
    std::vector<bool> reserved;
    for (int round = 0; round < 1500; ++round) {
        const std::size_t action = pick(6);
        if (action == 0 || sessions.empty()) {  // admit one more, when the pool says so
            const std::size_t budget = 1 + pick(16);
            const bool with_reservation = pick(5) != 0;
            if (!with_reservation ||
                pool->admission(pool->blocks_for(budget)) == KeyValueCachePool::Admission::Admit) {
                sessions.push_back(with_reservation
                                       ? std::make_unique<DecodeSession>(model, pool, budget)
                                       : std::make_unique<DecodeSession>(model, pool));
                budgets.push_back(budget);
                reserved.push_back(with_reservation);
                if (pick(2) == 0) {  // a prompt sharing a prefix with earlier ones
                    const std::size_t length = std::min(budget, 2 + pick(15));
                    std::vector<std::uint32_t> prompt(shared.begin(),
                                                      shared.begin() + static_cast<long>(length));
                    static_cast<void>(sessions.back()->reuse_prefix(prompt));
                }
            }
            continue;
        }
        const std::size_t which = pick(sessions.size());
        DecodeSession& session = *sessions[which];
        if (action == 1) {  // end it
            sessions.erase(sessions.begin() + static_cast<long>(which));
            budgets.erase(budgets.begin() + static_cast<long>(which));
            reserved.erase(reserved.begin() + static_cast<long>(which));
        } else if (action == 2) {
            session.reset();
        } else {  // feed within its budget: 1 token, or a chunk of the shared prompt
            const std::size_t room = budgets[which] - std::min(budgets[which], session.size());
            if (room == 0) {
                session.reset();
                continue;
            }
            const std::size_t count = action == 3 ? 1 : 1 + pick(room);
            std::vector<std::uint32_t> tokens(std::min(count, room));
            for (std::size_t i = 0; i < tokens.size(); ++i) {
                const std::size_t position = session.size() + i;
                tokens[i] = position < shared.size() && pick(4) != 0
                                ? shared[position]
                                : static_cast<std::uint32_t>(pick(V));
            }
            if (reserved[which]) {
                ASSERT_NO_THROW(static_cast<void>(session.prefill(tokens)))
                    << "round " << round << ": a reserved session met an exhausted pool";
            } else {
                const std::size_t before = session.size();
                try {
                    static_cast<void>(session.prefill(tokens));
                } catch (const std::runtime_error&) {  // beyond the reservations: refused
                    ASSERT_EQ(session.size(), before);
                }
            }
        }
        ASSERT_LE(pool->available_block_count(), pool->free_block_count()) << "round " << round;
        ASSERT_LE(pool->leased_block_count(), pool->block_count());
    }
    sessions.clear();
    EXPECT_EQ(pool->reserved_block_count(), 0U);
    EXPECT_EQ(pool->available_block_count(), pool->block_count());
}

}  // namespace
}  // namespace riftco_transformer
