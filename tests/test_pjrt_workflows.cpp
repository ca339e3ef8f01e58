// Whole workflows on the PJRT backend against the same run on the CPU reference: a TINY
// pretraining run of 20 Adam steps follows the CPU's loss curve; LoRA and QLoRA steps train on
// the device; evaluation and KV-cached decoding give the CPU's logits. It also reports, per
// training step, the compile count, the cache hit rate and the host<->device bytes (which must
// not grow with the step count: everything stays on the device apart from the batch and the
// optimizer's one small read).
//
// Tolerances: losses and logits agree to 2e-4 relative + 2e-4 absolute over 20 steps (float32
// on both sides; XLA's reduction order differs from ours and Adam amplifies the differences a
// little every step).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/model_support.hpp"
#include "support/pjrt_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr double curve_tolerance = 2e-4;

class PjrtWorkflows : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }
    void TearDown() override { set_execution_backend(ExecutionBackend::Cpu); }
    ExecutionBackend device = test::pjrt_test_backend();
};

struct Batch {
    std::vector<std::uint32_t> inputs;
    std::vector<std::uint32_t> targets;
};

Batch batch_for_step(int step) {
    return {testing::pseudo_random_tokens(4 * 16, 27, 100U + static_cast<unsigned>(step)),
            testing::pseudo_random_tokens(4 * 16, 27, 200U + static_cast<unsigned>(step))};
}

// Loss per step of `steps` Adam steps of the reference tiny model built with `seed`, on
// `backend`, with `attention`.
std::vector<float> pretraining_curve(ExecutionBackend backend, AttentionKind attention, int steps) {
    const ScopedExecutionBackend on(backend);
    std::mt19937 generator(11);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator, 1e-5F, attention);
    Adam adam(
        model.parameters(),
        AdamOptions{.learning_rate = 3e-3, .maximum_gradient_norm = 1.0, .weight_decay = 0.01});
    std::vector<float> losses;
    for (int step = 0; step < steps; ++step) {
        const Batch batch = batch_for_step(step);
        Variable loss = cross_entropy(model.forward(batch.inputs, {4, 16}), batch.targets);
        losses.push_back(loss.value().item());
        loss.backward();
        adam.step();
    }
    return losses;
}

void expect_curves_agree(const std::vector<float>& device, const std::vector<float>& cpu) {
    ASSERT_EQ(device.size(), cpu.size());
    for (std::size_t step = 0; step < cpu.size(); ++step) {
        EXPECT_NEAR(device[step], cpu[step],
                    curve_tolerance + curve_tolerance * std::fabs(cpu[step]))
            << "step " << step;
    }
    EXPECT_LT(device.back(), device.front());
}

TEST_F(PjrtWorkflows, TinyPretrainingFollowsTheCpuLossCurveForTwentySteps) {
    const std::vector<float> cpu =
        pretraining_curve(ExecutionBackend::Cpu, AttentionKind::Materialized, 20);
    const std::vector<float> on_device = pretraining_curve(device, AttentionKind::Materialized, 20);
    expect_curves_agree(on_device, cpu);
}

TEST_F(PjrtWorkflows, FlashAttentionTrainingFollowsTheCpuLossCurve) {
    const std::vector<float> cpu =
        pretraining_curve(ExecutionBackend::Cpu, AttentionKind::Flash, 8);
    const std::vector<float> on_device = pretraining_curve(device, AttentionKind::Flash, 8);
    expect_curves_agree(on_device, cpu);
}

TEST_F(PjrtWorkflows, TrainingStepsCompileNothingNewAndMoveConstantBytes) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const ScopedExecutionBackend on(device);
    std::mt19937 generator(11);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    Adam adam(model.parameters(), AdamOptions{.learning_rate = 3e-3});
    const auto step = [&](int index) {
        const Batch batch = batch_for_step(index);
        Variable loss = cross_entropy(model.forward(batch.inputs, {4, 16}), batch.targets);
        loss.backward();
        adam.step();
    };
    step(0);  // compiles what the step needs
    const auto warm = test::pjrt_statistics();
    const std::uint64_t reads_before = host_read_count();
    step(1);
    const auto one = test::pjrt_statistics();
    for (int index = 2; index < 6; ++index) {
        step(index);
    }
    const auto five = test::pjrt_statistics();
    const std::uint64_t reads_after = host_read_count();

    EXPECT_EQ(one.compiles, warm.compiles) << "a second step compiled new programs";
    EXPECT_EQ(five.compiles, warm.compiles);
    const std::uint64_t to_device = one.bytes_to_device - warm.bytes_to_device;
    const std::uint64_t to_host = one.bytes_to_host - warm.bytes_to_host;
    // Every step moves the same bytes: the batch's ids and a few runtime scalars up, the
    // optimizer's check down.
    EXPECT_EQ(five.bytes_to_device - one.bytes_to_device, 4 * to_device);
    EXPECT_EQ(five.bytes_to_host - one.bytes_to_host, 4 * to_host);
    const std::uint64_t batch_bytes = 2 * 4 * 16 * sizeof(std::uint32_t);
    EXPECT_LT(to_host, 1024U) << "a training step downloads more than its one small read";
    EXPECT_EQ(reads_after - reads_before, 5U) << "one host read per step";
    const double executions = static_cast<double>(one.executions - warm.executions);
    const double hits = static_cast<double>(one.cache_hits - warm.cache_hits);
    std::printf(
        "[pjrt] training step (reference tiny, B=4, T=16): %llu programs compiled by the "
        "first step, %.0f program runs per step, cache hit rate after warm-up %.1f%%, "
        "%llu bytes to device per step (batch ids %llu), %llu bytes to host per step\n",
        static_cast<unsigned long long>(warm.compiles), executions,
        executions > 0 ? 100.0 * hits / executions : 0.0,
        static_cast<unsigned long long>(to_device), static_cast<unsigned long long>(batch_bytes),
        static_cast<unsigned long long>(to_host));
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

TEST_F(PjrtWorkflows, LoraAndQloraTrainOnTheDeviceLikeOnTheCpu) {
    for (const bool packed : {false, true}) {
        std::vector<float> curves[2];
        for (const ExecutionBackend backend : {ExecutionBackend::Cpu, device}) {
            const ScopedExecutionBackend on(backend);
            std::mt19937 generator(5);
            DecoderOnlyTransformer model(testing::reference_tiny(), generator);
            if (packed) {
                model.quantize_nf4();
            }
            model.attach_lora({.targets = 0x7F});
            Adam adam(model.lora_parameters(), AdamOptions{.learning_rate = 1e-2});
            std::vector<float>& losses = curves[backend == ExecutionBackend::Cpu ? 0 : 1];
            // One batch, seen again every step: the adapters must fit it, so the loss falls.
            const Batch batch = batch_for_step(0);
            for (int step = 0; step < 6; ++step) {
                Variable loss = cross_entropy(model.forward(batch.inputs, {4, 16}), batch.targets);
                losses.push_back(loss.value().item());
                loss.backward();
                adam.step();
            }
            for (const NamedParameter& named : model.lora_parameters()) {
                EXPECT_EQ(named.parameter.backend(), backend) << named.name;
            }
        }
        SCOPED_TRACE(packed ? "QLoRA" : "LoRA");
        expect_curves_agree(curves[1], curves[0]);
    }
}

TEST_F(PjrtWorkflows, EvaluationAndDecodingGiveTheCpuLogits) {
    std::mt19937 generator(21);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::uint32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
    std::vector<float> reference;
    {
        DecodeSession session(model);
        reference = session.prefill(prompt).to_host();
        const std::vector<float> next = session.decode_token(5).to_host();
        reference.insert(reference.end(), next.begin(), next.end());
    }
    const std::vector<float> full_cpu = model.forward(prompt, {1, 8}).value().to_host();
    model.to(device);
    const std::vector<float> full_device = model.forward(prompt, {1, 8}).value().to_host();
    EXPECT_TRUE(testing::all_close(full_device, testing::to_double(full_cpu), 2e-5, 2e-5));
    DecodeSession session(model);
    std::vector<float> decoded = session.prefill(prompt).to_host();
    const std::vector<float> next = session.decode_token(5).to_host();
    decoded.insert(decoded.end(), next.begin(), next.end());
    EXPECT_TRUE(testing::all_close(decoded, testing::to_double(reference), 2e-5, 2e-5));
}

}  // namespace
}  // namespace riftco_transformer
