// CPU reductions. Sums accumulate in double over fixed-size blocks combined in block order,
// so results do not depend on the thread count.

#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/parallel/parallel_for.hpp"

namespace riftco_transformer::detail {
namespace {
constexpr std::size_t sum_block = 4096;
}  // namespace

void CpuReduction::sum_all(const Tensor& x, double multiplier, Tensor& out) const {
    const float* values = cpu_data(x);
    const std::size_t count = x.numel();
    const std::size_t blocks = (count + sum_block - 1) / sum_block;
    std::vector<double> partial(blocks, 0.0);
    parallel_for(blocks, items_per_thread_for(sum_block), [&](std::size_t begin, std::size_t end) {
        for (std::size_t block = begin; block < end; ++block) {
            const std::size_t first = block * sum_block;
            const std::size_t last = std::min(count, first + sum_block);
            double total = 0.0;
            for (std::size_t i = first; i < last; ++i) total += values[i];
            partial[block] = total;
        }
    });
    double total = 0.0;
    for (const double block_total : partial) total += block_total;
    cpu_output(out)[0] = static_cast<float>(total * multiplier);
}

void CpuReduction::sum_axis(const Tensor& x, std::size_t axis, double multiplier,
                            Tensor& out) const {
    // x viewed as [outer, extent, inner]; out[o, i] = multiplier · Σ_e x[o, e, i].
    std::size_t outer = 1;
    std::size_t inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    for (std::size_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape()[d];
    const std::size_t extent = x.shape()[axis];
    const float* src = cpu_data(x);
    float* dst = cpu_output(out);
    parallel_for(outer, items_per_thread_for(extent * inner), [&](std::size_t begin, std::size_t end) {
        std::vector<double> totals(inner);
        for (std::size_t o = begin; o < end; ++o) {
            const float* slab = src + o * extent * inner;
            std::fill(totals.begin(), totals.end(), 0.0);
            for (std::size_t e = 0; e < extent; ++e) {
                const float* row = slab + e * inner;
                for (std::size_t i = 0; i < inner; ++i) totals[i] += row[i];
            }
            for (std::size_t i = 0; i < inner; ++i) {
                dst[o * inner + i] = static_cast<float>(totals[i] * multiplier);
            }
        }
    });
}

}  // namespace riftco_transformer::detail
