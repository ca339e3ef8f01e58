#pragma once
// Adam options (docs/ARCHITECTURE.md, 'Adam') with the additive AdamW weight decay and
// learning-rate schedule. The defaults are plain Adam at a constant rate.

#include <cstddef>
#include <cstdint>

#include "riftco_transformer/optim/learning_rate_schedule.hpp"

namespace riftco_transformer {

// How the first and second moments are held on the backend. Both layouts give bit-identical
// results; Paged bounds the size of each allocation (and device request), not the total.
enum class AdamStateStorage : std::uint32_t {
    Contiguous = 0,  // one [numel] tensor per parameter and moment
    Paged = 1,       // per parameter, 1-D pages of at most page_size elements
};

struct AdamOptions {
    double learning_rate = 1e-3;         // finite, > 0: the base rate the schedule scales
    double beta1 = 0.9;                  // in (0, 1)
    double beta2 = 0.999;                // in (0, 1)
    double epsilon = 1e-8;               // finite, > 0; added after the square root
    double maximum_gradient_norm = 1.0;  // > 0; +infinity disables clipping
    AdamStateStorage state_storage = AdamStateStorage::Contiguous;
    std::size_t page_size = 4096;  // elements per page; > 0 even when Contiguous
    // Decoupled weight decay λ (AdamW: θ ← θ·(1 − lr_t·λ) − lr_t·m̂/(√v̂ + ε)), applied to
    // every parameter of the optimizer. Finite, >= 0; 0 is plain Adam, bit for bit.
    double weight_decay = 0.0;
    LearningRateSchedule schedule{};
};

// std::invalid_argument naming the option and its value for any constraint above (NaN fails
// every one), an unknown state_storage value, or an invalid schedule.
void validate_adam_options(const AdamOptions& options);

}  // namespace riftco_transformer
