// The adapter contract on an asynchronous device, against the emulated one of the test
// builds (tests/support/emulated_device.hpp): value-domain errors are deferred to the next
// sync point with the CPU's category and message, outputs may arrive in new buffers, storage
// moves between backends without host staging, and CPU and the device agree bit for bit on
// a whole training step, which reads the host once whatever the parameter count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/emulated_device.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend device = ExecutionBackend::Metal;

template <typename Exception, typename Call>
std::string message_of(Call&& call) {
    try {
        call();
    } catch (const Exception& error) {
        return error.what();
    }
    ADD_FAILURE() << "no exception of the expected category";
    return {};
}

// The device raises at the sync point what the CPU raises at the call.
template <typename Exception, typename Operation>
void expect_deferred_like_the_cpu(Operation&& operation, const Tensor& cpu_input) {
    const std::string on_cpu =
        message_of<Exception>([&] { static_cast<void>(operation(cpu_input)); });
    const Tensor device_input = cpu_input.to(device);
    Tensor result;
    ASSERT_NO_THROW(result = operation(device_input)) << "the device must not raise at the call";
    const std::string at_sync = message_of<Exception>([&] { static_cast<void>(result.to_host()); });
    EXPECT_EQ(at_sync, on_cpu);
    EXPECT_FALSE(on_cpu.empty());
    // Raised once: the next sync point is clean.
    EXPECT_NO_THROW(static_cast<void>(result.to_host()));
}

TEST(EmulatedDevice, SoftmaxOfANanSliceIsRaisedAtTheNextSyncPointWithTheCpuMessage) {
    const Tensor x({2, 3}, {0.0F, std::numeric_limits<float>::quiet_NaN(), 1.0F, 1.0F, 2.0F, 3.0F},
                   cpu);
    expect_deferred_like_the_cpu<std::domain_error>(
        [](const Tensor& input) { return tensor_ops::softmax(input, 1); }, x);
    const Tensor scores({1, 1, 2, 2}, {std::numeric_limits<float>::infinity(), 0.0F, 1.0F, 2.0F},
                        cpu);
    expect_deferred_like_the_cpu<std::domain_error>(
        [](const Tensor& input) { return tensor_ops::causal_softmax(input, 1.0F); }, scores);
}

TEST(EmulatedDevice, LogOfANegativeValueAndANonFiniteTargetLogitAreDeferredToo) {
    expect_deferred_like_the_cpu<std::domain_error>(
        [](const Tensor& input) { return tensor_ops::log(input); },
        Tensor({3}, {1.0F, -2.0F, 3.0F}, cpu));
    const std::vector<std::uint32_t> targets{1, 0};
    const Tensor logits(
        {2, 3}, {0.0F, std::numeric_limits<float>::infinity(), 0.0F, 1.0F, 2.0F, 3.0F}, cpu);
    expect_deferred_like_the_cpu<std::domain_error>(
        [&](const Tensor& input) {
            return tensor_ops::cross_entropy(input, IndexTensor({2}, targets, input.backend()))
                .loss;
        },
        logits);
}

TEST(EmulatedDevice, OutputsMayArriveInNewBuffersAndStillMatchTheCpuBitForBit) {
    const std::vector<float> a = testing::pseudo_random(6 * 5, -1.0F, 1.0F, 1);
    const std::vector<float> b = testing::pseudo_random(5 * 4, -1.0F, 1.0F, 2);
    const Tensor left({6, 5}, std::span<const float>(a), cpu);
    const Tensor right({5, 4}, std::span<const float>(b), cpu);
    const std::size_t replaced = test::emulated_replaced_outputs();
    const Tensor on_device = tensor_ops::matmul(left.to(device), right.to(device));
    EXPECT_GT(test::emulated_replaced_outputs(), replaced);
    EXPECT_EQ(on_device.backend(), device);
    EXPECT_EQ(on_device.to_host(), tensor_ops::matmul(left, right).to_host());
}

TEST(EmulatedDevice, ATimeRangeCrossEntropyReadsNothingAndMatchesTheCpuBitForBit) {
    // logits [2,4,5] over t in [1, 3): the window reaches the adapter with the targets left
    // on the device, and nothing is read until the results are.
    const std::vector<float> values = testing::pseudo_random(2 * 4 * 5, -2.0F, 2.0F, 3);
    const std::vector<std::uint32_t> ids{0, 1, 2, 3, 4, 0, 1, 2};
    const Tensor logits({2, 4, 5}, std::span<const float>(values), cpu);
    const Tensor on_device_logits = logits.to(device);
    const IndexTensor on_device_targets({2, 4}, ids, device);
    const std::uint64_t reads = host_read_count();
    const tensor_ops::CrossEntropyResult on_device =
        tensor_ops::cross_entropy_time_range(on_device_logits, on_device_targets, 1, 2);
    EXPECT_EQ(host_read_count(), reads);
    const tensor_ops::CrossEntropyResult on_cpu =
        tensor_ops::cross_entropy_time_range(logits, ids, 1, 2);
    EXPECT_EQ(on_device.loss.to_host(), on_cpu.loss.to_host());
    EXPECT_EQ(on_device.gradient.to_host(), on_cpu.gradient.to_host());
}

TEST(EmulatedDevice, WritesGoThroughTheAdapterAndNeverReachACopy) {
    Tensor x({4}, {1.0F, 2.0F, 3.0F, 4.0F}, device);
    const Tensor copy = x;
    const std::size_t replaced = test::emulated_replaced_outputs();
    x.set_flat(2, 30.0F);
    EXPECT_EQ(test::emulated_replaced_outputs(), replaced + 1);
    EXPECT_EQ(x.to_host(), (std::vector<float>{1.0F, 2.0F, 30.0F, 4.0F}));
    EXPECT_EQ(copy.to_host(), (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
    const std::vector<float> replacement{5.0F, 6.0F, 7.0F, 8.0F};
    x.copy_from_host(replacement);
    EXPECT_EQ(x.to_host(), replacement);
    EXPECT_EQ(copy.to_host(), (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
}

TEST(EmulatedDevice, TransfersCopyStorageDirectlyAndArrivingOnTheHostIsOneRead) {
    const std::vector<float> values = testing::pseudo_random(1000, -1.0F, 1.0F, 3);
    const Tensor on_cpu({10, 100}, std::span<const float>(values), cpu);
    const std::size_t imports = test::emulated_direct_imports();
    const std::uint64_t reads = host_read_count();
    const Tensor on_device = on_cpu.to(device);
    EXPECT_EQ(test::emulated_direct_imports(), imports + 1);
    EXPECT_EQ(host_read_count(), reads) << "host -> device is no host read";
    const Tensor back = on_device.to(cpu);
    EXPECT_EQ(host_read_count(), reads + 1) << "device -> host is one sync point";
    EXPECT_EQ(back.to_host(), values);

    const std::vector<std::uint32_t> ids{4, 1, 9};
    const IndexTensor cpu_ids({3}, ids, cpu);
    const IndexTensor device_ids = cpu_ids.to(device);
    EXPECT_EQ(device_ids.backend(), device);
    EXPECT_EQ(device_ids.max_id(), 9U);
    EXPECT_EQ(device_ids.to_host(), ids);
    const std::uint64_t before_ids_back = host_read_count();
    EXPECT_EQ(device_ids.to(cpu).to_host(), ids);
    EXPECT_EQ(host_read_count(), before_ids_back + 2) << "to(cpu) and to_host: one read each";
    // Ids live on one backend: a gather from a device table with CPU ids is rejected.
    EXPECT_THROW(static_cast<void>(tensor_ops::gather_rows(on_device, cpu_ids)),
                 std::invalid_argument);
    EXPECT_EQ(tensor_ops::gather_rows(on_device, device_ids).to_host(),
              tensor_ops::gather_rows(on_cpu, cpu_ids).to_host());
}

TEST(EmulatedDevice, OptimizerOpsRejectTensorsOfAnotherBackend) {
    const Tensor on_cpu({2}, 1.0F, cpu);
    const Tensor on_device({2}, 1.0F, device);
    const std::vector<const Tensor*> mixed{&on_device, &on_cpu};
    try {
        static_cast<void>(tensor_ops::gradient_statistics(device, mixed));
        FAIL() << "expected invalid_argument";
    } catch (const std::invalid_argument& error) {
        EXPECT_STREQ(error.what(), "gradient_statistics: tensor 1 is on cpu, not metal");
    }
    EXPECT_THROW(static_cast<void>(tensor_ops::first_non_finite(device, mixed)),
                 std::invalid_argument);
}

TransformerDimensions tiny(std::size_t blocks) {
    return {.vocabulary_size = 19,
            .maximum_context = 8,
            .model_width = 16,
            .head_count = 2,
            .block_count = blocks,
            .feed_forward_width = 32};
}

struct StepResult {
    std::vector<float> loss;
    std::vector<float> parameters;
    std::uint64_t step_reads = 0;
};

StepResult train_two_steps(ExecutionBackend backend, std::size_t blocks, AttentionKind kind) {
    std::mt19937 generator(21);
    DecoderOnlyTransformer model(tiny(blocks), generator, 1e-5F, kind);
    model.to(backend);
    Adam adam(model.parameters(), {.learning_rate = 1e-2, .weight_decay = 0.01});
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(2 * 8, 19, 4);
    const IndexTensor inputs({2, 8}, tokens, backend);
    const IndexTensor targets({16}, tokens, backend);
    StepResult result;
    for (int step = 0; step < 2; ++step) {
        adam.zero_gradients();
        Variable loss = cross_entropy(model.forward(inputs), targets);
        loss.backward();
        const std::uint64_t before = host_read_count();
        static_cast<void>(adam.step());
        result.step_reads = host_read_count() - before;
        result.loss.push_back(loss.value().item());
    }
    for (const NamedParameter& named : model.parameters()) {
        const std::vector<float> values = named.parameter.value().to_host();
        result.parameters.insert(result.parameters.end(), values.begin(), values.end());
    }
    return result;
}

TEST(EmulatedDevice, ATrainingStepOnTheDeviceMatchesTheCpuBitForBitWithOneHostRead) {
    for (const AttentionKind kind : {AttentionKind::Materialized, AttentionKind::Flash}) {
        const std::size_t replaced = test::emulated_replaced_outputs();
        const StepResult on_cpu = train_two_steps(cpu, 2, kind);
        const StepResult on_device = train_two_steps(device, 2, kind);
        EXPECT_GT(test::emulated_replaced_outputs(), replaced);
        EXPECT_EQ(on_device.loss, on_cpu.loss);
        EXPECT_EQ(on_device.parameters, on_cpu.parameters);
        EXPECT_EQ(on_device.step_reads, 1U);
        EXPECT_EQ(train_two_steps(device, 4, kind).step_reads, 1U);
    }
}

}  // namespace
}  // namespace riftco_transformer
