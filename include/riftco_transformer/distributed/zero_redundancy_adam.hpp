#pragma once
// ZeRO-1: Adam with its moments sharded over the ranks of a data-parallel group.
//
// Every rank holds the whole model and, after DataParallel's gradient average, the whole
// averaged gradient; but rank r keeps the first and second moments of only its own share of
// the parameters, and updates only those. A step is:
//   1. each rank's sum of squares over its shard's gradients, merged over the ranks in rank
//      order: the global ‖g‖ and one clip factor, the same on every rank;
//   2. each rank checks its shard's candidate θ', m', v' (optim/adam.hpp), and nothing is
//      written anywhere unless every rank's check passed;
//   3. each rank writes its shard, then each parameter's owner broadcasts its new value to
//      the other ranks (into their values' own memory on the CPU), so the replicas stay
//      identical.
// The update is Adam's (optim/adam.hpp) on every scalar; only the clip factor's summation
// order differs from one process (within rounding).
//
// Partition: whole parameters, largest first, each to the rank holding the fewest values so
// far (ties to the lower rank), as PyTorch's ZeroRedundancyOptimizer; every rank computes the
// same assignment. A rank may own nothing (more ranks than parameters); it still takes part.
//
// State: state() and load_state() speak Adam's logical state (optim/adam_state.hpp) of the
// whole parameter list, so a checkpoint moves between world sizes, and between sharded and
// unsharded optimizers, unchanged. Both are collective.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace riftco_transformer {

class ZeroRedundancyAdam {
  public:
    // Collective (checks that every rank passes the same names and shapes). Errors:
    // std::invalid_argument: an empty list, an empty Variable, a non-leaf or a frozen parameter
    // (on every rank alike), and Adam's own construction errors for this rank's share;
    // DistributedError: the ranks' lists differ.
    ZeroRedundancyAdam(DataParallel& parallel, ParameterList parameters, AdamOptions options = {});

    // One step of the whole model (collective; call after the gradient average). Errors as
    // Adam::step, on every rank, with nothing changed anywhere.
    AdamStepStats step();

    // The whole list's logical state (collective): every rank gets all of it.
    [[nodiscard]] AdamState state();
    // Restores a whole-list state (every rank passes the same one; collective only in that
    // the ranks must agree): each rank keeps its share of the moments, and every value is
    // written. std::invalid_argument: a vector whose size is not the list's scalar count, a
    // NaN/±inf element or a negative second moment (checked over the whole state on every
    // rank before anything is written), and Adam::load_state's errors.
    void load_state(const AdamState& state);

    [[nodiscard]] const ParameterList& parameters() const noexcept { return parameters_; }
    // The Adam over this rank's share (null when it owns nothing).
    [[nodiscard]] const Adam* shard() const noexcept { return adam_ ? &*adam_ : nullptr; }
    [[nodiscard]] ExecutionBackend backend() const {
        return parameters_.front().parameter.backend();
    }
    // Clears every parameter's gradient.
    void zero_gradients();
    [[nodiscard]] const AdamOptions& options() const noexcept { return options_; }
    // The rank that updates parameters()[index].
    [[nodiscard]] int owner(std::size_t index) const { return owners_.at(index); }
    [[nodiscard]] std::uint64_t step_count() const noexcept;
    [[nodiscard]] double learning_rate() const;
    // N, the scalars of the whole list.
    [[nodiscard]] std::size_t state_value_count() const noexcept { return value_count_; }
    // The moment bytes this rank holds, and what an unsharded Adam would hold (2·N·4).
    [[nodiscard]] std::size_t owned_state_bytes() const noexcept;
    [[nodiscard]] std::size_t unsharded_state_bytes() const noexcept {
        return 2 * value_count_ * sizeof(float);
    }

  private:
    // Gathers every rank's `mine` (its owned parameters' values, in list order) into list
    // order.
    [[nodiscard]] std::vector<float> gather(const std::vector<float>& mine);
    // The values of the parameters this rank does not own, from a whole list's (load_state).
    void write_unowned_values(const std::vector<float>& values);
    // After a step: each parameter's owner broadcasts its new value to the other ranks.
    void share_updated_values();

    DataParallel& parallel_;
    ParameterList parameters_;
    AdamOptions options_;
    std::vector<int> owners_;               // per parameter
    std::vector<std::size_t> offsets_;      // each parameter's first scalar in list order
    std::vector<std::size_t> rank_counts_;  // scalars owned per rank
    std::size_t value_count_ = 0;
    std::optional<Adam> adam_;  // over this rank's share; none when it owns nothing
    // The step count and beta powers of a rank that owns nothing.
    std::uint64_t idle_step_count_ = 0;
};

}  // namespace riftco_transformer
