#pragma once
// Process groups and data-parallel training (built on MPI; RIFTCO_TRANSFORMER_ENABLE_MPI=ON).
//
// A ProcessGroup is the world of ranks an `mpirun -n R` (or mpiexec) launch started: rank,
// world size, barrier, broadcast and sum-allreduce over host buffers, run as MPI's own
// blocking collectives. Every collective has a deadline (the group's timeout), kept by a
// watchdog thread: a collective that has not returned in time (a peer died, stopped, or runs
// a different program) makes the rank print which collective timed out and exit with status
// 3, and the launcher then ends every other rank, so no rank is left hanging. An MPI error
// code is a DistributedError; the group is then broken (further collectives throw at once)
// and the process ends the MPI job with MPI_Abort at exit instead of waiting in MPI_Finalize.
//
// Without MPI compiled in, distributed_compiled_in() is false and create_process_group()
// throws DistributedError saying so; the single-process group (world size 1, collectives are
// identities) works everywhere, so one code path serves R = 1 and R > 1.
//
// DataParallel keeps replicas identical: synchronize_parameters() checks that every rank has
// the same parameter names and shapes (a mismatch is a DistributedError on every rank, listing
// the first difference) and broadcasts rank 0's values; reduce_gradients() replaces each
// gradient g_r by Σ_r w_r·g_r / Σ_r w_r, reduced in buckets of at most `bucket_bytes`, where
// w_r is the rank's share of the global batch (its target count), so the result is the
// gradient of the global batch's mean loss and the gradient norm, clipping and Adam step that
// follow are the same on every rank.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer {

class DistributedError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Whether this build links MPI.
[[nodiscard]] bool distributed_compiled_in() noexcept;

struct ProcessGroupOptions {
    std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // per collective, > 0
};

class ProcessGroup {
  public:
    virtual ~ProcessGroup() = default;
    [[nodiscard]] virtual int rank() const noexcept = 0;
    [[nodiscard]] virtual int world_size() const noexcept = 0;
    [[nodiscard]] virtual std::chrono::milliseconds timeout() const noexcept = 0;

    virtual void barrier() = 0;
    // root's values into every rank's buffer (same length on every rank).
    virtual void broadcast(std::span<float> values, int root) = 0;
    virtual void broadcast(std::span<std::uint8_t> bytes, int root) = 0;
    // In place: every rank ends with the elementwise sum over ranks (same length everywhere).
    virtual void allreduce_sum(std::span<float> values) = 0;
    virtual void allreduce_sum(std::span<double> values) = 0;
    // Every rank's value, in rank order.
    [[nodiscard]] virtual std::vector<std::uint64_t> allgather(std::uint64_t value) = 0;
};

// The world of the current launch (MPI initialised on first use, thread level SERIALIZED).
// DistributedError: MPI not compiled in, or initialisation failed. std::invalid_argument: a
// timeout <= 0.
[[nodiscard]] std::unique_ptr<ProcessGroup> create_process_group(
    const ProcessGroupOptions& options = {});
// World size 1: rank 0, every collective an identity. Available in every build.
[[nodiscard]] std::unique_ptr<ProcessGroup> create_single_process_group();

class DataParallel {
  public:
    static constexpr std::size_t default_bucket_bytes = std::size_t{16} << 20;

    // std::invalid_argument: bucket_bytes < 4.
    explicit DataParallel(ProcessGroup& group, std::size_t bucket_bytes = default_bucket_bytes);

    [[nodiscard]] ProcessGroup& group() const noexcept { return group_; }
    [[nodiscard]] std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }

    // Layout check, then rank 0's values on every rank.
    void synchronize_parameters(const ParameterList& parameters);
    // DistributedError on every rank when the ranks' names or shapes differ.
    void check_layout(const ParameterList& parameters);
    // The weighted gradient average above (a parameter without a gradient counts as zeros).
    // std::invalid_argument: local_weight < 0 or not finite; DistributedError: the weights sum
    // to 0. Returns Σ_r w_r.
    double reduce_gradients(const ParameterList& parameters, double local_weight);
    // Rows [begin, end) of a global batch of `global_rows` that this rank trains on: equal,
    // contiguous shards in rank order. std::invalid_argument: global_rows not a multiple of
    // the world size.
    [[nodiscard]] std::pair<std::size_t, std::size_t> shard(std::size_t global_rows) const;
    // A 64-bit FNV-1a hash of every parameter's values, for replica checks.
    [[nodiscard]] static std::uint64_t parameter_hash(const ParameterList& parameters);

    // Host bytes this object moved through collectives so far (both directions counted once).
    [[nodiscard]] std::uint64_t communicated_bytes() const noexcept { return communicated_; }
    [[nodiscard]] double communication_seconds() const noexcept { return seconds_; }

  private:
    ProcessGroup& group_;
    std::size_t bucket_bytes_;
    std::uint64_t communicated_ = 0;
    double seconds_ = 0.0;
};

}  // namespace riftco_transformer
