// DecoderOnlyTransformer's DecoderOptions (GPT-2 checkpoints): tanh GELU in the FFN and a head
// tied to the token embedding. Each is checked against a double-precision forward written
// here from the formulas, plus decode-session parity, gradients through the tied table, and
// the option rules (checked before any random draw).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

TransformerDimensions small() {
    return {.vocabulary_size = 13,
            .maximum_context = 8,
            .model_width = 8,
            .head_count = 2,
            .block_count = 2,
            .feed_forward_width = 12};
}

DecoderOptions gpt2_options() {
    DecoderOptions options;
    options.feed_forward_activation = Activation::GeluTanh;
    options.tie_embeddings = true;
    return options;
}

std::unique_ptr<DecoderOnlyTransformer> make(
    const DecoderOptions& options, std::uint32_t seed,
    AttentionKind attention = AttentionKind::Materialized) {
    std::mt19937 generator(seed);
    return std::make_unique<DecoderOnlyTransformer>(small(), generator, 1e-5F, attention,
                                                    ActivationCheckpointing::Disabled, options);
}

// ---- a double-precision GPT-2 forward over one sequence, from the parameter values

using Matrix = std::vector<double>;  // row-major

struct Weights {
    std::map<std::string, std::vector<double>> values;
    const std::vector<double>& operator[](const std::string& name) const { return values.at(name); }
};

Weights weights_of(const DecoderOnlyTransformer& model) {
    Weights weights;
    for (const NamedParameter& named : model.parameters()) {
        const std::vector<float> host = named.parameter.value().to_host();
        weights.values[named.name] = std::vector<double>(host.begin(), host.end());
    }
    return weights;
}

// y[t] = W x[t] + b for W [out, in] (b may be empty).
Matrix affine(const Matrix& x, std::size_t time, std::size_t in, const std::vector<double>& w,
              const std::vector<double>& b, std::size_t out) {
    Matrix y(time * out, 0.0);
    for (std::size_t t = 0; t < time; ++t) {
        for (std::size_t o = 0; o < out; ++o) {
            double sum = b.empty() ? 0.0 : b[o];
            for (std::size_t i = 0; i < in; ++i)
                sum += w[o * in + i] * x[t * in + i];
            y[t * out + o] = sum;
        }
    }
    return y;
}

Matrix layer_norm(const Matrix& x, std::size_t time, std::size_t width,
                  const std::vector<double>& scale, const std::vector<double>& bias) {
    Matrix y(x.size());
    for (std::size_t t = 0; t < time; ++t) {
        double mean = 0.0;
        for (std::size_t i = 0; i < width; ++i)
            mean += x[t * width + i];
        mean /= static_cast<double>(width);
        double variance = 0.0;
        for (std::size_t i = 0; i < width; ++i)
            variance += (x[t * width + i] - mean) * (x[t * width + i] - mean);
        variance /= static_cast<double>(width);
        const double inverse = 1.0 / std::sqrt(variance + 1e-5);
        for (std::size_t i = 0; i < width; ++i)
            y[t * width + i] = (x[t * width + i] - mean) * inverse * scale[i] + bias[i];
    }
    return y;
}

double gelu_tanh(double x) {
    const double pi = std::acos(-1.0);
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

// logits [T, V] of the tied, tanh-GELU decoder.
Matrix reference_logits(const Weights& w, const std::vector<std::uint32_t>& tokens) {
    const TransformerDimensions d = small();
    const std::size_t T = tokens.size();
    const std::size_t D = d.model_width;
    const std::size_t H = d.head_count;
    const std::size_t hd = D / H;
    const std::size_t F = d.feed_forward_width;
    const std::size_t V = d.vocabulary_size;
    Matrix h(T * D);
    for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t i = 0; i < D; ++i) {
            h[t * D + i] = w["token_embedding.weight"][tokens[t] * D + i] +
                           w["position_embedding.weight"][t * D + i];
        }
    }
    for (std::size_t block = 0; block < d.block_count; ++block) {
        const std::string p = "blocks." + std::to_string(block) + ".";
        const Matrix a =
            layer_norm(h, T, D, w[p + "attention_norm.scale"], w[p + "attention_norm.bias"]);
        const Matrix q =
            affine(a, T, D, w[p + "attention.query.weight"], w[p + "attention.query.bias"], D);
        const Matrix k =
            affine(a, T, D, w[p + "attention.key.weight"], w[p + "attention.key.bias"], D);
        const Matrix v =
            affine(a, T, D, w[p + "attention.value.weight"], w[p + "attention.value.bias"], D);
        Matrix mixed(T * D, 0.0);
        for (std::size_t head = 0; head < H; ++head) {
            for (std::size_t t = 0; t < T; ++t) {
                std::vector<double> score(t + 1);
                double top = -INFINITY;
                for (std::size_t s = 0; s <= t; ++s) {
                    double dot = 0.0;
                    for (std::size_t j = 0; j < hd; ++j)
                        dot += q[t * D + head * hd + j] * k[s * D + head * hd + j];
                    score[s] = dot / std::sqrt(static_cast<double>(hd));
                    top = std::max(top, score[s]);
                }
                double total = 0.0;
                for (double& value : score) {
                    value = std::exp(value - top);
                    total += value;
                }
                for (std::size_t s = 0; s <= t; ++s) {
                    for (std::size_t j = 0; j < hd; ++j)
                        mixed[t * D + head * hd + j] += score[s] / total * v[s * D + head * hd + j];
                }
            }
        }
        const Matrix attended = affine(mixed, T, D, w[p + "attention.output.weight"],
                                       w[p + "attention.output.bias"], D);
        for (std::size_t i = 0; i < h.size(); ++i)
            h[i] += attended[i];
        const Matrix n =
            layer_norm(h, T, D, w[p + "feed_forward_norm.scale"], w[p + "feed_forward_norm.bias"]);
        Matrix hidden = affine(n, T, D, w[p + "feed_forward.expand.weight"],
                               w[p + "feed_forward.expand.bias"], F);
        for (double& value : hidden)
            value = gelu_tanh(value);
        const Matrix projected = affine(hidden, T, F, w[p + "feed_forward.project.weight"],
                                        w[p + "feed_forward.project.bias"], D);
        for (std::size_t i = 0; i < h.size(); ++i)
            h[i] += projected[i];
    }
    const Matrix final_hidden = layer_norm(h, T, D, w["final_norm.scale"], w["final_norm.bias"]);
    // Tied head: logits = h·Eᵀ, E [V, D] read as the weight [out, in]; no bias.
    return affine(final_hidden, T, D, w["token_embedding.weight"], {}, V);
}

}  // namespace

TEST(DecoderGpt2Variant, TiedHeadHasNoHeadParametersAndNoHeadTarget) {
    const auto model = make(gpt2_options(), 3);
    const ParameterList parameters = model->parameters();
    EXPECT_EQ(parameters.back().name, "final_norm.bias");
    for (const NamedParameter& named : parameters)
        EXPECT_EQ(named.name.find("language_model_head"), std::string::npos) << named.name;
    // VD + CD + N(4D² + 2DF + 9D + F) + 2D, with V=13, C=8, D=8, N=2, F=12: the untied
    // count less the head's VD + V.
    EXPECT_EQ(model->parameter_count(),
              13U * 8 + 8 * 8 + 2U * (4 * 64 + 2 * 8 * 12 + 9 * 8 + 12) + 2 * 8);
    EXPECT_EQ(model->projections().size(), 12U);  // 6 per block, no head
    LoraConfig lora;
    lora.targets = lora_target_bit(LoraTarget::LanguageModelHead);
    EXPECT_THROW(model->attach_lora(lora), std::invalid_argument);
    EXPECT_FALSE(model->lora_attached());
}

TEST(DecoderGpt2Variant, ForwardMatchesTheDoubleReference) {
    for (const AttentionKind attention : {AttentionKind::Materialized, AttentionKind::Flash}) {
        const auto model = make(gpt2_options(), 5, attention);
        const std::vector<std::uint32_t> tokens = {3, 1, 12, 7, 0, 7, 9, 2};
        const std::vector<float> logits =
            model->forward(tokens, {1, tokens.size()}).value().to_host();
        EXPECT_TRUE(
            testing::all_close(logits, reference_logits(weights_of(*model), tokens), 1e-5, 1e-4));
    }
}

TEST(DecoderGpt2Variant, TheActivationChangesTheLogitsAndTheSeedDrawsTheSameWeights) {
    DecoderOptions erf = gpt2_options();
    erf.feed_forward_activation = Activation::Gelu;
    const auto tanh_model = make(gpt2_options(), 9);
    const auto erf_model = make(erf, 9);
    const std::vector<std::uint32_t> tokens = {1, 2, 3, 4};
    // Same draws (the activation has no parameters), different function.
    const ParameterList a = tanh_model->parameters();
    const ParameterList b = erf_model->parameters();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(a[i].parameter.value().to_host(),
                                           b[i].parameter.value().to_host()));
    }
    EXPECT_FALSE(testing::bit_identical(tanh_model->forward(tokens, {1, 4}).value().to_host(),
                                        erf_model->forward(tokens, {1, 4}).value().to_host()));
}

TEST(DecoderGpt2Variant, DecodeSessionMatchesTheFullForward) {
    const auto model = make(gpt2_options(), 21);
    const std::vector<std::uint32_t> tokens = {4, 4, 11, 0, 5, 6, 12, 1};
    std::vector<float> expected;
    {
        const NoGradientGuard guard;
        expected = model->forward(tokens, {1, tokens.size()}).value().to_host();
    }
    DecodeSession session(*model);
    const std::size_t V = small().vocabulary_size;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
        const std::vector<float> logits = session.decode_token(tokens[t]).to_host();
        for (std::size_t v = 0; v < V; ++v)
            EXPECT_NEAR(logits[v], expected[t * V + v], 1e-5) << "position " << t;
    }
}

TEST(DecoderGpt2Variant, GradientsReachTheTiedTableFromBothEndsAndMatchFiniteDifferences) {
    auto model = make(gpt2_options(), 13);
    const std::vector<std::uint32_t> tokens = {1, 5, 9, 2, 2, 7};
    const std::vector<std::uint32_t> targets = {5, 9, 2, 2, 7, 0};
    cross_entropy(model->forward(tokens, {1, 6}), targets).backward();
    // Row 12 of E is never an input token: its gradient comes through the head alone.
    const ParameterList parameters = model->parameters();
    const std::vector<float> table_gradient = parameters[0].parameter.gradient().to_host();
    double unused_row = 0.0;
    for (std::size_t i = 0; i < small().model_width; ++i)
        unused_row += std::fabs(table_gradient[12 * small().model_width + i]);
    EXPECT_GT(unused_row, 0.0);
    testing::expect_gradients_match_finite_differences(
        parameters,
        [&] {
            return static_cast<double>(
                cross_entropy(model->forward(tokens, {1, 6}), targets).value().item());
        },
        3);
}

TEST(DecoderGpt2Variant, Nf4PacksTheBlockProjectionsOnly) {
    auto model = make(gpt2_options(), 17);
    model->quantize_nf4();
    EXPECT_TRUE(model->has_quantized_weights());
    EXPECT_EQ(model->packed_quantized_state().size(), 12U);  // 6 per block; E stays dense
    const std::vector<std::uint32_t> tokens = {1, 2, 3};
    const std::vector<float> logits = model->forward(tokens, {1, 3}).value().to_host();
    for (const float value : logits)
        EXPECT_TRUE(std::isfinite(value));
}

TEST(DecoderGpt2Variant, UntieEmbeddingsGivesAHeadWithAZeroBiasAndTheSameLogits) {
    auto model = make(gpt2_options(), 19);
    const std::vector<std::uint32_t> tokens = {3, 1, 12, 7, 0};
    const std::vector<float> before = model->forward(tokens, {1, 5}).value().to_host();
    const std::size_t tied_count = model->parameter_count();
    model->untie_embeddings();
    EXPECT_FALSE(model->options().tie_embeddings);
    {  // the list holds the dense weights, which quantize_nf4 below must own alone
        const ParameterList parameters = model->parameters();
        ASSERT_GE(parameters.size(), 2U);
        EXPECT_EQ(parameters[parameters.size() - 2].name, "language_model_head.weight");
        EXPECT_EQ(parameters.back().name, "language_model_head.bias");
        EXPECT_EQ(parameters[parameters.size() - 2].parameter.value().to_host(),
                  model->parameters().front().parameter.value().to_host());  // token_embedding
        EXPECT_EQ(parameters.back().parameter.value().to_host(), std::vector<float>(13, 0.0F));
    }
    EXPECT_EQ(model->parameter_count(), tied_count + 13U * 8 + 13);  // VD + V
    EXPECT_EQ(model->forward(tokens, {1, 5}).value().to_host(), before);
    EXPECT_THROW(model->untie_embeddings(), std::invalid_argument);
    model->quantize_nf4();
    EXPECT_EQ(model->packed_quantized_state().size(), 13U);  // 6 per block and the head
}

TEST(DecoderGpt2Variant, AnUnknownActivationIsRejectedBeforeAnyDraw) {
    DecoderOptions options;
    options.feed_forward_activation = static_cast<Activation>(7);
    std::mt19937 generator(4);
    try {
        const DecoderOnlyTransformer model(small(), generator, 1e-5F, AttentionKind::Materialized,
                                           ActivationCheckpointing::Disabled, options);
        ADD_FAILURE() << "an unknown activation was accepted";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("feed_forward_activation value 7"),
                  std::string::npos)
            << error.what();
    }
    std::mt19937 untouched(4);
    EXPECT_EQ(generator(), untouched());
}

}  // namespace riftco_transformer
