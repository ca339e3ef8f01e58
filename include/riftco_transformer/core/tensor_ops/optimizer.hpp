#pragma once
// The optimizer's operations over tensors (docs/ARCHITECTURE.md, 'Adam'): batched finiteness checks
// and the overflow-safe global sum of squares, and the two passes of an Adam step. Each request
// covers every tensor of a step in one call and is one sync point of the backend (one host
// read of a small result), whatever the number of tensors. The optimizer (optim/) calls these,
// never a backend directly.

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

// Overflow-safe partial sum of squares (docs/ARCHITECTURE.md, 'Adam'): Σ x² = scale²·scaled_squares
// with scale = max |x|, a pair that neither overflows nor underflows whatever the magnitudes or
// the element count.
struct ScaledSumOfSquares {
    double scale = 0.0;           // max |x| of the elements summed (0 when all were zero)
    double scaled_squares = 0.0;  // Σ (|x|/scale)²; 0 while scale is 0

    // Adds another partial: the running-pair rule of optim/gradient_norm.hpp, applied to a pair
    // instead of one element (an element |x| is the pair (|x|, 1)).
    void merge(const ScaledSumOfSquares& other) noexcept {
        if (other.scale == 0.0) {
            return;
        }
        if (scale < other.scale) {
            const double ratio = scale / other.scale;
            scaled_squares = other.scaled_squares + scaled_squares * ratio * ratio;
            scale = other.scale;
        } else {
            const double ratio = other.scale / scale;
            scaled_squares += other.scaled_squares * ratio * ratio;
        }
    }
    // √(Σ x²) = scale·√scaled_squares.
    [[nodiscard]] double norm() const noexcept { return scale * std::sqrt(scaled_squares); }
};

// The first NaN/±inf of a list of tensors: (tensor, element, its value); tensor equals the
// list's size when every element is finite.
struct FirstNonFinite {
    std::size_t tensor = 0;
    std::size_t element = 0;
    float value = 0.0F;
};

// One batched reduction over every gradient of a step, read by the host in one go.
struct GradientStatistics {
    ScaledSumOfSquares squares;  // merged in list order; unspecified when one is non-finite
    FirstNonFinite first_non_finite;
};

// The per-step constants of one Adam update (docs/ARCHITECTURE.md, 'Adam'; AdamW included).
struct AdamUpdateScalars {
    double beta1 = 0.0;
    double beta2 = 0.0;
    double bias_correction1 = 0.0;  // c1 = 1 − β1^t
    double bias_correction2 = 0.0;  // c2 = 1 − β2^t
    double learning_rate = 0.0;     // the scheduled lr_t
    double epsilon = 0.0;
    double clip_scale = 1.0;    // s, the global clip factor
    double decay_factor = 1.0;  // 1 − lr_t·λ (decoupled weight decay); exactly 1 without it
};

// One moment page and the stretch of its parameter it covers: value[offset, offset + n),
// gradient[offset, offset + n), first_moment [n], second_moment [n] with n the page's numel.
// A null gradient reads as zeros (a parameter backward never reached).
struct AdamSlice {
    Tensor* value = nullptr;
    const Tensor* gradient = nullptr;
    std::size_t offset = 0;
    Tensor* first_moment = nullptr;
    Tensor* second_moment = nullptr;
};

// Where the first problem of a step lies, as (slice, element within the slice); slice equals
// the slice count when there is none.
struct AdamCheck {
    std::size_t value_slice = 0;  // a non-finite current value θ
    std::size_t value_element = 0;
    float value = 0.0F;            // that θ
    std::size_t update_slice = 0;  // a θ', m' or v' that is not finite once narrowed to float
    std::size_t update_element = 0;
};

// That `backend` can run these operations: invalid_argument for an unknown value,
// std::runtime_error "<operation>: ..." when it is unavailable or lacks them.
void require_optimizer_backend(ExecutionBackend backend, std::string_view operation);

// The whole read-only pass of one Adam step: the gradients' statistics, the global clip
// factor s = max_norm/‖g‖ when ‖g‖ > max_norm (else 1, computed in double from the merged
// sum of squares) and the check of every slice under that s.
struct AdamStepCheck {
    GradientStatistics gradients;  // when a gradient is non-finite, the rest is unspecified
    double clip_scale = 1.0;
    AdamCheck check;
};

// The clip factor of a global norm: max_norm/norm when norm > max_norm, else exactly 1.
[[nodiscard]] inline double clip_scale_for(double norm, double maximum_norm) noexcept {
    return norm > maximum_norm ? maximum_norm / norm : 1.0;
}

// Every non-null tensor on `backend` (invalid_argument naming the position otherwise). The
// merged sum of squares of all of them in list order and their first non-finite element.
[[nodiscard]] GradientStatistics gradient_statistics(ExecutionBackend backend,
                                                     std::span<const Tensor* const> tensors);
// The first non-finite element of the tensors, in list order (null entries skipped).
[[nodiscard]] FirstNonFinite first_non_finite(ExecutionBackend backend,
                                              std::span<const Tensor* const> tensors);
// Pass 1 of a step as ONE request and one host read, whatever the parameter count:
// gradient_statistics over `gradients`, the clip factor, and the check of every slice with
// scalars.clip_scale replaced by it (reads, writes nothing). This is the optimizer's one read
// per step. Slices are checked first: every tensor on `backend`, the moments of one page the
// same size, the page inside its value, a gradient of its value's shape (invalid_argument
// otherwise).
[[nodiscard]] AdamStepCheck adam_step_check(ExecutionBackend backend,
                                            const AdamUpdateScalars& scalars,
                                            double maximum_gradient_norm,
                                            std::span<const Tensor* const> gradients,
                                            std::span<const AdamSlice> slices);
// Pass 1's check alone, under the given scalars.clip_scale (a step whose clip factor comes from
// elsewhere: the sharded optimizer's global norm). Reads, writes nothing.
[[nodiscard]] AdamCheck adam_check(ExecutionBackend backend, const AdamUpdateScalars& scalars,
                                   std::span<const AdamSlice> slices);
// Pass 2: gives every value and moment its θ', m', v' through the backend (in place after
// copy-on-write, or new buffers), after adam_check accepted the same arguments.
void adam_apply(ExecutionBackend backend, const AdamUpdateScalars& scalars,
                std::span<const AdamSlice> slices);

}  // namespace riftco_transformer::tensor_ops
