// CPU reductions. Sums accumulate in double, over fixed blocks combined in block order, so
// results do not depend on the thread count.

#include <algorithm>
#include <vector>

#include "core/backend/cpu/axis_sum.hpp"
#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {
constexpr std::size_t sum_block = 4096;
constexpr std::size_t column_block = 512;
}  // namespace

void sum_over_axis(const float* x, std::size_t outer, std::size_t extent, std::size_t inner,
                   double multiplier, float* out) {
    if (inner == 1) {
        // Contiguous rows: out[o] = Σ_e x[o, e].
        parallel_for(outer, items_per_thread_for(extent), [&](std::size_t begin, std::size_t end) {
            for (std::size_t o = begin; o < end; ++o) {
                out[o] = static_cast<float>(row_sum(x + o * extent, extent) * multiplier);
            }
        });
        return;
    }
    // Column sums: work items are (o, block of up to 512 columns), each summed down the extent.
    const std::size_t blocks = (inner + column_block - 1) / column_block;
    parallel_for(outer * blocks, items_per_thread_for(extent * column_block),
                 [&](std::size_t begin, std::size_t end) {
                     double totals[column_block];
                     for (std::size_t item = begin; item < end; ++item) {
                         const std::size_t o = item / blocks;
                         const std::size_t first = (item % blocks) * column_block;
                         const std::size_t width = std::min(column_block, inner - first);
                         std::fill_n(totals, width, 0.0);
                         const float* slab = x + o * extent * inner + first;
                         for (std::size_t e = 0; e < extent; ++e) {
                             const float* row = slab + e * inner;
                             for (std::size_t i = 0; i < width; ++i)
                                 totals[i] += row[i];
                         }
                         float* destination = out + o * inner + first;
                         for (std::size_t i = 0; i < width; ++i) {
                             destination[i] = static_cast<float>(totals[i] * multiplier);
                         }
                     }
                 });
}

void CpuReduction::sum_all(const Tensor& x, double multiplier, Tensor& out) const {
    const float* values = cpu_data(x);
    const std::size_t count = x.numel();
    const std::size_t blocks = (count + sum_block - 1) / sum_block;
    std::vector<double> partial(blocks, 0.0);
    parallel_for(blocks, items_per_thread_for(sum_block), [&](std::size_t begin, std::size_t end) {
        for (std::size_t block = begin; block < end; ++block) {
            const std::size_t first = block * sum_block;
            partial[block] = row_sum(values + first, std::min(count, first + sum_block) - first);
        }
    });
    double total = 0.0;
    for (const double block_total : partial)
        total += block_total;
    cpu_output(out)[0] = static_cast<float>(total * multiplier);
}

void CpuReduction::sum_axis(const Tensor& x, std::size_t axis, double multiplier,
                            Tensor& out) const {
    std::size_t outer = 1;
    std::size_t inner = 1;
    for (std::size_t d = 0; d < axis; ++d)
        outer *= x.shape()[d];
    for (std::size_t d = axis + 1; d < x.rank(); ++d)
        inner *= x.shape()[d];
    sum_over_axis(cpu_data(x), outer, x.shape()[axis], inner, multiplier, cpu_output(out));
}

}  // namespace riftco_transformer::detail
