// DataParallel on a device whose gradients are not host memory (the test-only variant in which
// ExecutionBackend::Metal is an emulated device): buckets that a CPU gradient would reduce in
// its own memory go through host copies instead, with the same collectives, and the averaged
// gradient comes back on the device; ZeroRedundancyAdam steps there like Adam.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/distributed/zero_redundancy_adam.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend metal = ExecutionBackend::Metal;

Variable leaf(Shape shape, std::uint32_t seed) {
    const std::vector<float> values =
        testing::pseudo_random(checked_element_count(shape), -1.0F, 1.0F, seed);
    return Variable(Tensor(std::move(shape), std::span<const float>(values), metal));
}

// Two leaves, one large enough for buckets of its own (split: larger than a bucket), one
// packed; the loss reads both.
struct Pair {
    Variable large = leaf({40, 64}, 1);
    Variable small = leaf({8}, 2);
    [[nodiscard]] ParameterList list() const { return {{"large", large}, {"small", small}}; }
    [[nodiscard]] Variable loss() const { return sum(large * large) + sum(small * small); }
};

TEST(EmulatedDataParallel, DeviceGradientsAreReducedThroughHostCopiesOverlappedOrNot) {
    ASSERT_TRUE(execution_backend_available(metal));
    const auto group = create_single_process_group();
    DataParallel parallel(*group, 4096);  // 1024 values a bucket: `large` takes three
    Pair blocking;
    blocking.loss().backward();
    const std::vector<float> expected = blocking.large.gradient().to_host();
    EXPECT_EQ(parallel.reduce_gradients(blocking.list(), 3.0), 3.0);
    EXPECT_EQ(blocking.large.gradient().backend(), metal);
    EXPECT_TRUE(testing::bit_identical(blocking.large.gradient().to_host(), expected));
    Pair overlapped;
    EXPECT_EQ(parallel.backward_and_reduce(overlapped.loss(), overlapped.list(), 3.0), 3.0);
    EXPECT_EQ(overlapped.large.gradient().backend(), metal);
    EXPECT_TRUE(testing::bit_identical(overlapped.large.gradient().to_host(), expected));
    EXPECT_TRUE(testing::bit_identical(overlapped.small.gradient().to_host(),
                                       blocking.small.gradient().to_host()));
}

TEST(EmulatedDataParallel, ZeroRedundancyAdamStepsOnTheDeviceLikeAdam) {
    const auto group = create_single_process_group();
    DataParallel parallel(*group);
    Pair sharded;
    Pair plain;
    ZeroRedundancyAdam zero(parallel, sharded.list());
    Adam adam(plain.list());
    for (int step = 0; step < 2; ++step) {
        sharded.loss().backward();
        plain.loss().backward();
        static_cast<void>(zero.step());
        static_cast<void>(adam.step());
    }
    EXPECT_EQ(sharded.large.value().backend(), metal);
    EXPECT_TRUE(
        testing::bit_identical(sharded.large.value().to_host(), plain.large.value().to_host()));
    EXPECT_EQ(zero.state().second_moments, adam.state().second_moments);
}

}  // namespace
}  // namespace riftco_transformer
