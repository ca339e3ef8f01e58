// The decoder's family choices (Qwen 2, Qwen 3, Gemma 2/3, Phi-3 and GPT-2 beside Llama/Mistral):
// presets and parameter lists, the architecture table of checkpoint names, the config rules,
// Gemma's (1 + w) RMSNorm and GeGLU by hand, RoPE scaling against the formulas, and for every
// preset: gradients by finite differences, flash equal to materialized, decode sessions equal to
// the full forward through and past the windows, block checkpointing, LoRA on every projection and
// NF4. Logits against Hugging Face transformers and llama.cpp:
// tests/oracle/decoder_families_parity.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/interchange/checkpoint_names.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/decoder_families.hpp"
#include "support/model_support.hpp"

namespace riftco_transformer {
namespace {

using testing::dimensions;
using testing::family_configs;
using testing::name_of;
using testing::perturb;

std::vector<std::string> names(const Module& model) {
    std::vector<std::string> out;
    for (const NamedParameter& named : model.parameters())
        out.push_back(named.name);
    return out;
}

bool has(const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
}

TEST(DecoderFamilies, PresetsSetEachFamilysChoices) {
    const DecoderConfig base = dimensions();
    const DecoderConfig llama = architecture_preset(DecoderArchitecture::Llama, base);
    EXPECT_FALSE(llama.query_key_value_bias || llama.query_key_norm || llama.norm_weight_offset ||
                 llama.post_block_norms);
    EXPECT_EQ(llama.feed_forward_activation, GatedActivation::Silu);
    EXPECT_TRUE(architecture_preset(DecoderArchitecture::Qwen2, base).query_key_value_bias);
    EXPECT_TRUE(architecture_preset(DecoderArchitecture::Qwen3, base).query_key_norm);
    DecoderConfig windowed = base;
    windowed.sliding_window = 4;
    const DecoderConfig gemma = architecture_preset(DecoderArchitecture::Gemma3, windowed);
    EXPECT_TRUE(gemma.query_key_norm && gemma.norm_weight_offset && gemma.post_block_norms);
    EXPECT_EQ(gemma.feed_forward_activation, GatedActivation::GeluTanh);
    EXPECT_EQ(gemma.embedding_scale, static_cast<float>(std::sqrt(16.0)));
    EXPECT_EQ(gemma.sliding_window_period, 6U);
    EXPECT_EQ(gemma.rope_local_theta, 10000.0);
    // Layers 0-4 windowed, layer 5 dense, then again.
    for (std::size_t layer = 0; layer < 12; ++layer)
        EXPECT_EQ(gemma.layer_window(layer).has_value(), layer % 6 != 5) << layer;
    // Gemma 2: Gemma 3's choices without QK-norm, every other layer windowed (layer 0 first),
    // one RoPE base, and both soft caps (50 and 30) unless given.
    const DecoderConfig gemma2 = architecture_preset(DecoderArchitecture::Gemma2, windowed);
    EXPECT_TRUE(gemma2.norm_weight_offset && gemma2.post_block_norms && !gemma2.query_key_norm);
    EXPECT_EQ(gemma2.feed_forward_activation, GatedActivation::GeluTanh);
    EXPECT_EQ(gemma2.embedding_scale, static_cast<float>(std::sqrt(16.0)));
    EXPECT_EQ(gemma2.sliding_window_period, 2U);
    EXPECT_EQ(gemma2.rope_local_theta, 0.0);
    EXPECT_EQ(gemma2.attention_logit_softcap, 50.0F);
    EXPECT_EQ(gemma2.final_logit_softcap, 30.0F);
    for (std::size_t layer = 0; layer < 6; ++layer)
        EXPECT_EQ(gemma2.layer_window(layer).has_value(), layer % 2 == 0) << layer;
    DecoderConfig given_caps = base;
    given_caps.attention_logit_softcap = 20.0F;
    given_caps.final_logit_softcap = 7.5F;
    const DecoderConfig kept = architecture_preset(DecoderArchitecture::Gemma2, given_caps);
    EXPECT_EQ(kept.attention_logit_softcap, 20.0F);
    EXPECT_EQ(kept.final_logit_softcap, 7.5F);
    EXPECT_FALSE(kept.sliding_window_period != 0) << "no window, no period";
    EXPECT_EQ(decoder_architecture_name(DecoderArchitecture::Gemma2), "gemma2");
    // No other family caps anything.
    EXPECT_EQ(gemma.attention_logit_softcap, 0.0F);
    EXPECT_EQ(gemma.final_logit_softcap, 0.0F);
    // GPT-2: learned positions, LayerNorm, the plain tanh-GELU feed-forward, a bias on every
    // projection; nothing of the rotary families.
    const DecoderConfig gpt2 = architecture_preset(DecoderArchitecture::Gpt2, base);
    EXPECT_EQ(gpt2.positions, PositionEncoding::Learned);
    EXPECT_EQ(gpt2.norm, NormKind::Layer);
    EXPECT_EQ(gpt2.feed_forward, FeedForwardKind::Plain);
    EXPECT_EQ(gpt2.plain_activation, Activation::GeluTanh);
    EXPECT_TRUE(gpt2.query_key_value_bias && gpt2.output_bias && gpt2.feed_forward_bias &&
                gpt2.head_bias);
    EXPECT_FALSE(gpt2.query_key_norm || gpt2.norm_weight_offset || gpt2.post_block_norms);
    EXPECT_EQ(gpt2.embedding_scale, 0.0F);
    EXPECT_EQ(decoder_architecture_name(DecoderArchitecture::Gpt2), "gpt2");
    // Every other family keeps Llama's RoPE, RMSNorm and gated feed-forward.
    for (const DecoderConfig& c : {llama, gemma, gemma2}) {
        EXPECT_EQ(c.positions, PositionEncoding::Rotary);
        EXPECT_EQ(c.norm, NormKind::Rms);
        EXPECT_EQ(c.feed_forward, FeedForwardKind::Gated);
        EXPECT_FALSE(c.output_bias || c.feed_forward_bias || c.head_bias);
    }
    EXPECT_THROW((void)architecture_preset(static_cast<DecoderArchitecture>(8), base),
                 std::invalid_argument);
}

TEST(DecoderFamilies, ParameterListsNameEveryChoice) {
    for (const DecoderConfig& config : family_configs()) {
        std::mt19937 generator(1);
        const Decoder model(config, generator);
        const std::vector<std::string> list = names(model);
        const std::string a = "blocks.0.attention.";
        EXPECT_EQ(has(list, a + "query.bias"), config.query_key_value_bias) << name_of(config);
        EXPECT_EQ(has(list, a + "value.bias"), config.query_key_value_bias) << name_of(config);
        EXPECT_EQ(has(list, a + "output.bias"), config.output_bias) << name_of(config);
        const bool learned = config.positions == PositionEncoding::Learned;
        const bool plain = config.feed_forward == FeedForwardKind::Plain;
        EXPECT_EQ(has(list, "position_embedding.weight"), learned) << name_of(config);
        EXPECT_EQ(has(list, "blocks.0.attention_norm.bias"), config.norm == NormKind::Layer)
            << name_of(config);
        EXPECT_EQ(has(list, "blocks.0.feed_forward.expand.bias"), plain && config.feed_forward_bias)
            << name_of(config);
        EXPECT_EQ(has(list, "blocks.0.feed_forward.gate.weight"), !plain) << name_of(config);
        EXPECT_EQ(has(list, "language_model_head.bias"), config.head_bias && !config.tie_embeddings)
            << name_of(config);
        EXPECT_EQ(has(list, a + "query_norm.scale"), config.query_key_norm) << name_of(config);
        EXPECT_EQ(has(list, "blocks.0.post_feed_forward_norm.scale"), config.post_block_norms)
            << name_of(config);
        const std::size_t d = config.resolved_head_width();
        for (const NamedParameter& named : model.parameters()) {
            if (named.name == a + "query.weight") {
                EXPECT_EQ(named.parameter.shape(), (Shape{config.query_head_count * d, 16}));
            }
            if (named.name == a + "output.weight") {
                EXPECT_EQ(named.parameter.shape(), (Shape{16, config.query_head_count * d}));
            }
            if (named.name == a + "key_norm.scale") {
                EXPECT_EQ(named.parameter.shape(), (Shape{d}));
            }
            // Gemma's (1 + w) norms start at w = 0, the others at scale = 1.
            if (named.name == "final_norm.scale") {
                EXPECT_EQ(named.parameter.value().to_host()[0],
                          config.norm_weight_offset ? 0.0F : 1.0F);
            }
        }
        EXPECT_EQ(model.incremental_cache_shape().head_width, d) << name_of(config);
    }
}

// The one architecture table names a distinct checkpoint tensor (or fused part) for every
// parameter of every family, in both formats (GPT-2: Hugging Face only), and refuses names that
// are not parameters.
TEST(DecoderFamilies, TheArchitectureTableNamesEveryParameterOnce) {
    for (const DecoderConfig& config : family_configs()) {
        std::mt19937 generator(1);
        const Decoder model(config, generator);
        for (const CheckpointFormat format :
             {CheckpointFormat::Gguf, CheckpointFormat::HuggingFace}) {
            if (format == CheckpointFormat::Gguf &&
                config.architecture == DecoderArchitecture::Gpt2) {
                EXPECT_THROW((void)checkpoint_tensor_name(config.architecture, format,
                                                          "token_embedding.weight"),
                             std::invalid_argument);
                continue;
            }
            std::set<std::pair<std::string, std::size_t>> seen;
            for (const NamedParameter& named : model.parameters()) {
                if (config.architecture == DecoderArchitecture::Gpt2 &&
                    named.name == "language_model_head.bias") {
                    // GPT2LMHeadModel's head has no bias: such a checkpoint cannot hold ours.
                    EXPECT_THROW(
                        (void)checkpoint_tensor_name(config.architecture, format, named.name),
                        std::invalid_argument);
                    continue;
                }
                const std::optional<CheckpointTensorName> name =
                    checkpoint_tensor_name(config.architecture, format, named.name);
                ASSERT_TRUE(name.has_value()) << name_of(config) << " " << named.name;
                EXPECT_TRUE(seen.insert({name->name, name->part.value_or(99)}).second)
                    << name_of(config) << ": " << named.name << " -> " << name->name;
            }
        }
        EXPECT_THROW(
            (void)checkpoint_tensor_name(config.architecture, CheckpointFormat::HuggingFace,
                                         "blocks.0.attention.nothing.weight"),
            std::invalid_argument);
        EXPECT_THROW((void)checkpoint_tensor_name(config.architecture,
                                                  CheckpointFormat::HuggingFace, "blocks.x.y"),
                     std::invalid_argument);
    }
    // Worked rows: block indices carried over, fused parts, the second GGUF layout of Phi-3.
    const auto name = [](DecoderArchitecture a, CheckpointFormat f, const char* parameter,
                         std::size_t alternative = 0) {
        return checkpoint_tensor_name(a, f, parameter, alternative);
    };
    using A = DecoderArchitecture;
    using F = CheckpointFormat;
    EXPECT_EQ(name(A::Llama, F::Gguf, "blocks.12.attention.query.weight")->name,
              "blk.12.attn_q.weight");
    EXPECT_EQ(name(A::Qwen2, F::HuggingFace, "blocks.3.attention.key.bias")->name,
              "model.layers.3.self_attn.k_proj.bias");
    EXPECT_EQ(name(A::Gemma2, F::HuggingFace, "blocks.1.feed_forward_norm.scale")->name,
              "model.layers.1.pre_feedforward_layernorm.weight");
    EXPECT_EQ(name(A::Llama, F::HuggingFace, "blocks.1.feed_forward_norm.scale")->name,
              "model.layers.1.post_attention_layernorm.weight");
    EXPECT_EQ(name(A::Gemma3, F::Gguf, "blocks.0.post_feed_forward_norm.scale")->name,
              "blk.0.post_ffw_norm.weight");
    const auto phi3_value = name(A::Phi3, F::HuggingFace, "blocks.2.attention.value.weight");
    EXPECT_EQ(phi3_value->name, "model.layers.2.self_attn.qkv_proj.weight");
    EXPECT_EQ(phi3_value->part, 2U);
    EXPECT_EQ(name(A::Phi3, F::Gguf, "blocks.2.attention.value.weight")->name,
              "blk.2.attn_v.weight");
    const auto fused_up = name(A::Phi3, F::Gguf, "blocks.2.feed_forward.up.weight", 1);
    EXPECT_EQ(fused_up->name, "blk.2.ffn_up.weight");
    EXPECT_EQ(fused_up->part, 1U);
    EXPECT_FALSE(name(A::Phi3, F::Gguf, "blocks.2.attention_norm.scale", 1).has_value());
    EXPECT_FALSE(name(A::Llama, F::Gguf, "blocks.2.attention.query.weight", 1).has_value());
    const auto gpt2_key = name(A::Gpt2, F::HuggingFace, "blocks.4.attention.key.bias");
    EXPECT_EQ(gpt2_key->name, "h.4.attn.c_attn.bias");
    EXPECT_EQ(gpt2_key->part, 1U);
    EXPECT_EQ(name(A::Gpt2, F::HuggingFace, "position_embedding.weight")->name, "wpe.weight");
    // A Llama has no position table; a block name must carry a canonical index.
    EXPECT_THROW((void)name(A::Llama, F::HuggingFace, "position_embedding.weight"),
                 std::invalid_argument);
    EXPECT_THROW((void)name(A::Llama, F::HuggingFace, "blocks.01.attention_norm.scale"),
                 std::invalid_argument);
    EXPECT_THROW((void)name(A::Llama, F::HuggingFace, "attention_norm.scale"),
                 std::invalid_argument);
    EXPECT_THROW((void)name(static_cast<A>(8), F::HuggingFace, "final_norm.scale"),
                 std::invalid_argument);
    EXPECT_THROW((void)name(A::Llama, static_cast<F>(2), "final_norm.scale"),
                 std::invalid_argument);
}

TEST(DecoderFamilies, ConfigRulesNameTheFieldBeforeAnyDraw) {
    const auto rejected = [](DecoderConfig config, const std::string& field) {
        std::mt19937 generator(1);
        const std::mt19937 before = generator;
        try {
            Decoder model(config, generator);
            ADD_FAILURE() << "accepted a config with a bad " << field;
        } catch (const std::invalid_argument& error) {
            EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
        }
        EXPECT_TRUE(generator == before) << field << ": a draw happened before the rule";
    };
    DecoderConfig c = dimensions();
    c.head_width = 5;
    rejected(c, "even head width");
    c.positions = PositionEncoding::Learned;  // without RoPE an odd head width is fine
    {
        std::mt19937 generator(1);
        EXPECT_NO_THROW(Decoder(c, generator));
    }
    c.rope_scaling.kind = RopeScalingKind::Linear;
    c.rope_scaling.factor = 2.0;
    rejected(c, "rope_scaling linear needs rotary positions");
    c.rope_scaling = RopeScaling{};
    c.rope_local_theta = 100.0;
    rejected(c, "rope_local_theta needs rotary positions");
    c = dimensions();
    c.norm = NormKind::Layer;
    c.norm_weight_offset = true;
    rejected(c, "norm_weight_offset");
    c = dimensions();
    c.positions = static_cast<PositionEncoding>(2);
    rejected(c, "unknown positions value 2");
    c = dimensions();
    c.norm = static_cast<NormKind>(5);
    rejected(c, "unknown norm value 5");
    c = dimensions();
    c.feed_forward = static_cast<FeedForwardKind>(9);
    rejected(c, "unknown feed_forward value 9");
    c = dimensions();
    c.plain_activation = static_cast<Activation>(3);
    rejected(c, "unknown plain_activation value 3");
    c = dimensions();
    c.model_width = 18;  // not a multiple of Hq = 4 ...
    rejected(c, "multiple of query_head_count");
    c.head_width = 4;  // ... which a given head width allows
    std::mt19937 generator(1);
    EXPECT_NO_THROW(Decoder(c, generator));
    c = dimensions();
    c.sliding_window_period = 6;
    rejected(c, "sliding_window_period 6 needs a sliding_window");
    c = dimensions();
    c.embedding_scale = -1.0F;
    rejected(c, "embedding_scale");
    c = dimensions();
    c.attention_scale = std::numeric_limits<float>::quiet_NaN();
    rejected(c, "attention_scale");
    c = dimensions();
    c.rope_local_theta = -5.0;
    rejected(c, "rope_local_theta");
    c = dimensions();
    c.attention_logit_softcap = -1.0F;
    rejected(c, "attention_logit_softcap must be finite and >= 0 (got -1)");
    c = dimensions();
    c.final_logit_softcap = std::numeric_limits<float>::infinity();
    rejected(c, "final_logit_softcap must be finite and >= 0 (got inf)");
    c = dimensions();
    c.feed_forward_activation = static_cast<GatedActivation>(7);
    rejected(c, "feed_forward_activation");
    c = dimensions();
    c.rope_scaling.kind = RopeScalingKind::Llama3;
    c.rope_scaling.high_frequency_factor = 1.0;
    rejected(c, "high_frequency_factor");
    c = dimensions();
    c.rope_scaling.kind = RopeScalingKind::Linear;
    c.rope_scaling.factor = 0.0;
    rejected(c, "rope_scaling.factor");
    c = dimensions();
    c.rope_scaling.kind = RopeScalingKind::FrequencyFactors;
    c.rope_scaling.frequency_factors = {1.0F, 2.0F};  // d/2 = 2 ...
    EXPECT_NO_THROW(Decoder(c, generator));
    c.rope_scaling.frequency_factors = {1.0F, 2.0F, 3.0F};  // ... not 3
    rejected(c, "frequency_factors");
    c.rope_scaling.frequency_factors = {1.0F, -2.0F};
    rejected(c, "frequency_factors[1]");
}

TEST(DecoderFamilies, GemmaNormAndGeGluByHand) {
    // RMSNorm in Gemma's form: y = x/√(mean(x²) + eps)·(1 + w).
    RMSNorm norm(2, 1e-6F, true);
    Variable scale = norm.parameters()[0].parameter;
    scale.set_value(Tensor({2}, std::vector<float>{0.5F, -0.25F}));
    const std::vector<float> y =
        norm.forward(Variable(Tensor({1, 2}, std::vector<float>{3.0F, 4.0F}), false))
            .value()
            .to_host();
    const double inverse = 1.0 / std::sqrt((9.0 + 16.0) / 2.0 + 1e-6);
    EXPECT_NEAR(y[0], 3.0 * inverse * 1.5, 1e-6);
    EXPECT_NEAR(y[1], 4.0 * inverse * 0.75, 1e-6);

    // GeGLU: down(gelu_tanh(gate·x) ⊙ up·x), one hidden unit, weights set by hand.
    std::mt19937 generator(3);
    SwiGLU geglu(1, 1, generator, GatedActivation::GeluTanh);
    for (const NamedParameter& named : geglu.parameters()) {
        Variable leaf = named.parameter;
        const float value = named.name == "gate.weight" ? 2.0F
                            : named.name == "up.weight" ? 3.0F
                                                        : 0.5F;
        leaf.set_value(Tensor({1, 1}, std::vector<float>{value}));
    }
    const double x = 0.7;
    const double gate = 2.0 * x;
    const double gelu = 0.5 * gate *
                        (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) *
                                         (gate + 0.044715 * gate * gate * gate)));
    const float out = geglu.forward(Variable(Tensor({1, 1}, std::vector<float>{0.7F}), false))
                          .value()
                          .to_host()[0];
    EXPECT_NEAR(out, 0.5 * gelu * 3.0 * x, 1e-5);
    EXPECT_THROW(SwiGLU(1, 1, generator, static_cast<GatedActivation>(2)), std::invalid_argument);
}

TEST(DecoderFamilies, RopeScalingFollowsTheFormulas) {
    constexpr std::size_t d = 16;
    constexpr double theta = 10000.0;
    const std::vector<double> plain = rotary_frequencies(d, theta, RopeScaling{});
    for (std::size_t i = 0; i < d / 2; ++i)
        EXPECT_DOUBLE_EQ(plain[i], std::pow(theta, -2.0 * static_cast<double>(i) / d));
    RopeScaling linear;
    linear.kind = RopeScalingKind::Linear;
    linear.factor = 4.0;
    const std::vector<double> divided = rotary_frequencies(d, theta, linear);
    for (std::size_t i = 0; i < d / 2; ++i)
        EXPECT_DOUBLE_EQ(divided[i], plain[i] / 4.0);
    // Llama 3's rule against the divisors llama.cpp's converter writes to rope_freqs.weight,
    // computed here from the converter's own formulation (factor per wavelength band).
    RopeScaling llama3;
    llama3.kind = RopeScalingKind::Llama3;
    llama3.factor = 8.0;
    llama3.low_frequency_factor = 1.0;
    llama3.high_frequency_factor = 4.0;
    llama3.original_context = 64;
    RopeScaling factors;
    factors.kind = RopeScalingKind::FrequencyFactors;
    bool banded[3] = {false, false, false};
    for (std::size_t i = 0; i < d / 2; ++i) {
        const double wavelength = 2.0 * std::numbers::pi / plain[i];
        double divisor = 1.0;
        if (wavelength > 64.0 / 1.0) {
            divisor = 8.0;
            banded[2] = true;
        } else if (wavelength >= 64.0 / 4.0) {
            const double smooth = (64.0 / wavelength - 1.0) / (4.0 - 1.0);
            divisor = 1.0 / ((1.0 - smooth) / 8.0 + smooth);
            banded[1] = true;
        } else {
            banded[0] = true;
        }
        factors.frequency_factors.push_back(static_cast<float>(divisor));
    }
    ASSERT_TRUE(banded[0] && banded[1] && banded[2]) << "the test must cover all three bands";
    const std::vector<double> rule = rotary_frequencies(d, theta, llama3);
    const std::vector<double> divisors = rotary_frequencies(d, theta, factors);
    for (std::size_t i = 0; i < d / 2; ++i)
        EXPECT_NEAR(rule[i], divisors[i], 1e-7 * plain[i]) << i;
}

// YaRN worked by hand for d = 16, θ = 10⁴, factor 4, L = 64: the correction dimensions are
// f(32) = 16·ln(64/(64π))/(2·ln 10⁴) = −0.994 and f(1) = 16·ln(64/(2π))/(2·ln 10⁴) = 2.016, so
// lo = max(⌊−0.994⌋, 0) = 0 and hi = ⌈2.016⌉ = 3; γ_i = i/3 up to 1. ω_0 keeps 1; ω_1 =
// 10^(−1/2)·(2/3 + 1/12) = 0.2371708245; ω_2 = 0.1·(1/3 + 1/6) = 0.05; from i = 3 on, θ^(−2i/d)/4.
// The tables carry m = 0.1·ln 4 + 1 on cos and sin; a given attention factor replaces it.
TEST(DecoderFamilies, YarnFollowsItsFormulaWorkedByHand) {
    RopeScaling yarn;
    yarn.kind = RopeScalingKind::Yarn;
    yarn.factor = 4.0;
    yarn.original_context = 64;
    const std::vector<double> expected = {
        1.0,    0.23717082451262847,   0.05,    0.007905694150420948,
        0.0025, 0.0007905694150420947, 0.00025, 7.905694150420948e-05};
    const std::vector<double> actual = rotary_frequencies(16, 10000.0, yarn);
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i)
        EXPECT_NEAR(actual[i], expected[i], 1e-12 * expected[i]) << i;
    EXPECT_NEAR(rotary_magnitude(yarn), 0.1 * std::log(4.0) + 1.0, 1e-15);
    const std::size_t positions[] = {0, 5};
    const RotaryTables tables =
        rotary_tables(positions, actual, ExecutionBackend::Cpu, rotary_magnitude(yarn));
    const std::vector<float> cosine = tables.cosine.to_host();
    const std::vector<float> sine = tables.sine.to_host();
    const double m = 0.1 * std::log(4.0) + 1.0;
    for (std::size_t i = 0; i < 8; ++i) {
        EXPECT_FLOAT_EQ(cosine[i], static_cast<float>(m));  // position 0: m·cos 0
        EXPECT_FLOAT_EQ(cosine[8 + i], static_cast<float>(m * std::cos(5.0 * expected[i])));
        EXPECT_FLOAT_EQ(sine[8 + i], static_cast<float>(m * std::sin(5.0 * expected[i])));
    }
    // A magnitude that is not finite and > 0 is refused, naming it.
    for (const double bad : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
        EXPECT_TRUE(testing::throws<std::invalid_argument>(
            [&] { (void)rotary_tables(positions, actual, ExecutionBackend::Cpu, bad); },
            "rotary_tables: magnitude must be finite and > 0"));
    }
    yarn.attention_factor = 1.5;
    EXPECT_EQ(rotary_magnitude(yarn), 1.5);
    yarn.factor = 0.5;  // a factor <= 1 has no magnitude of its own
    yarn.attention_factor = 0.0;
    EXPECT_EQ(rotary_magnitude(yarn), 1.0);
    EXPECT_EQ(rotary_magnitude(RopeScaling{}), 1.0);
    // The rules name the field and the value.
    yarn = RopeScaling{};
    yarn.kind = RopeScalingKind::Yarn;
    yarn.beta_fast = 1.0;
    EXPECT_TRUE(testing::throws<std::invalid_argument>(
        [&] { require_rope_scaling("t", 16, yarn); },
        "t: rope_scaling.beta_fast 1 must be greater than beta_slow 1"));
    yarn.beta_fast = 32.0;
    yarn.attention_factor = -1.0;
    EXPECT_TRUE(testing::throws<std::invalid_argument>([&] { require_rope_scaling("t", 16, yarn); },
                                                       "rope_scaling.attention_factor"));
    yarn.attention_factor = 0.0;
    yarn.original_context = 0;
    EXPECT_TRUE(testing::throws<std::invalid_argument>([&] { require_rope_scaling("t", 16, yarn); },
                                                       "rope_scaling.original_context"));
    EXPECT_STREQ(rope_scaling_name(RopeScalingKind::Yarn), "yarn");
}

// The score scale against another formulation of it: scores s·q·k equal the default 1/√d
// scores of a model whose query weights are multiplied by s·√d (no QK-norm, no bias).
TEST(DecoderFamilies, AttentionScaleEqualsQueriesScaledInTheirWeights) {
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        DecoderConfig scaled_config = dimensions();
        scaled_config.head_width = 6;
        scaled_config.attention_scale = 0.3F;
        DecoderConfig plain_config = scaled_config;
        plain_config.attention_scale = 0.0F;
        std::mt19937 first(21);
        std::mt19937 second(21);
        Decoder scaled(scaled_config, first, kind);
        Decoder plain(plain_config, second, kind);
        const float multiplier = static_cast<float>(0.3 * std::sqrt(6.0));
        for (const NamedParameter& named : plain.parameters()) {
            if (named.name.find("attention.query.weight") == std::string::npos)
                continue;
            Variable leaf = named.parameter;
            std::vector<float> values = named.parameter.value().to_host();
            for (float& value : values)
                value *= multiplier;
            leaf.set_value(Tensor(named.parameter.shape(), values));
        }
        const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
        const std::vector<float> expected = plain.forward(tokens, {1, 8}).value().to_host();
        const std::vector<float> actual = scaled.forward(tokens, {1, 8}).value().to_host();
        double spread = 0.0;
        for (std::size_t i = 0; i < expected.size(); ++i) {
            EXPECT_NEAR(actual[i], expected[i], 1e-5 + 1e-5 * std::abs(expected[i])) << i;
            spread = std::max(spread, static_cast<double>(std::abs(expected[i])));
        }
        EXPECT_GT(spread, 0.0);
    }
}

// The final soft cap is c·tanh(z/c) of the uncapped logits, in the forward and in decoding;
// the attention cap changes the logits (it is not the identity at a small c) and a cap far
// above every score leaves them within rounding.
TEST(DecoderFamilies, SoftCapsFollowTheirDefinition) {
    DecoderConfig plain_config = dimensions();
    plain_config.block_count = 2;
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
    const auto logits_of = [&](const DecoderConfig& config, AttentionKind kind) {
        std::mt19937 generator(41);
        Decoder model(config, generator, kind);
        perturb(model, 42);
        return model.forward(tokens, {1, 8}).value().to_host();
    };
    const std::vector<float> plain = logits_of(plain_config, AttentionKind::Flash);
    DecoderConfig final_capped = plain_config;
    final_capped.final_logit_softcap = 0.5F;
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        const std::vector<float> capped = logits_of(final_capped, kind);
        double largest = 0.0;
        for (std::size_t i = 0; i < plain.size(); ++i) {
            const double expected = 0.5 * std::tanh(static_cast<double>(plain[i]) / 0.5);
            EXPECT_NEAR(capped[i], expected, 2e-6) << i;
            largest = std::max(largest, std::abs(static_cast<double>(plain[i])));
        }
        EXPECT_GT(largest, 1.0) << "the cap must bite somewhere";
    }
    {
        std::mt19937 generator(41);
        Decoder model(final_capped, generator);
        perturb(model, 42);
        DecodeSession session(model, KeyValueCacheKind::Contiguous);
        const std::vector<float> decoded = session.prefill(tokens, PrefillLogits::All).to_host();
        for (std::size_t i = 0; i < plain.size(); ++i)
            EXPECT_NEAR(decoded[i], 0.5 * std::tanh(static_cast<double>(plain[i]) / 0.5), 2e-5)
                << i;
    }
    DecoderConfig attention_capped = plain_config;
    attention_capped.attention_logit_softcap = 0.05F;
    const std::vector<float> tight = logits_of(attention_capped, AttentionKind::Flash);
    attention_capped.attention_logit_softcap = 1e6F;
    const std::vector<float> loose = logits_of(attention_capped, AttentionKind::Flash);
    double tight_gap = 0.0;
    for (std::size_t i = 0; i < plain.size(); ++i) {
        EXPECT_NEAR(loose[i], plain[i], 1e-5) << i;
        tight_gap = std::max(tight_gap, std::abs(static_cast<double>(tight[i] - plain[i])));
    }
    EXPECT_GT(tight_gap, 1e-3);
}

TEST(DecoderFamilies, GradientsMatchFiniteDifferences) {
    for (DecoderConfig config : family_configs()) {
        config.maximum_context = 8;
        std::mt19937 generator(6);
        Decoder model(config, generator);
        perturb(model, 11);
        const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
        const std::vector<std::uint32_t> targets = {1, 4, 1, 5, 9, 2, 6, 5};
        const auto loss_value = [&]() {
            const NoGradientGuard no_graph;
            return static_cast<double>(
                cross_entropy(reshape(model.forward(tokens, {1, 8}), {8, 17}), targets)
                    .value()
                    .to_host()[0]);
        };
        Variable loss = cross_entropy(reshape(model.forward(tokens, {1, 8}), {8, 17}), targets);
        loss.backward();
        SCOPED_TRACE(name_of(config));
        testing::expect_gradients_match_finite_differences(model.parameters(), loss_value, 2);
    }
}

TEST(DecoderFamilies, FlashEqualsMaterializedAndCheckpointingKeepsGradients) {
    for (const DecoderConfig& config : family_configs()) {
        const auto run = [&](AttentionKind kind, ActivationCheckpointing checkpointing) {
            std::mt19937 generator(4);
            Decoder model(config, generator, kind, checkpointing);
            perturb(model, 5);
            const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3,
                                                       5, 8, 9, 7, 9, 3, 2, 3, 8, 4};
            const std::vector<std::uint32_t> targets(tokens.begin() + 1, tokens.end());
            const Variable logits = model.forward(tokens, {2, 10});
            std::vector<std::uint32_t> shifted(tokens.begin() + 1, tokens.end());
            shifted.push_back(0);
            Variable loss = cross_entropy(reshape(logits, {20, 17}), shifted);
            loss.backward();
            std::vector<float> out = logits.value().to_host();
            for (const NamedParameter& named : model.parameters()) {
                const std::vector<float> g = named.parameter.gradient().to_host();
                out.insert(out.end(), g.begin(), g.end());
            }
            return out;
        };
        const std::vector<float> materialized =
            run(AttentionKind::Materialized, ActivationCheckpointing::Disabled);
        const std::vector<float> flash =
            run(AttentionKind::Flash, ActivationCheckpointing::Disabled);
        const std::vector<float> checkpointed =
            run(AttentionKind::Flash, ActivationCheckpointing::TransformerBlock);
        ASSERT_EQ(flash.size(), materialized.size());
        for (std::size_t i = 0; i < flash.size(); ++i) {
            ASSERT_NEAR(flash[i], materialized[i], 1e-4 + 1e-4 * std::abs(materialized[i]))
                << name_of(config) << " value " << i;
            ASSERT_EQ(checkpointed[i], flash[i]) << name_of(config) << " value " << i;
        }
    }
}

TEST(DecoderFamilies, DecodeSessionsEqualTheFullForwardThroughAndPastTheWindows) {
    for (const DecoderConfig& config : family_configs()) {
        for (const KeyValueCacheKind kind :
             {KeyValueCacheKind::Paged, KeyValueCacheKind::Contiguous}) {
            std::mt19937 generator(8);
            Decoder model(config, generator);
            perturb(model, 9);
            const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7};
            const std::vector<float> full =
                model.forward(tokens, {1, tokens.size()}).value().to_host();
            DecodeSession session(model, kind, 4);
            // A prefill of five rows, then one token at a time past every window.
            const std::vector<std::uint32_t> first(tokens.begin(), tokens.begin() + 5);
            // prefill returns the logits of its last row.
            const std::vector<float> last_of_prefill = session.prefill(first).to_host();
            for (std::size_t v = 0; v < 17; ++v)
                EXPECT_NEAR(last_of_prefill[v], full[4 * 17 + v], 1e-4) << name_of(config);
            for (std::size_t t = 5; t < tokens.size(); ++t) {
                const std::vector<float> row = session.decode_token(tokens[t]).to_host();
                for (std::size_t v = 0; v < 17; ++v) {
                    EXPECT_NEAR(row[v], full[t * 17 + v], 1e-4 + 1e-4 * std::abs(full[t * 17 + v]))
                        << name_of(config) << " position " << t;
                }
            }
        }
    }
}

TEST(DecoderFamilies, QloraOnEveryProjectionRunsForEveryPreset) {
    for (const DecoderConfig& config : family_configs()) {
        std::mt19937 generator(12);
        Decoder model(config, generator);
        perturb(model, 13);
        const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9};
        const std::vector<std::uint32_t> targets = {1, 4, 1, 5, 9, 2};
        const std::vector<float> dense = model.forward(tokens, {1, 6}).value().to_host();
        model.quantize_nf4();
        ASSERT_TRUE(model.has_quantized_weights());
        const std::vector<float> packed = model.forward(tokens, {1, 6}).value().to_host();
        double worst = 0.0;
        for (std::size_t i = 0; i < dense.size(); ++i) {
            ASSERT_TRUE(std::isfinite(packed[i])) << name_of(config);
            worst = std::max(worst, static_cast<double>(std::abs(packed[i] - dense[i])));
        }
        EXPECT_GT(worst, 0.0) << name_of(config) << ": the packed weights were not used";
        EXPECT_LT(worst, 2.0) << name_of(config);
        LoraConfig lora;
        lora.rank = 2;
        lora.targets = 0;
        const bool plain = config.feed_forward == FeedForwardKind::Plain;
        const std::vector<LoraTarget> feed_forward =
            plain ? std::vector<LoraTarget>{LoraTarget::FeedForwardExpand,
                                            LoraTarget::FeedForwardProject}
                  : std::vector<LoraTarget>{LoraTarget::FeedForwardGate, LoraTarget::FeedForwardUp,
                                            LoraTarget::FeedForwardDown};
        for (LoraTarget target :
             {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value, LoraTarget::Output})
            lora.targets |= lora_target_bit(target);
        for (LoraTarget target : feed_forward)
            lora.targets |= lora_target_bit(target);
        model.attach_lora(lora);
        const ParameterList adapters = model.lora_parameters();
        EXPECT_EQ(adapters.size(), 2 * (4 + feed_forward.size()) * config.block_count)
            << name_of(config);
        // B starts at zero: the adapted model gives the packed model's logits.
        const Variable logits = model.forward(tokens, {1, 6});
        const std::vector<float> adapted = logits.value().to_host();
        for (std::size_t i = 0; i < packed.size(); ++i)
            ASSERT_EQ(adapted[i], packed[i]) << name_of(config);
        Variable loss = cross_entropy(reshape(logits, {6, 17}), targets);
        loss.backward();
        double gradient_norm = 0.0;
        for (const NamedParameter& named : adapters) {
            for (float g : named.parameter.gradient().to_host())
                gradient_norm += static_cast<double>(g) * g;
        }
        EXPECT_GT(gradient_norm, 0.0) << name_of(config);
    }
}

}  // namespace
}  // namespace riftco_transformer
