// The device-ready core on the CPU (issue: index tensors, sync points, one host read per
// optimizer step): IndexTensor uploads and their O(1) range checks, the IndexTensor forms of
// gather / scatter-add / cross-entropy / the model's forward against the host-id forms, the
// host-read counter over a training step, and the cause named for non-finite activations.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;

std::vector<float> values_of(const Tensor& tensor) {
    return tensor.to_host();
}

TEST(IndexTensor, UploadRoundTripsAndRecordsTheLargestIdAndItsFirstPosition) {
    const std::vector<std::uint32_t> ids{3, 9, 1, 9, 0, 4};
    const IndexTensor tensor({2, 3}, ids, cpu);
    EXPECT_EQ(tensor.shape(), (Shape{2, 3}));
    EXPECT_EQ(tensor.numel(), 6U);
    EXPECT_EQ(tensor.backend(), cpu);
    EXPECT_EQ(tensor.max_id(), 9U);
    EXPECT_EQ(tensor.max_id_position(), 1U);
    EXPECT_EQ(tensor.to_host(), ids);
    const IndexTensor flat = tensor.reshape({6});
    EXPECT_EQ(flat.shape(), (Shape{6}));
    EXPECT_EQ(flat.to_host(), ids);
    EXPECT_EQ(tensor.to(cpu).to_host(), ids);
}

TEST(IndexTensor, BadUploadsAreRejectedNamingTheProblem) {
    const std::vector<std::uint32_t> ids{1, 2, 3};
    EXPECT_THROW(IndexTensor({2, 2}, ids, cpu), std::invalid_argument);
    EXPECT_THROW(IndexTensor({0, 3}, ids, cpu), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(IndexTensor({3}, ids, cpu).reshape({2})), std::invalid_argument);
    // Host ids above the uint32 range fail at the upload, naming the position and the value.
    const std::vector<std::size_t> wide{1, std::size_t{1} << 33U};
    try {
        static_cast<void>(tensor_ops::gather_rows(Tensor({4, 2}, 1.0F, cpu), wide, {2}));
        FAIL() << "expected overflow_error";
    } catch (const std::overflow_error& error) {
        EXPECT_NE(std::string(error.what()).find("indices[1] = 8589934592"), std::string::npos)
            << error.what();
    }
    const IndexTensor singular;
    EXPECT_TRUE(singular.is_singular());
    EXPECT_THROW(static_cast<void>(singular.backend()), std::logic_error);
    EXPECT_THROW(static_cast<void>(singular.to_host()), std::logic_error);
    const Tensor table({4, 2}, 1.0F, cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(table, singular)), std::logic_error);
}

TEST(IndexTensor, GatherScatterAndCrossEntropyMatchTheHostIdFormsExactly) {
    const std::vector<float> table_values = testing::pseudo_random(5 * 3, -1.0F, 1.0F, 11);
    const Tensor table({5, 3}, std::span<const float>(table_values), cpu);
    const std::vector<std::size_t> host_ids{4, 0, 4, 2};
    const std::vector<std::uint32_t> ids{4, 0, 4, 2};
    const IndexTensor uploaded({2, 2}, ids, cpu);
    const Tensor gathered = tensor_ops::gather_rows(table, uploaded);
    EXPECT_EQ(gathered.shape(), (Shape{2, 2, 3}));
    EXPECT_EQ(values_of(gathered), values_of(tensor_ops::gather_rows(table, host_ids, {2, 2})));

    const std::vector<float> upstream_values = testing::pseudo_random(4 * 3, -1.0F, 1.0F, 12);
    const Tensor upstream({4, 3}, std::span<const float>(upstream_values), cpu);
    EXPECT_EQ(values_of(tensor_ops::scatter_add_rows(upstream, uploaded.reshape({4}), 5)),
              values_of(tensor_ops::scatter_add_rows(upstream, host_ids, 5)));

    const std::vector<float> logit_values = testing::pseudo_random(4 * 5, -2.0F, 2.0F, 13);
    const Tensor logits({4, 5}, std::span<const float>(logit_values), cpu);
    const auto from_tensor = tensor_ops::cross_entropy(logits, uploaded);
    const auto from_host = tensor_ops::cross_entropy(logits, std::span<const std::uint32_t>(ids));
    EXPECT_EQ(from_tensor.loss.item(), from_host.loss.item());
    EXPECT_EQ(values_of(from_tensor.gradient), values_of(from_host.gradient));
}

TEST(IndexTensor, RangeIsCheckedFromTheRecordedMaximumNamingItsPosition) {
    const Tensor table({5, 3}, 1.0F, cpu);
    const std::vector<std::uint32_t> ids{1, 7, 2, 7};
    const IndexTensor uploaded({4}, ids, cpu);
    try {
        static_cast<void>(tensor_ops::gather_rows(table, uploaded));
        FAIL() << "expected out_of_range";
    } catch (const std::out_of_range& error) {
        EXPECT_STREQ(error.what(), "gather_rows: indices[1] = 7 is out of range for 5 rows");
    }
    EXPECT_THROW(
        static_cast<void>(tensor_ops::scatter_add_rows(Tensor({4, 3}, 1.0F, cpu), uploaded, 5)),
        std::out_of_range);
    EXPECT_THROW(static_cast<void>(tensor_ops::cross_entropy(Tensor({4, 5}, 0.0F, cpu), uploaded)),
                 std::out_of_range);
    // Counts still match the data.
    EXPECT_THROW(static_cast<void>(tensor_ops::cross_entropy(Tensor({3, 9}, 0.0F, cpu), uploaded)),
                 std::invalid_argument);
}

TransformerDimensions tiny(std::size_t blocks) {
    return {.vocabulary_size = 23,
            .maximum_context = 8,
            .model_width = 16,
            .head_count = 2,
            .block_count = blocks,
            .feed_forward_width = 32};
}

TEST(DeviceContract, ModelForwardFromAnIndexTensorEqualsTheHostIdForm) {
    std::mt19937 generator(3);
    const DecoderOnlyTransformer model(tiny(2), generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 6, 23, 5);
    const Variable from_host = model.forward(tokens, {2, 6});
    const Variable from_tensor = model.forward(IndexTensor({2, 6}, tokens, cpu));
    EXPECT_EQ(values_of(from_host.value()), values_of(from_tensor.value()));
    std::vector<std::uint32_t> bad = tokens;
    bad[4] = 23;
    bad[7] = 30;
    try {
        static_cast<void>(model.forward(IndexTensor({2, 6}, bad, cpu)));
        FAIL() << "expected out_of_range";
    } catch (const std::out_of_range& error) {
        EXPECT_NE(std::string(error.what()).find("token id 30 at position 7"), std::string::npos)
            << error.what();
    }
}

// Host reads of one training step: forward, loss, backward and Adam::step read the host
// only in the optimizer, once, whatever the number of parameter tensors.
std::uint64_t host_reads_of_one_step(std::size_t blocks) {
    std::mt19937 generator(9);
    const DecoderOnlyTransformer model(tiny(blocks), generator);
    Adam adam(model.parameters(), {.learning_rate = 1e-3});
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 8, 23, 17);
    const IndexTensor inputs({2, 8}, tokens, cpu);
    const IndexTensor targets({16}, tokens, cpu);
    const std::uint64_t before = host_read_count();
    Variable loss = cross_entropy(model.forward(inputs), targets);
    loss.backward();
    const std::uint64_t after_backward = host_read_count();
    EXPECT_EQ(after_backward, before) << "forward and backward must not read the host";
    static_cast<void>(adam.step());
    return host_read_count() - before;
}

TEST(DeviceContract, AnAdamStepReadsTheHostOnceWhateverTheParameterCount) {
    std::mt19937 generator(9);
    EXPECT_GT(DecoderOnlyTransformer(tiny(4), generator).parameters().size(),
              DecoderOnlyTransformer(tiny(1), generator).parameters().size() + 30);
    EXPECT_EQ(host_reads_of_one_step(1), 1U);
    EXPECT_EQ(host_reads_of_one_step(4), 1U);
}

TEST(DeviceContract, HugeWeightsNameNonFiniteActivationsAsTheCause) {
    std::mt19937 generator(4);
    DecoderOnlyTransformer model(tiny(2), generator);
    for (const NamedParameter& named : model.parameters()) {
        Tensor& value = leaf_view(named.parameter, "test").value;
        value = Tensor(value.shape(), 1e12F, cpu);
    }
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(6, 23, 2);
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        model.set_attention(kind);
        try {
            static_cast<void>(model.forward(tokens, {1, 6}));
            FAIL() << "expected domain_error";
        } catch (const std::domain_error& error) {
            EXPECT_NE(std::string(error.what()).find("non-finite activations in block 0"),
                      std::string::npos)
                << error.what();
        }
    }
}

TEST(LeafAccess, AViewShowsTheLiveTensorsAndAnUpdateBumpsTheVersionAndDropsTheGradient) {
    Variable leaf(Tensor({2}, {1.0F, 2.0F}, cpu));
    Variable loss = sum(leaf * leaf);
    loss.backward();
    const LeafView view = leaf_view(leaf, "test");
    EXPECT_TRUE(view.leaf);
    EXPECT_TRUE(view.requires_gradient);
    EXPECT_EQ(view.identity, leaf_view(Variable(leaf), "test").identity);
    EXPECT_EQ(view.gradient.to_host(), (std::vector<float>{2.0F, 4.0F}));  // d/dx Σx² = 2x
    view.value.set_flat(0, 5.0F);
    EXPECT_EQ(leaf.value().flat(0), 5.0F);  // the view is the live value, not a copy
    const std::uint64_t version = leaf.version();
    mark_leaf_updated(leaf);
    EXPECT_EQ(leaf.version(), version + 1);
    EXPECT_FALSE(leaf.has_gradient());

    const Variable product = leaf * leaf;
    const LeafView interior = leaf_view(product, "test");
    EXPECT_FALSE(interior.leaf);
    EXPECT_FALSE(interior.operation.empty());
    EXPECT_THROW(mark_leaf_updated(product), std::logic_error);
    EXPECT_THROW(static_cast<void>(leaf_view(Variable(), "test")), std::logic_error);
}

TEST(OptimizerOps, GradientStatisticsAreOneBatchedReadOfTheNormAndTheFirstNonFinite) {
    const Tensor a({3}, {3.0F, 0.0F, -4.0F}, cpu);
    const Tensor b({2}, {12.0F, 0.0F}, cpu);
    const std::vector<const Tensor*> tensors{&a, nullptr, &b};
    const std::uint64_t before = host_read_count();
    const tensor_ops::GradientStatistics statistics = tensor_ops::gradient_statistics(cpu, tensors);
    EXPECT_EQ(host_read_count(), before + 1);
    EXPECT_DOUBLE_EQ(statistics.squares.norm(), 13.0);  // √(9 + 16 + 144)
    EXPECT_EQ(statistics.first_non_finite.tensor, tensors.size());

    const Tensor bad({4}, {1.0F, 2.0F, std::numeric_limits<float>::infinity(), 0.0F}, cpu);
    const std::vector<const Tensor*> with_bad{&a, &bad};
    const tensor_ops::FirstNonFinite found = tensor_ops::first_non_finite(cpu, with_bad);
    EXPECT_EQ(found.tensor, 1U);
    EXPECT_EQ(found.element, 2U);
    EXPECT_EQ(found.value, std::numeric_limits<float>::infinity());
    EXPECT_EQ(tensor_ops::clip_scale_for(13.0, 1.0), 1.0 / 13.0);
    EXPECT_EQ(tensor_ops::clip_scale_for(0.5, 1.0), 1.0);
}

TEST(OptimizerOps, MalformedSlicesAreRejectedBeforeAnyRead) {
    Tensor value({4}, 1.0F, cpu);
    const Tensor gradient({4}, 0.5F, cpu);
    const Tensor wrong_gradient({2, 2}, 0.5F, cpu);
    Tensor moment({2}, 0.0F, cpu);
    Tensor other_moment({3}, 0.0F, cpu);
    const tensor_ops::AdamUpdateScalars scalars{.beta1 = 0.9,
                                                .beta2 = 0.999,
                                                .bias_correction1 = 0.1,
                                                .bias_correction2 = 0.001,
                                                .learning_rate = 0.01,
                                                .epsilon = 1e-8};
    const std::vector<const Tensor*> gradients{&gradient};
    const auto check = [&](tensor_ops::AdamSlice slice) {
        const std::vector<tensor_ops::AdamSlice> slices{slice};
        return tensor_ops::adam_step_check(cpu, scalars, 1.0, gradients, slices).check;
    };
    const std::uint64_t before = host_read_count();
    EXPECT_THROW(static_cast<void>(check({nullptr, &gradient, 0, &moment, &moment})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(check({&value, &gradient, 3, &moment, &moment})),
                 std::invalid_argument);  // [3, 5) is outside a value of 4
    EXPECT_THROW(static_cast<void>(check({&value, &gradient, 0, &moment, &other_moment})),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(check({&value, &wrong_gradient, 0, &moment, &moment})),
                 std::invalid_argument);
    EXPECT_EQ(host_read_count(), before);
    const tensor_ops::AdamCheck fine = check({&value, &gradient, 2, &moment, &moment});
    EXPECT_EQ(fine.value_slice, 1U);
    EXPECT_EQ(fine.update_slice, 1U);
    EXPECT_EQ(host_read_count(), before + 1);
}

}  // namespace
}  // namespace riftco_transformer
