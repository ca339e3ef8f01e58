// distributed/process_group.hpp in one process: the single-process group, DataParallel's
// rules (layout hash, weighted reduction, shards), Variable::set_gradient, and what a build
// without MPI says. The multi-rank behaviour runs under mpirun in tests/distributed/.

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

DecoderOnlyTransformer tiny_model(std::uint32_t seed) {
    std::mt19937 generator(seed);
    return DecoderOnlyTransformer(testing::reference_tiny(), generator);
}

}  // namespace

TEST(ProcessGroup, SingleProcessGroupIsAWorldOfOne) {
    const auto group = create_single_process_group();
    EXPECT_EQ(group->rank(), 0);
    EXPECT_EQ(group->world_size(), 1);
    std::vector<float> values = {1.0F, 2.0F};
    group->allreduce_sum(std::span<float>(values));
    EXPECT_EQ(values, (std::vector<float>{1.0F, 2.0F}));
    group->broadcast(std::span<float>(values), 0);
    EXPECT_THROW(group->broadcast(std::span<float>(values), 1), std::invalid_argument);
    EXPECT_EQ(group->allgather(7), (std::vector<std::uint64_t>{7}));
    group->barrier();
}

TEST(ProcessGroup, CreationNamesWhatIsMissing) {
    ProcessGroupOptions options;
    options.timeout = std::chrono::milliseconds(0);
    EXPECT_THROW(static_cast<void>(create_process_group(options)), std::invalid_argument);
    if (!distributed_compiled_in()) {
        try {
            static_cast<void>(create_process_group());
            ADD_FAILURE() << "a build without MPI created a process group";
        } catch (const DistributedError& error) {
            EXPECT_NE(std::string(error.what()).find("not compiled in"), std::string::npos);
        }
    }
}

TEST(DataParallel, ShardsAreEqualContiguousAndRequireADivisibleBatch) {
    const auto group = create_single_process_group();
    const DataParallel parallel(*group);
    EXPECT_EQ(parallel.shard(8), (std::pair<std::size_t, std::size_t>{0, 8}));
    EXPECT_THROW(static_cast<void>(parallel.shard(0)), std::invalid_argument);
    EXPECT_THROW(DataParallel(*group, 3), std::invalid_argument);
}

TEST(DataParallel, ReductionOfOneRankKeepsTheGradientForAnyBucketSize) {
    for (const std::size_t bucket : {std::size_t{4}, std::size_t{4096}, std::size_t{1} << 24}) {
        auto model = tiny_model(3);
        const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(16, 27, 1);
        cross_entropy(model.forward(tokens, {2, 8}), tokens).backward();
        const ParameterList parameters = model.parameters();
        std::vector<std::vector<float>> before;
        for (const NamedParameter& named : parameters)
            before.push_back(named.parameter.gradient().to_host());
        const auto group = create_single_process_group();
        DataParallel parallel(*group, bucket);
        parallel.synchronize_parameters(parameters);
        EXPECT_EQ(parallel.reduce_gradients(parameters, 16.0), 16.0);
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            EXPECT_TRUE(
                testing::bit_identical(parameters[i].parameter.gradient().to_host(), before[i]))
                << parameters[i].name << " bucket " << bucket;
        }
        EXPECT_GT(parallel.communicated_bytes(), 0U);
    }
}

TEST(DataParallel, WeightRulesAndParameterHash) {
    auto model = tiny_model(4);
    const ParameterList parameters = model.parameters();
    const auto group = create_single_process_group();
    DataParallel parallel(*group);
    EXPECT_THROW(static_cast<void>(parallel.reduce_gradients(parameters, -1.0)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(parallel.reduce_gradients(parameters, NAN)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(parallel.reduce_gradients(parameters, 0.0)), DistributedError);
    const std::uint64_t hash = DataParallel::parameter_hash(parameters);
    EXPECT_EQ(hash, DataParallel::parameter_hash(tiny_model(4).parameters()));
    EXPECT_NE(hash, DataParallel::parameter_hash(tiny_model(5).parameters()));
}

TEST(VariableSetGradient, ReplacesALeafGradientAndChecksShapeAndKind) {
    Variable leaf(Tensor({2}, {1.0F, 2.0F}));
    leaf.set_gradient(Tensor({2}, {3.0F, 4.0F}));
    EXPECT_TRUE(leaf.has_gradient());
    EXPECT_EQ(leaf.gradient().to_host(), (std::vector<float>{3.0F, 4.0F}));
    EXPECT_THROW(leaf.set_gradient(Tensor({3}, {1.0F, 1.0F, 1.0F})), std::invalid_argument);
    EXPECT_EQ(leaf.gradient().to_host(), (std::vector<float>{3.0F, 4.0F}));
    Variable frozen(Tensor({2}, {1.0F, 2.0F}), false);
    EXPECT_THROW(frozen.set_gradient(Tensor({2}, {1.0F, 1.0F})), std::logic_error);
}

}  // namespace riftco_transformer
