// LoRA dropout on the adapter input (docs/ARCHITECTURE.md, 'LoRA'): the counter-based masks,
// the config's rules, training-only application, the model's dropout key (determinism and
// resume), replays of checkpointed blocks, QLoRA, and the factor gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr float probability = 0.25F;

// Gives every factor small non-zero values, so adapters change the outputs.
void perturb_adapters(const DecoderOnlyTransformer& model, std::uint32_t seed) {
    for (const NamedParameter& named : model.lora_parameters()) {
        Variable factor = named.parameter;
        factor.set_value(Tensor(
            factor.shape(), testing::pseudo_random(factor.value().numel(), -0.3F, 0.3F, seed++)));
    }
}

std::unique_ptr<DecoderOnlyTransformer> adapted_model(
    float dropout, bool quantized = false,
    ActivationCheckpointing checkpointing = ActivationCheckpointing::Disabled) {
    std::mt19937 generator(5);
    auto model = std::make_unique<DecoderOnlyTransformer>(
        testing::reference_tiny(), generator, 1e-5F, AttentionKind::Materialized, checkpointing);
    if (quantized)
        model->quantize_nf4();
    model->attach_lora({.rank = 2, .targets = 0x3F, .dropout = dropout});
    perturb_adapters(*model, 17);
    return model;
}

const std::vector<std::uint32_t>& tokens() {
    static const std::vector<std::uint32_t> ids = testing::pseudo_random_tokens(2 * 7, 27, 1);
    return ids;
}
const std::vector<std::uint32_t>& targets() {
    static const std::vector<std::uint32_t> ids = testing::pseudo_random_tokens(2 * 7, 27, 2);
    return ids;
}

std::vector<float> training_logits(const DecoderOnlyTransformer& model) {
    return model.forward(tokens(), {2, 7}).value().to_host();
}
std::vector<float> evaluation_logits(const DecoderOnlyTransformer& model) {
    const NoGradientGuard guard;
    return model.forward(tokens(), {2, 7}).value().to_host();
}
float training_loss(const DecoderOnlyTransformer& model) {
    return cross_entropy(model.forward(tokens(), {2, 7}), targets()).value().item();
}

}  // namespace

TEST(LoraDropoutMask, KeptFractionAndScaleFollowTheProbability) {
    constexpr std::size_t count = std::size_t{1} << 20U;
    for (const float p : {0.05F, 0.25F, 0.5F, 0.9F}) {
        const std::vector<float> mask =
            tensor_ops::dropout_mask({count}, ExecutionBackend::Cpu, p, 5489, 3, 2).to_host();
        const float kept_value = 1.0F / (1.0F - p);
        const std::uint64_t stream = tensor_ops::dropout_stream(5489, 3, 2);
        const std::uint64_t threshold = tensor_ops::dropout_threshold(p);
        std::size_t kept = 0;
        for (std::size_t i = 0; i < count; ++i) {
            const bool keeps = tensor_ops::dropout_keeps(stream, i, threshold);
            // Kept: exactly 1/(1 - p) in float (so x ⊙ m scales by it); dropped: 0.
            ASSERT_EQ(mask[i], keeps ? kept_value : 0.0F) << p << " at " << i;
            kept += keeps ? 1 : 0;
        }
        const double n = static_cast<double>(count);
        const double q = 1.0 - static_cast<double>(p);
        const double deviation = std::sqrt(n * q * (1.0 - q));
        EXPECT_LE(std::fabs(static_cast<double>(kept) - n * q), 4.5 * deviation) << p;
    }
    // p = 0 keeps everything at 1.
    for (const float value :
         tensor_ops::dropout_mask({4096}, ExecutionBackend::Cpu, 0.0F, 1, 2, 3).to_host())
        ASSERT_EQ(value, 1.0F);
}

TEST(LoraDropoutMask, IsAPureFunctionOfSeedKeyStreamAndElement) {
    const auto draw = [](std::uint64_t seed, std::uint64_t key, std::uint64_t stream) {
        return tensor_ops::dropout_mask({3, 4096}, ExecutionBackend::Cpu, 0.5F, seed, key, stream)
            .to_host();
    };
    EXPECT_EQ(draw(1, 2, 3), draw(1, 2, 3));
    EXPECT_NE(draw(1, 2, 3), draw(2, 2, 3));
    EXPECT_NE(draw(1, 2, 3), draw(1, 3, 3));
    EXPECT_NE(draw(1, 2, 3), draw(1, 2, 4));
    // Element i depends on i alone, not on the shape around it.
    const std::vector<float> flat =
        tensor_ops::dropout_mask({3 * 4096}, ExecutionBackend::Cpu, 0.5F, 1, 2, 3).to_host();
    EXPECT_EQ(flat, draw(1, 2, 3));
    for (const float bad : {-0.1F, 1.0F, 1.5F, std::nanf("")}) {
        const std::string message = testing::message_of<std::invalid_argument>([&] {
            static_cast<void>(tensor_ops::dropout_mask({4}, ExecutionBackend::Cpu, bad, 1, 2, 3));
        });
        EXPECT_NE(message.find("probability"), std::string::npos) << message;
    }
}

TEST(LoraDropout, ConfigRejectsAProbabilityOutsideZeroToOneAndChangesNothing) {
    EXPECT_EQ(LoraConfig{}.dropout, 0.0F);
    for (const float bad : {-0.25F, 1.0F, 2.0F, std::nanf(""), INFINITY}) {
        const LoraConfig config{.dropout = bad};
        std::string message = testing::message_of<std::invalid_argument>(
            [&] { static_cast<void>(lora_scale(config, "test")); });
        EXPECT_NE(message.find("dropout"), std::string::npos) << message;
        std::mt19937 generator(5);
        DecoderOnlyTransformer model(testing::reference_tiny(), generator);
        const std::vector<float> before = evaluation_logits(model);
        message = testing::message_of<std::invalid_argument>([&] { model.attach_lora(config); });
        EXPECT_NE(message.find("dropout"), std::string::npos) << message;
        std::ostringstream value;
        value << bad;
        EXPECT_NE(message.find("(got " + value.str() + ")"), std::string::npos) << message;
        EXPECT_FALSE(model.lora_attached());
        EXPECT_EQ(model.lora_dropout_key(), 0U);
        EXPECT_EQ(evaluation_logits(model), before);
        model.attach_lora({});  // the model still takes its one adapter
    }
    std::mt19937 generator(1);
    const std::string message = testing::message_of<std::invalid_argument>([&] {
        LowRankAdapter adapter(4, 4, 2, 1.0F, generator, ExecutionBackend::Cpu);
        adapter.set_dropout(1.0F, 0, 0);
    });
    EXPECT_NE(message.find("dropout"), std::string::npos) << message;
}

TEST(LoraDropout, ZeroProbabilityAndEvaluationForwardsAreTheUndroppedPath) {
    const std::unique_ptr<DecoderOnlyTransformer> plain_model = adapted_model(0.0F);
    DecoderOnlyTransformer& plain = *plain_model;
    const std::unique_ptr<DecoderOnlyTransformer> dropped_model = adapted_model(probability);
    DecoderOnlyTransformer& dropped = *dropped_model;
    const std::vector<float> reference = evaluation_logits(plain);
    // p = 0: the fused path in training too, and no key is taken.
    EXPECT_EQ(training_logits(plain), reference);
    EXPECT_EQ(plain.lora_dropout_key(), 0U);
    // p > 0 under NoGradientGuard: exactly the undropped forward, key untouched.
    EXPECT_EQ(evaluation_logits(dropped), reference);
    EXPECT_EQ(dropped.lora_dropout_key(), 0U);
    // Disabled (evaluation through a forward that records a graph): the same.
    dropped.set_lora_dropout_enabled(false);
    EXPECT_EQ(training_logits(dropped), reference);
    EXPECT_EQ(dropped.lora_dropout_key(), 0U);
    dropped.set_lora_dropout_enabled(true);
    // A training forward drops, and takes a key (every forward form does).
    EXPECT_NE(training_logits(dropped), reference);
    EXPECT_EQ(dropped.lora_dropout_key(), 1U);
    const IndexTensor ids({2, 7}, tokens(), ExecutionBackend::Cpu);
    EXPECT_NE(dropped.forward(ids).value().to_host(), reference);
    EXPECT_EQ(dropped.lora_dropout_key(), 2U);
}

TEST(LoraDropout, ALinearComputesTheBaseAndTheAdapterOfTheMaskedInput) {
    std::mt19937 generator(3);
    Linear layer(6, 5, generator);
    LowRankAdapter adapter(6, 5, 2, 3.0F, generator, ExecutionBackend::Cpu);
    Variable b = adapter.b();
    b.set_value(Tensor({5, 2}, testing::pseudo_random(10, -0.5F, 0.5F, 9)));
    adapter.set_dropout(probability, 77, 4);
    const Tensor a = adapter.a().value();
    layer.attach_adapter(std::move(adapter));
    const std::vector<float> x = testing::pseudo_random(3 * 6, -1.0F, 1.0F, 2);
    const Variable input(Tensor({3, 6}, x), true);
    std::vector<float> y;
    {
        const LoraDropoutScope scope(std::uint64_t{12});
        y = layer.forward(input).value().to_host();
    }
    // The reference in double: x·Wᵀ + b + scale·((x ⊙ m)·Aᵀ)·Bᵀ, m from the generator.
    const std::vector<float> w = layer.weight().value().to_host();
    const std::vector<float> av = a.to_host();
    const std::vector<float> bv = b.value().to_host();
    const std::uint64_t stream = tensor_ops::dropout_stream(77, 12, 4);
    const std::uint64_t threshold = tensor_ops::dropout_threshold(probability);
    std::size_t dropped = 0;
    for (std::size_t r = 0; r < 3; ++r) {
        std::vector<double> masked(6);
        for (std::size_t i = 0; i < 6; ++i) {
            const bool keeps = tensor_ops::dropout_keeps(stream, r * 6 + i, threshold);
            dropped += keeps ? 0 : 1;
            masked[i] = keeps ? x[r * 6 + i] / (1.0 - probability) : 0.0;
        }
        for (std::size_t o = 0; o < 5; ++o) {
            double expected = 0.0;
            for (std::size_t i = 0; i < 6; ++i)
                expected += static_cast<double>(x[r * 6 + i]) * w[o * 6 + i];
            for (std::size_t k = 0; k < 2; ++k) {
                double hidden = 0.0;
                for (std::size_t i = 0; i < 6; ++i)
                    hidden += masked[i] * av[k * 6 + i];
                expected += 1.5 * hidden * bv[o * 2 + k];  // scale 3/2
            }
            EXPECT_NEAR(y[r * 5 + o], expected, 1e-5) << r << "," << o;
        }
    }
    EXPECT_GT(dropped, 0U);  // the case really drops something
}

TEST(LoraDropout, TheKeyMakesTrainingDeterministicAndResumable) {
    const std::unique_ptr<DecoderOnlyTransformer> model_model = adapted_model(probability);
    DecoderOnlyTransformer& model = *model_model;
    EXPECT_EQ(model.lora_dropout_key(), 0U);
    model.set_lora_dropout_key(41);
    const float first = training_loss(model);
    EXPECT_EQ(model.lora_dropout_key(), 42U);
    const float second = training_loss(model);
    EXPECT_EQ(model.lora_dropout_key(), 43U);
    EXPECT_NE(first, second);  // a new mask per forward
    // Restoring the key replays the masks bit for bit, in this model or another.
    model.set_lora_dropout_key(41);
    EXPECT_EQ(training_loss(model), first);
    EXPECT_EQ(training_loss(model), second);
    const std::unique_ptr<DecoderOnlyTransformer> resumed_model = adapted_model(probability);
    DecoderOnlyTransformer& resumed = *resumed_model;
    resumed.set_lora_dropout_key(42);
    EXPECT_EQ(training_loss(resumed), second);
}

TEST(LoraDropout, CheckpointedBlocksReplayTheirForwardsMasks) {
    std::vector<std::vector<float>> gradients[2];
    for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
        const std::unique_ptr<DecoderOnlyTransformer> owner =
            adapted_model(probability, false,
                          checkpointed ? ActivationCheckpointing::TransformerBlock
                                       : ActivationCheckpointing::Disabled);
        DecoderOnlyTransformer& model = *owner;
        model.set_lora_dropout_key(5);
        Variable loss = cross_entropy(model.forward(tokens(), {2, 7}), targets());
        // Another training forward in between moves the key; the replay keeps its own.
        static_cast<void>(training_loss(model));
        loss.backward();
        for (const NamedParameter& named : model.lora_parameters())
            gradients[checkpointed].push_back(named.parameter.gradient().to_host());
    }
    ASSERT_EQ(gradients[0].size(), gradients[1].size());
    for (std::size_t i = 0; i < gradients[0].size(); ++i)
        EXPECT_TRUE(
            testing::all_close(gradients[1][i], testing::to_double(gradients[0][i]), 1e-5, 1e-5))
            << i;
}

TEST(LoraDropout, GradientsOfTheFactorsMatchFiniteDifferencesUnderAFixedKey) {
    const TransformerDimensions dims{.vocabulary_size = 11,
                                     .maximum_context = 6,
                                     .model_width = 8,
                                     .head_count = 2,
                                     .block_count = 1,
                                     .feed_forward_width = 12};
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(dims, generator);
    model.attach_lora(
        {.rank = 2, .alpha = 3.0F, .targets = lora_known_targets & 0x7F, .dropout = 0.3F});
    perturb_adapters(model, 40);
    const std::vector<std::uint32_t> ids = testing::pseudo_random_tokens(2 * 5, 11, 1);
    const std::vector<std::uint32_t> wanted = testing::pseudo_random_tokens(2 * 5, 11, 2);
    constexpr std::uint64_t key = 9;
    const auto loss = [&] {
        model.set_lora_dropout_key(key);
        return static_cast<double>(
            cross_entropy(model.forward(ids, {2, 5}), wanted).value().item());
    };
    model.set_lora_dropout_key(key);
    cross_entropy(model.forward(ids, {2, 5}), wanted).backward();
    testing::expect_gradients_match_finite_differences(model.lora_parameters(), loss, 4);
    // The probe's losses were dropped ones: they differ from the undropped loss.
    double undropped = 0.0;
    {
        const NoGradientGuard guard;
        undropped = cross_entropy(model.forward(ids, {2, 5}), wanted).value().item();
    }
    EXPECT_NE(loss(), undropped);
}

TEST(LoraDropout, QloraDropsTheAdapterInputOverPackedWeights) {
    const std::unique_ptr<DecoderOnlyTransformer> plain_model = adapted_model(0.0F, true);
    DecoderOnlyTransformer& plain = *plain_model;
    const std::unique_ptr<DecoderOnlyTransformer> dropped_model = adapted_model(probability, true);
    DecoderOnlyTransformer& dropped = *dropped_model;
    const std::vector<float> reference = evaluation_logits(plain);
    EXPECT_EQ(evaluation_logits(dropped), reference);
    dropped.set_lora_dropout_key(3);
    const float first = training_loss(dropped);
    EXPECT_NE(first, training_loss(plain));
    dropped.set_lora_dropout_key(3);
    EXPECT_EQ(training_loss(dropped), first);
    Variable loss = cross_entropy(dropped.forward(tokens(), {2, 7}), targets());
    loss.backward();
    for (const NamedParameter& named : dropped.lora_parameters()) {
        for (const float g : named.parameter.gradient().to_host())
            ASSERT_TRUE(std::isfinite(g)) << named.name;
    }
}

}  // namespace riftco_transformer
