// The optional fusions of the decode path on a backend without them: the emulated device
// (the Metal identity of the test builds) has no RotaryCapability and keeps
// MatmulCapability::project_many's default, so tensor_ops composes RoPE from slices, products
// and a concatenation and runs one matmul per projection. Both must give the CPU's fused
// results bit for bit, or decoding would depend on the backend's kernel choice.

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

std::vector<float> random_values(std::size_t count, unsigned seed) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> value(-2.0F, 2.0F);
    std::vector<float> values(count);
    for (float& v : values)
        v = value(generator);
    return values;
}

TEST(EmulatedFusions, TheDeviceHasNoFusedRotaryButTheCpuHas) {
    EXPECT_EQ(detail::find_backend_adapter(metal)->rotary(), nullptr);
    EXPECT_NE(detail::find_backend_adapter(cpu)->rotary(), nullptr);
}

TEST(EmulatedFusions, ComposedRotaryEqualsTheCpuKernelBitForBit) {
    const std::size_t heads = 3;
    const std::size_t d = 12;
    // Row form [R,H,1,d] (decoding) and sequence form [B,H,T,d].
    const std::vector<std::size_t> positions = {4, 0, 9};
    const RotaryTables tables = rotary_tables(positions, d, 10000.0, cpu);
    for (const auto& [shape, axis] : {std::pair{Shape{3, heads, 1, d}, std::size_t{0}},
                                      std::pair{Shape{2, heads, 3, d}, std::size_t{2}}}) {
        std::size_t count = 1;
        for (const std::size_t extent : shape)
            count *= extent;
        const Tensor x(shape, random_values(count, 5));
        const std::vector<float> fused =
            tensor_ops::rotary_embedding(x, tables.cosine, tables.sine, axis).to_host();
        const std::vector<float> composed =
            tensor_ops::rotary_embedding(x.to(metal), tables.cosine.to(metal),
                                         tables.sine.to(metal), axis)
                .to_host();
        EXPECT_EQ(composed, fused) << "table axis " << axis;
    }
}

TEST(EmulatedFusions, OneMatmulPerProjectionEqualsTheFusedGemvPassBitForBit) {
    const std::size_t k = 320;
    const Tensor x({2, k}, random_values(2 * k, 6));
    const std::vector<Tensor> weights = {Tensor({640, k}, random_values(640 * k, 7)),
                                         Tensor({213, k}, random_values(213 * k, 8)),
                                         Tensor({213, k}, random_values(213 * k, 9))};
    std::vector<Tensor> on_device;
    for (const Tensor& w : weights)
        on_device.push_back(w.to(metal));
    const std::vector<Tensor> fused = tensor_ops::project_many(x, weights);
    const std::vector<Tensor> separate = tensor_ops::project_many(x.to(metal), on_device);
    ASSERT_EQ(separate.size(), fused.size());
    for (std::size_t i = 0; i < fused.size(); ++i) {
        EXPECT_EQ(separate[i].backend(), metal);
        EXPECT_EQ(separate[i].to_host(), fused[i].to_host()) << "projection " << i;
    }
}

}  // namespace
}  // namespace riftco_transformer
