// Model conversion to packed NF4 and QLoRA (docs/ARCHITECTURE.md, 'NF4'): what quantize_nf4 packs
// and releases, its rejections and transactions, plain inference straight from the packed weights
// against a dequantized dense twin, adapters on a packed base, merge back to float32, the
// packed state round trip and memory accounting.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/packed_state.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

std::vector<std::string> names_of(const ParameterList& list) {
    std::vector<std::string> names;
    for (const NamedParameter& named : list)
        names.push_back(named.name);
    return names;
}

const std::vector<std::uint32_t>& tokens() {
    static const std::vector<std::uint32_t> ids = testing::pseudo_random_tokens(2 * 9, 27, 4);
    return ids;
}

std::vector<float> logits(const DecoderOnlyTransformer& model) {
    return model.forward(tokens(), {2, 9}).value().to_host();
}

// A dense model from the same seed whose projection weights are `packed`'s dequantized ones.
std::unique_ptr<DecoderOnlyTransformer> dequantized_twin(const DecoderOnlyTransformer& packed) {
    std::mt19937 generator(5);
    auto twin = std::make_unique<DecoderOnlyTransformer>(testing::reference_tiny(), generator);
    for (std::size_t i = 0; i < packed.projections().size(); ++i) {
        Variable weight = twin->projections()[i].linear->weight();
        weight.set_value(packed.projections()[i].linear->quantized_weight().dequantize());
    }
    return twin;
}

}  // namespace

TEST(Qlora, QuantizePacksEveryProjectionAndReleasesTheDenseWeights) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::string> before = names_of(model.parameters());
    model.quantize_nf4();
    EXPECT_TRUE(model.has_quantized_weights());
    EXPECT_EQ(model.structure_version(), 1U);
    ASSERT_EQ(model.projections().size(), 13U);
    for (const AdaptableProjection& projection : model.projections()) {
        EXPECT_TRUE(projection.linear->is_quantized()) << projection.path;
        EXPECT_FALSE(projection.linear->weight().defined()) << projection.path;
        EXPECT_TRUE(projection.linear->quantized_weight().uses_double_quantized_scales());
        EXPECT_EQ(projection.linear->quantized_weight().block_size(), 64U);
    }
    // The base list loses exactly the 13 projection weights; biases, norms and embeddings stay.
    std::vector<std::string> expected;
    for (const std::string& name : before) {
        const bool projection_weight =
            name.ends_with(".weight") && name.find("embedding") == std::string::npos;
        if (!projection_weight)
            expected.push_back(name);
    }
    EXPECT_EQ(names_of(model.parameters()), expected);
    EXPECT_EQ(expected.size(), before.size() - 13U);
}

TEST(Qlora, PackedInferenceMatchesADequantizedDenseTwin) {
    for (const bool double_quantization : {false, true}) {
        std::mt19937 generator(5);
        DecoderOnlyTransformer model(testing::reference_tiny(), generator);
        model.quantize_nf4(
            {.block_size = 32, .double_quantization = double_quantization, .scale_block_size = 64});
        const auto twin = dequantized_twin(model);
        const std::vector<float> expected = logits(*twin);
        EXPECT_TRUE(testing::all_close(logits(model), testing::to_double(expected), 1e-4, 1e-4))
            << "double_quantization " << double_quantization;
        // Plain inference (no graph) straight from the packed weights.
        const NoGradientGuard no_graph;
        const Variable detached = model.forward(tokens(), {2, 9});
        EXPECT_FALSE(detached.requires_gradient());
        EXPECT_TRUE(testing::all_close(detached.value().to_host(), testing::to_double(expected),
                                       1e-4, 1e-4));
    }
}

TEST(Qlora, QuantizeRejectionsChangeNothing) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<float> dense = logits(model);
    const auto untouched = [&] {
        EXPECT_FALSE(model.has_quantized_weights());
        EXPECT_EQ(model.structure_version(), 0U);
        for (const AdaptableProjection& projection : model.projections())
            EXPECT_FALSE(projection.linear->is_quantized()) << projection.path;
        EXPECT_TRUE(testing::bit_identical(logits(model), dense));
    };
    EXPECT_THROW(model.quantize_nf4({.block_size = 48}), std::invalid_argument);
    EXPECT_THROW(model.quantize_nf4({.block_size = 8192}), std::invalid_argument);
    EXPECT_THROW(model.quantize_nf4({.block_size = 64, .scale_block_size = 16}),
                 std::invalid_argument);
    {
        // A parameter list still holds the dense weights.
        const ParameterList held = model.parameters();
        EXPECT_THROW(model.quantize_nf4(), std::logic_error);
    }
    untouched();
    {
        // A non-finite weight in the LAST projection: nothing is packed, not even the first 12.
        const Tensor original = model.projections().back().linear->weight().value();
        std::vector<float> values = original.to_host();
        values.back() = std::numeric_limits<float>::infinity();
        {
            Variable head = model.projections().back().linear->weight();
            head.set_value(Tensor(original.shape(), values));
        }  // no handle outside the model while quantizing
        try {
            model.quantize_nf4();
            ADD_FAILURE() << "a non-finite weight was packed";
        } catch (const std::invalid_argument& error) {
            EXPECT_NE(std::string(error.what()).find("language_model_head"), std::string::npos)
                << error.what();
        }
        for (const AdaptableProjection& projection : model.projections())
            EXPECT_FALSE(projection.linear->is_quantized()) << projection.path;
        Variable head = model.projections().back().linear->weight();
        head.set_value(original);
    }
    untouched();
    model.quantize_nf4();
    EXPECT_THROW(model.quantize_nf4(), std::invalid_argument);  // twice
    std::mt19937 other_generator(5);
    DecoderOnlyTransformer adapted(testing::reference_tiny(), other_generator);
    adapted.attach_lora({});
    EXPECT_THROW(adapted.quantize_nf4(), std::invalid_argument);  // after attach
}

TEST(Qlora, MemoryUsageSumsEveryPackedWeight) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    EXPECT_EQ(model.quantized_memory_usage().weight_count, 0U);
    model.quantize_nf4({.block_size = 32, .double_quantization = true, .scale_block_size = 32});
    const QuantizedMemoryUsage usage = model.quantized_memory_usage();
    QuantizedMemoryUsage expected;
    for (const AdaptableProjection& projection : model.projections())
        expected += projection.linear->quantized_weight().memory_usage();
    EXPECT_EQ(usage.weight_count, 13U);
    EXPECT_EQ(usage.double_quantized_weight_count, 13U);
    EXPECT_EQ(usage.logical_payload_bytes, expected.logical_payload_bytes);
    EXPECT_EQ(usage.resident_payload_bytes, usage.logical_payload_bytes);  // no hidden mirror
    // Per block: 4·D² + 2·D·F weights; then the head V·D.
    const std::size_t n = 2 * (4 * 32 * 32 + 2 * 32 * 64) + 27 * 32;
    EXPECT_EQ(usage.fp32_equivalent_bytes, 4 * n);
    EXPECT_LT(usage.resident_payload_bytes * 6, usage.fp32_equivalent_bytes);
}

TEST(Qlora, AdaptersTrainOnAPackedBaseAndMergeRestoresADenseModel) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::string> dense_names = names_of(model.parameters());
    model.quantize_nf4();
    const std::vector<PackedNf4Payload> packed_before = [&] {
        std::vector<PackedNf4Payload> payloads;
        for (const QuantizedWeight& weight : model.packed_quantized_state())
            payloads.push_back(weight.copy_payload_to_host());
        return payloads;
    }();
    model.attach_lora({.rank = 4, .alpha = 8.0F, .targets = 0x7F});
    Adam adam(model.lora_parameters(), AdamOptions{.learning_rate = 1e-2});
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 9, 27, 8);
    reset_autograd_counters();
    float first = 0;
    float last = 0;
    for (int step = 0; step < 20; ++step) {
        Variable loss = cross_entropy(model.forward(tokens(), {2, 9}), targets);
        (step == 0 ? first : last) = loss.value().item();
        loss.backward();
        adam.step();
    }
    EXPECT_LT(last, first - 0.1F);
    // The packed base never received a weight gradient: only the 26 factors' products and
    // attention's own (at most 4 per step) were computed.
    EXPECT_LE(autograd_counters().matmul_right_gradients, 20U * (26U + 4U));
    const std::vector<QuantizedWeight> packed_after = model.packed_quantized_state();
    for (std::size_t i = 0; i < packed_after.size(); ++i)
        EXPECT_EQ(packed_after[i].copy_payload_to_host().codes, packed_before[i].codes) << i;

    // Merge: W = deq(W) + scale·B·A, dense again, outputs unchanged within 1e-5.
    const std::vector<float> adapted = logits(model);
    std::vector<Tensor> expected_weights;
    for (const AdaptableProjection& projection : model.projections()) {
        expected_weights.push_back(
            tensor_ops::add(projection.linear->quantized_weight().dequantize(),
                            projection.linear->adapter()->weight_delta()));
    }
    model.merge_lora();
    EXPECT_FALSE(model.has_quantized_weights());
    EXPECT_EQ(names_of(model.parameters()), dense_names);
    for (std::size_t i = 0; i < model.projections().size(); ++i) {
        const Linear& layer = *model.projections()[i].linear;
        EXPECT_FALSE(layer.is_quantized());
        EXPECT_TRUE(
            testing::bit_identical(layer.weight().value().to_host(), expected_weights[i].to_host()))
            << model.projections()[i].path;
    }
    EXPECT_TRUE(testing::all_close(logits(model), testing::to_double(adapted), 1e-5, 1e-5));
    EXPECT_EQ(model.quantized_memory_usage().weight_count, 0U);
    // The merged model is an ordinary trainable dense model.
    EXPECT_NO_THROW(Adam(model.parameters(), AdamOptions{}));
}

TEST(Qlora, MergeWithoutAdaptersOnPackedWeightsIsRejected) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    model.quantize_nf4();
    EXPECT_THROW(model.merge_lora(), std::logic_error);
    EXPECT_TRUE(model.has_quantized_weights());
}

TEST(Qlora, PackedStateRoundTripsThroughItsByteFormAndLoadsTransactionally) {
    std::mt19937 g1(5);
    DecoderOnlyTransformer source(testing::reference_tiny(), g1);
    source.quantize_nf4({.block_size = 64, .double_quantization = false});
    const std::vector<QuantizedWeight> state = source.packed_quantized_state();
    const std::vector<std::uint8_t> bytes = encode_packed_state(state);
    EXPECT_EQ(bytes.size(), packed_state_size(state));
    std::vector<PackedNf4Payload> payloads;
    for (const PackedWeightPayload& payload : decode_packed_state(bytes)) {
        payloads.push_back(std::get<PackedNf4Payload>(payload));
    }
    ASSERT_EQ(payloads.size(), 13U);

    std::mt19937 g2(6);  // different weights
    DecoderOnlyTransformer target(testing::reference_tiny(), g2);
    target.quantize_nf4({.block_size = 64, .double_quantization = false});
    target.attach_lora({});
    const std::vector<float> adapters_before =
        target.lora_parameters()[0].parameter.value().to_host();
    std::vector<QuantizedWeight> loaded;
    for (const PackedNf4Payload& payload : payloads)
        loaded.push_back(QuantizedWeight::from_packed_nf4(payload, ExecutionBackend::Cpu));
    // Mismatches first: a wrong count, then a wrong shape at the last weight: nothing changes.
    const std::vector<QuantizedWeight> target_state = target.packed_quantized_state();
    EXPECT_THROW(target.load_packed_quantized_state(std::span(loaded).first(12)),
                 std::invalid_argument);
    std::vector<QuantizedWeight> wrong = loaded;
    wrong.back() = loaded.front();  // [32,32] where the head is [27,32]
    EXPECT_THROW(target.load_packed_quantized_state(wrong), std::invalid_argument);
    for (std::size_t i = 0; i < target_state.size(); ++i) {
        EXPECT_EQ(target.packed_quantized_state()[i].copy_payload_to_host().codes,
                  target_state[i].copy_payload_to_host().codes);
    }
    target.load_packed_quantized_state(loaded);
    for (std::size_t i = 0; i < 13; ++i) {
        const PackedNf4Payload a = target.packed_quantized_state()[i].copy_payload_to_host();
        EXPECT_EQ(a.codes, payloads[i].codes);
        EXPECT_EQ(a.scales, payloads[i].scales);
    }
    EXPECT_TRUE(testing::bit_identical(target.lora_parameters()[0].parameter.value().to_host(),
                                       adapters_before));
    // Malformed framing is rejected with the field named.
    std::vector<std::uint8_t> truncated(bytes.begin(), bytes.end() - 1);
    EXPECT_THROW((void)decode_packed_state(truncated), std::invalid_argument);
    std::vector<std::uint8_t> trailing = bytes;
    trailing.push_back(0);
    EXPECT_THROW((void)decode_packed_state(trailing), std::invalid_argument);
    std::vector<std::uint8_t> bad_flag = bytes;
    bad_flag[8 + 8 + 24] = 2;  // weight 0's double_quantized word
    try {
        (void)decode_packed_state(bad_flag);
        ADD_FAILURE() << "a double_quantized flag of 2 was accepted";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("double_quantized"), std::string::npos)
            << error.what();
    }
    // A model that is not packed has no packed state to load or read.
    std::mt19937 g3(5);
    DecoderOnlyTransformer dense(testing::reference_tiny(), g3);
    EXPECT_THROW((void)dense.packed_quantized_state(), std::logic_error);
    EXPECT_THROW(dense.load_packed_quantized_state(loaded), std::logic_error);
}

TEST(Qlora, CheckpointedQloraGivesTheSameFactorGradients) {
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 9, 27, 8);
    std::vector<std::vector<float>> gradients[2];
    for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
        std::mt19937 generator(5);
        DecoderOnlyTransformer model(testing::reference_tiny(), generator, 1e-5F,
                                     AttentionKind::Flash,
                                     checkpointed ? ActivationCheckpointing::TransformerBlock
                                                  : ActivationCheckpointing::Disabled);
        model.quantize_nf4();
        model.attach_lora({.targets = 0x7F});
        for (const NamedParameter& named : model.lora_parameters()) {
            Variable factor = named.parameter;
            factor.set_value(Tensor(
                factor.shape(), testing::pseudo_random(factor.value().numel(), -0.1F, 0.1F, 3)));
        }
        cross_entropy(model.forward(tokens(), {2, 9}), targets).backward();
        for (const NamedParameter& named : model.lora_parameters())
            gradients[checkpointed].push_back(named.parameter.gradient().to_host());
    }
    for (std::size_t i = 0; i < gradients[0].size(); ++i)
        EXPECT_TRUE(
            testing::all_close(gradients[1][i], testing::to_double(gradients[0][i]), 1e-5, 1e-5))
            << i;
}

}  // namespace riftco_transformer
