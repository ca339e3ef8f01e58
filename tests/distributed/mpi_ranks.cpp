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
//   mpi_ranks mismatch rank 1 builds a model of another shape: every rank must report the
//                      layout mismatch as a DistributedError (and exit 0 having seen it).
//
// Prints "rank r: ok" per rank; any failure prints the reason and exits 1.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
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

int parity(ProcessGroup& group) {
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
    AdamOptions options;
    options.learning_rate = 3e-3F;
    Adam adam(model.parameters(), options);
    Adam twin_adam(twin.parameters(), options);
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
        loss.backward();
        parallel.reduce_gradients(model.parameters(), static_cast<double>(local_targets.size()));
        group.allreduce_sum(std::span<double>(&global_loss, 1));
        global_loss /= static_cast<double>(targets.size());
        static_cast<void>(adam.step());

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
    if (argc != 2) {
        std::fprintf(stderr, "usage: mpi_ranks parity|mismatch\n");
        return 2;
    }
    const std::string mode = argv[1];
    try {
        ProcessGroupOptions options;
        options.timeout = std::chrono::seconds(60);
        const auto group = create_process_group(options);
        const int status = mode == "parity" ? parity(*group) : mismatch(*group);
        if (status == 0)
            std::printf("rank %d: ok\n", group->rank());
        return status;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "mpi_ranks: %s\n", error.what());
        return 1;
    }
}
