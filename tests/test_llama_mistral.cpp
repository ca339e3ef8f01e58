// Decoder: structure and names, config rules, forward against an independent
// double-precision reference (RoPE split-half, GQA with Hq != Hkv, Mistral's sliding window
// shorter than the context, tied embeddings), flash vs materialized, causality, gradients by
// finite differences, checkpointing, LoRA/NF4 on every projection, the incremental forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"
#include "riftco_transformer/serving/decode_session.hpp"

namespace riftco_transformer {
namespace {

DecoderConfig tiny_config() {
    DecoderConfig c;
    c.vocabulary_size = 13;
    c.maximum_context = 9;
    c.model_width = 16;
    c.query_head_count = 4;
    c.key_value_head_count = 2;  // GQA: two query heads per key/value head
    c.block_count = 2;
    c.feed_forward_width = 24;
    c.rms_norm_epsilon = 1e-5F;
    c.rope_theta = 500.0;
    return c;
}

using Values = std::map<std::string, std::vector<double>>;

Values parameter_values(const Module& model) {
    Values values;
    for (const NamedParameter& named : model.parameters()) {
        const std::vector<float> host = named.parameter.value().to_host();
        values[named.name] = std::vector<double>(host.begin(), host.end());
    }
    return values;
}

// y[o] = Σ_i W[o,i]·x[i] for W [out, in].
std::vector<double> project(const std::vector<double>& weight, const std::vector<double>& x,
                            std::size_t out) {
    const std::size_t in = x.size();
    std::vector<double> y(out, 0.0);
    for (std::size_t o = 0; o < out; ++o) {
        for (std::size_t i = 0; i < in; ++i)
            y[o] += weight[o * in + i] * x[i];
    }
    return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& scale,
                             double epsilon) {
    double square_sum = 0.0;
    for (double v : x)
        square_sum += v * v;
    const double inverse = 1.0 / std::sqrt(square_sum / static_cast<double>(x.size()) + epsilon);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        y[i] = x[i] * inverse * scale[i];
    return y;
}

// Split-half RoPE of one head vector at position p, straight from the formula.
void rotate(double* head, std::size_t d, std::size_t p, double theta) {
    for (std::size_t i = 0; i < d / 2; ++i) {
        const double angle =
            static_cast<double>(p) *
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double c = static_cast<double>(static_cast<float>(std::cos(angle)));
        const double s = static_cast<double>(static_cast<float>(std::sin(angle)));
        const double a = head[i];
        const double b = head[i + d / 2];
        head[i] = a * c - b * s;
        head[i + d / 2] = b * c + a * s;
    }
}

// logits [T][V] of one sequence, all in double, from the model's own parameter values.
std::vector<std::vector<double>> reference_logits(const DecoderConfig& c, const Values& w,
                                                  const std::vector<std::uint32_t>& tokens) {
    const std::size_t T = tokens.size();
    const std::size_t D = c.model_width;
    const std::size_t d = D / c.query_head_count;
    const std::size_t group = c.query_head_count / c.key_value_head_count;
    const std::size_t kv = c.key_value_head_count * d;
    const std::size_t F = c.feed_forward_width;
    const double eps = static_cast<double>(c.rms_norm_epsilon);
    std::vector<std::vector<double>> h(T);
    const auto& embedding = w.at("token_embedding.weight");
    for (std::size_t t = 0; t < T; ++t)
        h[t].assign(embedding.begin() + tokens[t] * D, embedding.begin() + (tokens[t] + 1) * D);
    for (std::size_t b = 0; b < c.block_count; ++b) {
        const std::string p = "blocks." + std::to_string(b) + ".";
        std::vector<std::vector<double>> q(T), k(T), v(T);
        for (std::size_t t = 0; t < T; ++t) {
            const auto x = rms_norm(h[t], w.at(p + "attention_norm.scale"), eps);
            q[t] = project(w.at(p + "attention.query.weight"), x, D);
            k[t] = project(w.at(p + "attention.key.weight"), x, kv);
            v[t] = project(w.at(p + "attention.value.weight"), x, kv);
            for (std::size_t head = 0; head < c.query_head_count; ++head)
                rotate(&q[t][head * d], d, t, c.rope_theta);
            for (std::size_t head = 0; head < c.key_value_head_count; ++head)
                rotate(&k[t][head * d], d, t, c.rope_theta);
        }
        for (std::size_t t = 0; t < T; ++t) {
            std::vector<double> context(D, 0.0);
            const std::size_t first =
                c.sliding_window && t + 1 > *c.sliding_window ? t + 1 - *c.sliding_window : 0;
            for (std::size_t head = 0; head < c.query_head_count; ++head) {
                const std::size_t kv_head = head / group;
                std::vector<double> scores;
                for (std::size_t s = first; s <= t; ++s) {
                    double dot = 0.0;
                    for (std::size_t i = 0; i < d; ++i)
                        dot += q[t][head * d + i] * k[s][kv_head * d + i];
                    scores.push_back(dot / std::sqrt(static_cast<double>(d)));
                }
                const double top = *std::max_element(scores.begin(), scores.end());
                double total = 0.0;
                for (double& score : scores)
                    total += (score = std::exp(score - top));
                for (std::size_t s = first; s <= t; ++s) {
                    for (std::size_t i = 0; i < d; ++i)
                        context[head * d + i] += scores[s - first] / total * v[s][kv_head * d + i];
                }
            }
            const auto attended = project(w.at(p + "attention.output.weight"), context, D);
            for (std::size_t i = 0; i < D; ++i)
                h[t][i] += attended[i];
            const auto x = rms_norm(h[t], w.at(p + "feed_forward_norm.scale"), eps);
            const auto gate = project(w.at(p + "feed_forward.gate.weight"), x, F);
            const auto up = project(w.at(p + "feed_forward.up.weight"), x, F);
            std::vector<double> hidden(F);
            for (std::size_t f = 0; f < F; ++f)
                hidden[f] = gate[f] / (1.0 + std::exp(-gate[f])) * up[f];
            const auto down = project(w.at(p + "feed_forward.down.weight"), hidden, D);
            for (std::size_t i = 0; i < D; ++i)
                h[t][i] += down[i];
        }
    }
    const auto& head_weight =
        c.tie_embeddings ? w.at("token_embedding.weight") : w.at("language_model_head.weight");
    std::vector<std::vector<double>> logits(T);
    for (std::size_t t = 0; t < T; ++t)
        logits[t] =
            project(head_weight, rms_norm(h[t], w.at("final_norm.scale"), eps), c.vocabulary_size);
    return logits;
}

// Gives every parameter non-trivial values (norm scales away from 1) so that a mistake in any
// one of them shows in the logits.
void perturb_parameters(Module& model, unsigned seed) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> noise(-0.4F, 0.4F);
    for (const NamedParameter& named : model.parameters()) {
        std::vector<float> values = named.parameter.value().to_host();
        const bool is_scale = named.name.find(".scale") != std::string::npos;
        for (float& value : values)
            value = is_scale ? 1.0F + noise(generator) : value + noise(generator) * 0.5F;
        Variable leaf = named.parameter;  // handles share the registered leaf
        leaf.set_value(Tensor(named.parameter.shape(), values));
    }
}

void expect_matches_reference(const DecoderConfig& config, AttentionKind kind, double tolerance) {
    std::mt19937 generator(5);
    Decoder model(config, generator, kind);
    perturb_parameters(model, 17);
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7};
    const std::size_t T = 7;
    const Variable logits = model.forward(tokens, {2, T});
    const std::vector<float> actual = logits.value().to_host();
    const Values values = parameter_values(model);
    for (std::size_t row = 0; row < 2; ++row) {
        const std::vector<std::uint32_t> sequence(tokens.begin() + row * T,
                                                  tokens.begin() + (row + 1) * T);
        const auto expected = reference_logits(config, values, sequence);
        for (std::size_t t = 0; t < T; ++t) {
            for (std::size_t v = 0; v < config.vocabulary_size; ++v) {
                EXPECT_NEAR(actual[(row * T + t) * config.vocabulary_size + v], expected[t][v],
                            tolerance)
                    << "row " << row << " t " << t << " v " << v;
            }
        }
    }
}

}  // namespace

TEST(LlamaMistral, ParameterNamesFollowTheContractOrder) {
    std::mt19937 generator(1);
    const Decoder model(tiny_config(), generator);
    std::vector<std::string> names;
    for (const auto& named : model.parameters())
        names.push_back(named.name);
    std::vector<std::string> expected = {"token_embedding.weight"};
    for (const char* block : {"blocks.0.", "blocks.1."}) {
        for (const char* name :
             {"attention_norm.scale", "attention.query.weight", "attention.key.weight",
              "attention.value.weight", "attention.output.weight", "feed_forward_norm.scale",
              "feed_forward.gate.weight", "feed_forward.up.weight", "feed_forward.down.weight"}) {
            expected.push_back(std::string(block) + name);
        }
    }
    expected.emplace_back("final_norm.scale");
    expected.emplace_back("language_model_head.weight");
    EXPECT_EQ(names, expected);
    // V·D + N·(2D + 2D² + 2·D·Hkv·d + 3·D·F) + D + V·D, by hand: 208 + 2·(32 + 512 + 256 + 1152)
    // + 16 + 208
    EXPECT_EQ(model.parameter_count(), 208U + 2U * (32U + 512U + 256U + 1152U) + 16U + 208U);
    EXPECT_EQ(model.parameters()[0].parameter.shape(), (Shape{13, 16}));
    EXPECT_EQ(model.parameters()[3].parameter.shape(), (Shape{8, 16}));  // key: Hkv·d x D
}

TEST(LlamaMistral, TiedEmbeddingsHaveNoHeadParameter) {
    DecoderConfig config = tiny_config();
    config.tie_embeddings = true;
    std::mt19937 generator(1);
    const Decoder model(config, generator);
    EXPECT_EQ(model.parameters().back().name, "final_norm.scale");
    EXPECT_EQ(model.projections().size(), 14U);  // 7 per block, no head
}

// untie_embeddings: the model becomes exactly an untied model of the same configuration (the
// same parameter names, shapes and order), the head starts as a bit copy of the table, so the
// logits are unchanged, and from then on the two are independent; NF4 and LoRA reach the head.
TEST(LlamaMistral, UntieEmbeddingsMakesAnUntiedModelWithTheSameLogits) {
    DecoderConfig config = tiny_config();
    config.tie_embeddings = true;
    std::mt19937 generator(21);
    Decoder model(config, generator);
    perturb_parameters(model, 22);
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9};
    const std::vector<float> before = model.forward(tokens, {1, 6}).value().to_host();
    DecodeSession old_session(model, KeyValueCacheKind::Paged, 4);
    const std::uint64_t version = model.structure_version();

    model.untie_embeddings();
    EXPECT_FALSE(model.config().tie_embeddings);
    EXPECT_FALSE(model.embeddings_tied());
    EXPECT_GT(model.structure_version(), version);
    EXPECT_TRUE(old_session.stale());
    DecoderConfig untied = config;
    untied.tie_embeddings = false;
    std::mt19937 other(21);
    const Decoder reference(untied, other);
    {  // the lists hold the dense weights, which quantize_nf4 below must own alone
        const ParameterList got = model.parameters();
        const ParameterList want = reference.parameters();
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            EXPECT_EQ(got[i].name, want[i].name);
            EXPECT_EQ(got[i].parameter.shape(), want[i].parameter.shape()) << got[i].name;
        }
        const Values values = parameter_values(model);
        EXPECT_EQ(values.at("language_model_head.weight"), values.at("token_embedding.weight"));
        EXPECT_EQ(model.forward(tokens, {1, 6}).value().to_host(), before);
        ASSERT_EQ(model.projections().size(), 15U);
        EXPECT_EQ(model.projections().back().target, LoraTarget::LanguageModelHead);
        EXPECT_EQ(model.projections().back().path, "language_model_head");

        // Independent parameters: writing the head leaves the table alone.
        Variable head = got.back().parameter;
        head.set_value(Tensor::zeros(head.shape()));
        EXPECT_EQ(parameter_values(model).at("token_embedding.weight"),
                  values.at("token_embedding.weight"));
    }

    // Refused once untied; nothing changes.
    const std::size_t count = model.parameter_count();
    try {
        model.untie_embeddings();
        ADD_FAILURE() << "untied twice";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what())
                      .find("Decoder::untie_embeddings: "
                            "the model's embeddings are not tied"),
                  std::string::npos)
            << error.what();
    }
    EXPECT_EQ(model.parameter_count(), count);
    Nf4Options options;
    options.block_size = 32;
    model.quantize_nf4(options);
    EXPECT_EQ(model.packed_quantized_state().size(), 15U);  // 7 per block and the head
}

// Without a graph (evaluation, decoding) RoPE runs fused and the gate/up projections share
// one GEMV pass; the logits must be the graph's, bit for bit.
TEST(LlamaMistral, TheForwardWithoutAGraphEqualsTheRecordedForwardBitForBit) {
    std::mt19937 generator(31);
    Decoder model(tiny_config(), generator);
    perturb_parameters(model, 32);
    for (const std::size_t time : {std::size_t{3}, std::size_t{7}}) {
        std::vector<std::uint32_t> tokens(time);
        for (std::size_t t = 0; t < time; ++t)
            tokens[t] = static_cast<std::uint32_t>((3 * t + 1) % 13);
        const Variable recorded = model.forward(tokens, {1, time});
        ASSERT_TRUE(recorded.requires_gradient());
        std::vector<float> constant;
        {
            const NoGradientGuard no_graph;
            constant = model.forward(tokens, {1, time}).value().to_host();
        }
        EXPECT_EQ(constant, recorded.value().to_host()) << "T " << time;
    }
}

TEST(LlamaMistral, UntieEmbeddingsIsRefusedWithAdaptersOrPackedWeights) {
    DecoderConfig config = tiny_config();
    config.tie_embeddings = true;
    const auto expect_refused = [](Decoder& model, const std::string& fragment) {
        const std::size_t count = model.parameters().size();
        const std::uint64_t version = model.structure_version();
        try {
            model.untie_embeddings();
            ADD_FAILURE() << "accepted; expected: " << fragment;
        } catch (const std::invalid_argument& error) {
            EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
        }
        EXPECT_TRUE(model.embeddings_tied());
        EXPECT_EQ(model.parameters().size(), count);
        EXPECT_EQ(model.structure_version(), version);
        EXPECT_EQ(model.projections().size(), 14U);
    };
    std::mt19937 generator(23);
    Decoder adapted(config, generator);
    adapted.attach_lora(LoraConfig{});
    expect_refused(adapted, "untie before attach_lora");
    Decoder packed(config, generator);
    Nf4Options options;
    options.block_size = 32;
    packed.quantize_nf4(options);
    expect_refused(packed, "untie before quantize_nf4");
    // After a merge the model is dense again and may be untied.
    Decoder merged(config, generator);
    merged.attach_lora(LoraConfig{});
    merged.merge_lora();
    merged.untie_embeddings();
    EXPECT_FALSE(merged.embeddings_tied());
}

TEST(LlamaMistral, ConfigRulesAreCheckedBeforeAnyDraw) {
    const auto expect_rejected = [](DecoderConfig config, const std::string& fragment) {
        std::mt19937 generator(3);
        try {
            const Decoder model(config, generator);
            ADD_FAILURE() << "accepted a config that should fail with: " << fragment;
        } catch (const std::invalid_argument& error) {
            EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
        }
        std::mt19937 untouched(3);
        EXPECT_EQ(generator(), untouched());
    };
    DecoderConfig c = tiny_config();
    c.model_width = 0;
    expect_rejected(c, "every dimension must be positive");
    c = tiny_config();
    c.model_width = 18;
    expect_rejected(c, "multiple of query_head_count");
    c = tiny_config();
    c.key_value_head_count = 3;
    expect_rejected(c, "multiple of key_value_head_count");
    c = tiny_config();
    c.model_width = 12;  // d_h = 3
    expect_rejected(c, "even head width");
    c = tiny_config();
    c.rms_norm_epsilon = 0.0F;
    expect_rejected(c, "rms_norm_epsilon");
    c = tiny_config();
    c.rope_theta = std::nan("");
    expect_rejected(c, "rope_theta");
    c = tiny_config();
    c.rope_theta = -1.0;
    expect_rejected(c, "rope_theta");
    c = tiny_config();
    c.sliding_window = 0;
    expect_rejected(c, "sliding_window");
    c = tiny_config();
    c.architecture = static_cast<DecoderArchitecture>(8);
    expect_rejected(c, "unknown architecture value 8");

    c = tiny_config();
    c.block_count = std::size_t{1} << 40;
    std::mt19937 generator(3);
    EXPECT_THROW(Decoder(c, generator), std::overflow_error);
}

TEST(LlamaMistral, ForwardMatchesDoubleReferenceWithGroupedQueryAttention) {
    expect_matches_reference(tiny_config(), AttentionKind::Materialized, 2e-4);
}

TEST(LlamaMistral, FlashForwardMatchesDoubleReference) {
    expect_matches_reference(tiny_config(), AttentionKind::Flash, 2e-4);
}

TEST(LlamaMistral, TiedEmbeddingsMatchDoubleReference) {
    DecoderConfig config = tiny_config();
    config.tie_embeddings = true;
    config.key_value_head_count = 1;  // multi-query attention
    expect_matches_reference(config, AttentionKind::Materialized, 2e-4);
}

TEST(LlamaMistral, MistralSlidingWindowShorterThanTheContextMatchesReference) {
    DecoderConfig config = tiny_config();
    config.architecture = DecoderArchitecture::Mistral;
    config.sliding_window = 3;  // C = 9, T = 7
    expect_matches_reference(config, AttentionKind::Materialized, 2e-4);
}

TEST(LlamaMistral, MistralSlidingWindowWithFlashMatchesReference) {
    DecoderConfig config = tiny_config();
    config.architecture = DecoderArchitecture::Mistral;
    config.sliding_window = 3;  // C = 9, T = 7
    expect_matches_reference(config, AttentionKind::Flash, 2e-4);
}

TEST(LlamaMistral, SlidingWindowChangesTheLogitsOnlyPastTheWindow) {
    DecoderConfig windowed = tiny_config();
    windowed.sliding_window = 3;
    std::mt19937 first_generator(8);
    std::mt19937 second_generator(8);
    const Decoder dense(tiny_config(), first_generator);
    const Decoder sliding(windowed, second_generator);
    const std::vector<std::uint32_t> tokens = {2, 7, 1, 8, 2, 8, 1};
    const auto a = dense.forward(tokens, {1, 7}).value().to_host();
    const auto b = sliding.forward(tokens, {1, 7}).value().to_host();
    const std::size_t V = 13;
    // Positions 0..2 see at most 3 keys: bit-identical computation paths are not guaranteed
    // (different kernels), so equal within float rounding; position 6 must differ.
    for (std::size_t i = 0; i < 3 * V; ++i)
        EXPECT_NEAR(a[i], b[i], 1e-5);
    double difference = 0.0;
    for (std::size_t i = 6 * V; i < 7 * V; ++i)
        difference += std::abs(a[i] - b[i]);
    EXPECT_GT(difference, 1e-3);
}

TEST(LlamaMistral, FlashWithAWindowShorterThanTheSequenceEqualsMaterialized) {
    // The flash kernel applies the window itself (K/V heads unrepeated); the materialized
    // path repeats K/V and masks [T,T] scores. Contract tolerances: 3e-5 forward, 5e-5 on
    // gradients (docs/ARCHITECTURE.md, 'Numeric parity').
    DecoderConfig config = tiny_config();
    config.architecture = DecoderArchitecture::Mistral;
    config.sliding_window = 3;  // C = 9, T = 7
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7};
    const std::vector<std::uint32_t> targets = {1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9};
    const auto run = [&](AttentionKind kind) {
        std::mt19937 generator(12);
        Decoder model(config, generator, kind);
        perturb_parameters(model, 23);
        const Variable logits = model.forward(tokens, {2, 7});
        Variable loss = cross_entropy(reshape(logits, {14, 13}), targets);
        loss.backward();
        std::vector<std::vector<float>> gradients;
        for (const NamedParameter& named : model.parameters())
            gradients.push_back(named.parameter.gradient().to_host());
        return std::pair{logits.value().to_host(), gradients};
    };
    const auto [materialized_logits, materialized_gradients] = run(AttentionKind::Materialized);
    const auto [flash_logits, flash_gradients] = run(AttentionKind::Flash);
    ASSERT_EQ(flash_logits.size(), materialized_logits.size());
    for (std::size_t i = 0; i < flash_logits.size(); ++i)
        EXPECT_NEAR(flash_logits[i], materialized_logits[i], 3e-5) << "logit " << i;
    ASSERT_EQ(flash_gradients.size(), materialized_gradients.size());
    for (std::size_t p = 0; p < flash_gradients.size(); ++p) {
        ASSERT_EQ(flash_gradients[p].size(), materialized_gradients[p].size());
        for (std::size_t i = 0; i < flash_gradients[p].size(); ++i) {
            EXPECT_NEAR(flash_gradients[p][i], materialized_gradients[p][i], 5e-5)
                << "parameter " << p << " element " << i;
        }
    }
}

TEST(LlamaMistral, CausalityIsBitExact) {
    std::mt19937 generator(4);
    Decoder model(tiny_config(), generator);
    for (AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        model.set_attention(kind);
        const std::vector<std::uint32_t> a = {1, 2, 3, 4, 5, 6};
        const std::vector<std::uint32_t> b = {1, 2, 3, 12, 0, 7};
        const auto la = model.forward(a, {1, 6}).value().to_host();
        const auto lb = model.forward(b, {1, 6}).value().to_host();
        for (std::size_t i = 0; i < 3 * 13; ++i)
            ASSERT_EQ(la[i], lb[i]) << "index " << i;
    }
}

TEST(LlamaMistral, ForwardErrorsNameTheArgument) {
    std::mt19937 generator(4);
    const Decoder model(tiny_config(), generator);
    const std::vector<std::uint32_t> too_long(10, 1);
    EXPECT_THROW((void)model.forward(too_long, {1, 10}), std::invalid_argument);
    const std::vector<std::uint32_t> bad_id = {1, 13};
    try {
        (void)model.forward(bad_id, {1, 2});
        ADD_FAILURE() << "an id equal to V was accepted";
    } catch (const std::out_of_range& error) {
        EXPECT_NE(std::string(error.what()).find("token id 13 at position 1"), std::string::npos);
    }
    const std::vector<std::uint32_t> three = {1, 2, 3};
    EXPECT_THROW((void)model.forward(three, {1, 2}), std::invalid_argument);
}

TEST(LlamaMistral, GradientsMatchFiniteDifferences) {
    DecoderConfig config = tiny_config();
    config.tie_embeddings = true;
    config.sliding_window = 4;
    std::mt19937 generator(6);
    Decoder model(config, generator);
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9};
    const std::vector<std::uint32_t> targets = {1, 4, 1, 5, 9, 2};
    const auto loss_value = [&]() {
        const Variable logits = model.forward(tokens, {1, 6});
        return static_cast<double>(
            cross_entropy(reshape(logits, {6, 13}), targets).value().to_host()[0]);
    };
    const Variable logits = model.forward(tokens, {1, 6});
    Variable loss = cross_entropy(reshape(logits, {6, 13}), targets);
    loss.backward();
    for (const NamedParameter& named : model.parameters()) {
        Variable leaf = named.parameter;  // handles share the registered leaf
        const std::vector<float> gradient = named.parameter.gradient().to_host();
        std::vector<float> values = named.parameter.value().to_host();
        for (std::size_t index : {std::size_t{0}, values.size() / 2, values.size() - 1}) {
            const float saved = values[index];
            constexpr float step = 1e-2F;
            values[index] = saved + step;
            leaf.set_value(Tensor(named.parameter.shape(), values));
            const double plus = loss_value();
            values[index] = saved - step;
            leaf.set_value(Tensor(named.parameter.shape(), values));
            const double minus = loss_value();
            values[index] = saved;
            leaf.set_value(Tensor(named.parameter.shape(), values));
            const double numeric = (plus - minus) / (2.0 * step);
            EXPECT_NEAR(gradient[index], numeric, 5e-3 + 5e-3 * std::abs(numeric))
                << named.name << "[" << index << "]";
        }
    }
}

TEST(LlamaMistral, BlockCheckpointingGivesTheSameGradients) {
    const auto gradients = [](ActivationCheckpointing checkpointing) {
        std::mt19937 generator(9);
        Decoder model(tiny_config(), generator, AttentionKind::Flash, checkpointing);
        const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
        const std::vector<std::uint32_t> targets = {1, 4, 1, 5, 9, 2, 6, 5};
        Variable loss = cross_entropy(reshape(model.forward(tokens, {2, 4}), {8, 13}), targets);
        loss.backward();
        std::vector<float> all;
        for (const NamedParameter& named : model.parameters()) {
            const auto g = named.parameter.gradient().to_host();
            all.insert(all.end(), g.begin(), g.end());
        }
        return all;
    };
    const auto plain = gradients(ActivationCheckpointing::Disabled);
    const auto replayed = gradients(ActivationCheckpointing::TransformerBlock);
    ASSERT_EQ(plain.size(), replayed.size());
    for (std::size_t i = 0; i < plain.size(); ++i)
        ASSERT_EQ(plain[i], replayed[i]) << "gradient element " << i;
}

TEST(LlamaMistral, LoraTargetsEveryProjectionByName) {
    std::mt19937 generator(10);
    Decoder model(tiny_config(), generator);
    LoraConfig lora;
    lora.rank = 2;
    lora.targets = lora_target_bit(LoraTarget::Query) | lora_target_bit(LoraTarget::Key) |
                   lora_target_bit(LoraTarget::Value) | lora_target_bit(LoraTarget::Output) |
                   lora_target_bit(LoraTarget::FeedForwardGate) |
                   lora_target_bit(LoraTarget::FeedForwardUp) |
                   lora_target_bit(LoraTarget::FeedForwardDown) |
                   lora_target_bit(LoraTarget::LanguageModelHead);
    const std::vector<std::uint32_t> tokens = {1, 2, 3};
    const auto before = model.forward(tokens, {1, 3}).value().to_host();
    model.attach_lora(lora);
    // 15 adapted projections, two factors each; B starts at zero so the logits are unchanged.
    EXPECT_EQ(model.lora_parameters().size(), 30U);
    EXPECT_EQ(model.lora_parameters()[0].name, "blocks.0.attention.query.lora_a.weight");
    const auto after = model.forward(tokens, {1, 3}).value().to_host();
    EXPECT_EQ(before, after);
    for (const NamedParameter& named : model.parameters())
        EXPECT_FALSE(named.parameter.requires_gradient()) << named.name;
}

TEST(LlamaMistral, FeedForwardExpandIsNotATargetOfThisModel) {
    std::mt19937 generator(10);
    Decoder model(tiny_config(), generator);
    LoraConfig lora;
    lora.targets = lora_target_bit(LoraTarget::FeedForwardExpand);
    EXPECT_THROW(model.attach_lora(lora), std::invalid_argument);
    EXPECT_FALSE(model.lora_attached());
}

TEST(LlamaMistral, Nf4PacksEveryProjectionAndRunsTheDequantizedWeights) {
    std::mt19937 generator(12);
    Decoder model(tiny_config(), generator);
    Nf4Options options;
    options.block_size = 32;
    model.quantize_nf4(options);
    EXPECT_TRUE(model.has_quantized_weights());
    // Only embeddings and norm scales stay dense: V·D + N·2D + D.
    EXPECT_EQ(model.parameter_count(), 208U + 2U * 32U + 16U);
    // Oracle: the double reference over the decoded NF4 weights.
    Values values = parameter_values(model);
    for (const AdaptableProjection& projection : model.projections()) {
        ASSERT_TRUE(projection.linear->is_quantized()) << projection.path;
        const auto decoded = projection.linear->quantized_weight().dequantize().to_host();
        values[projection.path + ".weight"] = std::vector<double>(decoded.begin(), decoded.end());
    }
    const std::vector<std::uint32_t> tokens = {1, 2, 3, 4};
    const auto packed = model.forward(tokens, {1, 4}).value().to_host();
    const auto expected = reference_logits(tiny_config(), values, tokens);
    for (std::size_t t = 0; t < 4; ++t) {
        for (std::size_t v = 0; v < 13; ++v)
            EXPECT_NEAR(packed[t * 13 + v], expected[t][v], 2e-4) << "t " << t << " v " << v;
    }
}

namespace {

// A host-side K/V store computing attention in double: the oracle for the incremental path.
// Keys and values arrive with Hkv heads; query head h reads head ⌊h/(Hq/Hkv)⌋, within the
// window when one is given.
class ReferenceCache final : public IncrementalAttentionCache {
  public:
    ReferenceCache(std::size_t layers, std::vector<std::size_t> positions)
        : keys_(layers), values_(layers), positions_(std::move(positions)) {}
    void set_positions(std::vector<std::size_t> positions) { positions_ = std::move(positions); }

    Tensor append_and_attend(std::size_t layer, const Tensor& query, const Tensor& key,
                             const Tensor& value,
                             const IncrementalAttentionOptions& options) override {
        const Shape& s = query.shape();  // [R,Hq,1,d]
        const std::size_t rows = s[0];
        const std::size_t heads = s[1];
        const std::size_t kv_heads = key.shape()[1];  // [R,Hkv,1,d]
        const std::size_t group = heads / kv_heads;
        const std::size_t d = s[3];
        const auto q = query.to_host();
        const auto k = key.to_host();
        const auto v = value.to_host();
        for (std::size_t r = 0; r < rows; ++r) {
            keys_[layer][positions_[r]].assign(k.begin() + r * kv_heads * d,
                                               k.begin() + (r + 1) * kv_heads * d);
            values_[layer][positions_[r]].assign(v.begin() + r * kv_heads * d,
                                                 v.begin() + (r + 1) * kv_heads * d);
        }
        std::vector<float> context(rows * heads * d, 0.0F);
        for (std::size_t r = 0; r < rows; ++r) {
            const std::size_t first = options.window == 0 || options.window > positions_[r]
                                          ? 0
                                          : positions_[r] + 1 - options.window;
            for (std::size_t h = 0; h < heads; ++h) {
                const std::size_t kv = h / group;
                std::vector<double> scores;
                for (std::size_t p = first; p <= positions_[r]; ++p) {
                    double dot = 0.0;
                    for (std::size_t i = 0; i < d; ++i)
                        dot += static_cast<double>(q[(r * heads + h) * d + i]) *
                               keys_[layer].at(p)[kv * d + i];
                    scores.push_back(dot / std::sqrt(static_cast<double>(d)));
                }
                const double top = *std::max_element(scores.begin(), scores.end());
                double total = 0.0;
                for (double& score : scores)
                    total += (score = std::exp(score - top));
                for (std::size_t p = 0; p < scores.size(); ++p) {
                    for (std::size_t i = 0; i < d; ++i) {
                        context[(r * heads + h) * d + i] += static_cast<float>(
                            scores[p] / total * values_[layer].at(first + p)[kv * d + i]);
                    }
                }
            }
        }
        return Tensor(s, context);
    }

  private:
    std::vector<std::map<std::size_t, std::vector<float>>> keys_;
    std::vector<std::map<std::size_t, std::vector<float>>> values_;
    std::vector<std::size_t> positions_;
};

}  // namespace

TEST(LlamaMistral, IncrementalForwardEqualsTheFullForwardAtEveryPosition) {
    std::mt19937 generator(13);
    Decoder model(tiny_config(), generator);
    perturb_parameters(model, 3);
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2};
    const auto full = model.forward(tokens, {1, 7}).value().to_host();
    // Prefill of the first four rows in one pass, then one token at a time.
    ReferenceCache cache(2, {0, 1, 2, 3});
    const std::vector<std::size_t> positions = {0, 1, 2, 3};
    const std::vector<std::size_t> all_rows = {0, 1, 2, 3};
    const auto prefill =
        model.forward_incremental(std::span(tokens).first(4), positions, cache, all_rows).to_host();
    std::vector<float> incremental = prefill;
    for (std::size_t t = 4; t < 7; ++t) {
        cache.set_positions({t});
        const std::vector<std::size_t> position = {t};
        const std::vector<std::size_t> row = {0};
        const auto step =
            model.forward_incremental(std::span(tokens).subspan(t, 1), position, cache, row)
                .to_host();
        incremental.insert(incremental.end(), step.begin(), step.end());
    }
    ASSERT_EQ(incremental.size(), full.size());
    for (std::size_t i = 0; i < full.size(); ++i)
        EXPECT_NEAR(incremental[i], full[i], 1e-4) << "index " << i;
}

TEST(LlamaMistral, RotaryTablesFollowTheFormula) {
    const std::vector<std::size_t> positions = {0, 3};
    const RotaryTables tables = rotary_tables(positions, 4, 100.0, ExecutionBackend::Cpu);
    const auto cosine = tables.cosine.to_host();
    const auto sine = tables.sine.to_host();
    // position 3: angles 3·100^0 = 3 and 3·100^(-1/2) = 0.3
    EXPECT_FLOAT_EQ(cosine[2], static_cast<float>(std::cos(3.0)));
    EXPECT_FLOAT_EQ(sine[3], static_cast<float>(std::sin(0.3)));
    EXPECT_FLOAT_EQ(cosine[0], 1.0F);
    EXPECT_FLOAT_EQ(sine[1], 0.0F);
    EXPECT_THROW((void)rotary_tables(positions, 3, 100.0, ExecutionBackend::Cpu),
                 std::invalid_argument);
    EXPECT_THROW((void)rotary_tables(positions, 4, 0.0, ExecutionBackend::Cpu),
                 std::invalid_argument);
    EXPECT_THROW((void)rotary_tables({}, 4, 100.0, ExecutionBackend::Cpu), std::invalid_argument);
}

TEST(LlamaMistral, DecodeSessionsEqualTheFullForwardWithinTolerance) {
    std::mt19937 generator(14);
    Decoder model(tiny_config(), generator);
    perturb_parameters(model, 5);
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    const auto full = model.forward(tokens, {1, 9}).value().to_host();
    const std::size_t V = 13;
    for (KeyValueCacheKind kind : {KeyValueCacheKind::Paged, KeyValueCacheKind::Contiguous}) {
        DecodeSession session(model, kind, 4);
        // A prompt of five (one pass, every row's logits), then single tokens to the capacity.
        const auto prompt =
            session.prefill(std::span(tokens).first(5), PrefillLogits::All).to_host();
        for (std::size_t i = 0; i < 5 * V; ++i)
            EXPECT_NEAR(prompt[i], full[i], 1e-4) << "prefill index " << i;
        for (std::size_t t = 5; t < 9; ++t) {
            const auto step = session.decode_token(tokens[t]).to_host();
            for (std::size_t v = 0; v < V; ++v)
                EXPECT_NEAR(step[v], full[t * V + v], 1e-4) << "position " << t << " id " << v;
        }
        EXPECT_EQ(session.size(), 9U);
        EXPECT_THROW((void)session.decode_token(1), std::out_of_range);
    }
}

TEST(LlamaMistral, BatchedDecodeOverASharedPoolMatchesSingleSessions) {
    std::mt19937 generator(15);
    DecoderConfig config = tiny_config();
    config.key_value_head_count = 1;
    Decoder model(config, generator);
    perturb_parameters(model, 6);
    auto pool = make_key_value_cache_pool(model, 2, 0);
    auto second_pool = make_key_value_cache_pool(model, 2, 0);
    DecodeSession first(model, pool);
    DecodeSession second(model, second_pool);
    const std::vector<std::uint32_t> a = {1, 2, 3};
    const std::vector<std::uint32_t> b = {7, 8};
    const std::vector<DecodeWork> work = {{&first, a}, {&second, b}};
    const auto batched = decode_batch(work).to_host();
    const auto alone_a = model.forward(a, {1, 3}).value().to_host();
    const auto alone_b = model.forward(b, {1, 2}).value().to_host();
    const std::size_t V = 13;
    for (std::size_t v = 0; v < V; ++v) {
        EXPECT_NEAR(batched[v], alone_a[2 * V + v], 1e-4);
        EXPECT_NEAR(batched[V + v], alone_b[V + v], 1e-4);
    }
}

// Mistral with GQA (Hq = 4, Hkv = 2) and a window of 3 shorter than the context of 9.
DecoderConfig windowed_config() {
    DecoderConfig config = tiny_config();
    config.architecture = DecoderArchitecture::Mistral;
    config.sliding_window = 3;
    return config;
}

void expect_rows_near(const std::vector<float>& actual, const std::vector<float>& full,
                      std::size_t first_position, const std::string& what) {
    const std::size_t V = 13;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        EXPECT_NEAR(actual[i], full[first_position * V + i], 1e-4)
            << what << ", position " << first_position + i / V << ", id " << i % V;
    }
}

TEST(LlamaMistral, WindowedDecodeEqualsTheFullForwardThroughAndPastTheWindow) {
    std::mt19937 generator(16);
    Decoder model(windowed_config(), generator);
    perturb_parameters(model, 7);
    const std::vector<std::uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    // The oracle: the materialized full forward, masked to the window.
    const auto full = model.forward(tokens, {1, 9}).value().to_host();
    for (KeyValueCacheKind kind : {KeyValueCacheKind::Paged, KeyValueCacheKind::Contiguous}) {
        const std::string name(key_value_cache_kind_name(kind));
        // One token at a time from position 0: the paged kernel at every position.
        DecodeSession stepped(model, kind, 2);
        for (std::size_t t = 0; t < 9; ++t) {
            expect_rows_near(stepped.decode_token(tokens[t]).to_host(), full, t, name + " stepped");
        }
        // A prompt longer than the window (flash with the window over [1,Hq,T,d] and
        // K/V [1,Hkv,T,d]), a chunk of two (the paged kernel, one row per position), then
        // single tokens to the capacity.
        DecodeSession chunked(model, kind, 2);
        expect_rows_near(chunked.prefill(std::span(tokens).first(5), PrefillLogits::All).to_host(),
                         full, 0, name + " prompt");
        expect_rows_near(
            chunked.prefill(std::span(tokens).subspan(5, 2), PrefillLogits::All).to_host(), full, 5,
            name + " chunk");
        for (std::size_t t = 7; t < 9; ++t) {
            expect_rows_near(chunked.decode_token(tokens[t]).to_host(), full, t, name + " chunked");
        }
        EXPECT_EQ(chunked.size(), 9U);
    }
}

TEST(LlamaMistral, WindowedBatchedDecodeOverASharedPoolEqualsTheFullForward) {
    std::mt19937 generator(17);
    Decoder model(windowed_config(), generator);
    perturb_parameters(model, 8);
    const std::size_t V = 13;
    const std::vector<std::vector<std::uint32_t>> sequences = {
        {3, 1, 4, 1, 5, 9, 2, 6, 5}, {2, 7, 1, 8, 2, 8, 1}, {6, 6, 0, 7, 4, 3, 1, 12}};
    std::vector<std::vector<float>> full;
    for (const auto& sequence : sequences) {
        full.push_back(model.forward(sequence, {1, sequence.size()}).value().to_host());
    }
    // Two sessions share a pool of pages of 2 (the scheduler's layout), the third leases from
    // its own, so the step gathers rows per pool too.
    auto shared = make_key_value_cache_pool(model, 2, 10);
    auto own = make_key_value_cache_pool(model, 2, 0);
    DecodeSession first(model, shared);
    DecodeSession second(model, shared);
    DecodeSession third(model, own);
    const std::vector<DecodeSession*> sessions = {&first, &second, &third};
    // Session i starts i steps late, so the batch mixes lengths on either side of the window.
    for (std::size_t step = 0; step < 10; ++step) {  // the last: session 2, position 7
        std::vector<DecodeWork> work;
        std::vector<std::size_t> positions;
        for (std::size_t i = 0; i < sessions.size(); ++i) {
            if (step < i || step - i >= sequences[i].size()) {
                continue;
            }
            const std::size_t t = step - i;
            work.push_back({sessions[i], std::span(sequences[i]).subspan(t, 1)});
            positions.push_back(t);
        }
        const auto logits = decode_batch(work).to_host();
        std::size_t n = 0;
        for (std::size_t i = 0; i < sessions.size(); ++i) {
            if (step < i || step - i >= sequences[i].size()) {
                continue;
            }
            for (std::size_t v = 0; v < V; ++v) {
                EXPECT_NEAR(logits[n * V + v], full[i][positions[n] * V + v], 1e-4)
                    << "session " << i << ", position " << positions[n] << ", id " << v;
            }
            ++n;
        }
    }
    for (std::size_t i = 0; i < sessions.size(); ++i) {
        EXPECT_EQ(sessions[i]->size(), sequences[i].size());
    }
}

TEST(LlamaMistral, KeyValuePoolStoresTheKeyValueHeadsOnly) {
    DecoderConfig config = tiny_config();
    config.key_value_head_count = 1;  // Hq = 4 query heads share one key/value head
    std::mt19937 generator(18);
    const Decoder model(config, generator);
    const KeyValueCacheDimensions dimensions = key_value_cache_dimensions(model);
    EXPECT_EQ(dimensions.head_count, 1U);
    EXPECT_EQ(dimensions.head_width, 4U);  // D / Hq
    const std::size_t block_size = 4;
    const auto pool = make_key_value_cache_pool(model, block_size, 0);
    const std::size_t blocks = 3;  // ceil(9 / 4)
    EXPECT_EQ(pool->keys(0).shape(), (Shape{blocks, 1, block_size, 4}));
    // Both pools of N layers, [blocks, Hkv, S, D/Hq] floats each: Hkv/Hq = 1/4 of the
    // [blocks, Hq, S, D/Hq] layout that repeated the heads.
    const std::size_t hkv_bytes = 2 * config.block_count * blocks * config.key_value_head_count *
                                  block_size * (config.model_width / config.query_head_count) *
                                  sizeof(float);
    const std::size_t hq_bytes = 2 * config.block_count * blocks * config.query_head_count *
                                 block_size * (config.model_width / config.query_head_count) *
                                 sizeof(float);
    EXPECT_EQ(pool->storage_bytes(), hkv_bytes);
    EXPECT_EQ(pool->storage_bytes() * config.query_head_count,
              hq_bytes * config.key_value_head_count);
    // A pool sized for the query heads no longer fits the model's sessions.
    KeyValueCacheDimensions repeated = dimensions;
    repeated.head_count = config.query_head_count;
    EXPECT_THROW(DecodeSession(model, KeyValueCachePool::create(repeated, model.backend(), 4)),
                 std::invalid_argument);
}

}  // namespace riftco_transformer
