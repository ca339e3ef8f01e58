#pragma once
// Adam with global gradient-norm clipping and bias correction (docs/ARCHITECTURE.md, 'Adam'), plus
// the additive AdamW weight decay and learning-rate schedules (adam_options.hpp).
//
// A step t = step_count() + 1, for every scalar of every parameter, in double:
//   ‖g‖ = √(Σ g²) over all scalars (overflow-safe, gradient_norm.hpp)
//   s   = G_max/‖g‖ if ‖g‖ > G_max, else 1 (also when ‖g‖ = 0): one global factor
//   c1  = 1 − β1^t,  c2 = 1 − β2^t,  lr_t = the schedule's rate for step t
//   g̃ = s·g;  m' = β1·m + (1−β1)·g̃;  v' = β2·v + (1−β2)·g̃²
//   θ' = θ·(1 − lr_t·λ) − lr_t·(m'/c1)/(√(v'/c2) + ε)     (ε after the square root)
// θ', m', v' are narrowed to float. A parameter that backward never reached (no gradient)
// takes g = 0: its moments decay and it still moves while they are non-zero.
//
// A step is a transaction without out-of-place copies (docs/ARCHITECTURE.md, 'Transactions'):
//   pass 1 writes nothing. It rechecks every parameter, computes ‖g‖ (a NaN/±inf gradient:
//          std::domain_error), and evaluates every θ', m', v' (a non-finite current value:
//          std::domain_error; a result that is not finite in float: std::overflow_error);
//   pass 2 writes θ', m', v' in place with the same arithmetic, then gives every parameter a
//          new version (graphs built before the step fail at backward with
//          std::logic_error) and clears its gradient, then commits the step count and the
//          beta powers.
// Any failure leaves values, moments, gradients, versions, the step count and the beta
// powers as they were. Transient memory is a few bytes per 8192 scalars; values are
// written in place unless a copy of the value tensor shares its storage (copy-on-write).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"
#include "riftco_transformer/nn/parameter.hpp"
#include "riftco_transformer/optim/adam_options.hpp"
#include "riftco_transformer/optim/adam_state.hpp"
#include "riftco_transformer/optim/gradient_norm.hpp"
#include "riftco_transformer/optim/learning_rate_schedule.hpp"

namespace riftco_transformer {

struct AdamStepStats {
    std::uint64_t step = 0;      // the step count after this update
    double gradient_norm = 0.0;  // ‖g‖ before clipping
    double clip_scale = 1.0;     // s
    double learning_rate = 0.0;  // lr_t, the scheduled rate this step used
};

// The other shards of a step sharded over ranks (ZeRO-1, distributed/zero_redundancy_adam.hpp):
// R optimizers each own a part of one model's parameters and step(peers) on every one of them
// makes one step of the whole. Both calls are collective (every shard makes them, in this
// order; all_passed only when merge reported no non-finite gradient anywhere).
class AdamShardPeers {
  public:
    virtual ~AdamShardPeers() = default;
    // The sum of squares over every shard's gradients (the same value on every shard), and in
    // any_non_finite whether some shard has a NaN/±inf gradient.
    [[nodiscard]] virtual tensor_ops::ScaledSumOfSquares merge(
        const tensor_ops::ScaledSumOfSquares& mine, bool mine_non_finite, bool& any_non_finite) = 0;
    // Whether every shard's check of its candidate values passed.
    [[nodiscard]] virtual bool all_passed(bool mine) = 0;
};

class Adam {
  public:
    // Copies the list (the handles keep the parameters alive); the list is fixed from then on
    // and the backend of the first parameter is captured. Moments start at zero (FP32, on
    // that backend), the beta powers at 1, the step count at 0. Nothing is changed by a
    // failure. Errors:
    //   std::invalid_argument: invalid options (validate_adam_options); an empty list; an
    //     empty or repeated name; an empty Variable; a non-leaf; a frozen parameter
    //     (requires_gradient false: pass only trainable ones); a parameter listed twice; a
    //     value or gradient on a backend other than the first parameter's;
    //   std::logic_error: a gradient whose shape differs from its value;
    //   std::overflow_error: a moment state whose byte count overflows std::size_t;
    //   std::runtime_error: a backend that is unavailable or has no Adam capability;
    //   std::domain_error: a NaN/±inf value, or gradient (the norm runs once here).
    Adam(ParameterList parameters, AdamOptions options = {});

    Adam(const Adam&) = delete;
    Adam& operator=(const Adam&) = delete;
    // A moved-from optimizer may only be destroyed or assigned to.
    Adam(Adam&&) noexcept = default;
    Adam& operator=(Adam&&) noexcept = default;
    ~Adam() = default;

    // One update (see the top of this file). Errors, each changing nothing:
    //   std::overflow_error: the step count is already at its maximum; an update that is not
    //     finite in float;
    //   std::invalid_argument: a value or gradient no longer on backend() (e.g. a parameter
    //     moved after construction);
    //   std::logic_error: a parameter frozen, or given another shape, after construction; a
    //     gradient whose shape differs from its value;
    //   std::domain_error: a NaN/±inf gradient element or current value.
    AdamStepStats step();
    // The same step as one shard of a sharded optimizer: ‖g‖ and the clip factor are the
    // global ones (peers.merge), and nothing is written on any shard unless every shard's
    // check passed (peers.all_passed). A shard whose own gradient or update is the problem
    // throws the errors above; the others throw std::domain_error (a non-finite gradient) or
    // std::overflow_error (a failed check) saying another shard failed. Either way nothing
    // changed on any shard.
    AdamStepStats step(AdamShardPeers& peers);

    // Clears every parameter's gradient; values, versions and moments are untouched.
    void zero_gradients();

    // The logical state, for exact resume. Needs a clean step boundary: a parameter holding
    // a gradient (not yet consumed by step() or cleared) is std::logic_error; a NaN/±inf
    // parameter value is std::domain_error (the state could not be loaded back); parameter
    // checks as in step().
    [[nodiscard]] AdamState state() const;

    // Restores a state captured from any layout or backend: values, moments, step count and
    // beta powers. Validates everything before writing anything, then writes in place, gives
    // every parameter a new version and clears its gradient. Errors, changing nothing:
    //   std::logic_error: a parameter holding a gradient (not a clean step boundary);
    //   std::invalid_argument: a vector whose size is not state_value_count(); a NaN/±inf
    //     element; a negative second moment; a beta power outside [0, 1], not exactly 1 at
    //     step 0, exactly 1 after it, or further than a relative 1e-12 from β^t (any power
    //     <= DBL_MIN is accepted once β^t is below DBL_MIN);
    //   parameter checks as in step().
    void load_state(const AdamState& state);

    [[nodiscard]] const AdamOptions& options() const noexcept { return options_; }
    [[nodiscard]] const ParameterList& parameters() const noexcept { return parameters_; }
    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] std::uint64_t step_count() const noexcept { return step_count_; }
    // β^step_count, evaluated as std::pow(β, t) at each step rather than by repeated
    // multiplication, so the powers never drift from β^t (which load_state checks to 1e-12).
    [[nodiscard]] double beta1_power() const noexcept { return beta1_power_; }
    [[nodiscard]] double beta2_power() const noexcept { return beta2_power_; }
    // The scheduled rate the next step will use (the last step's once the count is maximal).
    [[nodiscard]] double learning_rate() const;
    [[nodiscard]] std::size_t parameter_tensor_count() const noexcept { return parameters_.size(); }
    // N, the scalars of all parameters: each has one first and one second moment.
    [[nodiscard]] std::size_t state_value_count() const noexcept { return value_count_; }
    [[nodiscard]] AdamStateStorage state_storage_kind() const noexcept {
        return options_.state_storage;
    }
    [[nodiscard]] std::size_t state_page_size() const noexcept { return options_.page_size; }
    // Σ ceil(numel / page_size) when Paged; 0 when Contiguous.
    [[nodiscard]] std::size_t state_page_count() const noexcept;
    // 2·N·4 bytes in either layout.
    [[nodiscard]] std::size_t state_payload_bytes() const noexcept {
        return 2 * value_count_ * sizeof(float);
    }

  private:
    struct MomentPage {
        std::size_t parameter = 0;  // index in parameters_
        std::size_t offset = 0;     // first element of that parameter the page covers
        Tensor first_moment;        // [count]
        Tensor second_moment;       // [count]
    };

    AdamStepStats step_with(AdamShardPeers* peers);
    void check_parameters(const char* operation) const;
    void require_clean_boundary(const char* operation) const;
    void require_finite_values(const char* operation) const;

    ParameterList parameters_;
    AdamOptions options_;
    ExecutionBackend backend_ = ExecutionBackend::Cpu;
    std::vector<Shape> shapes_;                   // each parameter's shape at construction
    std::vector<std::size_t> parameter_offsets_;  // first flat state index of each parameter
    std::size_t value_count_ = 0;
    std::vector<MomentPage> pages_;
    std::uint64_t step_count_ = 0;
    double beta1_power_ = 1.0;
    double beta2_power_ = 1.0;
};

}  // namespace riftco_transformer
