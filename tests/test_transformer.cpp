// DecoderOnlyTransformer: structure, parameter names and count, causality, checkpointing.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

// The overflow_error message of constructing a model with `dimensions`, or "" when none is
// thrown. The generator must not have been drawn from when construction is rejected.
std::string construction_overflow_message(const TransformerDimensions& dimensions) {
    std::mt19937 generator(11);
    std::string message;
    try {
        const DecoderOnlyTransformer model(dimensions, generator);
    } catch (const std::overflow_error& error) {
        message = error.what();
    }
    std::mt19937 untouched(11);
    EXPECT_EQ(generator(), untouched()) << "a rejected config drew random weights";
    return message;
}

}  // namespace

// The GPT decoder is the one Decoder with the gpt2 preset: a Decoder built from
// gpt_decoder_config with the same seed has the same parameters (names, order, values) and gives
// bit-identical logits, in the forward, with flash attention and in decoding; tying and the
// activation follow the options.
TEST(Transformer, IsTheOneDecoderWithTheGpt2Preset) {
    for (const bool tie : {false, true}) {
        DecoderOptions options;
        options.tie_embeddings = tie;
        options.feed_forward_activation = tie ? Activation::Relu : Activation::Gelu;
        const TransformerDimensions dimensions = testing::reference_tiny();
        const DecoderConfig config = gpt_decoder_config(dimensions, 1e-5F, options);
        EXPECT_EQ(config.architecture, DecoderArchitecture::Gpt2);
        EXPECT_EQ(config.positions, PositionEncoding::Learned);
        EXPECT_EQ(config.norm, NormKind::Layer);
        EXPECT_EQ(config.feed_forward, FeedForwardKind::Plain);
        EXPECT_EQ(config.plain_activation, options.feed_forward_activation);
        EXPECT_EQ(config.key_value_head_count, dimensions.head_count);
        EXPECT_EQ(config.tie_embeddings, tie);
        std::mt19937 first(21);
        std::mt19937 second(21);
        DecoderOnlyTransformer gpt(dimensions, first, 1e-5F, AttentionKind::Materialized,
                                   ActivationCheckpointing::Disabled, options);
        Decoder general(config, second);
        EXPECT_EQ(first(), second()) << "the same draws";
        EXPECT_STREQ(gpt.model_name(), "DecoderOnlyTransformer");
        const TransformerDimensions read = gpt.dimensions();  // read from the config
        EXPECT_EQ(read.vocabulary_size, 27U);
        EXPECT_EQ(read.maximum_context, 16U);
        EXPECT_EQ(read.model_width, 32U);
        EXPECT_EQ(read.head_count, 4U);
        EXPECT_EQ(read.block_count, 2U);
        EXPECT_EQ(read.feed_forward_width, 64U);
        EXPECT_STREQ(general.model_name(), "Decoder");
        const ParameterList a = gpt.parameters();
        const ParameterList b = general.parameters();
        ASSERT_EQ(a.size(), b.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
            EXPECT_EQ(a[i].name, b[i].name);
            EXPECT_EQ(a[i].parameter.value().to_host(), b[i].parameter.value().to_host())
                << a[i].name;
        }
        const std::vector<std::uint32_t> tokens = {1, 5, 9, 2, 26, 0, 7, 7, 3, 3, 14, 8};
        for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
            gpt.set_attention(kind);
            general.set_attention(kind);
            EXPECT_EQ(gpt.forward(tokens, {2, 6}).value().to_host(),
                      general.forward(tokens, {2, 6}).value().to_host());
        }
        EXPECT_EQ(gpt.options().tie_embeddings, tie);
        if (tie) {
            gpt.untie_embeddings();
            EXPECT_FALSE(gpt.options().tie_embeddings);
            EXPECT_EQ(gpt.parameters().back().name, "language_model_head.bias");
        }
    }
}

TEST(Transformer, ReferenceTinyModelHas19419ParametersInTheContractOrder) {
    std::mt19937 generator(7);
    const DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    EXPECT_EQ(model.parameter_count(), 19419U);
    // 2VD + CD + N(4D² + 2DF + 9D + F) + 2D + V by hand: 1728 + 512 + 2·(4096 + 4096 + 288 + 64) +
    // 64 + 27
    EXPECT_EQ(1728U + 512U + 2U * (4096U + 4096U + 288U + 64U) + 64U + 27U, 19419U);
    std::vector<std::string> names;
    for (const auto& named : model.parameters())
        names.push_back(named.name);
    std::vector<std::string> expected = {"token_embedding.weight", "position_embedding.weight"};
    for (const char* block : {"blocks.0.", "blocks.1."}) {
        for (const char* name :
             {"attention_norm.scale", "attention_norm.bias", "attention.query.weight",
              "attention.query.bias", "attention.key.weight", "attention.key.bias",
              "attention.value.weight", "attention.value.bias", "attention.output.weight",
              "attention.output.bias", "feed_forward_norm.scale", "feed_forward_norm.bias",
              "feed_forward.expand.weight", "feed_forward.expand.bias",
              "feed_forward.project.weight", "feed_forward.project.bias"}) {
            expected.push_back(std::string(block) + name);
        }
    }
    for (const char* name : {"final_norm.scale", "final_norm.bias", "language_model_head.weight",
                             "language_model_head.bias"}) {
        expected.emplace_back(name);
    }
    EXPECT_EQ(names, expected);
}

TEST(Transformer, SameSeedGivesBitIdenticalWeights) {
    std::mt19937 first_generator(42);
    std::mt19937 second_generator(42);
    const DecoderOnlyTransformer first(testing::reference_tiny(), first_generator);
    const DecoderOnlyTransformer second(testing::reference_tiny(), second_generator);
    const ParameterList a = first.parameters();
    const ParameterList b = second.parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(a[i].parameter.value().to_host(),
                                           b[i].parameter.value().to_host()))
            << a[i].name;
    }
}

TEST(Transformer, LaterTokensLeaveEarlierLogitsBitIdentical) {
    for (const auto kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        std::mt19937 generator(3);
        DecoderOnlyTransformer model(testing::reference_tiny(), generator);
        model.set_attention(kind);
        const std::size_t batch = 2;
        const std::size_t time = 12;
        std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(batch * time, 27, 5);
        const std::vector<float> before = model.forward(tokens, {batch, time}).value().to_host();
        const std::size_t cut = 7;
        for (std::size_t b = 0; b < batch; ++b) {
            for (std::size_t t = cut + 1; t < time; ++t)
                tokens[b * time + t] = (tokens[b * time + t] + 11) % 27;
        }
        const std::vector<float> after = model.forward(tokens, {batch, time}).value().to_host();
        for (std::size_t b = 0; b < batch; ++b) {
            const std::size_t begin = b * time * 27;
            const std::vector<float> early_before(
                before.begin() + static_cast<std::ptrdiff_t>(begin),
                before.begin() + static_cast<std::ptrdiff_t>(begin + (cut + 1) * 27));
            const std::vector<float> early_after(
                after.begin() + static_cast<std::ptrdiff_t>(begin),
                after.begin() + static_cast<std::ptrdiff_t>(begin + (cut + 1) * 27));
            EXPECT_TRUE(testing::bit_identical(early_before, early_after)) << "row " << b;
        }
        EXPECT_FALSE(testing::bit_identical(before, after));
    }
}

TEST(Transformer, CheckpointedAndPlainTrainingTakeTheSameAdamSteps) {
    std::mt19937 plain_generator(17);
    std::mt19937 checkpointed_generator(17);
    DecoderOnlyTransformer plain(testing::reference_tiny(), plain_generator);
    DecoderOnlyTransformer checkpointed(testing::reference_tiny(), checkpointed_generator, 1e-5F,
                                        AttentionKind::Flash,
                                        ActivationCheckpointing::TransformerBlock);
    plain.set_attention(AttentionKind::Flash);
    Adam plain_adam(plain.parameters());
    Adam checkpointed_adam(checkpointed.parameters());
    for (std::uint32_t step = 0; step < 3; ++step) {
        const std::vector<std::uint32_t> tokens =
            testing::pseudo_random_tokens(2 * 10, 27, 30 + step);
        const std::vector<std::uint32_t> targets =
            testing::pseudo_random_tokens(2 * 10, 27, 40 + step);
        Variable plain_loss = cross_entropy(plain.forward(tokens, {2, 10}), targets);
        Variable checkpointed_loss = cross_entropy(checkpointed.forward(tokens, {2, 10}), targets);
        EXPECT_NEAR(plain_loss.value().item(), checkpointed_loss.value().item(), 1e-6);
        plain_loss.backward();
        checkpointed_loss.backward();
        const AdamStepStats a = plain_adam.step();
        const AdamStepStats b = checkpointed_adam.step();
        EXPECT_NEAR(a.gradient_norm, b.gradient_norm, 1e-6 * a.gradient_norm);
    }
    const ParameterList p = plain.parameters();
    const ParameterList c = checkpointed.parameters();
    for (std::size_t i = 0; i < p.size(); ++i) {
        EXPECT_TRUE(testing::all_close(c[i].parameter.value(),
                                       testing::to_double(p[i].parameter.value().to_host()), 1e-6,
                                       1e-6))
            << p[i].name;
    }
}

TEST(Transformer, CheckpointedBlocksGiveTheSameLossAndGradients) {
    std::mt19937 generator(11);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 8, 27, 9);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 8, 27, 10);
    const Variable plain_loss = cross_entropy(model.forward(tokens, {2, 8}), targets);
    Variable plain = plain_loss;
    plain.backward();
    std::vector<std::vector<float>> plain_gradients;
    for (const auto& named : model.parameters())
        plain_gradients.push_back(named.parameter.gradient().to_host());

    model.set_activation_checkpointing(ActivationCheckpointing::TransformerBlock);
    Variable checkpointed = cross_entropy(model.forward(tokens, {2, 8}), targets);
    EXPECT_EQ(checkpointed.value().item(), plain_loss.value().item());
    checkpointed.backward();
    const ParameterList parameters = model.parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(testing::all_close(parameters[i].parameter.gradient(),
                                       testing::to_double(plain_gradients[i]), 1e-6, 1e-5))
            << parameters[i].name;
    }
}

TEST(Transformer, FlashAndMaterializedAgreeAndComposeWithCheckpointing) {
    std::mt19937 generator(13);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(3 * 16, 27, 21);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(3 * 16, 27, 22);
    const auto run = [&](AttentionKind kind, ActivationCheckpointing checkpointing) {
        model.set_attention(kind);
        model.set_activation_checkpointing(checkpointing);
        Variable logits = model.forward(tokens, {3, 16});
        std::vector<std::vector<float>> result{logits.value().to_host()};
        cross_entropy(logits, targets).backward();
        for (const auto& named : model.parameters())
            result.push_back(named.parameter.gradient().to_host());
        return result;
    };
    const auto reference = run(AttentionKind::Materialized, ActivationCheckpointing::Disabled);
    for (const auto checkpointing :
         {ActivationCheckpointing::Disabled, ActivationCheckpointing::TransformerBlock}) {
        const auto flash = run(AttentionKind::Flash, checkpointing);
        EXPECT_TRUE(testing::all_close(flash[0], testing::to_double(reference[0]), 3e-5, 0.0));
        for (std::size_t i = 1; i < flash.size(); ++i) {
            EXPECT_TRUE(testing::all_close(flash[i], testing::to_double(reference[i]), 5e-5, 0.0))
                << i;
        }
    }
    EXPECT_THROW(model.set_attention(static_cast<AttentionKind>(5)), std::invalid_argument);
    EXPECT_EQ(model.attention(), AttentionKind::Flash);
}

TEST(Transformer, CheckpointedModelEvaluatesUnderNoGradientGuard) {
    std::mt19937 generator(19);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator, 1e-5F, AttentionKind::Flash,
                                 ActivationCheckpointing::TransformerBlock);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 6, 27, 3);
    const std::vector<float> recorded = model.forward(tokens, {2, 6}).value().to_host();
    const NoGradientGuard no_graph;
    const Variable logits = model.forward(tokens, {2, 6});
    EXPECT_FALSE(logits.requires_gradient());
    EXPECT_TRUE(testing::bit_identical(logits.value().to_host(), recorded));
}

TEST(Transformer, GradientsMatchFiniteDifferencesOnSampledParameters) {
    const TransformerDimensions dims{.vocabulary_size = 11,
                                     .maximum_context = 6,
                                     .model_width = 8,
                                     .head_count = 2,
                                     .block_count = 1,
                                     .feed_forward_width = 12};
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(dims, generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 5, 11, 1);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 5, 11, 2);
    cross_entropy(model.forward(tokens, {2, 5}), targets).backward();
    testing::expect_gradients_match_finite_differences(
        model.parameters(),
        [&] {
            return static_cast<double>(
                cross_entropy(model.forward(tokens, {2, 5}), targets).value().item());
        },
        3);
}

TEST(Transformer, RejectsBadDimensionsAndInputs) {
    std::mt19937 generator(1);
    TransformerDimensions bad = testing::reference_tiny();
    bad.head_count = 5;
    EXPECT_THROW(DecoderOnlyTransformer(bad, generator), std::invalid_argument);
    bad = testing::reference_tiny();
    bad.block_count = 0;
    EXPECT_THROW(DecoderOnlyTransformer(bad, generator), std::invalid_argument);
    EXPECT_THROW(DecoderOnlyTransformer(testing::reference_tiny(), generator, 0.0F),
                 std::invalid_argument);
    const DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::uint32_t> tokens(17, 1);
    EXPECT_THROW(static_cast<void>(model.forward(tokens, {1, 17})),
                 std::invalid_argument);                                                    // T > C
    EXPECT_THROW(static_cast<void>(model.forward(tokens, {2, 8})), std::invalid_argument);  // count
    EXPECT_THROW(static_cast<void>(model.forward(tokens, {17})), std::invalid_argument);    // rank
    const std::vector<std::uint32_t> out_of_range = {1, 27};
    EXPECT_THROW(static_cast<void>(model.forward(out_of_range, {1, 2})), std::out_of_range);
}

TEST(Transformer, RejectsBlockCountPastTheParameterByteLimitBeforeAllocating) {
    // Reference tiny model, by hand: one block is 4D² + 2DF + 9D + F = 8544 floats = 34176
    // bytes; outside the blocks 2VD + CD + 2D + V = 2331 floats = 9324 bytes. The limit is
    // 2^47 bytes, so at most (2^47 − 9324) / 34176 = 4118021077 blocks fit.
    constexpr std::size_t most_blocks = 4118021077U;
    for (const std::size_t block_count :
         {std::numeric_limits<std::size_t>::max(), std::size_t{1} << 40, most_blocks + 1}) {
        TransformerDimensions dimensions = testing::reference_tiny();
        dimensions.block_count = block_count;
        const std::string message = construction_overflow_message(dimensions);
        EXPECT_NE(message.find("block_count " + std::to_string(block_count)), std::string::npos)
            << message;
        EXPECT_NE(message.find("at most 4118021077 blocks fit"), std::string::npos) << message;
    }
}

TEST(Transformer, RejectsWidthsWhoseParameterBytesOverflowBeforeAllocating) {
    TransformerDimensions wide = testing::reference_tiny();
    wide.model_width = std::size_t{1} << 62;  // V·D·4 bytes overflows size_t
    wide.head_count = 1;
    std::string message = construction_overflow_message(wide);
    EXPECT_NE(message.find("model_width too large: token_embedding.weight"), std::string::npos)
        << message;
    EXPECT_NE(message.find("D=4611686018427387904"), std::string::npos) << message;

    TransformerDimensions deep = testing::reference_tiny();
    deep.feed_forward_width = std::numeric_limits<std::size_t>::max();
    message = construction_overflow_message(deep);
    EXPECT_NE(message.find("feed_forward_width too large: blocks.{i}.feed_forward.expand.weight"),
              std::string::npos)
        << message;

    // Each parameter fits but their sum does not: with V = 2^32 and D = 2^12 the token
    // embedding and the LM head weight are 2^46 bytes each, and the position table and final
    // norm already sit between them.
    TransformerDimensions large_vocabulary = testing::reference_tiny();
    large_vocabulary.vocabulary_size = std::size_t{1} << 32;
    large_vocabulary.maximum_context = 1;
    large_vocabulary.model_width = std::size_t{1} << 12;
    message = construction_overflow_message(large_vocabulary);
    EXPECT_NE(message.find("vocabulary_size/model_width too large: language_model_head.weight"),
              std::string::npos)
        << message;
}

}  // namespace riftco_transformer
