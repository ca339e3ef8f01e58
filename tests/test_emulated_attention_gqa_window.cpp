// Grouped-query, windowed flash attention through the attention capability of an
// asynchronous device (the emulated one of the test builds): the same values as the CPU bit
// for bit, key/value gradients of K's shape, and a bad score raised at the next sync point
// with the CPU's message.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/emulated_device.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend device = ExecutionBackend::Metal;

const Shape query_shape{2, 6, 90, 8};  // Hq = 6
const Shape key_shape{2, 2, 90, 8};    // Hkv = 2
constexpr std::size_t window = 20;

struct AttentionRun {
    std::vector<float> context, query_gradient, key_gradient, value_gradient;
    Shape key_gradient_shape;
};

AttentionRun run_on(ExecutionBackend backend) {
    Variable q(
        Tensor(query_shape, testing::pseudo_random(2 * 6 * 90 * 8, -1.5F, 1.5F, 1), backend));
    Variable k(Tensor(key_shape, testing::pseudo_random(2 * 2 * 90 * 8, -1.5F, 1.5F, 2), backend));
    Variable v(Tensor(key_shape, testing::pseudo_random(2 * 2 * 90 * 8, -1.0F, 1.0F, 3), backend));
    const Variable weights(
        Tensor(query_shape, testing::pseudo_random(2 * 6 * 90 * 8, -1.0F, 1.0F, 4), backend),
        false);
    const Variable context = flash_attention(q, k, v, {.window = window});
    sum(context * weights).backward();
    return {context.value().to_host(), q.gradient().to_host(), k.gradient().to_host(),
            v.gradient().to_host(), k.gradient().shape()};
}

}  // namespace

TEST(EmulatedGroupedWindowedFlash, DeviceEqualsTheCpuBitForBitWithKeyShapedGradients) {
    const std::size_t replaced = test::emulated_replaced_outputs();
    const AttentionRun on_cpu = run_on(cpu);
    const AttentionRun on_device = run_on(device);
    EXPECT_GT(test::emulated_replaced_outputs(), replaced);
    EXPECT_EQ(on_device.key_gradient_shape, key_shape);
    EXPECT_TRUE(testing::bit_identical(on_device.context, on_cpu.context));
    EXPECT_TRUE(testing::bit_identical(on_device.query_gradient, on_cpu.query_gradient));
    EXPECT_TRUE(testing::bit_identical(on_device.key_gradient, on_cpu.key_gradient));
    EXPECT_TRUE(testing::bit_identical(on_device.value_gradient, on_cpu.value_gradient));
}

TEST(EmulatedGroupedWindowedFlash, ANanScoreIsRaisedAtTheNextSyncPointWithTheCpuMessage) {
    std::vector<float> keys = testing::pseudo_random(2 * 2 * 90 * 8, -1.5F, 1.5F, 2);
    keys[(90 + 50) * 8] = std::numeric_limits<float>::quiet_NaN();  // kv head 1, key 50
    const auto attend = [&](ExecutionBackend backend) {
        const Tensor q(query_shape, testing::pseudo_random(2 * 6 * 90 * 8, -1.5F, 1.5F, 1),
                       backend);
        const Tensor k(key_shape, keys, backend);
        return tensor_ops::flash_attention(q, k, k, {.window = window}).context;
    };
    const std::string on_cpu =
        testing::message_of<std::domain_error>([&] { static_cast<void>(attend(cpu)); });
    Tensor result;
    ASSERT_NO_THROW(result = attend(device)) << "the device must not raise at the call";
    const std::string at_sync =
        testing::message_of<std::domain_error>([&] { static_cast<void>(result.to_host()); });
    EXPECT_FALSE(on_cpu.empty());
    EXPECT_EQ(at_sync, on_cpu);
}

// Packed rows (attention within document boundaries) are the CPU's for now: a second backend
// refuses them by name at the call, never a silent dense fallback.
TEST(EmulatedAttention, PackedRowsAreRefusedByName) {
    const Tensor q(Shape{1, 2, 6, 4}, 0.25F, device);
    tensor_ops::FlashAttentionOptions options;
    const std::vector<std::uint32_t> positions = {0, 1, 2, 0, 1, 2};
    options.documents = tensor_ops::packed_documents("test", positions, 1, 6);
    try {
        static_cast<void>(tensor_ops::flash_attention(q, q, q, options));
        FAIL() << "packed rows ran on the emulated device";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("not available on the metal backend"),
                  std::string::npos)
            << error.what();
    }
}

}  // namespace riftco_transformer
