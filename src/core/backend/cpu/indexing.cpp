// CPU row gather and scatter-add.

#include <algorithm>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"

namespace riftco_transformer::detail {

void CpuIndexing::gather_rows(const Tensor& table, const IndexTensor& index_tensor,
                              Tensor& out) const {
    // table [R,W], out [n,W]: out[i] = table[indices[i]]
    const std::size_t width = table.shape()[1];
    const float* src = cpu_data(table);
    const std::uint32_t* indices = cpu_indices(index_tensor);
    float* dst = cpu_output(out);
    parallel_for(index_tensor.numel(), items_per_thread_for(width),
                 [&](std::size_t begin, std::size_t end) {
                     for (std::size_t i = begin; i < end; ++i) {
                         std::copy_n(src + std::size_t{indices[i]} * width, width, dst + i * width);
                     }
                 });
}

void CpuIndexing::scatter_add_rows(const Tensor& upstream, const IndexTensor& index_tensor,
                                   Tensor& out) const {
    // upstream [n,W], out [R,W]: out[r] = Σ_{i: indices[i] = r} upstream[i].
    // Threads own disjoint bands of destination rows and each scans every index, so repeated
    // indices accumulate in index order and no two threads write one row.
    const std::size_t width = out.shape()[1];
    const std::size_t row_count = out.shape()[0];
    const float* src = cpu_data(upstream);
    const std::uint32_t* indices = cpu_indices(index_tensor);
    const std::size_t index_count = index_tensor.numel();
    float* dst = cpu_output(out);
    std::fill_n(dst, out.numel(), 0.0F);
    const std::size_t work_per_band = index_count * width;
    const std::size_t bands = work_per_band < (std::size_t{1} << 16U) ? 1 : cpu_thread_count();
    parallel_for(bands, 1, [&](std::size_t band_begin, std::size_t band_end) {
        const std::size_t first_row = row_count * band_begin / bands;
        const std::size_t last_row = row_count * band_end / bands;
        for (std::size_t i = 0; i < index_count; ++i) {
            const std::size_t row = indices[i];
            if (row < first_row || row >= last_row)
                continue;
            const float* in = src + i * width;
            float* accumulator = dst + row * width;
            for (std::size_t j = 0; j < width; ++j)
                accumulator[j] += in[j];
        }
    });
}

}  // namespace riftco_transformer::detail
