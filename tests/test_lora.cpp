// LoRA (docs/ARCHITECTURE.md, 'LoRA'): adapters, target selection, atomic attach, the frozen base
// (no weight-gradient product), finite differences, merge, checkpointing and every rejection rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "nn/lora_fault_injection.hpp"
#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/initialization.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

std::vector<std::vector<float>> values_of(const ParameterList& list) {
    std::vector<std::vector<float>> values;
    for (const NamedParameter& named : list)
        values.push_back(named.parameter.value().to_host());
    return values;
}

std::vector<std::string> names_of(const ParameterList& list) {
    std::vector<std::string> names;
    for (const NamedParameter& named : list)
        names.push_back(named.name);
    return names;
}

// Gives every B factor small non-zero values, so adapters change the outputs.
void perturb_adapters(const DecoderOnlyTransformer& model, std::uint32_t seed) {
    for (const NamedParameter& named : model.lora_parameters()) {
        Variable factor = named.parameter;
        factor.set_value(Tensor(
            factor.shape(), testing::pseudo_random(factor.value().numel(), -0.2F, 0.2F, seed++)));
    }
}

}  // namespace

TEST(LoraConfig, DefaultsAreTheSpecs) {
    const LoraConfig config;
    EXPECT_EQ(config.rank, 4U);
    EXPECT_EQ(config.alpha, 8.0F);
    EXPECT_EQ(config.random_seed, 5489U);
    EXPECT_EQ(config.targets,
              lora_target_bit(LoraTarget::Query) | lora_target_bit(LoraTarget::Value));
    EXPECT_EQ(config.targets, 0x5U);
    EXPECT_EQ(lora_scale(config, "test"), 2.0F);
}

TEST(LoraConfig, TargetsAreNamedByProjectionPath) {
    EXPECT_EQ(lora_target_name(LoraTarget::Query), "attention.query");
    EXPECT_EQ(lora_target_name(LoraTarget::FeedForwardProject), "feed_forward.project");
    EXPECT_EQ(lora_target_name(LoraTarget::LanguageModelHead), "language_model_head");
    EXPECT_EQ(lora_target_name(LoraTarget::FeedForwardGate), "feed_forward.gate");
    for (std::uint32_t i = 0; i < lora_target_count; ++i) {
        const auto target = static_cast<LoraTarget>(i);
        EXPECT_EQ(lora_target_from_name(lora_target_name(target)), target);
    }
    const std::string message = testing::message_of<std::invalid_argument>(
        [] { (void)lora_target_from_name("attention.qkv"); });
    EXPECT_NE(message.find("'attention.qkv'"), std::string::npos) << message;
    EXPECT_NE(message.find("attention.query"), std::string::npos) << message;
    EXPECT_THROW((void)lora_target_name(static_cast<LoraTarget>(10)), std::invalid_argument);
}

TEST(LoraConfig, RejectsBadRankAlphaScaleAndMasks) {
    const auto rejects = [](LoraConfig config, const std::string& fragment) {
        const std::string message =
            testing::message_of<std::invalid_argument>([&] { (void)lora_scale(config, "op"); });
        EXPECT_NE(message.find(fragment), std::string::npos) << message;
    };
    rejects({.rank = 0}, "rank");
    rejects({.alpha = 0.0F}, "alpha");
    rejects({.alpha = -1.0F}, "alpha");
    rejects({.alpha = std::nanf("")}, "alpha");
    rejects({.alpha = INFINITY}, "alpha");
    // alpha/rank underflows to 0 in float: the scale itself is rejected.
    rejects({.rank = 4, .alpha = 1e-45F}, "scale");
    rejects({.targets = 0}, "empty");
    rejects({.targets = LoraTargetMask{1} << 40}, "unknown bits");
}

TEST(LowRankAdapter, ShapesInitialisationScaleAndDelta) {
    std::mt19937 generator(3);
    const LowRankAdapter adapter(6, 5, 2, 3.0F, generator, ExecutionBackend::Cpu);
    EXPECT_EQ(adapter.a().shape(), (Shape{2, 6}));
    EXPECT_EQ(adapter.b().shape(), (Shape{5, 2}));
    EXPECT_EQ(adapter.scale(), 1.5F);
    // A ~ Xavier(in=6, rank=2): |a| <= sqrt(6/8); B = 0.
    const double limit = std::sqrt(6.0 / 8.0);
    for (float a : adapter.a().value().to_host())
        EXPECT_LE(std::fabs(a), limit);
    for (float b : adapter.b().value().to_host())
        EXPECT_EQ(b, 0.0F);
    // Same draws as xavier_uniform from the same generator state.
    std::mt19937 replay(3);
    EXPECT_TRUE(testing::bit_identical(
        adapter.a().value().to_host(),
        xavier_uniform({2, 6}, 6, 2, replay, ExecutionBackend::Cpu).to_host()));

    Variable b = adapter.b();
    b.set_value(Tensor({5, 2}, testing::pseudo_random(10, -1, 1, 8)));
    // weight_delta = scale·B·A, checked against a double loop.
    const std::vector<float> a_host = adapter.a().value().to_host();
    const std::vector<float> b_host = b.value().to_host();
    std::vector<float> expected(5 * 6);
    for (std::size_t o = 0; o < 5; ++o)
        for (std::size_t i = 0; i < 6; ++i) {
            double sum = 0;
            for (std::size_t r = 0; r < 2; ++r)
                sum += static_cast<double>(b_host[o * 2 + r]) * a_host[r * 6 + i];
            expected[o * 6 + i] = static_cast<float>(1.5 * sum);
        }
    EXPECT_TRUE(testing::all_close(adapter.weight_delta().to_host(), testing::to_double(expected),
                                   1e-6, 1e-6));
    // forward(x) = x·deltaᵀ.
    const std::vector<float> x = testing::pseudo_random(3 * 6, -1, 1, 9);
    const Variable y = adapter.forward(Variable(Tensor({3, 6}, x), false));
    std::vector<float> reference(3 * 5);
    for (std::size_t r = 0; r < 3; ++r)
        for (std::size_t o = 0; o < 5; ++o) {
            double sum = 0;
            for (std::size_t i = 0; i < 6; ++i)
                sum += static_cast<double>(x[r * 6 + i]) * expected[o * 6 + i];
            reference[r * 5 + o] = static_cast<float>(sum);
        }
    EXPECT_TRUE(testing::all_close(y.value().to_host(), testing::to_double(reference), 1e-5, 1e-5));
    EXPECT_THROW((void)adapter.forward(Variable(Tensor::zeros({3, 5}), false)),
                 std::invalid_argument);
}

// rsLoRA: scale alpha/√rank (rank 4, alpha 3: 1.5, where alpha/rank is 0.75), in the adapter,
// in lora_scale and through a model's attach; the delta is scale·B·A as before.
TEST(LowRankAdapter, RankStabilizedScaleIsAlphaOverTheSquareRootOfTheRank) {
    std::mt19937 generator(3);
    const LowRankAdapter plain(6, 5, 4, 3.0F, generator, ExecutionBackend::Cpu);
    const LowRankAdapter stabilized(6, 5, 4, 3.0F, generator, ExecutionBackend::Cpu, true);
    EXPECT_EQ(plain.scale(), 0.75F);
    EXPECT_EQ(stabilized.scale(), 1.5F);
    LoraConfig config;
    config.rank = 9;
    config.alpha = 6.0F;
    EXPECT_FLOAT_EQ(lora_scale(config, "test"), 6.0F / 9.0F);
    config.rank_stabilized = true;
    EXPECT_EQ(lora_scale(config, "test"), 2.0F);
    Variable b = stabilized.b();
    b.set_value(Tensor({5, 4}, testing::pseudo_random(20, -1, 1, 8)));
    const std::vector<float> a_host = stabilized.a().value().to_host();
    const std::vector<float> b_host = b.value().to_host();
    std::vector<double> expected(5 * 6);
    for (std::size_t o = 0; o < 5; ++o)
        for (std::size_t i = 0; i < 6; ++i) {
            double sum = 0;
            for (std::size_t r = 0; r < 4; ++r)
                sum += static_cast<double>(b_host[o * 4 + r]) * a_host[r * 6 + i];
            expected[o * 6 + i] = 1.5 * sum;
        }
    EXPECT_TRUE(testing::all_close(stabilized.weight_delta().to_host(), expected, 1e-6, 1e-6));
}

TEST(LowRankAdapter, RejectsRanksWidthsAndAlpha) {
    std::mt19937 generator(1);
    const auto make = [&](std::size_t in, std::size_t out, std::size_t rank, float alpha) {
        return LowRankAdapter(in, out, rank, alpha, generator, ExecutionBackend::Cpu);
    };
    EXPECT_THROW(make(4, 4, 0, 1.0F), std::invalid_argument);
    EXPECT_THROW(make(4, 3, 4, 1.0F), std::invalid_argument);  // rank > min(in, out)
    EXPECT_THROW(make(0, 3, 1, 1.0F), std::invalid_argument);
    EXPECT_THROW(make(4, 3, 1, std::nanf("")), std::invalid_argument);
    EXPECT_THROW(make(4, 3, 2, 1e-45F), std::invalid_argument);
    EXPECT_NO_THROW(make(4, 3, 3, 1.0F));
}

TEST(Lora, AProjectionTakesOneAdapterOfItsOwnWidthsInItsLifetime) {
    std::mt19937 generator(2);
    Linear layer(6, 5, generator);
    EXPECT_THROW(
        layer.attach_adapter(LowRankAdapter(5, 5, 2, 4.0F, generator, ExecutionBackend::Cpu)),
        std::invalid_argument);
    EXPECT_TRUE(layer.adapter_parameters().empty());
    layer.attach_adapter(LowRankAdapter(6, 5, 2, 4.0F, generator, ExecutionBackend::Cpu));
    EXPECT_EQ(names_of(layer.adapter_parameters()),
              (std::vector<std::string>{"lora_a.weight", "lora_b.weight"}));
    EXPECT_EQ(names_of(layer.parameters()), (std::vector<std::string>{"weight", "bias"}));
    EXPECT_THROW(
        layer.attach_adapter(LowRankAdapter(6, 5, 2, 4.0F, generator, ExecutionBackend::Cpu)),
        std::logic_error);
    // After a merge the factors leave the adapter list, and the projection still refuses a new
    // adapter.
    layer.commit_merge(Variable(layer.prepare_merge(), true));
    EXPECT_TRUE(layer.adapter_parameters().empty());
    EXPECT_EQ(layer.adapter(), nullptr);
    EXPECT_TRUE(layer.used_adapter());
    EXPECT_THROW(
        layer.attach_adapter(LowRankAdapter(6, 5, 2, 4.0F, generator, ExecutionBackend::Cpu)),
        std::logic_error);
}

TEST(Lora, AttachLeavesOutputsAndTheBaseListUnchangedAndNamesFactors) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 7, 27, 1);
    const std::vector<float> before = model.forward(tokens, {2, 7}).value().to_host();
    const std::vector<std::string> base_names = names_of(model.parameters());
    const std::vector<std::vector<float>> base_values = values_of(model.parameters());

    model.attach_lora({.rank = 2,
                       .alpha = 4.0F,
                       .targets = lora_target_bit(LoraTarget::Query) |
                                  lora_target_bit(LoraTarget::FeedForwardProject) |
                                  lora_target_bit(LoraTarget::LanguageModelHead)});
    EXPECT_TRUE(model.lora_attached());
    EXPECT_FALSE(model.lora_merged());
    EXPECT_EQ(model.lora_config().rank, 2U);
    EXPECT_TRUE(testing::bit_identical(model.forward(tokens, {2, 7}).value().to_host(), before));
    EXPECT_EQ(names_of(model.parameters()), base_names);
    EXPECT_EQ(values_of(model.parameters()), base_values);
    const std::vector<std::string> expected = {"blocks.0.attention.query.lora_a.weight",
                                               "blocks.0.attention.query.lora_b.weight",
                                               "blocks.0.feed_forward.project.lora_a.weight",
                                               "blocks.0.feed_forward.project.lora_b.weight",
                                               "blocks.1.attention.query.lora_a.weight",
                                               "blocks.1.attention.query.lora_b.weight",
                                               "blocks.1.feed_forward.project.lora_a.weight",
                                               "blocks.1.feed_forward.project.lora_b.weight",
                                               "language_model_head.lora_a.weight",
                                               "language_model_head.lora_b.weight"};
    EXPECT_EQ(names_of(model.lora_parameters()), expected);
    const ParameterList factors = model.lora_parameters();
    EXPECT_EQ(factors[2].parameter.shape(), (Shape{2, 64}));  // project: in = F
    EXPECT_EQ(factors[3].parameter.shape(), (Shape{32, 2}));
    EXPECT_EQ(factors[9].parameter.shape(), (Shape{27, 2}));
    // The whole base is frozen; the factors train.
    for (const NamedParameter& named : model.parameters())
        EXPECT_FALSE(named.parameter.requires_gradient()) << named.name;
    for (const NamedParameter& named : factors)
        EXPECT_TRUE(named.parameter.requires_gradient()) << named.name;
}

TEST(Lora, AdaptersAreDrawnBlockMajorFromTheConfigSeed) {
    std::mt19937 g1(5);
    std::mt19937 g2(6);  // a different base
    DecoderOnlyTransformer first(testing::reference_tiny(), g1);
    DecoderOnlyTransformer second(testing::reference_tiny(), g2);
    first.attach_lora({.random_seed = 77});
    second.attach_lora({.random_seed = 77});
    EXPECT_EQ(values_of(first.lora_parameters()), values_of(second.lora_parameters()));
    // Order q (block 0), v (block 0), q (block 1), ...: A factors come from one mt19937(77).
    std::mt19937 replay(77);
    const ParameterList factors = first.lora_parameters();
    for (std::size_t i = 0; i < factors.size(); i += 2) {
        EXPECT_TRUE(testing::bit_identical(
            factors[i].parameter.value().to_host(),
            xavier_uniform({4, 32}, 32, 4, replay, ExecutionBackend::Cpu).to_host()))
            << factors[i].name;
    }
}

TEST(Lora, FrozenBaseComputesNoWeightGradientProducts) {
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 7, 27, 1);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 7, 27, 2);
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);

    reset_autograd_counters();
    cross_entropy(model.forward(tokens, {2, 7}), targets).backward();
    const AutogradCounters full = autograd_counters();
    // Full backward: one dW per Linear (6 per block + the head) plus attention's own matmuls.
    EXPECT_GE(full.matmul_right_gradients, 13U);

    model.attach_lora({});  // q and v: 4 adapted projections, 8 factors
    reset_autograd_counters();
    cross_entropy(model.forward(tokens, {2, 7}), targets).backward();
    const AutogradCounters lora = autograd_counters();
    // full = 13 base dW products + attention's own (Q·Kᵀ and P·V, 2 per block). With the
    // frozen base only the 8 factor products remain next to attention's (which may lose one
    // where K needs no gradient): every one of the 13 base products is gone.
    EXPECT_EQ(full.matmul_right_gradients, 13U + 4U);
    EXPECT_GE(lora.matmul_right_gradients, 8U);
    EXPECT_LE(lora.matmul_right_gradients, full.matmul_right_gradients - 13U + 8U)
        << "full " << full.matmul_right_gradients << ", lora " << lora.matmul_right_gradients;
    EXPECT_LT(lora.matmul_right_gradients, full.matmul_right_gradients);
    for (const NamedParameter& named : model.parameters())
        EXPECT_FALSE(named.parameter.requires_gradient());
    for (const NamedParameter& named : model.lora_parameters())
        EXPECT_TRUE(named.parameter.has_gradient()) << named.name;
}

TEST(Lora, GradientsOfTheFactorsMatchFiniteDifferences) {
    const TransformerDimensions dims{.vocabulary_size = 11,
                                     .maximum_context = 6,
                                     .model_width = 8,
                                     .head_count = 2,
                                     .block_count = 1,
                                     .feed_forward_width = 12};
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(dims, generator);
    model.attach_lora({.rank = 2, .alpha = 3.0F, .targets = lora_known_targets & 0x7F});
    perturb_adapters(model, 40);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 5, 11, 1);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 5, 11, 2);
    const auto loss = [&] {
        return static_cast<double>(
            cross_entropy(model.forward(tokens, {2, 5}), targets).value().item());
    };
    cross_entropy(model.forward(tokens, {2, 5}), targets).backward();
    testing::expect_gradients_match_finite_differences(model.lora_parameters(), loss, 4);
}

TEST(Lora, MergeReproducesTheAdaptedModelAndRestoresTheDenseSchema) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::string> base_names = names_of(model.parameters());
    model.attach_lora({.rank = 3, .alpha = 5.0F, .targets = 0x7F});
    perturb_adapters(model, 90);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 9, 27, 4);
    const std::vector<float> adapted = model.forward(tokens, {2, 9}).value().to_host();
    const ParameterList old_factors = model.lora_parameters();
    const std::uint64_t version = model.structure_version();

    model.merge_lora();
    EXPECT_FALSE(model.lora_attached());
    EXPECT_TRUE(model.lora_merged());
    EXPECT_GT(model.structure_version(), version);
    EXPECT_TRUE(model.lora_parameters().empty());
    EXPECT_EQ(names_of(model.parameters()), base_names);
    for (const NamedParameter& named : model.parameters())
        EXPECT_TRUE(named.parameter.requires_gradient()) << named.name;
    EXPECT_TRUE(testing::all_close(model.forward(tokens, {2, 9}).value().to_host(),
                                   testing::to_double(adapted), 1e-5, 1e-5));
    // Old handles on the factors stay valid.
    EXPECT_EQ(old_factors[0].parameter.value().numel(), 3U * 32U);
    // One-way: no second merge, no attach after merge.
    EXPECT_THROW(model.merge_lora(), std::logic_error);
    EXPECT_THROW(model.attach_lora({}), std::logic_error);
}

TEST(Lora, LifecycleRejectionsChangeNothing) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::vector<float>> base_values = values_of(model.parameters());
    const auto untouched = [&] {
        EXPECT_FALSE(model.lora_attached());
        EXPECT_TRUE(model.lora_parameters().empty());
        EXPECT_EQ(values_of(model.parameters()), base_values);
        for (const NamedParameter& named : model.parameters())
            EXPECT_TRUE(named.parameter.requires_gradient());
        EXPECT_EQ(model.structure_version(), 0U);
    };
    EXPECT_THROW(model.merge_lora(), std::logic_error);
    EXPECT_THROW((void)model.lora_config(), std::logic_error);
    EXPECT_THROW(model.attach_lora({.rank = 0}), std::invalid_argument);
    EXPECT_THROW(model.attach_lora({.alpha = -2.0F}), std::invalid_argument);
    EXPECT_THROW(model.attach_lora({.targets = 0}), std::invalid_argument);
    // gate/up/down exist only in SwiGLU models: selects nothing here.
    const std::string nothing = testing::message_of<std::invalid_argument>(
        [&] { model.attach_lora({.targets = lora_target_bit(LoraTarget::FeedForwardGate)}); });
    EXPECT_NE(nothing.find("selects no projection"), std::string::npos) << nothing;
    // rank 28 > min(32, 27) of the head only: rejected before anything is attached.
    const std::string rank = testing::message_of<std::invalid_argument>(
        [&] { model.attach_lora({.rank = 28, .alpha = 28.0F, .targets = 0x7F}); });
    EXPECT_NE(rank.find("language_model_head"), std::string::npos) << rank;
    untouched();
}

TEST(Lora, ATiedHeadIsRefusedAsATargetUntilUntied) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator, 1e-5F,
                                 AttentionKind::Materialized, ActivationCheckpointing::Disabled,
                                 {.tie_embeddings = true});
    ASSERT_TRUE(model.embeddings_tied());
    const LoraTargetMask with_head =
        lora_default_targets | lora_target_bit(LoraTarget::LanguageModelHead);
    const std::string message = testing::message_of<std::invalid_argument>(
        [&] { model.attach_lora({.targets = with_head}); });
    EXPECT_NE(message.find("head is tied to the token embedding; call untie_embeddings() first"),
              std::string::npos)
        << message;
    EXPECT_FALSE(model.lora_attached());
    EXPECT_EQ(model.structure_version(), 0U);
    model.untie_embeddings();
    model.attach_lora({.targets = with_head});
    bool head_adapted = false;
    for (const NamedParameter& named : model.lora_parameters()) {
        head_adapted = head_adapted || named.name.starts_with("language_model_head.");
    }
    EXPECT_TRUE(head_adapted);
}

TEST(Lora, AFailedAttachRollsBackEveryAdapterAttachedSoFar) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::string> base_names = names_of(model.parameters());
    detail::set_lora_attach_failure_after(3);
    EXPECT_THROW(model.attach_lora({.targets = 0x7F}), std::runtime_error);
    detail::set_lora_attach_failure_after(0);
    EXPECT_FALSE(model.lora_attached());
    EXPECT_TRUE(model.lora_parameters().empty());
    EXPECT_EQ(names_of(model.parameters()), base_names);
    for (const NamedParameter& named : model.parameters())
        EXPECT_TRUE(named.parameter.requires_gradient());
    for (const AdaptableProjection& projection : model.projections())
        EXPECT_FALSE(projection.linear->used_adapter()) << projection.path;
    // The model still takes its one attach.
    EXPECT_NO_THROW(model.attach_lora({.targets = 0x7F}));
    EXPECT_EQ(model.lora_parameters().size(), 2U * 13U);
}

TEST(Lora, AdapterOnlyAdamTrainsTheFactorsAndLeavesTheBase) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    model.attach_lora({.rank = 4, .alpha = 8.0F, .targets = 0x7F});
    const std::vector<std::vector<float>> base_values = values_of(model.parameters());
    // A frozen base parameter cannot be handed to Adam.
    EXPECT_THROW(Adam(model.parameters(), AdamOptions{}), std::invalid_argument);
    Adam adam(model.lora_parameters(), AdamOptions{.learning_rate = 1e-2});
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(4 * 8, 27, 11);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(4 * 8, 27, 12);
    float first = 0;
    float last = 0;
    for (int step = 0; step < 30; ++step) {
        Variable loss = cross_entropy(model.forward(tokens, {4, 8}), targets);
        (step == 0 ? first : last) = loss.value().item();
        loss.backward();
        adam.step();
    }
    EXPECT_LT(last, first - 0.1F);
    EXPECT_EQ(values_of(model.parameters()), base_values);
}

TEST(Lora, CheckpointedBlocksGiveTheSameFactorGradientsAndRefuseStaleReplays) {
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 7, 27, 1);
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 7, 27, 2);
    std::vector<std::vector<float>> gradients[2];
    for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
        std::mt19937 generator(5);
        DecoderOnlyTransformer model(testing::reference_tiny(), generator, 1e-5F,
                                     AttentionKind::Materialized,
                                     checkpointed ? ActivationCheckpointing::TransformerBlock
                                                  : ActivationCheckpointing::Disabled);
        model.attach_lora({.targets = 0x3F});
        perturb_adapters(model, 7);
        cross_entropy(model.forward(tokens, {2, 7}), targets).backward();
        for (const NamedParameter& named : model.lora_parameters())
            gradients[checkpointed].push_back(named.parameter.gradient().to_host());
    }
    ASSERT_EQ(gradients[0].size(), gradients[1].size());
    for (std::size_t i = 0; i < gradients[0].size(); ++i)
        EXPECT_TRUE(
            testing::all_close(gradients[1][i], testing::to_double(gradients[0][i]), 1e-5, 1e-5))
            << i;

    // A graph recorded before attach cannot replay its blocks after it.
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator, 1e-5F,
                                 AttentionKind::Materialized,
                                 ActivationCheckpointing::TransformerBlock);
    Variable loss = cross_entropy(model.forward(tokens, {2, 7}), targets);
    model.attach_lora({});
    const std::string message = testing::message_of<std::logic_error>([&] { loss.backward(); });
    EXPECT_NE(message.find("cannot be replayed"), std::string::npos) << message;
}

}  // namespace riftco_transformer
