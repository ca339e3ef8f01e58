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
// follow are the same on every rank. backward_and_reduce() computes the same average while
// backward runs (DDP's overlap); ZeroRedundancyAdam (zero_redundancy_adam.hpp) shards the
// optimizer state over the ranks (ZeRO-1).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
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

// A non-blocking collective in flight (ProcessGroup::start_allreduce_sum). Its buffer must
// stay alive and untouched until it finished. Destroying one that has not finished waits for
// it (the other ranks take part in it too); errors there are dropped.
class PendingCollective {
  public:
    virtual ~PendingCollective() = default;
    // Whether it has finished; drives its progress and never blocks. DistributedError: MPI
    // reported an error.
    [[nodiscard]] virtual bool test() = 0;
    // Blocks until it has finished, under the group's deadline. DistributedError as test().
    virtual void wait() = 0;
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
    // Every rank's `mine`, concatenated in rank order into `all`: counts[r] values from rank r
    // (counts has one entry per rank, the same everywhere; mine.size() == counts[rank()] and
    // all.size() == Σ counts, else std::invalid_argument).
    virtual void allgather(std::span<const float> mine, std::span<float> all,
                           std::span<const std::size_t> counts) = 0;
    // Starts the in-place sum of allreduce_sum without waiting for it (MPI_Iallreduce): every
    // rank must start the same non-blocking collectives in the same order.
    [[nodiscard]] virtual std::unique_ptr<PendingCollective> start_allreduce_sum(
        std::span<float> values) = 0;
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
    // From the next reduction on (std::invalid_argument: < 4; nothing changed).
    void set_bucket_bytes(std::size_t bucket_bytes);

    // Layout check, then rank 0's values on every rank.
    void synchronize_parameters(const ParameterList& parameters);
    // DistributedError on every rank when the ranks' names or shapes differ.
    void check_layout(const ParameterList& parameters);

    // The weighted gradient average above, after backward (a parameter without a gradient
    // counts as zeros). Buckets: the trainable parameters in reverse list order (roughly the
    // order backward finishes them), packed into buckets of at most bucket_bytes, a parameter
    // larger than a bucket split over several; each bucket is scaled by w_r/Σw and summed
    // over the ranks with one non-blocking allreduce (several in flight at once).
    // std::invalid_argument: local_weight < 0 or not finite; DistributedError: the weights sum
    // to 0. Returns Σ_r w_r.
    double reduce_gradients(const ParameterList& parameters, double local_weight);
    // The same reduction overlapped with backward, with the same buckets and collectives, so
    // the result is bit-identical to loss.backward(options) then reduce_gradients(): runs the
    // backward of the scalar `loss` (seed `seed_scale`) with a gradient-ready hook
    // (core/autograd/variable.hpp) that copies each gradient into its bucket as soon as it is
    // final and starts the bucket's allreduce once every member is in (buckets start in order,
    // the same order on every rank), so communication proceeds while backward computes the
    // rest; then it waits for every bucket and writes the averages back. `options` are
    // backward's (accumulate: the averaged gradient is the accumulated one); a hook already in
    // them runs first. The weights are summed before backward starts. Errors as
    // reduce_gradients and Variable::backward; a failure inside backward publishes nothing
    // (the buckets already started still complete, so the ranks stay in step).
    double backward_and_reduce(const Variable& loss, const ParameterList& parameters,
                               double local_weight, BackwardOptions options = {},
                               float seed_scale = 1.0F);

    // Rows [begin, end) of a global batch of `global_rows` that this rank trains on: equal,
    // contiguous shards in rank order. std::invalid_argument: global_rows not a multiple of
    // the world size.
    [[nodiscard]] std::pair<std::size_t, std::size_t> shard(std::size_t global_rows) const;
    // A 64-bit FNV-1a hash of every parameter's values, for replica checks.
    [[nodiscard]] static std::uint64_t parameter_hash(const ParameterList& parameters);

    // Host bytes this object moved through collectives so far (both directions counted once).
    [[nodiscard]] std::uint64_t communicated_bytes() const noexcept { return communicated_; }
    // Seconds this rank spent inside collectives (blocked, or starting and testing
    // non-blocking ones): the time communication added to the step, not the time it took
    // while backward ran.
    [[nodiscard]] double communication_seconds() const noexcept { return seconds_; }
    // Accounting for collectives run by others on this group (the sharded optimizer).
    void add_communication(std::uint64_t bytes, double seconds) noexcept {
        communicated_ += bytes;
        seconds_ += seconds;
    }

  private:
    class Reduction;
    double summed_weight(double local_weight, const char* operation);

    ProcessGroup& group_;
    std::size_t bucket_bytes_;
    std::vector<std::vector<float>> buffers_;  // the buckets' host memory, kept between steps
    std::uint64_t communicated_ = 0;
    double seconds_ = 0.0;
};

}  // namespace riftco_transformer
