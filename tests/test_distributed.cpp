// distributed/process_group.hpp in one process: the single-process group, DataParallel's
// rules (layout hash, weighted reduction, shards), Variable::set_gradient, and what a build
// without MPI says. The multi-rank behaviour runs under mpirun in tests/distributed/.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/distributed/zero_redundancy_adam.hpp"
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
    const std::vector<float> mine = {3.0F, 4.0F};
    std::vector<float> all(2);
    const std::vector<std::size_t> counts = {2};
    group->allgather(std::span<const float>(mine), std::span<float>(all),
                     std::span<const std::size_t>(counts));
    EXPECT_EQ(all, mine);
    const std::vector<std::size_t> wrong = {1};
    EXPECT_THROW(group->allgather(std::span<const float>(mine), std::span<float>(all),
                                  std::span<const std::size_t>(wrong)),
                 std::invalid_argument);
    const auto pending = group->start_allreduce_sum(std::span<float>(values));
    EXPECT_TRUE(pending->test());
    pending->wait();
    EXPECT_EQ(values, (std::vector<float>{1.0F, 2.0F}));
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

namespace {

// A world of two identical ranks, played by one process: every sum doubles, and each
// non-blocking start is recorded with how many gradient-ready hooks had fired by then.
class MirroredPairGroup final : public ProcessGroup {
  public:
    explicit MirroredPairGroup(const std::size_t& hooks_fired) : hooks_fired_(hooks_fired) {}
    [[nodiscard]] int rank() const noexcept override { return 0; }
    [[nodiscard]] int world_size() const noexcept override { return 2; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override {
        return std::chrono::milliseconds(1000);
    }
    void barrier() override {}
    void broadcast(std::span<float>, int) override {}
    void broadcast(std::span<std::uint8_t>, int) override {}
    void allreduce_sum(std::span<float> values) override {
        for (float& v : values)
            v *= 2.0F;
    }
    void allreduce_sum(std::span<double> values) override {
        for (double& v : values)
            v *= 2.0;
    }
    [[nodiscard]] std::vector<std::uint64_t> allgather(std::uint64_t value) override {
        return {value, value};
    }
    void allgather(std::span<const float>, std::span<float>,
                   std::span<const std::size_t>) override {
        throw std::logic_error("not used");
    }
    [[nodiscard]] std::unique_ptr<PendingCollective> start_allreduce_sum(
        std::span<float> values) override {
        starts.push_back(hooks_fired_);
        return std::make_unique<Pending>(values);
    }
    std::vector<std::size_t> starts;

  private:
    // The sum happens at wait(), like a collective that completes later.
    class Pending final : public PendingCollective {
      public:
        explicit Pending(std::span<float> values) : values_(values) {}
        [[nodiscard]] bool test() override { return done_; }
        void wait() override {
            if (!done_) {
                for (float& v : values_)
                    v *= 2.0F;
            }
            done_ = true;
        }

      private:
        std::span<float> values_;
        bool done_ = false;
    };
    const std::size_t& hooks_fired_;
};

// FNV-1a over every parameter's gradient values.
std::uint64_t gradient_hash(const ParameterList& parameters) {
    std::uint64_t hash = 14695981039346656037ULL;
    for (const NamedParameter& named : parameters) {
        for (const float value : named.parameter.gradient().to_host()) {
            std::uint32_t bits = 0;
            std::memcpy(&bits, &value, sizeof bits);
            hash = (hash ^ bits) * 1099511628211ULL;
        }
    }
    return hash;
}

}  // namespace

TEST(DataParallel, OverlappedReductionStartsBucketsDuringBackwardAndMatchesTheBlockingOne) {
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(16, 27, 2);
    std::size_t hooks = 0;
    MirroredPairGroup group(hooks);
    DataParallel parallel(group, 4096);  // small buckets: many per step
    // Blocking: backward, then the reduction.
    auto blocking = tiny_model(6);
    cross_entropy(blocking.forward(tokens, {2, 8}), tokens).backward();
    EXPECT_EQ(parallel.reduce_gradients(blocking.parameters(), 16.0), 32.0);
    EXPECT_EQ(group.starts.size() > 3, true);
    group.starts.clear();
    // Overlapped: the same buckets, started while backward still has leaves to finish.
    auto overlapped = tiny_model(6);
    const ParameterList parameters = overlapped.parameters();
    BackwardOptions options;
    options.gradient_ready = [&](const Variable&, const Tensor&) { ++hooks; };
    Variable loss = cross_entropy(overlapped.forward(tokens, {2, 8}), tokens);
    EXPECT_EQ(parallel.backward_and_reduce(loss, parameters, 16.0, options), 32.0);
    EXPECT_EQ(hooks, parameters.size());
    ASSERT_GT(group.starts.size(), 3U);
    EXPECT_LT(group.starts.front(), parameters.size() / 2)
        << "the first bucket started only after most of backward";
    const ParameterList reference = blocking.parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(parameters[i].parameter.gradient().to_host(),
                                           reference[i].parameter.gradient().to_host()))
            << parameters[i].name;
    }
    // Accumulation: the averaged gradient is the accumulated one.
    auto twice = tiny_model(6);
    cross_entropy(twice.forward(tokens, {2, 8}), tokens).backward();
    Variable again = cross_entropy(twice.forward(tokens, {2, 8}), tokens);
    static_cast<void>(
        parallel.backward_and_reduce(again, twice.parameters(), 16.0, {.accumulate = true}, 0.5F));
    const ParameterList accumulated = twice.parameters();
    for (std::size_t i = 0; i < accumulated.size(); ++i) {
        const std::vector<float> got = accumulated[i].parameter.gradient().to_host();
        const std::vector<float> one = reference[i].parameter.gradient().to_host();
        for (std::size_t k = 0; k < got.size(); ++k)
            ASSERT_NEAR(got[k], 1.5F * one[k], 1e-6F + 1e-5F * std::fabs(one[k]))
                << accumulated[i].name;
    }
    // A gradient that backward hands to two leaves as one tensor (an addition's): reducing one
    // in place must not show through the other. The mirrored pair halves then doubles.
    Variable a(Tensor({2048}, std::vector<float>(2048, 0.5F)));
    Variable b(Tensor({2048}, std::vector<float>(2048, -0.5F)));
    static_cast<void>(parallel.backward_and_reduce(sum(a + b), {{"a", a}, {"b", b}}, 1.0));
    EXPECT_EQ(a.gradient().to_host(), std::vector<float>(2048, 1.0F));
    EXPECT_EQ(b.gradient().to_host(), std::vector<float>(2048, 1.0F));
    // A backward that fails midway (here a hook that throws after some leaves) publishes
    // nothing, though some buckets had started.
    auto failing = tiny_model(6);
    const ParameterList failing_parameters = failing.parameters();
    cross_entropy(failing.forward(tokens, {2, 8}), tokens).backward();
    const std::uint64_t before_failure = gradient_hash(failing_parameters);
    std::size_t seen = 0;
    BackwardOptions throwing;
    throwing.gradient_ready = [&](const Variable&, const Tensor&) {
        if (++seen == failing_parameters.size() - 2)
            throw std::runtime_error("backward failed");
    };
    Variable failing_loss = cross_entropy(failing.forward(tokens, {2, 8}), tokens);
    EXPECT_THROW(static_cast<void>(parallel.backward_and_reduce(failing_loss, failing_parameters,
                                                                16.0, throwing)),
                 std::runtime_error);
    EXPECT_EQ(gradient_hash(failing_parameters), before_failure);
    // Argument rules, checked before backward runs (the graph stays usable).
    Variable unused = cross_entropy(twice.forward(tokens, {2, 8}), tokens);
    EXPECT_THROW(static_cast<void>(parallel.backward_and_reduce(unused, parameters, -1.0)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(parallel.backward_and_reduce(unused, parameters, 1.0, {}, NAN)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(
                     parallel.backward_and_reduce(twice.forward(tokens, {2, 8}), parameters, 1.0)),
                 std::invalid_argument);  // not a one-element loss
    ParameterList twice_listed = parameters;
    twice_listed.push_back(parameters.front());
    EXPECT_THROW(static_cast<void>(parallel.backward_and_reduce(unused, twice_listed, 1.0)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(parallel.reduce_gradients(twice_listed, 1.0)),
                 std::invalid_argument);
    EXPECT_TRUE(unused.holds_graph());
}

TEST(ZeroRedundancyAdam, OneRankStepsExactlyLikeAdamAndSpeaksItsState) {
    const std::vector<std::uint32_t> tokens = testing::pseudo_random_tokens(16, 27, 3);
    const auto group = create_single_process_group();
    DataParallel parallel(*group);
    auto sharded = tiny_model(8);
    auto plain = tiny_model(8);
    AdamOptions options;
    options.learning_rate = 1e-2F;
    options.maximum_gradient_norm = 0.1;  // clipping active
    ZeroRedundancyAdam zero(parallel, sharded.parameters(), options);
    Adam adam(plain.parameters(), options);
    EXPECT_EQ(zero.owned_state_bytes(), zero.unsharded_state_bytes());
    EXPECT_EQ(zero.unsharded_state_bytes(), adam.state_payload_bytes());
    for (int step = 0; step < 3; ++step) {
        cross_entropy(sharded.forward(tokens, {2, 8}), tokens).backward();
        cross_entropy(plain.forward(tokens, {2, 8}), tokens).backward();
        const AdamStepStats a = zero.step();
        const AdamStepStats b = adam.step();
        EXPECT_EQ(a.step, b.step);
        EXPECT_EQ(a.gradient_norm, b.gradient_norm);
        EXPECT_EQ(a.clip_scale, b.clip_scale);
        EXPECT_LT(a.clip_scale, 1.0);
        EXPECT_EQ(DataParallel::parameter_hash(sharded.parameters()),
                  DataParallel::parameter_hash(plain.parameters()));
    }
    const AdamState state = zero.state();
    const AdamState expected = adam.state();
    EXPECT_EQ(state.step_count, expected.step_count);
    EXPECT_EQ(state.first_moments, expected.first_moments);
    EXPECT_EQ(state.second_moments, expected.second_moments);
    EXPECT_EQ(state.parameter_values, expected.parameter_values);
    // Bad states are refused with nothing changed.
    const std::uint64_t before = DataParallel::parameter_hash(sharded.parameters());
    AdamState short_state = state;
    short_state.first_moments.pop_back();
    EXPECT_THROW(zero.load_state(short_state), std::invalid_argument);
    AdamState negative = state;
    negative.second_moments[5] = -1.0F;
    EXPECT_THROW(zero.load_state(negative), std::invalid_argument);
    AdamState not_finite = state;
    not_finite.parameter_values[2] = NAN;
    EXPECT_THROW(zero.load_state(not_finite), std::invalid_argument);
    EXPECT_EQ(DataParallel::parameter_hash(sharded.parameters()), before);
    EXPECT_EQ(zero.state().first_moments, expected.first_moments);
    // A non-finite gradient fails the step with nothing changed.
    cross_entropy(sharded.forward(tokens, {2, 8}), tokens).backward();
    Variable first = sharded.parameters().front().parameter;
    Tensor poisoned = first.gradient();
    std::vector<float> values = poisoned.to_host();
    values[0] = NAN;
    poisoned.copy_from_host(values);
    first.set_gradient(poisoned);
    EXPECT_THROW(static_cast<void>(zero.step()), std::domain_error);
    EXPECT_EQ(zero.step_count(), 3U);
    EXPECT_EQ(DataParallel::parameter_hash(sharded.parameters()), before);
    // The list's rules.
    EXPECT_THROW(ZeroRedundancyAdam(parallel, {}, options), std::invalid_argument);
    ParameterList frozen = tiny_model(9).parameters();
    frozen.front().parameter.set_requires_gradient(false);
    EXPECT_THROW(ZeroRedundancyAdam(parallel, frozen, options), std::invalid_argument);
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
