// ZeRO-1 (distributed/zero_redundancy_adam.hpp): the partition, the sharded step and the
// logical state of the whole list.

#include "riftco_transformer/distributed/zero_redundancy_adam.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/backend/cpu/cpu_storage.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
#include "riftco_transformer/optim/learning_rate_schedule.hpp"

namespace riftco_transformer {

namespace {

// The collective half of a sharded step, over the data-parallel group.
class GroupPeers final : public AdamShardPeers {
  public:
    explicit GroupPeers(DataParallel& parallel) : parallel_(parallel) {}

    [[nodiscard]] tensor_ops::ScaledSumOfSquares merge(const tensor_ops::ScaledSumOfSquares& mine,
                                                       bool mine_non_finite,
                                                       bool& any_non_finite) override {
        const auto start = std::chrono::steady_clock::now();
        ProcessGroup& group = parallel_.group();
        const std::vector<std::uint64_t> scales =
            group.allgather(std::bit_cast<std::uint64_t>(mine.scale));
        const std::vector<std::uint64_t> sums =
            group.allgather(std::bit_cast<std::uint64_t>(mine.scaled_squares));
        const std::vector<std::uint64_t> bad = group.allgather(mine_non_finite ? 1U : 0U);
        tensor_ops::ScaledSumOfSquares merged;
        any_non_finite = false;
        for (std::size_t r = 0; r < scales.size(); ++r) {  // rank order: the same everywhere
            merged.merge({std::bit_cast<double>(scales[r]), std::bit_cast<double>(sums[r])});
            any_non_finite = any_non_finite || bad[r] != 0;
        }
        account(start, 3 * scales.size() * sizeof(std::uint64_t));
        return merged;
    }

    [[nodiscard]] bool all_passed(bool mine) override {
        const auto start = std::chrono::steady_clock::now();
        const std::vector<std::uint64_t> passed = parallel_.group().allgather(mine ? 1U : 0U);
        account(start, passed.size() * sizeof(std::uint64_t));
        return std::all_of(passed.begin(), passed.end(), [](std::uint64_t p) { return p != 0; });
    }

  private:
    void account(std::chrono::steady_clock::time_point start, std::size_t bytes) {
        parallel_.add_communication(
            bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    DataParallel& parallel_;
};

void require_trainable_leaves(const ParameterList& parameters) {
    if (parameters.empty())
        throw std::invalid_argument("ZeroRedundancyAdam: the parameter list is empty");
    for (const NamedParameter& entry : parameters) {
        if (!entry.parameter.defined()) {
            throw std::invalid_argument("ZeroRedundancyAdam: parameter '" + entry.name +
                                        "' is an empty Variable");
        }
        if (!entry.parameter.is_leaf() || !entry.parameter.requires_gradient()) {
            throw std::invalid_argument("ZeroRedundancyAdam: parameter '" + entry.name +
                                        "' is not a trainable leaf (pass only trainable ones)");
        }
    }
}

void require_finite(const std::vector<float>& values, const char* what) {
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (!std::isfinite(values[i])) {
            throw std::invalid_argument(std::string("ZeroRedundancyAdam::load_state: ") + what +
                                        " element " + std::to_string(i) + " is not finite");
        }
    }
}

}  // namespace

ZeroRedundancyAdam::ZeroRedundancyAdam(DataParallel& parallel, ParameterList parameters,
                                       AdamOptions options)
    : parallel_(parallel), parameters_(std::move(parameters)), options_(options) {
    require_trainable_leaves(parameters_);
    parallel_.check_layout(parameters_);
    const auto world = static_cast<std::size_t>(parallel_.group().world_size());
    const int rank = parallel_.group().rank();
    offsets_.resize(parameters_.size());
    std::vector<std::size_t> sizes(parameters_.size());
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        offsets_[i] = value_count_;
        sizes[i] = parameters_[i].parameter.value().numel();
        value_count_ += sizes[i];
    }
    // Largest first (stable: list order among equals), each to the least-loaded rank.
    std::vector<std::size_t> order(parameters_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
    owners_.assign(parameters_.size(), 0);
    rank_counts_.assign(world, 0);
    for (const std::size_t index : order) {
        const auto least = static_cast<std::size_t>(
            std::min_element(rank_counts_.begin(), rank_counts_.end()) - rank_counts_.begin());
        owners_[index] = static_cast<int>(least);
        rank_counts_[least] += sizes[index];
    }
    ParameterList mine;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        if (owners_[i] == rank)
            mine.push_back(parameters_[i]);
    }
    if (!mine.empty())
        adam_.emplace(std::move(mine), options_);
    else
        validate_adam_options(options_);
}

std::uint64_t ZeroRedundancyAdam::step_count() const noexcept {
    return adam_ ? adam_->step_count() : idle_step_count_;
}

double ZeroRedundancyAdam::learning_rate() const {
    if (adam_)
        return adam_->learning_rate();
    const std::uint64_t next = idle_step_count_ == std::numeric_limits<std::uint64_t>::max()
                                   ? idle_step_count_
                                   : idle_step_count_ + 1;
    return scheduled_learning_rate(options_.learning_rate, options_.schedule, next);
}

void ZeroRedundancyAdam::zero_gradients() {
    for (NamedParameter& entry : parameters_)
        entry.parameter.zero_gradient();
}

std::size_t ZeroRedundancyAdam::owned_state_bytes() const noexcept {
    return adam_ ? adam_->state_payload_bytes() : 0;
}

AdamStepStats ZeroRedundancyAdam::step() {
    GroupPeers peers(parallel_);
    AdamStepStats stats;
    if (adam_) {
        stats = adam_->step(peers);
    } else {
        // Nothing to update here: take part in both agreements, then advance the count.
        if (idle_step_count_ == std::numeric_limits<std::uint64_t>::max()) {
            throw std::overflow_error("ZeroRedundancyAdam::step: the step count cannot advance");
        }
        bool any_bad = false;
        const tensor_ops::ScaledSumOfSquares squares = peers.merge({}, false, any_bad);
        if (any_bad) {
            throw std::domain_error(
                "Adam::step: another shard has a NaN/inf gradient; nothing was changed");
        }
        if (!peers.all_passed(true)) {
            throw std::overflow_error(
                "Adam::step: another shard's check failed (a non-finite value or update); "
                "nothing was changed");
        }
        stats.step = ++idle_step_count_;
        stats.gradient_norm = squares.norm();
        stats.clip_scale =
            tensor_ops::clip_scale_for(stats.gradient_norm, options_.maximum_gradient_norm);
        stats.learning_rate =
            scheduled_learning_rate(options_.learning_rate, options_.schedule, stats.step);
    }
    share_updated_values();
    return stats;
}

void ZeroRedundancyAdam::share_updated_values() {
    const auto start = std::chrono::steady_clock::now();
    ProcessGroup& group = parallel_.group();
    const int rank = group.rank();
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const Variable& parameter = parameters_[i].parameter;
        const LeafView leaf = leaf_view(parameter, "ZeroRedundancyAdam");
        const bool owned = owners_[i] == rank;
        if (leaf.value.backend() == ExecutionBackend::Cpu) {
            // In the value's own memory: the owner sends it, the others receive into theirs
            // (storage made unique first, so no copy of the old value changes).
            float* values = detail::cpu_values_for_write(leaf.value);
            group.broadcast(std::span<float>(values, leaf.value.numel()), owners_[i]);
            if (!owned)
                mark_leaf_updated(parameter);  // a new version, no gradient: as Adam's update
        } else {
            std::vector<float> values =
                owned ? leaf.value.to_host() : std::vector<float>(leaf.value.numel());
            group.broadcast(std::span<float>(values), owners_[i]);
            if (!owned) {
                Variable target = parameter;
                target.set_value(Tensor(leaf.value.shape(), values, leaf.value.backend()));
            }
        }
    }
    parallel_.add_communication(
        value_count_ * sizeof(float),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

std::vector<float> ZeroRedundancyAdam::gather(const std::vector<float>& mine) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> ranked(value_count_);
    parallel_.group().allgather(std::span<const float>(mine), std::span<float>(ranked),
                                std::span<const std::size_t>(rank_counts_));
    // Rank order → list order: rank r's segment holds its parameters in list order.
    std::vector<std::size_t> cursor(rank_counts_.size(), 0);
    for (std::size_t r = 1; r < cursor.size(); ++r)
        cursor[r] = cursor[r - 1] + rank_counts_[r - 1];
    std::vector<float> listed(value_count_);
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const auto owner = static_cast<std::size_t>(owners_[i]);
        const std::size_t count = parameters_[i].parameter.value().numel();
        std::copy_n(ranked.begin() + static_cast<std::ptrdiff_t>(cursor[owner]), count,
                    listed.begin() + static_cast<std::ptrdiff_t>(offsets_[i]));
        cursor[owner] += count;
    }
    parallel_.add_communication(
        value_count_ * sizeof(float),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return listed;
}

void ZeroRedundancyAdam::write_unowned_values(const std::vector<float>& values) {
    const int rank = parallel_.group().rank();
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        if (owners_[i] == rank)
            continue;  // Adam wrote it
        // A new tensor: writing into the current value would clone its shared storage first.
        Variable parameter = parameters_[i].parameter;
        const Tensor& current = parameter.value();
        parameter.set_value(Tensor(
            current.shape(), std::span<const float>(values.data() + offsets_[i], current.numel()),
            current.backend()));
    }
}

AdamState ZeroRedundancyAdam::state() {
    AdamState whole;
    std::vector<float> first;
    std::vector<float> second;
    if (adam_) {
        AdamState mine = adam_->state();
        whole.step_count = mine.step_count;
        whole.beta1_power = mine.beta1_power;
        whole.beta2_power = mine.beta2_power;
        first = std::move(mine.first_moments);
        second = std::move(mine.second_moments);
    } else {
        whole.step_count = idle_step_count_;
        whole.beta1_power = std::pow(options_.beta1, static_cast<double>(idle_step_count_));
        whole.beta2_power = std::pow(options_.beta2, static_cast<double>(idle_step_count_));
    }
    whole.first_moments = gather(first);
    whole.second_moments = gather(second);
    whole.parameter_values.reserve(value_count_);
    for (const NamedParameter& entry : parameters_) {
        const std::vector<float> values = entry.parameter.value().to_host();
        whole.parameter_values.insert(whole.parameter_values.end(), values.begin(), values.end());
    }
    return whole;
}

void ZeroRedundancyAdam::load_state(const AdamState& state) {
    constexpr const char* operation = "ZeroRedundancyAdam::load_state";
    for (const auto* vector :
         {&state.parameter_values, &state.first_moments, &state.second_moments}) {
        if (vector->size() != value_count_) {
            throw std::invalid_argument(std::string(operation) + ": a state vector has " +
                                        std::to_string(vector->size()) + " values, the list " +
                                        std::to_string(value_count_));
        }
    }
    require_finite(state.parameter_values, "parameter value");
    require_finite(state.first_moments, "first moment");
    require_finite(state.second_moments, "second moment");
    for (std::size_t i = 0; i < state.second_moments.size(); ++i) {
        if (state.second_moments[i] < 0.0F) {
            throw std::invalid_argument(std::string(operation) + ": second moment element " +
                                        std::to_string(i) + " is negative");
        }
    }
    const int rank = parallel_.group().rank();
    if (adam_) {
        AdamState mine;
        mine.step_count = state.step_count;
        mine.beta1_power = state.beta1_power;
        mine.beta2_power = state.beta2_power;
        for (std::size_t i = 0; i < parameters_.size(); ++i) {
            if (owners_[i] != rank)
                continue;
            const auto begin = static_cast<std::ptrdiff_t>(offsets_[i]);
            const auto end =
                begin + static_cast<std::ptrdiff_t>(parameters_[i].parameter.value().numel());
            mine.parameter_values.insert(mine.parameter_values.end(),
                                         state.parameter_values.begin() + begin,
                                         state.parameter_values.begin() + end);
            mine.first_moments.insert(mine.first_moments.end(), state.first_moments.begin() + begin,
                                      state.first_moments.begin() + end);
            mine.second_moments.insert(mine.second_moments.end(),
                                       state.second_moments.begin() + begin,
                                       state.second_moments.begin() + end);
        }
        adam_->load_state(mine);
    } else {
        idle_step_count_ = state.step_count;
    }
    write_unowned_values(state.parameter_values);
}

}  // namespace riftco_transformer
