// CUDA flash attention against the CPU reference (form B, 3e-4:
// docs/ARCHITECTURE.md, 'Numeric parity'): the forward's context and row statistics (m, l) and the
// three VJPs (dQ, dK, dV) for dense causal attention, a window shorter than T, grouped query heads
// (Hq != Hkv, Hkv = 1 included), T on both sides of and not a multiple of the kernels' tile (32),
// head widths 16/64/128 (and 80, not a multiple of a warp), batch > 1; the backward bit-identical
// run to run (no float atomics); a NaN score raised at the sync point with the CPU's category and
// message. They skip without a device (fail under RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON).

#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "support/cuda_support.hpp"

namespace riftco_transformer {
namespace {

using test::matches_reference;
using test::uniform_values;

constexpr ExecutionBackend cuda = ExecutionBackend::Cuda;
constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr double attention_tolerance = 3e-4;  // form B of docs/ARCHITECTURE.md, 'Numeric parity'

class CudaAttention : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_CUDA_DEVICE(); }
};

struct Case {
    std::size_t batch;
    std::size_t query_heads;
    std::size_t kv_heads;
    std::size_t time;
    std::size_t width;
    std::size_t window;
};

std::string name_of(const Case& c) {
    return "B=" + std::to_string(c.batch) + " Hq=" + std::to_string(c.query_heads) +
           " Hkv=" + std::to_string(c.kv_heads) + " T=" + std::to_string(c.time) +
           " d=" + std::to_string(c.width) + " W=" + std::to_string(c.window);
}

void expect_parity(const Case& c, unsigned seed, float softcap = 0.0F) {
    SCOPED_TRACE(name_of(c) + " cap=" + std::to_string(softcap));
    const Shape query_shape{c.batch, c.query_heads, c.time, c.width};
    const Shape kv_shape{c.batch, c.kv_heads, c.time, c.width};
    const std::size_t query_count = c.batch * c.query_heads * c.time * c.width;
    const std::size_t kv_count = c.batch * c.kv_heads * c.time * c.width;
    const std::vector<float> q = uniform_values(query_count, -1.5F, 1.5F, seed);
    const std::vector<float> k = uniform_values(kv_count, -1.5F, 1.5F, seed + 1);
    const std::vector<float> v = uniform_values(kv_count, -1.0F, 1.0F, seed + 2);
    const std::vector<float> g = uniform_values(query_count, -1.0F, 1.0F, seed + 3);
    const tensor_ops::FlashAttentionOptions options{.window = c.window, .softcap = softcap};

    const Tensor q_cpu(query_shape, q, cpu);
    const Tensor k_cpu(kv_shape, k, cpu);
    const Tensor v_cpu(kv_shape, v, cpu);
    const Tensor q_cuda(query_shape, q, cuda);
    const Tensor k_cuda(kv_shape, k, cuda);
    const Tensor v_cuda(kv_shape, v, cuda);

    const auto reference = tensor_ops::flash_attention(q_cpu, k_cpu, v_cpu, options);
    const auto device = tensor_ops::flash_attention(q_cuda, k_cuda, v_cuda, options);
    ASSERT_EQ(device.context.backend(), cuda);
    EXPECT_TRUE(matches_reference(device.context.to_host(), reference.context.to_host(),
                                  attention_tolerance))
        << "context";
    EXPECT_TRUE(matches_reference(device.row_max.to_host(), reference.row_max.to_host(),
                                  attention_tolerance))
        << "row_max";
    EXPECT_TRUE(matches_reference(device.row_sum.to_host(), reference.row_sum.to_host(),
                                  attention_tolerance))
        << "row_sum";

    const auto reference_gradients = tensor_ops::flash_attention_backward(
        q_cpu, k_cpu, v_cpu, reference, Tensor(query_shape, g, cpu));
    const auto device_gradients = tensor_ops::flash_attention_backward(
        q_cuda, k_cuda, v_cuda, device, Tensor(query_shape, g, cuda));
    ASSERT_EQ(device_gradients.key.shape(), kv_shape);
    EXPECT_TRUE(matches_reference(device_gradients.query.to_host(),
                                  reference_gradients.query.to_host(), attention_tolerance))
        << "dQ";
    EXPECT_TRUE(matches_reference(device_gradients.key.to_host(), reference_gradients.key.to_host(),
                                  attention_tolerance))
        << "dK";
    EXPECT_TRUE(matches_reference(device_gradients.value.to_host(),
                                  reference_gradients.value.to_host(), attention_tolerance))
        << "dV";
}

TEST_F(CudaAttention, DenseCausalMatchesTheCpuReference) {
    expect_parity({2, 4, 4, 37, 16, 0}, 11);   // batch > 1, T not a multiple of the tile
    expect_parity({1, 2, 2, 64, 64, 0}, 12);   // T a multiple of the tile
    expect_parity({2, 2, 2, 45, 128, 0}, 13);  // the widest head
    expect_parity({1, 1, 1, 5, 128, 0}, 14);   // T shorter than one tile
    expect_parity({1, 2, 2, 40, 80, 0}, 15);   // d not a multiple of a warp
}

TEST_F(CudaAttention, SlidingWindowShorterThanTMatchesTheCpuReference) {
    expect_parity({1, 2, 2, 100, 64, 19}, 21);  // the window straddles key tiles
    expect_parity({2, 2, 2, 70, 16, 5}, 22);
    expect_parity({1, 2, 2, 33, 128, 1}, 23);  // each query sees only itself
    expect_parity({1, 2, 2, 50, 16, 32}, 24);  // W equal to the tile
    expect_parity({1, 1, 1, 20, 16, 64}, 25);  // W >= T is dense
}

TEST_F(CudaAttention, GroupedQueryHeadsMatchTheCpuReference) {
    expect_parity({1, 4, 2, 70, 64, 0}, 31);
    expect_parity({2, 3, 1, 45, 128, 0}, 32);  // Hkv = 1
    expect_parity({2, 8, 1, 37, 16, 0}, 33);   // Hkv = 1, wide group
    expect_parity({2, 6, 2, 90, 64, 23}, 34);  // groups and a window
    expect_parity({1, 4, 1, 100, 16, 40}, 35);
}

// Gemma 2's attention-logit soft cap, forward and VJP (a cap of 0.5 bites on these scores).
TEST_F(CudaAttention, SoftCappedScoresMatchTheCpuReference) {
    expect_parity({2, 4, 2, 70, 64, 19}, 41, 0.5F);
    expect_parity({1, 2, 2, 45, 128, 0}, 42, 50.0F);
}

TEST_F(CudaAttention, BackwardIsBitIdenticalRunToRun) {
    const Shape query_shape{2, 4, 67, 64};
    const Shape kv_shape{2, 1, 67, 64};
    const Tensor q(query_shape, uniform_values(2 * 4 * 67 * 64, -1.0F, 1.0F, 41), cuda);
    const Tensor k(kv_shape, uniform_values(2 * 67 * 64, -1.0F, 1.0F, 42), cuda);
    const Tensor v(kv_shape, uniform_values(2 * 67 * 64, -1.0F, 1.0F, 43), cuda);
    const Tensor g(query_shape, uniform_values(2 * 4 * 67 * 64, -1.0F, 1.0F, 44), cuda);
    const auto forward = tensor_ops::flash_attention(q, k, v, {9});
    const auto first = tensor_ops::flash_attention_backward(q, k, v, forward, g);
    const auto second = tensor_ops::flash_attention_backward(q, k, v, forward, g);
    EXPECT_EQ(first.query.to_host(), second.query.to_host());
    EXPECT_EQ(first.key.to_host(), second.key.to_host());
    EXPECT_EQ(first.value.to_host(), second.value.to_host());
    const auto again = tensor_ops::flash_attention(q, k, v, {9});
    EXPECT_EQ(forward.context.to_host(), again.context.to_host());
}

TEST_F(CudaAttention, NanScoreIsRaisedAtTheSyncPointLikeTheCpu) {
    const Shape shape{2, 2, 40, 16};
    std::vector<float> q = uniform_values(2 * 2 * 40 * 16, -1.0F, 1.0F, 51);
    q[(3 * 40 + 35) * 16 + 2] = std::numeric_limits<float>::quiet_NaN();  // item 3, row 35
    const std::vector<float> kv = uniform_values(2 * 2 * 40 * 16, -1.0F, 1.0F, 52);
    std::string expected;
    try {
        static_cast<void>(tensor_ops::flash_attention(Tensor(shape, q, cpu), Tensor(shape, kv, cpu),
                                                      Tensor(shape, kv, cpu)));
    } catch (const std::domain_error& error) {
        expected = error.what();
    }
    ASSERT_FALSE(expected.empty());
    std::string message;
    try {
        const auto result = tensor_ops::flash_attention(
            Tensor(shape, q, cuda), Tensor(shape, kv, cuda), Tensor(shape, kv, cuda));
        static_cast<void>(result.context.to_host());
    } catch (const std::domain_error& error) {
        message = error.what();
    }
    EXPECT_EQ(message, expected);
}

}  // namespace
}  // namespace riftco_transformer
