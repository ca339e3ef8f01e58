// KV-cached decoding on a second backend (the emulated device under the Metal identity): the
// pools live on the device, the paged-attention capability runs there (context in a new
// buffer, a bad score deferred to the next sync point), logits match the CPU's, and a session
// made on one backend is stale once the model moves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/emulated_device.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

class EmulatedDecode : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(execution_backend_available(metal)); }
    void TearDown() override { set_execution_backend(cpu); }
};

TEST_F(EmulatedDecode, SessionsOnTheDeviceMatchTheCpu) {
    std::mt19937 generator(21);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(12, 27, 5);
    std::vector<float> on_cpu;
    {
        DecodeSession session(model);
        on_cpu = session.prefill(tokens, PrefillLogits::All).to_host();
    }
    model.to(metal);
    auto pool = make_key_value_cache_pool(model, 4, 8);
    EXPECT_EQ(pool->keys(0).backend(), metal);
    DecodeSession a(model, pool);
    DecodeSession b(model, pool);
    const std::size_t replaced_before = test::emulated_replaced_outputs();
    const Tensor prefilled = a.prefill({tokens.data(), 6}, PrefillLogits::All);
    EXPECT_EQ(prefilled.backend(), metal);
    EXPECT_GT(test::emulated_replaced_outputs(), replaced_before);
    std::vector<float> on_device = prefilled.to_host();
    std::vector<float> second;  // b decodes tokens 0..5 one at a time beside a
    for (std::size_t t = 6; t < tokens.size(); ++t) {
        const std::vector<DecodeWork> work = {{&a, {&tokens[t], 1}}, {&b, {&tokens[t - 6], 1}}};
        const std::vector<float> rows = decode_batch(work).to_host();
        on_device.insert(on_device.end(), rows.begin(), rows.begin() + 27);
        second.insert(second.end(), rows.begin() + 27, rows.end());
    }
    EXPECT_TRUE(testing::all_close(on_device, testing::to_double(on_cpu), 1e-5, 1e-5));
    const std::vector<float> first_six(on_cpu.begin(), on_cpu.begin() + 6 * 27);
    EXPECT_TRUE(testing::all_close(second, testing::to_double(first_six), 1e-5, 1e-5));
    model.to(cpu);
}

TEST_F(EmulatedDecode, AModelThatMovesLeavesItsSessionsStale) {
    std::mt19937 generator(22);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    DecodeSession session(model);
    static_cast<void>(session.decode_token(1));
    model.to(metal);
    EXPECT_TRUE(session.stale());
    const auto message =
        testing::message_of<std::logic_error>([&] { static_cast<void>(session.decode_token(2)); });
    EXPECT_NE(message.find("moved to backend 'metal'"), std::string::npos) << message;
    session.reset();
    EXPECT_TRUE(session.stale());  // its pool is still on the CPU
    model.to(cpu);
}

TEST_F(EmulatedDecode, BadScoresSurfaceAtTheNextSyncPoint) {
    Tensor keys = Tensor::zeros({1, 1, 2, 2}, metal);
    Tensor values = Tensor::zeros({1, 1, 2, 2}, metal);
    const std::vector<tensor_ops::PagedSlot> slot = {{0, 0}};
    tensor_ops::write_paged_key_value(keys, values, Tensor({1, 1, 1, 2}, {INFINITY, 0.0F}, metal),
                                      Tensor({1, 1, 1, 2}, {1.0F, 2.0F}, metal), slot);
    const std::vector<std::uint32_t> table = {0};
    const tensor_ops::PagedAttentionRequest request{table, 1};
    // The call returns; the deferred domain error is raised where the host reads.
    const Tensor context = tensor_ops::paged_decode_attention(
        Tensor({1, 1, 1, 2}, {1.0F, 1.0F}, metal), keys, values, {&request, 1});
    EXPECT_THROW(static_cast<void>(context.to_host()), std::domain_error);
}

}  // namespace
}  // namespace riftco_transformer
