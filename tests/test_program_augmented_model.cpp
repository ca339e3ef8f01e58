// ProgramAugmentedModel (docs/ARCHITECTURE.md, 'Programmed models'): topology and parameter order,
// traces equal to the same tensors computed by hand, the program branch against a direct evaluation
// of its map, every intervention, gradients through the branch and the interventions against finite
// differences, training, and the construction and forward rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "riftco_transformer/programmed/program_augmented_model.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr std::size_t modulus = 5;

ProgramAugmentedModelConfig small_config() {
    return {.vocabulary_size = 8,
            .context_length = 4,
            .model_width = 8,
            .head_count = 2,
            .feed_forward_width = 16,
            .attention_branch_count = 2,
            .attention = AttentionKind::Materialized,
            .random_seed = 42};
}

// (a + b) mod 5 as a bilinear map on one-hot vectors: T[o, i, j] = 1 iff (i + j) % 5 == o.
MultilinearMap modular_addition() {
    std::vector<double> values(modulus * modulus * modulus, 0.0);
    for (std::size_t i = 0; i < modulus; ++i)
        for (std::size_t j = 0; j < modulus; ++j)
            values[((i + j) % modulus) * modulus * modulus + i * modulus + j] = 1.0;
    return MultilinearMap::from_dense(modulus, {modulus, modulus}, values);
}

ProgramBranch addition_branch(bool trainable = false) {
    ProgramBranch branch{.map = modular_addition(),
                         .source_offset = 0,
                         .source_length = 2,
                         .target_offset = 2,
                         .output_length = 1,
                         .inputs = {{ProgramInputSource::SourcePosition, 0, 0},
                                    {ProgramInputSource::SourcePosition, 1, 1}},
                         .lowering = {},
                         .input_projection_bias = true,
                         .merge_bias = true};
    branch.lowering.trainable = trainable;
    return branch;
}

const std::vector<std::uint32_t>& tokens() {
    static const std::vector<std::uint32_t> ids = {1, 2, 0, 3, 4, 4, 7, 1, 0, 3, 5, 2};  // [3, 4]
    return ids;
}

const Representation& rep(const ProgramAugmentedForwardResult& result, const char* name) {
    return result.trace->at(name);
}

// Row-major y = x·Wᵀ + b in double, x [R, in].
std::vector<double> affine(const std::vector<float>& x, const Variable& weight,
                           const Variable& bias) {
    const std::size_t out = weight.shape()[0];
    const std::size_t in = weight.shape()[1];
    const std::vector<float> w = weight.value().to_host();
    const std::vector<float> b = bias.defined() ? bias.value().to_host() : std::vector<float>(out);
    std::vector<double> y;
    for (std::size_t r = 0; r < x.size() / in; ++r)
        for (std::size_t o = 0; o < out; ++o) {
            double sum = b[o];
            for (std::size_t i = 0; i < in; ++i)
                sum += static_cast<double>(x[r * in + i]) * w[o * in + i];
            y.push_back(sum);
        }
    return y;
}

Variable parameter(const ProgramAugmentedModel& model, const std::string& name) {
    for (const NamedParameter& named : model.parameters())
        if (named.name == name)
            return named.parameter;
    ADD_FAILURE() << "no parameter " << name;
    return {};
}

std::vector<float> rolled(const std::vector<float>& rows, std::size_t batch, std::size_t shift) {
    const std::size_t width = rows.size() / batch;
    std::vector<float> result(rows.size());
    for (std::size_t b = 0; b < batch; ++b)
        std::copy_n(
            rows.begin() + static_cast<std::ptrdiff_t>(((b + batch - shift) % batch) * width),
            width, result.begin() + static_cast<std::ptrdiff_t>(b * width));
    return result;
}

}  // namespace

TEST(ProgramAugmentedModel, ConfigDefaultsAndParameterOrder) {
    const ProgramAugmentedModelConfig defaults;
    EXPECT_EQ(defaults.vocabulary_size, 512U);
    EXPECT_EQ(defaults.context_length, 128U);
    EXPECT_EQ(defaults.model_width, 64U);
    EXPECT_EQ(defaults.head_count, 4U);
    EXPECT_EQ(defaults.feed_forward_width, 256U);
    EXPECT_EQ(defaults.attention_branch_count, 2U);
    EXPECT_EQ(defaults.random_seed, 42U);
    const ProgramAugmentedModel model(small_config(), addition_branch(true));
    std::vector<std::string> names;
    for (const NamedParameter& named : model.parameters())
        names.push_back(named.name);
    const std::vector<std::string> expected = {"token_embedding.weight",
                                               "position_embedding.weight",
                                               "feed_forward.expand.weight",
                                               "feed_forward.expand.bias",
                                               "feed_forward.project.weight",
                                               "feed_forward.project.bias",
                                               "attention_branches.0.query.weight",
                                               "attention_branches.0.query.bias",
                                               "attention_branches.0.key.weight",
                                               "attention_branches.0.key.bias",
                                               "attention_branches.0.value.weight",
                                               "attention_branches.0.value.bias",
                                               "attention_branches.0.output.weight",
                                               "attention_branches.0.output.bias",
                                               "attention_branches.1.query.weight",
                                               "attention_branches.1.query.bias",
                                               "attention_branches.1.key.weight",
                                               "attention_branches.1.key.bias",
                                               "attention_branches.1.value.weight",
                                               "attention_branches.1.value.bias",
                                               "attention_branches.1.output.weight",
                                               "attention_branches.1.output.bias",
                                               "attention_merge.weight",
                                               "attention_merge.bias",
                                               "program_input_projections.0.weight",
                                               "program_input_projections.0.bias",
                                               "program_input_projections.1.weight",
                                               "program_input_projections.1.bias",
                                               "program.coefficients",
                                               "program_merge.weight",
                                               "program_merge.bias",
                                               "output.weight",
                                               "output.bias"};
    EXPECT_EQ(names, expected);
    EXPECT_TRUE(model.has_program());
    EXPECT_EQ(model.lowered_program().strategy(), LoweringStrategy::LinearAttention);
    // Frozen coefficients are not a parameter.
    const ProgramAugmentedModel frozen(small_config(), addition_branch(false));
    EXPECT_EQ(frozen.parameters().size(), expected.size() - 1);
}

TEST(ProgramAugmentedModel, TracesEqualTheTensorsComputedByHand) {
    const ProgramAugmentedModel model(small_config(), addition_branch());
    const ProgramAugmentedForwardResult result =
        model.forward(tokens(), {3, 4}, {.capture_representations = true});
    ASSERT_TRUE(result.trace.has_value());
    const std::vector<std::string> names = {
        "embedding.sum",         "residual.pre_attention",    "learned_attention.merged",
        "program.source",        "program.input.0",           "program.input.0.projected",
        "program.input.1",       "program.input.1.projected", "program.output.raw",
        "program.output.placed", "residual.post_merge",       "logits"};
    ASSERT_EQ(result.trace->size(), names.size());
    for (std::size_t i = 0; i < names.size(); ++i)
        EXPECT_EQ(result.trace->entries()[i].name, names[i]);
    EXPECT_EQ(rep(result, "logits").values, result.logits.value().to_host());
    EXPECT_EQ(rep(result, "logits").shape, (Shape{3, 4, 8}));

    // embedding.sum = E_tok[id] + E_pos[t]
    const std::vector<float> token_table =
        parameter(model, "token_embedding.weight").value().to_host();
    const std::vector<float> position_table =
        parameter(model, "position_embedding.weight").value().to_host();
    std::vector<double> embedded;
    for (std::size_t p = 0; p < 12; ++p)
        for (std::size_t k = 0; k < 8; ++k)
            embedded.push_back(static_cast<double>(token_table[tokens()[p] * 8 + k]) +
                               position_table[(p % 4) * 8 + k]);
    EXPECT_TRUE(testing::all_close(rep(result, "embedding.sum").values, embedded, 1e-6, 1e-6));
    // program.source and the inputs are rows of residual.pre_attention.
    const std::vector<float>& r1 = rep(result, "residual.pre_attention").values;
    const std::vector<float>& input1 = rep(result, "program.input.1").values;
    for (std::size_t b = 0; b < 3; ++b)
        for (std::size_t k = 0; k < 8; ++k)
            EXPECT_EQ(input1[b * 8 + k], r1[(b * 4 + 1) * 8 + k]);
    // projected = raw·Wᵀ + b
    EXPECT_TRUE(
        testing::all_close(rep(result, "program.input.1.projected").values,
                           affine(input1, parameter(model, "program_input_projections.1.weight"),
                                  parameter(model, "program_input_projections.1.bias")),
                           1e-5, 1e-5));
    // program.output.raw = the map evaluated on the projected inputs (exact coefficients).
    const std::vector<float>& q0 = rep(result, "program.input.0.projected").values;
    const std::vector<float>& q1 = rep(result, "program.input.1.projected").values;
    const MultilinearMap map = modular_addition();
    std::vector<double> direct;
    for (std::size_t b = 0; b < 3; ++b) {
        const std::vector<std::vector<double>> inputs = {
            std::vector<double>(q0.begin() + static_cast<std::ptrdiff_t>(b * 5),
                                q0.begin() + static_cast<std::ptrdiff_t>(b * 5 + 5)),
            std::vector<double>(q1.begin() + static_cast<std::ptrdiff_t>(b * 5),
                                q1.begin() + static_cast<std::ptrdiff_t>(b * 5 + 5))};
        const std::vector<double> y = map.evaluate(inputs);
        direct.insert(direct.end(), y.begin(), y.end());
    }
    EXPECT_TRUE(testing::all_close(rep(result, "program.output.raw").values, direct, 1e-6, 1e-6));
    // place: the raw output at target row 2, zeros elsewhere.
    const std::vector<float>& placed = rep(result, "program.output.placed").values;
    const std::vector<float>& raw = rep(result, "program.output.raw").values;
    for (std::size_t b = 0; b < 3; ++b)
        for (std::size_t t = 0; t < 4; ++t)
            for (std::size_t o = 0; o < 5; ++o)
                EXPECT_EQ(placed[(b * 4 + t) * 5 + o], t == 2 ? raw[b * 5 + o] : 0.0F);
    // residual.post_merge = r1 + W_M·[h; placed] + b_M
    const std::vector<float>& h = rep(result, "learned_attention.merged").values;
    std::vector<float> joined;
    for (std::size_t row = 0; row < 12; ++row) {
        joined.insert(joined.end(), h.begin() + static_cast<std::ptrdiff_t>(row * 8),
                      h.begin() + static_cast<std::ptrdiff_t>(row * 8 + 8));
        joined.insert(joined.end(), placed.begin() + static_cast<std::ptrdiff_t>(row * 5),
                      placed.begin() + static_cast<std::ptrdiff_t>(row * 5 + 5));
    }
    std::vector<double> merged = affine(joined, parameter(model, "program_merge.weight"),
                                        parameter(model, "program_merge.bias"));
    for (std::size_t i = 0; i < merged.size(); ++i)
        merged[i] += r1[i];
    EXPECT_TRUE(testing::all_close(rep(result, "residual.post_merge").values, merged, 1e-5, 1e-5));
    // logits = W_out·r2 + b_out
    EXPECT_TRUE(testing::all_close(
        rep(result, "logits").values,
        affine(rep(result, "residual.post_merge").values, parameter(model, "output.weight"),
               parameter(model, "output.bias")),
        1e-5, 1e-5));
    // Without capture there is no trace; the logits are the same.
    const ProgramAugmentedForwardResult plain = model.forward(tokens(), {3, 4});
    EXPECT_FALSE(plain.trace.has_value());
    EXPECT_EQ(plain.logits.value().to_host(), result.logits.value().to_host());
}

TEST(ProgramAugmentedModel, LearnedOnlyModelAddsTheMergedAttentionToTheResidual) {
    const ProgramAugmentedModel model(small_config());
    EXPECT_FALSE(model.has_program());
    EXPECT_THROW((void)model.lowered_program(), std::logic_error);
    const ProgramAugmentedForwardResult result =
        model.forward(tokens(), {3, 4}, {.capture_representations = true});
    EXPECT_FALSE(result.trace->contains("program.source"));
    const std::vector<float>& r1 = rep(result, "residual.pre_attention").values;
    const std::vector<float>& h = rep(result, "learned_attention.merged").values;
    const std::vector<float>& r2 = rep(result, "residual.post_merge").values;
    for (std::size_t i = 0; i < r2.size(); ++i)
        EXPECT_EQ(r2[i], r1[i] + h[i]);
    // Program interventions need a program.
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.ablate_program_output = true}),
                 std::invalid_argument);
}

TEST(ProgramAugmentedModel, InterventionsRollSteerAndAblateInTheGraph) {
    const ProgramAugmentedModel model(small_config(), addition_branch());
    const ProgramAugmentedForwardResult base =
        model.forward(tokens(), {3, 4}, {.capture_representations = true});
    // Batch roll of the learned attention.
    const ProgramAugmentedForwardResult roll = model.forward(tokens(), {3, 4},
                                                             {.capture_representations = true,
                                                              .batch_roll_learned_attention = true,
                                                              .batch_roll_shift = 1});
    EXPECT_EQ(rep(roll, "learned_attention.merged").values,
              rolled(rep(base, "learned_attention.merged").values, 3, 1));
    // Ablating input 1 rolls its projection (shift 2); input 0 is untouched.
    const ProgramAugmentedForwardResult ablated = model.forward(
        tokens(), {3, 4},
        {.capture_representations = true, .batch_roll_shift = 2, .ablated_program_inputs = {1}});
    EXPECT_EQ(rep(ablated, "program.input.1.projected").values,
              rolled(rep(base, "program.input.1.projected").values, 3, 2));
    EXPECT_EQ(rep(ablated, "program.input.0.projected").values,
              rep(base, "program.input.0.projected").values);
    // Ablating the output rolls the raw program output.
    const ProgramAugmentedForwardResult output_ablated = model.forward(
        tokens(), {3, 4}, {.capture_representations = true, .ablate_program_output = true});
    EXPECT_EQ(rep(output_ablated, "program.output.raw").values,
              rolled(rep(base, "program.output.raw").values, 3, 1));
    EXPECT_NE(output_ablated.logits.value().to_host(), base.logits.value().to_host());
    // Steering: raw input 0 becomes scales ⊙ raw + offsets.
    const std::vector<float> scales = {2, 0, 1, 1, -1, 1, 1, 0.5F};
    const std::vector<float> offsets = {0, 1, 0, 0, 0, 0, 0.25F, 0};
    const ProgramAugmentedForwardResult steered = model.forward(
        tokens(), {3, 4}, {.capture_representations = true, .steering = {{0, 0, scales, offsets}}});
    const std::vector<float>& before = rep(base, "program.input.0").values;
    std::vector<double> expected;
    for (std::size_t i = 0; i < before.size(); ++i)
        expected.push_back(static_cast<double>(before[i]) * scales[i % 8] + offsets[i % 8]);
    EXPECT_TRUE(testing::all_close(rep(steered, "program.input.0").values, expected, 1e-6, 1e-6));
    EXPECT_EQ(rep(steered, "program.input.1").values, rep(base, "program.input.1").values);
}

TEST(ProgramAugmentedModel, GradientsThroughTheBranchAndInterventionsMatchFiniteDifferences) {
    ProgramAugmentedModel model(small_config(), addition_branch(true));
    const std::vector<std::uint32_t> targets = {2, 0, 3, 4, 4, 7, 1, 0, 3, 5, 2, 6};
    const ProgramAugmentedForwardOptions options{
        .batch_roll_learned_attention = true,
        .batch_roll_shift = 1,
        .steering = {{1, 0, std::vector<float>(8, 1.5F), std::vector<float>(8, 0.1F)}},
        .ablated_program_inputs = {0},
        .ablate_program_output = false};
    const auto loss = [&] {
        return static_cast<double>(
            cross_entropy(model.forward(tokens(), {3, 4}, options).logits, targets).value().item());
    };
    cross_entropy(model.forward(tokens(), {3, 4}, options).logits, targets).backward();
    ParameterList probed;
    for (const NamedParameter& named : model.parameters()) {
        if (named.name.starts_with("program") || named.name.starts_with("attention_merge") ||
            named.name == "token_embedding.weight")
            probed.push_back(named);
    }
    testing::expect_gradients_match_finite_differences(probed, loss, 3);
}

TEST(ProgramAugmentedModel, FlashAndMaterializedAgreeAndAdamTrains) {
    ProgramAugmentedModel model(small_config(), addition_branch());
    const std::vector<float> materialized =
        model.forward(tokens(), {3, 4}).logits.value().to_host();
    model.set_attention(AttentionKind::Flash);
    EXPECT_TRUE(testing::all_close(model.forward(tokens(), {3, 4}).logits.value().to_host(),
                                   testing::to_double(materialized), 1e-5, 1e-5));
    const std::vector<std::uint32_t> targets = {2, 0, 3, 4, 4, 7, 1, 0, 3, 5, 2, 6};
    Adam adam(model.parameters(), AdamOptions{.learning_rate = 1e-2});
    float first = 0;
    float last = 0;
    for (int step = 0; step < 25; ++step) {
        Variable loss = cross_entropy(model.forward(tokens(), {3, 4}).logits, targets);
        (step == 0 ? first : last) = loss.value().item();
        loss.backward();
        adam.step();
    }
    EXPECT_LT(last, first - 0.2F);
}

TEST(ProgramAugmentedModel, ConstructionRules) {
    const auto rejects = [](ProgramAugmentedModelConfig config, std::optional<ProgramBranch> branch,
                            const std::string& fragment) {
        try {
            const ProgramAugmentedModel model(config, std::move(branch));
            ADD_FAILURE() << "accepted; expected " << fragment;
        } catch (const std::invalid_argument& error) {
            EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
        }
    };
    ProgramAugmentedModelConfig config = small_config();
    config.attention_branch_count = 0;
    rejects(config, std::nullopt, "must all be positive");
    config = small_config();
    config.head_count = 3;
    rejects(config, std::nullopt, "multiple of head_count");
    config = small_config();
    config.attention = static_cast<AttentionKind>(7);
    rejects(config, std::nullopt, "attention");

    ProgramBranch branch = addition_branch();
    branch.output_length = 0;
    rejects(small_config(), branch, "output_length");
    branch = addition_branch();
    branch.source_offset = 3;
    rejects(small_config(), branch, "source span");
    branch = addition_branch();
    branch.target_offset = 4;
    rejects(small_config(), branch, "target span");
    branch = addition_branch();
    branch.inputs.pop_back();
    rejects(small_config(), branch, "1 input layouts for a map of arity 2");
    branch = addition_branch();
    branch.inputs[1].position = 2;
    rejects(small_config(), branch, "past the source span");
    branch = addition_branch();
    branch.inputs[0] = {ProgramInputSource::WholeSource, 1, 0};
    rejects(small_config(), branch, "position 0");
    branch = addition_branch();
    branch.inputs[1].source = static_cast<ProgramInputSource>(4);
    rejects(small_config(), branch, "unknown source");
    branch = addition_branch();
    branch.inputs[0] = {ProgramInputSource::WholeSource, 0, 1};  // group 1 with a [B, 2D] input
    rejects(small_config(), branch, "widths differ");
    branch = addition_branch();
    branch.source_length = 0;
    rejects(small_config(), branch, "non-constant map");
    branch = addition_branch();
    branch.lowering.strategy = LoweringStrategy::Linear;
    rejects(small_config(), branch, "cannot lower");
    // A constant map needs no source.
    ProgramBranch constant{.map = MultilinearMap::from_dense(3, {}, std::vector<double>{1, 2, 3}),
                           .source_offset = 0,
                           .source_length = 0,
                           .target_offset = 1,
                           .output_length = 2,
                           .inputs = {},
                           .lowering = {},
                           .input_projection_bias = false,
                           .merge_bias = false};
    const ProgramAugmentedModel model(small_config(), constant);
    const ProgramAugmentedForwardResult result =
        model.forward(tokens(), {3, 4}, {.capture_representations = true});
    EXPECT_EQ(rep(result, "program.output.raw").values,
              (std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3}));
}

TEST(ProgramAugmentedModel, ForwardRules) {
    const ProgramAugmentedModel model(small_config(), addition_branch());
    const std::vector<std::uint32_t> seven(7, 1);
    EXPECT_THROW((void)model.forward(seven, {2, 4}), std::invalid_argument);     // count != B·T
    EXPECT_THROW((void)model.forward(tokens(), {4, 3}), std::invalid_argument);  // T != 4
    std::vector<std::uint32_t> bad = tokens();
    bad[5] = 8;
    EXPECT_THROW((void)model.forward(bad, {3, 4}), std::out_of_range);
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.batch_roll_shift = 0}),
                 std::invalid_argument);
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.ablated_program_inputs = {1, 1}}),
                 std::invalid_argument);
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.ablated_program_inputs = {2}}),
                 std::invalid_argument);
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.steering = {{2, 0, {}, {}}}}),
                 std::invalid_argument);
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.steering = {{0, 1, {}, {}}}}),
                 std::invalid_argument);  // a source_position input has one row
    EXPECT_THROW((void)model.forward(tokens(), {3, 4}, {.steering = {{0, 0, {1, 2}, {}}}}),
                 std::invalid_argument);
}

}  // namespace riftco_transformer
