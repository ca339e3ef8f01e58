// Models over GGUF block weights: a decoder built under DeferredWeightsScope holds no dense
// projection or table, adopts packed ones and then gives the logits of a dense twin holding
// their dequantized values (tied and untied heads, incremental decoding included); every
// adoption rule refuses before anything changes; the packed state carries the table.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

DecoderConfig wide_config(bool tied) {
    DecoderConfig c;
    c.vocabulary_size = 40;
    c.maximum_context = 16;
    c.model_width = 32;
    c.query_head_count = 4;
    c.key_value_head_count = 2;
    c.block_count = 2;
    c.feed_forward_width = 64;
    c.rope_theta = 500.0;
    c.tie_embeddings = tied;
    return architecture_preset(DecoderArchitecture::Llama, c);
}

struct PackedTwin {
    std::vector<QuantizedWeight> projections;
    QuantizedWeight embedding;
};

// Packs the source's projections (and its table) and writes their dequantized values back
// into the source, so the source is the dense twin of the packed model.
PackedTwin pack_in_place(Decoder& source, WeightFormat format) {
    PackedTwin twin;
    for (const AdaptableProjection& projection : source.projections()) {
        Variable leaf = projection.linear->weight();
        twin.projections.push_back(QuantizedWeight::quantize_blocks(leaf.value(), format));
        leaf.set_value(twin.projections.back().dequantize());
    }
    for (const NamedParameter& named : source.parameters()) {
        if (named.name == "token_embedding.weight") {
            Variable table = named.parameter;
            twin.embedding = QuantizedWeight::quantize_blocks(table.value(), format);
            table.set_value(twin.embedding.dequantize());
        }
    }
    return twin;
}

std::vector<float> logits_of(const Decoder& model, const std::vector<std::uint32_t>& tokens) {
    return model.forward(tokens, Shape{1, tokens.size()}).value().to_host();
}

double relative_rms(const std::vector<float>& expected, const std::vector<float>& actual) {
    double error = 0.0;
    double norm = 0.0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
        error += (static_cast<double>(actual[i]) - expected[i]) *
                 (static_cast<double>(actual[i]) - expected[i]);
        norm += static_cast<double>(expected[i]) * expected[i];
    }
    return std::sqrt(error / norm);
}

const std::vector<std::uint32_t> tokens = {3, 17, 0, 39, 8, 22, 5, 11, 30};

TEST(BlockWeightModels, ADeferredModelAdoptsBlocksAndGivesItsDenseTwinsLogits) {
    for (const bool tied : {true, false}) {
        for (const WeightFormat format :
             {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::q4_1}) {
            SCOPED_TRACE(std::string(weight_format_name(format)) + (tied ? " tied" : " untied"));
            std::mt19937 generator(7);
            Decoder dense(wide_config(tied), generator);
            const PackedTwin twin = pack_in_place(dense, format);

            std::mt19937 other(8);
            std::unique_ptr<Decoder> packed;
            {
                const DeferredWeightsScope deferred(true, true);
                packed = std::make_unique<Decoder>(wide_config(tied), other);
            }
            // Only the dense rest is listed, and it takes the twin's values.
            std::vector<std::string> dense_names;
            for (const NamedParameter& named : packed->parameters())
                dense_names.push_back(named.name);
            for (const std::string& name : dense_names) {
                EXPECT_EQ(name.find("attention.query.weight"), std::string::npos) << name;
                EXPECT_NE(name, "token_embedding.weight");
            }
            {
                const ParameterList from = dense.parameters();
                const ParameterList to = packed->parameters();
                for (const NamedParameter& named : to) {
                    for (const NamedParameter& source : from) {
                        if (source.name == named.name) {
                            Variable leaf = named.parameter;
                            leaf.set_value(source.parameter.value());
                        }
                    }
                }
            }
            packed->adopt_packed_weights(twin.projections, &twin.embedding);
            EXPECT_TRUE(packed->has_packed_embedding());
            EXPECT_EQ(packed->quantized_memory_usage().weight_count, twin.projections.size() + 1);
            EXPECT_EQ(packed->quantized_memory_usage().resident_payload_bytes,
                      packed->quantized_memory_usage().logical_payload_bytes);
            const std::vector<float> expected = logits_of(dense, tokens);
            EXPECT_LE(relative_rms(expected, logits_of(*packed, tokens)), 1e-5);

            // Incremental decoding over the packed table and projections: a prefill of all
            // but the last token, then one decoded token, gives the last row's logits.
            {
                DecodeSession session(*packed);
                static_cast<void>(session.prefill(std::span(tokens).first(tokens.size() - 1)));
                const std::vector<float> last = session.decode_token(tokens.back()).to_host();
                const std::size_t vocabulary = wide_config(tied).vocabulary_size;
                const std::vector<float> expected_last(
                    expected.end() - static_cast<long>(vocabulary), expected.end());
                EXPECT_LE(relative_rms(expected_last, last), 1e-5);
            }

            // The packed state holds the table last and loads back.
            const std::vector<QuantizedWeight> state = packed->packed_quantized_state();
            ASSERT_EQ(state.size(), twin.projections.size() + 1);
            EXPECT_EQ(state.back().copy_blocks_to_host().blocks,
                      twin.embedding.copy_blocks_to_host().blocks);
            packed->load_packed_quantized_state(state);
            EXPECT_LE(relative_rms(expected, logits_of(*packed, tokens)), 1e-5);
        }
    }
}

TEST(BlockWeightModels, AdoptionRefusesBeforeAnythingChanges) {
    std::mt19937 generator(7);
    Decoder source(wide_config(true), generator);
    const PackedTwin twin = pack_in_place(source, WeightFormat::q8_0);
    std::mt19937 other(9);
    Decoder model(wide_config(true), other);
    const std::vector<float> before = logits_of(model, tokens);
    // One weight short.
    EXPECT_THROW(
        model.adopt_packed_weights(std::span(twin.projections).first(twin.projections.size() - 1)),
        std::invalid_argument);
    // A projection of the wrong shape, named.
    std::vector<QuantizedWeight> swapped = twin.projections;
    std::swap(swapped[0], swapped[4]);  // query [32,32] <-> gate [64,32]
    try {
        model.adopt_packed_weights(swapped, &twin.embedding);
        ADD_FAILURE() << "a gate-shaped query was adopted";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("blocks.0.attention.query"), std::string::npos)
            << error.what();
    }
    // A table of the wrong shape, named.
    const QuantizedWeight narrow_table = twin.projections[0];  // [32,32], not [40,32]
    try {
        model.adopt_packed_weights(twin.projections, &narrow_table);
        ADD_FAILURE() << "a [32,32] table was adopted";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("token_embedding"), std::string::npos)
            << error.what();
    }
    // A dense weight held outside the model (a parameter list).
    {
        const ParameterList held = model.parameters();
        EXPECT_THROW(model.adopt_packed_weights(twin.projections, &twin.embedding),
                     std::logic_error);
    }
    EXPECT_FALSE(model.has_quantized_weights());
    EXPECT_FALSE(model.has_packed_embedding());
    EXPECT_EQ(logits_of(model, tokens), before);
    // Then it succeeds, once.
    model.adopt_packed_weights(twin.projections, &twin.embedding);
    EXPECT_THROW(model.adopt_packed_weights(twin.projections), std::invalid_argument);
    EXPECT_THROW(model.untie_embeddings(), std::invalid_argument);
    EXPECT_THROW(model.merge_lora(), std::logic_error);
}

TEST(BlockWeightModels, APackedEmbeddingLooksUpHostIdsAndRefusesOutOfRangeOnes) {
    std::mt19937 generator(3);
    Embedding table(40, 32, generator, /*deferred=*/true);
    EXPECT_FALSE(table.weight().defined());
    EXPECT_TRUE(table.parameters().empty());
    const QuantizedWeight packed = QuantizedWeight::quantize_blocks(
        Tensor({40, 32}, testing::pseudo_random(40 * 32, -1.0F, 1.0F, 5U)), WeightFormat::q4_1);
    table.check_packed_replacement(packed);
    table.commit_packed(packed);
    const std::vector<float> dense = packed.dequantize().to_host();
    const std::vector<std::size_t> ids = {7, 0, 39};
    const std::vector<float> rows = table.forward(ids, Shape{3}).value().to_host();
    ASSERT_EQ(rows.size(), 3U * 32U);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        for (std::size_t c = 0; c < 32; ++c)
            ASSERT_EQ(rows[i * 32 + c], dense[ids[i] * 32 + c]);
    }
    try {
        static_cast<void>(table.forward(std::vector<std::size_t>{1, 40}, Shape{2}));
        ADD_FAILURE() << "id 40 of a 40-row table was looked up";
    } catch (const std::out_of_range& error) {
        EXPECT_NE(std::string(error.what()).find("id 40 at position 1"), std::string::npos)
            << error.what();
    }
    // A second table, or one of another shape, is refused.
    EXPECT_THROW(table.check_packed_replacement(packed), std::logic_error);
    Embedding other(40, 32, generator, /*deferred=*/true);
    const QuantizedWeight narrow = QuantizedWeight::quantize_blocks(
        Tensor({8, 32}, testing::pseudo_random(8 * 32)), WeightFormat::q8_0);
    EXPECT_THROW(other.check_packed_replacement(narrow), std::invalid_argument);
}

}  // namespace
}  // namespace riftco_transformer
