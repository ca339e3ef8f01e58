// Runs under `mpirun -n R` (CTest label "distributed", RIFTCO_TRANSFORMER_ENABLE_MPI=ON):
//
//   mpi_ranks parity   K Adam steps of data parallelism on a global batch G equal K steps of
//                      one process on the whole of G (each rank also trains that one-process
//                      twin itself): losses and parameters within 1e-6 relative (‖Δ‖/‖p‖ per
//                      tensor; the key biases, whose true gradient is zero, are shown to get
//                      only rounding noise and are left out), and every
//                      rank's parameters hash the same after every step. Rank 1's initial
//                      weights are deliberately different: synchronize_parameters must
//                      replace them with rank 0's.
//   mpi_ranks parity overlapped
//                      the same, with the reduction overlapped with backward
//                      (DataParallel::backward_and_reduce); a third model on every rank runs
//                      the blocking reduction, and the two must stay equal bit for bit.
//   mpi_ranks parity zero
//                      overlapped and ZeRO-1 (ZeroRedundancyAdam, gradient clipping active):
//                      the same parity; each rank holds <= 0.55x (2 ranks) of the unsharded
//                      moment bytes; the gathered logical state equals the one-process
//                      optimizer's, and loaded into an unsharded Adam it continues the run
//                      like the one-process twin (a checkpoint moving between the two).
//   mpi_ranks mismatch rank 1 builds a model of another shape: every rank must report the
//                      layout mismatch as a DistributedError (and exit 0 having seen it).
//
// Prints "rank r: ok" per rank; any failure prints the reason and exits 1.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/distributed/zero_redundancy_adam.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"

using namespace riftco_transformer;

namespace {

TransformerDimensions dimensions() {
    return {.vocabulary_size = 29,
            .maximum_context = 8,
            .model_width = 16,
            .head_count = 2,
            .block_count = 2,
            .feed_forward_width = 32};
}

int failures = 0;

void expect(bool condition, int rank, const std::string& what) {
    if (!condition) {
        std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
        ++failures;
    }
}

// ‖a − b‖ / ‖b‖ over one tensor (elementwise ratios are meaningless for values near zero).
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double difference = 0.0;
    double norm = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        difference += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
        norm += double{b[i]} * b[i];
    }
    return norm == 0.0 ? std::sqrt(difference) : std::sqrt(difference / norm);
}

enum class Mode { Blocking, Overlapped, Zero };

NamedParameter model_parameter(const DecoderOnlyTransformer& model, const std::string& name) {
    for (const NamedParameter& named : model.parameters()) {
        if (named.name == name)
            return named;
    }
    throw std::invalid_argument("no parameter " + name);
}

bool bit_equal(const ParameterList& a, const ParameterList& b) {
    for (std::size_t i = 0; i < a.size(); ++i) {
        const std::vector<float> x = a[i].parameter.value().to_host();
        const std::vector<float> y = b[i].parameter.value().to_host();
        if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0)
            return false;
    }
    return true;
}

int parity(ProcessGroup& group, Mode mode) {
    const int rank = group.rank();
    const TransformerDimensions d = dimensions();
    const std::size_t global_rows = 4 * static_cast<std::size_t>(group.world_size());
    const std::size_t time = d.maximum_context;
    std::mt19937 generator(rank == 1 ? 999 : 7);  // rank 1 starts wrong on purpose
    DecoderOnlyTransformer model(d, generator);
    std::mt19937 twin_generator(7);
    DecoderOnlyTransformer twin(d, twin_generator);  // one process, whole batch
    DataParallel parallel(group, 1024);              // small buckets: many collectives per step
    parallel.synchronize_parameters(model.parameters());
    expect(DataParallel::parameter_hash(model.parameters()) ==
               DataParallel::parameter_hash(twin.parameters()),
           rank, "parameters after synchronize_parameters equal rank 0's initial ones");
    // The blocking reduction's model, beside the overlapped one (Mode::Overlapped).
    std::mt19937 blocking_generator(7);
    DecoderOnlyTransformer blocking(d, blocking_generator);
    AdamOptions options;
    options.learning_rate = 3e-3F;
    if (mode == Mode::Zero)
        options.maximum_gradient_norm = 0.5;  // clipping on: the global norm across shards
    std::optional<Adam> adam;
    std::optional<ZeroRedundancyAdam> zero;
    if (mode == Mode::Zero)
        zero.emplace(parallel, model.parameters(), options);
    else
        adam.emplace(model.parameters(), options);
    Adam blocking_adam(blocking.parameters(), options);
    Adam twin_adam(twin.parameters(), options);
    if (zero) {
        const double share = static_cast<double>(zero->owned_state_bytes()) /
                             static_cast<double>(zero->unsharded_state_bytes());
        std::printf("rank %d: ZeRO-1 holds %zu of %zu moment bytes (%.3f)\n", rank,
                    zero->owned_state_bytes(), zero->unsharded_state_bytes(), share);
        if (group.world_size() == 2)
            expect(share <= 0.55, rank, "ZeRO-1 share " + std::to_string(share) + " > 0.55");
    }
    const auto [begin, end] = parallel.shard(global_rows);
    std::mt19937 data(11);
    for (int step = 0; step < 5; ++step) {
        std::vector<std::uint32_t> inputs(global_rows * time);
        std::vector<std::uint32_t> targets(global_rows * time);
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            inputs[i] = static_cast<std::uint32_t>(data() % d.vocabulary_size);
            targets[i] = static_cast<std::uint32_t>(data() % d.vocabulary_size);
        }
        const std::vector<std::uint32_t> local_inputs(inputs.begin() + begin * time,
                                                      inputs.begin() + end * time);
        const std::vector<std::uint32_t> local_targets(targets.begin() + begin * time,
                                                       targets.begin() + end * time);
        Variable loss =
            cross_entropy(model.forward(local_inputs, {end - begin, time}), local_targets);
        double global_loss = loss.value().item() * static_cast<double>(local_targets.size());
        const auto weight = static_cast<double>(local_targets.size());
        if (mode == Mode::Blocking) {
            loss.backward();
            parallel.reduce_gradients(model.parameters(), weight);
        } else {
            parallel.backward_and_reduce(loss, model.parameters(), weight);
        }
        group.allreduce_sum(std::span<double>(&global_loss, 1));
        global_loss /= static_cast<double>(targets.size());
        if (zero)
            static_cast<void>(zero->step());
        else
            static_cast<void>(adam->step());
        if (mode == Mode::Overlapped) {
            Variable blocking_loss =
                cross_entropy(blocking.forward(local_inputs, {end - begin, time}), local_targets);
            blocking_loss.backward();
            parallel.reduce_gradients(blocking.parameters(), weight);
            static_cast<void>(blocking_adam.step());
            expect(bit_equal(model.parameters(), blocking.parameters()), rank,
                   "step " + std::to_string(step) +
                       ": the overlapped reduction differs from the blocking one");
        }

        Variable twin_loss = cross_entropy(twin.forward(inputs, {global_rows, time}), targets);
        const double expected_loss = twin_loss.value().item();
        twin_loss.backward();
        // The key biases' true gradient is identically zero (q·b_k shifts every score of a
        // query row alike, and softmax ignores such shifts): what backward computes for them is
        // rounding noise, which Adam's m/√v normalises into ±lr steps that differ between any
        // two summation orders. They are checked to be noise here and left out of the
        // parameter comparison below.
        for (const NamedParameter& named : twin.parameters()) {
            if (named.name.find("attention.key.bias") == std::string::npos)
                continue;
            double noise = 0.0;
            for (const float g : named.parameter.gradient().to_host())
                noise = std::max(noise, std::fabs(double{g}));
            expect(noise < 1e-6, rank,
                   named.name + " gradient " + std::to_string(noise) + " is not rounding noise");
        }
        static_cast<void>(twin_adam.step());

        expect(std::fabs(global_loss - expected_loss) <= 1e-6 * std::fabs(expected_loss), rank,
               "step " + std::to_string(step) + " loss " + std::to_string(global_loss) +
                   " vs one process " + std::to_string(expected_loss));
        const std::vector<std::uint64_t> hashes =
            group.allgather(DataParallel::parameter_hash(model.parameters()));
        for (const std::uint64_t hash : hashes)
            expect(hash == hashes[0], rank, "replicas differ after step " + std::to_string(step));
    }
    if (zero) {
        // The logical state equals the one-process optimizer's (moments within rounding), and
        // an unsharded Adam loaded with it continues exactly like that optimizer would.
        const AdamState gathered = zero->state();
        const AdamState expected = twin_adam.state();
        expect(gathered.step_count == expected.step_count, rank, "ZeRO-1 state step count");
        expect(relative_difference(gathered.first_moments, expected.first_moments) <= 1e-5 &&
                   relative_difference(gathered.second_moments, expected.second_moments) <= 1e-5,
               rank, "ZeRO-1 gathered moments differ from one process");
        std::mt19937 moved_generator(3);
        DecoderOnlyTransformer moved(d, moved_generator);
        Adam unsharded(moved.parameters(), options);
        unsharded.load_state(gathered);
        expect(bit_equal(moved.parameters(), model.parameters()), rank,
               "the loaded values equal the sharded run's");
        // Back into a sharded optimizer on a fresh model: the same values and state.
        std::mt19937 back_generator(5);
        DecoderOnlyTransformer back(d, back_generator);
        ZeroRedundancyAdam resharded(parallel, back.parameters(), options);
        resharded.load_state(unsharded.state());
        const AdamState round_trip = resharded.state();
        expect(round_trip.first_moments == gathered.first_moments &&
                   round_trip.second_moments == gathered.second_moments &&
                   round_trip.parameter_values == gathered.parameter_values,
               rank, "sharded -> unsharded -> sharded state round trip");
        // Fewer parameters than ranks: the ranks that own nothing still take part, count the
        // steps and gather the values (one parameter: every rank but one owns nothing).
        std::mt19937 lone_generator(13);
        DecoderOnlyTransformer lone_model(d, lone_generator);
        std::mt19937 lone_twin_generator(13);
        DecoderOnlyTransformer lone_twin(d, lone_twin_generator);
        const ParameterList lone = {model_parameter(lone_model, "final_norm.scale")};
        const ParameterList lone_reference = {model_parameter(lone_twin, "final_norm.scale")};
        ZeroRedundancyAdam lone_zero(parallel, lone, options);
        Adam lone_adam(lone_reference, options);
        for (int lone_step = 0; lone_step < 2; ++lone_step) {
            const std::vector<std::uint32_t> ids(2 * time, 3);
            cross_entropy(lone_model.forward(ids, {2, time}), ids).backward();
            cross_entropy(lone_twin.forward(ids, {2, time}), ids).backward();
            const AdamStepStats sharded_stats = lone_zero.step();
            const AdamStepStats plain_stats = lone_adam.step();
            expect(sharded_stats.step == plain_stats.step &&
                       sharded_stats.gradient_norm == plain_stats.gradient_norm,
                   rank, "a rank owning nothing reports the step and the global norm");
        }
        expect(bit_equal(lone, lone_reference), rank,
               "a one-parameter ZeRO-1 run equals Adam on every rank");
        expect(lone_zero.state().step_count == 2 && (rank == 0) == (lone_zero.shard() != nullptr),
               rank, "only rank 0 owns the one parameter; every rank counts 2 steps");
        // A NaN in the last rank's shard fails the step on every rank: that rank names the
        // parameter, the others say another shard failed, and nothing changes anywhere.
        const std::vector<std::uint32_t> tokens(8 * time, 1);
        cross_entropy(model.forward(tokens, {8, time}), tokens).backward();
        std::size_t poisoned = 0;
        while (zero->owner(poisoned) != group.world_size() - 1)
            ++poisoned;
        Variable target = model.parameters()[poisoned].parameter;
        std::vector<float> values = target.gradient().to_host();
        values[0] = NAN;
        target.set_gradient(Tensor(target.shape(), values));
        const std::uint64_t before = DataParallel::parameter_hash(model.parameters());
        const std::uint64_t steps = zero->step_count();
        std::string message;
        try {
            static_cast<void>(zero->step());
        } catch (const std::domain_error& error) {
            message = error.what();
        }
        const bool owner = rank == group.world_size() - 1;
        expect(message.find(owner ? model.parameters()[poisoned].name : "another shard") !=
                   std::string::npos,
               rank, "a NaN gradient in a shard: got '" + message + "'");
        expect(DataParallel::parameter_hash(model.parameters()) == before &&
                   zero->step_count() == steps,
               rank, "a failed sharded step changed something");
    }
    const ParameterList ours = model.parameters();
    const ParameterList theirs = twin.parameters();
    double worst = 0.0;
    for (std::size_t i = 0; i < ours.size(); ++i) {
        if (ours[i].name.find("attention.key.bias") != std::string::npos)
            continue;  // zero true gradient: see above
        const double difference = relative_difference(ours[i].parameter.value().to_host(),
                                                      theirs[i].parameter.value().to_host());
        if (difference > 1e-6 && rank == 0)
            std::printf("  %s: %.3g\n", ours[i].name.c_str(), difference);
        worst = std::max(worst, difference);
    }
    expect(worst <= 1e-6, rank,
           "parameters vs one process: worst relative " + std::to_string(worst));
    std::printf(
        "rank %d: parity worst relative parameter difference %.3g, %llu bytes in %.3f s "
        "of collectives\n",
        rank, worst, static_cast<unsigned long long>(parallel.communicated_bytes()),
        parallel.communication_seconds());
    return failures == 0 ? 0 : 1;
}

int mismatch(ProcessGroup& group) {
    TransformerDimensions d = dimensions();
    if (group.rank() == 1)
        d.block_count = 1;
    std::mt19937 generator(7);
    DecoderOnlyTransformer model(d, generator);
    DataParallel parallel(group);
    try {
        parallel.synchronize_parameters(model.parameters());
    } catch (const DistributedError& error) {
        std::printf("rank %d: mismatch reported: %s\n", group.rank(), error.what());
        return 0;
    }
    expect(false, group.rank(), "a layout mismatch went unnoticed");
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || argc > 3) {
        std::fprintf(stderr, "usage: mpi_ranks parity [overlapped|zero] | mismatch\n");
        return 2;
    }
    const std::string mode = argv[1];
    const std::string variant = argc == 3 ? argv[2] : "blocking";
    const Mode reduction = variant == "zero"         ? Mode::Zero
                           : variant == "overlapped" ? Mode::Overlapped
                                                     : Mode::Blocking;
    try {
        ProcessGroupOptions options;
        options.timeout = std::chrono::seconds(60);
        const auto group = create_process_group(options);
        const int status = mode == "parity" ? parity(*group, reduction) : mismatch(*group);
        if (status == 0)
            std::printf("rank %d: ok\n", group->rank());
        return status;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "mpi_ranks: %s\n", error.what());
        return 1;
    }
}
