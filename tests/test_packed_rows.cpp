// Packed rows (the fine-tuning issue): several documents one after another in a row, each token
// at its position inside its document. For every decoder family and both attention kinds:
// each document's logits and gradients equal those of the document alone (the unpacked,
// unpadded run), a document's logits do not depend on the tokens of the documents before it
// (bit for bit), flash equals materialized, and the packing rules are errors that name the row
// and the token.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "support/decoder_families.hpp"
#include "support/model_support.hpp"

namespace riftco_transformer {
namespace {

using testing::family_configs;
using testing::name_of;
using testing::perturb;

// Two rows of 15 tokens: documents of 5, 7 and 3 tokens; of 9 and 6.
const std::vector<std::size_t> row_documents[2] = {{5, 7, 3}, {9, 6}};
constexpr std::size_t time_steps = 15;

std::vector<std::uint32_t> packed_tokens(std::uint32_t vocabulary, std::uint32_t salt) {
    std::vector<std::uint32_t> tokens(2 * time_steps);
    for (std::size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<std::uint32_t>((i * 7 + 3 + salt * (i < 5 ? 1 : 0)) % vocabulary);
    return tokens;
}

std::vector<std::uint32_t> packed_positions() {
    std::vector<std::uint32_t> positions;
    for (const auto& documents : row_documents) {
        for (const std::size_t length : documents) {
            for (std::size_t p = 0; p < length; ++p)
                positions.push_back(static_cast<std::uint32_t>(p));
        }
    }
    return positions;
}

// Logits of the packed batch [2,T,V], flattened.
std::vector<float> packed_logits(const Decoder& model, const std::vector<std::uint32_t>& tokens) {
    return model.forward(tokens, {2, time_steps}, packed_positions()).value().to_host();
}

TEST(PackedRows, EachDocumentGetsTheLogitsItGetsAloneInEveryFamilyAndKind) {
    for (const DecoderConfig& config : family_configs()) {
        for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
            std::mt19937 generator(4);
            Decoder model(config, generator, kind);
            perturb(model, 5);
            const std::size_t vocabulary = config.vocabulary_size;
            const std::vector<std::uint32_t> tokens =
                packed_tokens(static_cast<std::uint32_t>(vocabulary), 0);
            const std::vector<float> packed = packed_logits(model, tokens);
            for (std::size_t row = 0; row < 2; ++row) {
                std::size_t start = 0;
                for (const std::size_t length : row_documents[row]) {
                    const std::vector<std::uint32_t> alone_tokens(
                        tokens.begin() + static_cast<std::ptrdiff_t>(row * time_steps + start),
                        tokens.begin() +
                            static_cast<std::ptrdiff_t>(row * time_steps + start + length));
                    const std::vector<float> alone =
                        model.forward(alone_tokens, {1, length}).value().to_host();
                    for (std::size_t i = 0; i < length * vocabulary; ++i) {
                        const float want = alone[i];
                        const float got = packed[(row * time_steps + start) * vocabulary + i];
                        ASSERT_NEAR(got, want, 2e-5 + 2e-5 * std::abs(want))
                            << name_of(config) << " row " << row << " document at " << start
                            << " value " << i;
                    }
                    start += length;
                }
            }
        }
    }
}

TEST(PackedRows, ADocumentDoesNotSeeTheDocumentsBeforeItBitForBit) {
    for (const DecoderConfig& config : family_configs()) {
        for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
            std::mt19937 generator(4);
            Decoder model(config, generator, kind);
            perturb(model, 5);
            const auto vocabulary = static_cast<std::uint32_t>(config.vocabulary_size);
            // The first document of row 0 (tokens 0..4) changes; nothing else may.
            const std::vector<float> before = packed_logits(model, packed_tokens(vocabulary, 0));
            const std::vector<float> after = packed_logits(model, packed_tokens(vocabulary, 5));
            const std::size_t first_document = 5 * config.vocabulary_size;
            bool first_changed = false;
            for (std::size_t i = 0; i < before.size(); ++i) {
                if (i < first_document) {
                    first_changed |= before[i] != after[i];
                    continue;
                }
                ASSERT_EQ(before[i], after[i]) << name_of(config) << " value " << i;
            }
            EXPECT_TRUE(first_changed) << name_of(config);
        }
    }
}

// Σ over positions of w·logits, the same weights packed and alone: the parameter gradients of
// the packed batch equal the sum of the documents' gradients alone.
TEST(PackedRows, GradientsEqualTheSumOfTheDocumentsAlone) {
    for (const DecoderConfig& config : family_configs()) {
        for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
            std::mt19937 generator(4);
            Decoder model(config, generator, kind);
            perturb(model, 5);
            const std::size_t vocabulary = config.vocabulary_size;
            const std::vector<std::uint32_t> tokens =
                packed_tokens(static_cast<std::uint32_t>(vocabulary), 0);
            std::vector<float> weights(2 * time_steps * vocabulary);
            for (std::size_t i = 0; i < weights.size(); ++i)
                weights[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
            const auto gradients = [&]() {
                std::vector<float> out;
                for (const NamedParameter& named : model.parameters()) {
                    const std::vector<float> g = named.parameter.gradient().to_host();
                    out.insert(out.end(), g.begin(), g.end());
                }
                return out;
            };
            const Variable packed = model.forward(tokens, {2, time_steps}, packed_positions());
            sum(packed * Variable(Tensor(packed.shape(), weights), false)).backward();
            const std::vector<float> packed_gradients = gradients();
            std::vector<float> alone_gradients(packed_gradients.size(), 0.0F);
            for (std::size_t row = 0; row < 2; ++row) {
                std::size_t start = 0;
                for (const std::size_t length : row_documents[row]) {
                    const auto offset = static_cast<std::ptrdiff_t>(row * time_steps + start);
                    const std::vector<std::uint32_t> alone_tokens(
                        tokens.begin() + offset,
                        tokens.begin() + offset + static_cast<std::ptrdiff_t>(length));
                    const std::vector<float> alone_weights(
                        weights.begin() + offset * static_cast<std::ptrdiff_t>(vocabulary),
                        weights.begin() + (offset + static_cast<std::ptrdiff_t>(length)) *
                                              static_cast<std::ptrdiff_t>(vocabulary));
                    const Variable alone = model.forward(alone_tokens, {1, length});
                    sum(alone * Variable(Tensor(alone.shape(), alone_weights), false)).backward();
                    const std::vector<float> g = gradients();
                    for (std::size_t i = 0; i < g.size(); ++i)
                        alone_gradients[i] += g[i];
                    start += length;
                }
            }
            for (std::size_t i = 0; i < packed_gradients.size(); ++i) {
                ASSERT_NEAR(packed_gradients[i], alone_gradients[i],
                            1e-4 + 1e-4 * std::abs(alone_gradients[i]))
                    << name_of(config) << " gradient " << i;
            }
        }
    }
}

TEST(PackedRows, FlashEqualsMaterialized) {
    for (const DecoderConfig& config : family_configs()) {
        const auto run = [&](AttentionKind kind) {
            std::mt19937 generator(4);
            Decoder model(config, generator, kind);
            perturb(model, 5);
            return packed_logits(
                model, packed_tokens(static_cast<std::uint32_t>(config.vocabulary_size), 0));
        };
        const std::vector<float> flash = run(AttentionKind::Flash);
        const std::vector<float> materialized = run(AttentionKind::Materialized);
        for (std::size_t i = 0; i < flash.size(); ++i) {
            ASSERT_NEAR(flash[i], materialized[i], 1e-4 + 1e-4 * std::abs(materialized[i]))
                << name_of(config) << " value " << i;
        }
    }
}

// [B,H,T,d] host values -> the [1,H,len,d] values of row b, tokens start..start+len.
std::vector<float> document_of(const std::vector<float>& all, std::size_t heads, std::size_t time,
                               std::size_t width, std::size_t b, std::size_t start,
                               std::size_t length) {
    std::vector<float> out;
    for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t base = ((b * heads + h) * time + start) * width;
        out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(base),
                   all.begin() + static_cast<std::ptrdiff_t>(base + length * width));
    }
    return out;
}

// The kernel itself over several key tiles (T = 150, tiles of 64): documents that start and end
// inside tiles and across them, with and without a window, grouped heads; the packed forward
// and VJP against the same kernel run on each document alone.
TEST(PackedRows, FlashKernelMatchesEachDocumentAloneAcrossTiles) {
    constexpr std::size_t batch = 2, query_heads = 4, kv_heads = 2, time = 150, width = 8;
    const std::vector<std::vector<std::size_t>> documents = {{70, 3, 77}, {150}};
    std::vector<std::uint32_t> positions;
    for (const auto& row : documents) {
        for (const std::size_t length : row) {
            for (std::size_t p = 0; p < length; ++p)
                positions.push_back(static_cast<std::uint32_t>(p));
        }
    }
    const auto values = [](std::size_t count, double phase) {
        std::vector<float> out(count);
        for (std::size_t i = 0; i < count; ++i)
            out[i] = static_cast<float>(std::sin(phase + 0.731 * static_cast<double>(i)));
        return out;
    };
    const std::vector<float> q = values(batch * query_heads * time * width, 0.1);
    const std::vector<float> k = values(batch * kv_heads * time * width, 0.7);
    const std::vector<float> v = values(batch * kv_heads * time * width, 1.3);
    const std::vector<float> g = values(batch * query_heads * time * width, 2.9);
    for (const std::size_t window : {std::size_t{0}, std::size_t{40}}) {
        tensor_ops::FlashAttentionOptions options;
        options.window = window;
        options.documents = tensor_ops::packed_documents("test", positions, batch, time);
        const Tensor query({batch, query_heads, time, width}, q);
        const Tensor key({batch, kv_heads, time, width}, k);
        const Tensor value({batch, kv_heads, time, width}, v);
        const auto packed = tensor_ops::flash_attention(query, key, value, options);
        const auto packed_gradients = tensor_ops::flash_attention_backward(
            query, key, value, packed, Tensor({batch, query_heads, time, width}, g));
        const std::vector<float> context = packed.context.to_host();
        const std::vector<float> dq = packed_gradients.query.to_host();
        const std::vector<float> dk = packed_gradients.key.to_host();
        const std::vector<float> dv = packed_gradients.value.to_host();
        for (std::size_t b = 0; b < batch; ++b) {
            std::size_t start = 0;
            for (const std::size_t length : documents[b]) {
                const auto slice = [&](const std::vector<float>& all, std::size_t heads) {
                    return document_of(all, heads, time, width, b, start, length);
                };
                const Tensor dq_in({1, query_heads, length, width}, slice(q, query_heads));
                const Tensor dk_in({1, kv_heads, length, width}, slice(k, kv_heads));
                const Tensor dv_in({1, kv_heads, length, width}, slice(v, kv_heads));
                const auto alone =
                    tensor_ops::flash_attention(dq_in, dk_in, dv_in, {.window = window});
                const auto alone_gradients = tensor_ops::flash_attention_backward(
                    dq_in, dk_in, dv_in, alone,
                    Tensor({1, query_heads, length, width}, slice(g, query_heads)));
                const auto expect_near = [&](const std::vector<float>& got,
                                             const std::vector<float>& want, const char* what) {
                    ASSERT_EQ(got.size(), want.size());
                    for (std::size_t i = 0; i < got.size(); ++i) {
                        ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::abs(want[i]))
                            << what << " window " << window << " row " << b << " document at "
                            << start << " value " << i;
                    }
                };
                expect_near(slice(context, query_heads), alone.context.to_host(), "context");
                expect_near(slice(dq, query_heads), alone_gradients.query.to_host(), "dQ");
                expect_near(slice(dk, kv_heads), alone_gradients.key.to_host(), "dK");
                expect_near(slice(dv, kv_heads), alone_gradients.value.to_host(), "dV");
                start += length;
            }
        }
    }
}

TEST(PackedRows, PackingRulesAreErrorsNamingTheRowAndToken) {
    const DecoderConfig config = family_configs().front();
    std::mt19937 generator(4);
    const Decoder model(config, generator);
    const std::vector<std::uint32_t> tokens(2 * time_steps, 1);
    const auto message_of = [&](std::vector<std::uint32_t> positions) {
        try {
            static_cast<void>(model.forward(tokens, {2, time_steps}, positions));
        } catch (const std::invalid_argument& error) {
            return std::string(error.what());
        }
        return std::string("no error");
    };
    std::vector<std::uint32_t> positions = packed_positions();
    positions[time_steps] = 1;  // row 1 must start at 0
    EXPECT_NE(message_of(positions).find("row 1 at token 0 is 1"), std::string::npos)
        << message_of(positions);
    positions = packed_positions();
    positions[7] = 4;  // neither 0 nor the previous (1) + 1
    EXPECT_NE(message_of(positions).find("row 0 at token 7 is 4"), std::string::npos)
        << message_of(positions);
    positions = packed_positions();
    positions.pop_back();
    EXPECT_NE(message_of(positions).find("29 positions given for 2 rows of 15 tokens"),
              std::string::npos)
        << message_of(positions);
    // The tensor-level check: documents that do not fit the query.
    const Tensor q({1, 1, 4, 2}, 0.5F);
    tensor_ops::FlashAttentionOptions options;
    const std::vector<std::uint32_t> three = {0, 1, 2};
    options.documents = tensor_ops::packed_documents("test", three, 1, 3);
    EXPECT_THROW(static_cast<void>(tensor_ops::flash_attention(q, q, q, options)),
                 std::invalid_argument);
}

}  // namespace
}  // namespace riftco_transformer
