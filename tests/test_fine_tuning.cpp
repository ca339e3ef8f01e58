// Full, LoRA and QLoRA fine-tuning of the TINY model (V=256, D=128, H=4, N=4, F=512) each lower
// the loss on held-out sequences: the three workflows train for real, not just run.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace riftco_transformer {
namespace {

constexpr std::size_t batch = 4;
constexpr std::size_t time = 32;

TransformerDimensions tiny() {
    return {.vocabulary_size = 256,
            .maximum_context = time,
            .model_width = 128,
            .head_count = 4,
            .block_count = 4,
            .feed_forward_width = 512};
}

// A little language: each sequence follows t_{i+1} = (5·t_i + 3) mod 64 from its own start, so
// the next token is a function of the current one. Held-out sequences start where no training
// sequence does.
struct Batch {
    std::vector<std::uint32_t> tokens;
    std::vector<std::uint32_t> targets;
};

Batch sequences(std::uint32_t first_start, std::uint32_t start_step) {
    Batch result;
    for (std::size_t row = 0; row < batch; ++row) {
        std::uint32_t token = (first_start + static_cast<std::uint32_t>(row) * start_step) % 64;
        for (std::size_t t = 0; t < time; ++t) {
            result.tokens.push_back(token);
            token = (5 * token + 3) % 64;
            result.targets.push_back(token);
        }
    }
    return result;
}

float held_out_loss(const DecoderOnlyTransformer& model, const Batch& data) {
    const NoGradientGuard evaluation;
    return cross_entropy(model.forward(data.tokens, {batch, time}), data.targets).value().item();
}

enum class Method { Full, Lora, Qlora };

std::pair<float, float> fine_tune(Method method) {
    std::mt19937 generator(123);
    DecoderOnlyTransformer model(tiny(), generator, 1e-5F, AttentionKind::Flash);
    if (method == Method::Qlora) {
        model.quantize_nf4();
    }
    if (method != Method::Full) {
        model.attach_lora({.rank = 8, .alpha = 16.0F, .targets = 0x7F});
    }
    const ParameterList trainable =
        method == Method::Full ? model.parameters() : model.lora_parameters();
    Adam adam(trainable, AdamOptions{.learning_rate = method == Method::Full ? 1e-3 : 5e-3});
    const Batch held_out = sequences(1, 7);  // starts 1, 8, 15, 22
    const float before = held_out_loss(model, held_out);
    for (std::uint32_t step = 0; step < 40; ++step) {
        const Batch data = sequences(32 + step * 4, 2);  // even starts >= 32, disjoint
        Variable loss = cross_entropy(model.forward(data.tokens, {batch, time}), data.targets);
        loss.backward();
        adam.step();
    }
    return {before, held_out_loss(model, held_out)};
}

}  // namespace

// Each method must cut the held-out loss by at least a fifth in 40 steps.
TEST(FineTuning, FullFineTuningReducesHeldOutLoss) {
    const auto [before, after] = fine_tune(Method::Full);
    EXPECT_LT(after, 0.8F * before) << "held-out loss " << before << " -> " << after;
}

TEST(FineTuning, LoraReducesHeldOutLoss) {
    const auto [before, after] = fine_tune(Method::Lora);
    EXPECT_LT(after, 0.8F * before) << "held-out loss " << before << " -> " << after;
}

TEST(FineTuning, QloraReducesHeldOutLoss) {
    const auto [before, after] = fine_tune(Method::Qlora);
    EXPECT_LT(after, 0.8F * before) << "held-out loss " << before << " -> " << after;
}

}  // namespace riftco_transformer
