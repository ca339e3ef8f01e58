#pragma once
// The logical state of an Adam optimizer (docs/ARCHITECTURE.md, 'Adam'), for exact resume. It is
// independent of the moment layout and of the backend: a state captured from a paged CPU
// optimizer restores into a contiguous one on another backend.

#include <cstdint>
#include <vector>

namespace riftco_transformer {

struct AdamState {
    std::uint64_t step_count = 0;
    double beta1_power = 1.0;  // β1^step_count
    double beta2_power = 1.0;  // β2^step_count
    // N floats each, N = the scalar count of every parameter: parameter-list order, then each
    // tensor's flat row-major order.
    std::vector<float> parameter_values;
    std::vector<float> first_moments;
    std::vector<float> second_moments;
};

}  // namespace riftco_transformer
