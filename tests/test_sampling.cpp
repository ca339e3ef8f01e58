// The native sampler (docs/ARCHITECTURE.md, 'Sampling') against hand-computed draws:
// draw_unit(0, 0) is splitmix64's first output for state 0 (0xE220A8397B1DCDAF) as a 53-bit
// fraction, 0.8833108082136426; draw_unit(3, 0) is 0.11345034205715454. THIRDS has weights by
// id [1/3, 2/3, 1] at T = 1 (sum 2; running sums in id order 1/3, 1, 2).

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/serving/sampling.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::message_of;

const std::vector<float> thirds = {0.0F, static_cast<float>(std::log(2.0)),
                                   static_cast<float>(std::log(3.0))};

std::uint32_t draw(const std::vector<float>& logits, const SamplingOptions& options,
                   std::uint64_t draw_index = 0) {
    SamplingInput input;
    input.logits = logits;
    input.draw_index = draw_index;
    return sample_token(input, options);
}

TEST(Sampling, DrawUnitsAreSplitmix64Fractions) {
    EXPECT_EQ(draw_unit(0, 0), static_cast<double>(0xE220A8397B1DCDAFULL >> 11U) * 0x1.0p-53);
    EXPECT_EQ(draw_unit(0, 1), static_cast<double>(0x6E789E6AA1B965F4ULL >> 11U) * 0x1.0p-53);
    EXPECT_LT(draw_unit(std::numeric_limits<std::uint64_t>::max(), 7), 1.0);
}

TEST(Sampling, GreedyTakesTheFirstMaximumAfterThePenalties) {
    const std::vector<float> logits = {1.0F, 3.0F, 2.0F, 3.0F};
    EXPECT_EQ(draw(logits, {}), 1U);
    SamplingInput input;
    input.logits = logits;
    const std::vector<std::uint32_t> context = {0, 1, 1, 3};
    input.context = context;
    SamplingOptions options;
    options.repetition_penalty = 2.0;  // 3 -> 1.5 for ids 1 and 3: id 2 (2.0) wins
    EXPECT_EQ(sample_token(input, options), 2U);
    options = {};
    options.frequency_penalty = 0.6;  // generated after prompt_length 1: id 1 twice, id 3 once
    input.prompt_length = 1;          // 3 - 1.2 = 1.8 and 3 - 0.6 = 2.4: id 3
    EXPECT_EQ(sample_token(input, options), 3U);
    options.presence_penalty = 0.5;  // 1.3 and 1.9 against 2.0: id 2
    EXPECT_EQ(sample_token(input, options), 2U);
}

TEST(Sampling, TheDrawWalksIdsInAscendingOrder) {
    SamplingOptions options;
    options.temperature = 1.0;
    options.seed = 0;  // threshold 1.767: id 2
    EXPECT_EQ(draw(thirds, options), 2U);
    options.seed = 3;  // threshold 0.227: id 0
    EXPECT_EQ(draw(thirds, options), 0U);
    options.temperature = 0.5;  // weights [1/9, 4/9, 1]: threshold 0.1765 -> id 1
    EXPECT_EQ(draw(thirds, options), 1U);
    options.temperature = 1.0;
    options.seed = 0;  // draw 1 of seed 0: 0.4315 * 2 = 0.863 -> id 1
    EXPECT_EQ(draw(thirds, options, 1), 1U);
}

TEST(Sampling, TopKTopPAndMinPKeepWhatTheRulesSay) {
    SamplingOptions options;
    options.temperature = 1.0;
    options.top_k = 2;  // ids 1, 2 with [2/3, 1]: seed 0 threshold 1.472 -> 2, seed 3 -> 1
    EXPECT_EQ(draw(thirds, options), 2U);
    options.seed = 3;
    EXPECT_EQ(draw(thirds, options), 1U);
    options.top_k = 1;
    EXPECT_EQ(draw(thirds, options), 2U);
    options.top_k = 0;
    options.top_p = 0.45;  // target 0.9 of 2: the top id alone
    for (std::uint64_t index = 0; index < 20; ++index) {
        EXPECT_EQ(draw(thirds, options, index), 2U);
    }
    options.top_p = 0.55;  // ids 2 and 1
    EXPECT_EQ(draw(thirds, options), 1U);
    options.top_p = 1.0;
    options.min_p = 0.5;  // weights >= 0.5: ids 1 and 2
    EXPECT_EQ(draw(thirds, options), 1U);
    options.min_p = 0.7;  // id 2 only
    EXPECT_EQ(draw(thirds, options), 2U);
    // A ranking longer than the first sorted head (64): equal logits, ids ascend.
    std::vector<float> flat(500, 0.0F);
    options = {};
    options.temperature = 1.0;
    options.top_p = 0.5;  // the 250 lowest ids
    for (std::uint64_t index = 0; index < 50; ++index) {
        EXPECT_LT(draw(flat, options, index), 250U);
    }
}

TEST(Sampling, MaskedIdsAreNeverDrawn) {
    const std::vector<float> logits(16, 0.0F);
    std::vector<std::uint8_t> mask(16, 0);
    mask[3] = 1;
    mask[11] = 1;
    SamplingInput input;
    input.logits = logits;
    input.mask = mask;
    SamplingOptions options;
    options.temperature = 1.0;
    for (std::uint64_t index = 0; index < 40; ++index) {
        input.draw_index = index;
        const std::uint32_t id = sample_token(input, options);
        EXPECT_TRUE(id == 3U || id == 11U) << id;
    }
    EXPECT_EQ(sample_token(input, {}), 3U);  // greedy among the allowed
}

TEST(Sampling, EveryRuleIsNamed) {
    const std::vector<float> logits = {0.0F, 1.0F, 2.0F};
    const auto refusal = [&](SamplingInput input, const SamplingOptions& options) {
        if (input.logits.empty()) {
            input.logits = logits;
        }
        return message_of<std::invalid_argument>(
            [&] { static_cast<void>(sample_token(input, options)); });
    };
    SamplingOptions sampled;
    sampled.temperature = 1.0;
    const std::vector<std::uint32_t> outside = {0, 3};
    SamplingInput input;
    input.context = outside;
    EXPECT_NE(refusal(input, sampled).find("context[1] = 3 is outside the vocabulary of 3"),
              std::string::npos);
    input = {};
    const std::vector<std::uint32_t> one = {0};
    input.context = one;
    input.prompt_length = 2;
    EXPECT_NE(refusal(input, sampled).find("prompt_length 2 exceeds the 1 context ids"),
              std::string::npos);
    input = {};
    const std::vector<std::uint8_t> none(3, 0);
    input.mask = none;
    EXPECT_NE(refusal(input, sampled).find("allows no token"), std::string::npos);
    const std::vector<std::uint8_t> short_mask(2, 1);
    input.mask = short_mask;
    EXPECT_NE(refusal(input, sampled).find("the mask has 2 entries for 3 logits"),
              std::string::npos);
    const std::vector<float> infinite = {0.0F, std::numeric_limits<float>::infinity()};
    input = {};
    input.logits = infinite;
    EXPECT_NE(refusal(input, sampled).find("logits[1] = inf is not finite"), std::string::npos);
    struct Case {
        SamplingOptions options;
        const char* fragment;
    };
    const std::array<Case, 8> cases = {{
        {{.temperature = -1.0}, "temperature -1"},
        {{.temperature = std::nan("")}, "temperature nan"},
        {{.temperature = 1.0, .top_k = 4}, "top_k 4 exceeds the vocabulary size 3"},
        {{.temperature = 1.0, .top_p = 1.5}, "top_p 1.5 must be in (0, 1]"},
        {{.temperature = 1.0, .min_p = -0.1}, "min_p -0.10000000000000001 must be in [0, 1]"},
        {{.repetition_penalty = 0.0}, "repetition_penalty 0 must be finite and > 0"},
        {{.presence_penalty = 2.5}, "presence_penalty 2.5 must be in [-2, 2]"},
        {{.top_p = 0.5}, "temperature 0 is greedy decoding"},
    }};
    for (const Case& c : cases) {
        const std::string message = refusal({}, c.options);
        EXPECT_NE(message.find(c.fragment), std::string::npos) << message;
    }
}

TEST(Sampling, LogProbabilitiesAreALogSoftmax) {
    const std::vector<float> logits = {0.0F, static_cast<float>(std::log(3.0)), 0.0F};
    const TokenLogProbabilities result = token_log_probabilities(logits, 1, 3);
    EXPECT_NEAR(result.log_probability, std::log(3.0 / 5.0), 1e-7);
    ASSERT_EQ(result.top_ids, (std::vector<std::uint32_t>{1, 0, 2}));  // ties: the lower id
    EXPECT_NEAR(result.top_log_probabilities[1], std::log(1.0 / 5.0), 1e-7);
    EXPECT_THROW(static_cast<void>(token_log_probabilities(logits, 3, 0)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(token_log_probabilities(logits, 0, 4)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(token_log_probabilities({}, 0, 0)), std::invalid_argument);
}

}  // namespace
}  // namespace riftco_transformer
