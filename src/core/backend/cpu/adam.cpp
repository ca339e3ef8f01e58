// CPU Adam (docs/ARCHITECTURE.md, 'Adam'): the overflow-safe gradient sum of squares and the two
// passes of a step. Both passes evaluate every scalar with adam_candidate() below; this file is
// compiled with -ffp-contract=off (src/optim/sources.cmake), so neither pass fuses a
// multiply-add the other does not, and the write stores exactly the values the check
// accepted. Work is split into fixed blocks and chunks combined in order, so no result
// depends on the thread count.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr std::size_t norm_block = 4096;    // elements per sum-of-squares partial
constexpr std::size_t update_chunk = 8192;  // elements per work item of a step pass
constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

// The gradient of a parameter that backward never reached: one chunk of zeros.
constexpr std::array<float, update_chunk> zero_gradient_chunk{};

[[nodiscard]] inline bool is_finite(float x) {
    return std::fabs(x) <= std::numeric_limits<float>::max();  // false for NaN and ±inf
}

// The first index in [0, n) holding a NaN or ±inf, or n. (Flags accumulate in integers and
// combine with | only, never || or &&, so these loops vectorise.)
std::size_t scan_non_finite(const float* x, std::size_t n) {
    unsigned any = 0;
    for (std::size_t i = 0; i < n; ++i)
        any |= static_cast<unsigned>(!is_finite(x[i]));
    if (any == 0) {
        return n;
    }
    std::size_t i = 0;
    while (is_finite(x[i]))
        ++i;
    return i;
}

// One block of finite floats -> (max |x|, Σ x² / max²). A float squared in double can
// neither overflow (|x|² <= 1.2e77) nor lose precision to underflow (|x|² >= 2e-90), and max²
// is exact in double, so the block sums squares directly and scales once; blocks then merge
// by the scaled rule, which keeps the total overflow-safe for any element count. max |x| is
// the largest magnitude bit pattern (IEEE order): an integer reduction, which vectorises.
ScaledSumOfSquares block_squares(const float* x, std::size_t n) {
    std::uint32_t largest = 0;
    for (std::size_t i = 0; i < n; ++i)
        largest = std::max(largest, std::bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFU);
    ScaledSumOfSquares squares;
    if (largest != 0) {
        const double scale = std::bit_cast<float>(largest);
        squares.scale = scale;
        squares.scaled_squares = row_dot(x, x, n) / (scale * scale);
    }
    return squares;
}

// One scalar of a step, in double (docs/ARCHITECTURE.md, 'Adam', with decoupled weight decay):
//   g̃ = s·g;  m' = β1·m + (1−β1)·g̃;  v' = β2·v + (1−β2)·g̃²;
//   θ' = θ·(1 − lr·λ) − lr·(m'/c1)/(√(v'/c2) + ε)      (ε after the square root)
// The update uses the double m' and v'; the caller narrows all three to float.
struct Candidate {
    double value;
    double first_moment;
    double second_moment;
};

struct StepConstants {
    AdamUpdateScalars scalars;
    double one_minus_beta1;
    double one_minus_beta2;
};

[[nodiscard]] inline Candidate adam_candidate(const StepConstants& k, float value, float gradient,
                                              float first_moment, float second_moment) {
    const AdamUpdateScalars& s = k.scalars;
    const double g = s.clip_scale * static_cast<double>(gradient);
    const double m = s.beta1 * static_cast<double>(first_moment) + k.one_minus_beta1 * g;
    const double v = s.beta2 * static_cast<double>(second_moment) + k.one_minus_beta2 * (g * g);
    const double update = s.learning_rate * (m / s.bias_correction1) /
                          (std::sqrt(v / s.bias_correction2) + s.epsilon);
    return {static_cast<double>(value) * s.decay_factor - update, m, v};
}

// 1 when θ', m' or v' is not finite once narrowed to float.
[[nodiscard]] inline unsigned narrows_non_finite(const Candidate& c) {
    return static_cast<unsigned>(!is_finite(static_cast<float>(c.value))) |
           static_cast<unsigned>(!is_finite(static_cast<float>(c.first_moment))) |
           static_cast<unsigned>(!is_finite(static_cast<float>(c.second_moment)));
}

// A chunk [begin, end) of one slice (elements relative to the slice).
struct WorkItem {
    std::size_t slice;
    std::size_t begin;
    std::size_t end;
};

std::vector<WorkItem> work_items(std::span<const AdamSlice> slices) {
    std::vector<WorkItem> items;
    for (std::size_t s = 0; s < slices.size(); ++s) {
        const std::size_t count = slices[s].first_moment->numel();
        for (std::size_t begin = 0; begin < count; begin += update_chunk) {
            items.push_back({s, begin, std::min(count, begin + update_chunk)});
        }
    }
    return items;
}

// Host pointers of one work item, each advanced to the item's first element.
struct ItemPointers {
    const float* value;
    const float* gradient;
    const float* first_moment;
    const float* second_moment;
    std::size_t count;
};

ItemPointers pointers_of(const AdamSlice& slice, const WorkItem& item) {
    const std::size_t start = slice.offset + item.begin;
    return {
        cpu_data(*slice.value) + start,
        slice.gradient != nullptr ? cpu_data(*slice.gradient) + start : zero_gradient_chunk.data(),
        cpu_data(*slice.first_moment) + item.begin, cpu_data(*slice.second_moment) + item.begin,
        item.end - item.begin};
}

StepConstants constants_of(const AdamUpdateScalars& scalars) {
    return {scalars, 1.0 - scalars.beta1, 1.0 - scalars.beta2};
}

}  // namespace

namespace {

// One tensor's squares (unspecified when it holds a non-finite element) and the flat index
// of its first NaN/±inf (count when none).
struct TensorSquares {
    ScaledSumOfSquares squares;
    std::size_t first_non_finite = 0;
};

TensorSquares tensor_squares(const Tensor& x, bool with_squares) {
    const float* values = cpu_data(x);
    const std::size_t count = x.numel();
    const std::size_t blocks = (count + norm_block - 1) / norm_block;
    std::vector<ScaledSumOfSquares> partial(with_squares ? blocks : 0);
    std::vector<std::size_t> first_bad(blocks, none);
    parallel_for(blocks, items_per_thread_for(with_squares ? norm_block * 2 : norm_block),
                 [&](std::size_t begin, std::size_t end) {
                     for (std::size_t block = begin; block < end; ++block) {
                         const std::size_t first = block * norm_block;
                         const std::size_t n = std::min(count, first + norm_block) - first;
                         const std::size_t bad = scan_non_finite(values + first, n);
                         if (bad != n) {
                             first_bad[block] = first + bad;
                         } else if (with_squares) {
                             partial[block] = block_squares(values + first, n);
                         }
                     }
                 });
    TensorSquares result;
    result.first_non_finite = count;
    for (std::size_t block = 0; block < blocks; ++block) {
        if (first_bad[block] != none) {
            result.first_non_finite = first_bad[block];
            return result;
        }
        if (with_squares) {
            result.squares.merge(partial[block]);
        }
    }
    return result;
}

// Runs tensor_squares over the list in order, stopping at the first non-finite element.
GradientStatistics list_statistics(std::span<const Tensor* const> tensors, bool with_squares) {
    GradientStatistics statistics;
    statistics.first_non_finite.tensor = tensors.size();
    for (std::size_t t = 0; t < tensors.size(); ++t) {
        if (tensors[t] == nullptr) {
            continue;
        }
        const TensorSquares squares = tensor_squares(*tensors[t], with_squares);
        if (squares.first_non_finite != tensors[t]->numel()) {
            statistics.first_non_finite = {t, squares.first_non_finite,
                                           cpu_data(*tensors[t])[squares.first_non_finite]};
            return statistics;
        }
        statistics.squares.merge(squares.squares);
    }
    return statistics;
}

}  // namespace

GradientStatistics CpuAdam::gradient_statistics(std::span<const Tensor* const> tensors) const {
    return list_statistics(tensors, true);
}

FirstNonFinite CpuAdam::first_non_finite(std::span<const Tensor* const> tensors) const {
    return list_statistics(tensors, false).first_non_finite;
}

AdamCheck CpuAdam::check_update(const AdamUpdateScalars& scalars,
                                std::span<const AdamSlice> slices) const {
    const StepConstants constants = constants_of(scalars);
    const std::vector<WorkItem> items = work_items(slices);
    std::vector<std::size_t> bad_value(items.size(), none);   // element within the slice
    std::vector<std::size_t> bad_update(items.size(), none);  // element within the slice
    parallel_for(items.size(), 1, [&](std::size_t begin, std::size_t end) {
        for (std::size_t index = begin; index < end; ++index) {
            const WorkItem& item = items[index];
            const ItemPointers p = pointers_of(slices[item.slice], item);
            unsigned any = 0;
            for (std::size_t i = 0; i < p.count; ++i) {
                const Candidate c = adam_candidate(constants, p.value[i], p.gradient[i],
                                                   p.first_moment[i], p.second_moment[i]);
                any |= static_cast<unsigned>(!is_finite(p.value[i])) | narrows_non_finite(c);
            }
            if (any == 0) {
                continue;
            }
            // Rare path: locate the first offending element of each kind.
            for (std::size_t i = 0; i < p.count; ++i) {
                if (bad_value[index] == none && !is_finite(p.value[i])) {
                    bad_value[index] = item.begin + i;
                }
                const Candidate c = adam_candidate(constants, p.value[i], p.gradient[i],
                                                   p.first_moment[i], p.second_moment[i]);
                if (bad_update[index] == none && narrows_non_finite(c) != 0) {
                    bad_update[index] = item.begin + i;
                }
            }
        }
    });
    AdamCheck check{slices.size(), 0, 0.0F, slices.size(), 0};
    for (std::size_t index = 0; index < items.size(); ++index) {
        if (check.value_slice == slices.size() && bad_value[index] != none) {
            const AdamSlice& slice = slices[items[index].slice];
            check.value_slice = items[index].slice;
            check.value_element = bad_value[index];
            check.value = cpu_data(*slice.value)[slice.offset + bad_value[index]];
        }
        if (check.update_slice == slices.size() && bad_update[index] != none) {
            check.update_slice = items[index].slice;
            check.update_element = bad_update[index];
        }
    }
    return check;
}

void CpuAdam::apply_update(const AdamUpdateScalars& scalars,
                           std::span<const AdamSlice> slices) const {
    const StepConstants constants = constants_of(scalars);
    const std::vector<WorkItem> items = work_items(slices);
    // In place: every written storage is made unique first (copy-on-write clones allocate
    // here, before the first write), so no copy or gradient observes the update.
    for (const AdamSlice& slice : slices) {
        static_cast<void>(TensorAccess::unique_storage(*slice.value));
        static_cast<void>(TensorAccess::unique_storage(*slice.first_moment));
        static_cast<void>(TensorAccess::unique_storage(*slice.second_moment));
    }
    parallel_for(items.size(), 1, [&](std::size_t begin, std::size_t end) {
        for (std::size_t index = begin; index < end; ++index) {
            const WorkItem& item = items[index];
            const AdamSlice& slice = slices[item.slice];
            const ItemPointers p = pointers_of(slice, item);
            float* value = cpu_output(*slice.value) + slice.offset + item.begin;
            float* first_moment = cpu_output(*slice.first_moment) + item.begin;
            float* second_moment = cpu_output(*slice.second_moment) + item.begin;
            for (std::size_t i = 0; i < p.count; ++i) {
                const Candidate c = adam_candidate(constants, p.value[i], p.gradient[i],
                                                   p.first_moment[i], p.second_moment[i]);
                value[i] = static_cast<float>(c.value);
                first_moment[i] = static_cast<float>(c.first_moment);
                second_moment[i] = static_cast<float>(c.second_moment);
            }
        }
    });
}

}  // namespace riftco_transformer::detail
