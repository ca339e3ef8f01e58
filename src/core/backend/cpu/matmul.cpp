// CPU batched matmul over the GEMM seam: out[b] = op(left[b]) · op(right[b]).

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/gemv.hpp"
#include "core/backend/cpu/parallel_for.hpp"

namespace riftco_transformer::detail {

void CpuMatmul::batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                               bool transpose_right, Tensor& out) const {
    const std::size_t rank = left.rank();
    const std::size_t left_rows = left.shape()[rank - 2];
    const std::size_t left_columns = left.shape()[rank - 1];
    const std::size_t right_rows = right.shape()[rank - 2];
    const std::size_t right_columns = right.shape()[rank - 1];
    const std::size_t m = out.shape()[rank - 2];
    const std::size_t n = out.shape()[rank - 1];
    const std::size_t k = transpose_left ? left_rows : left_columns;
    const std::size_t batch = out.numel() / (m * n);

    const float* a = cpu_data(left);
    const float* b = cpu_data(right);
    float* c = cpu_output(out);
    const auto multiply = [&](std::size_t index) {
        GemmArguments g;
        g.transpose_a = transpose_left;
        g.transpose_b = transpose_right;
        g.m = m;
        g.n = n;
        g.k = k;
        g.a = a + index * left_rows * left_columns;
        g.lda = left_columns;
        g.b = b + index * right_rows * right_columns;
        g.ldb = right_columns;
        g.c = c + index * m * n;
        g.ldc = n;
        if (gemv_applies(g)) {
            gemv_rows(g);  // decode-shape products: stream B once (gemv.hpp)
        } else {
            gemm(g);
        }
    };
    // Large products use the GEMM's own threads; many small ones (attention heads) are
    // spread over the pool instead, each running single-threaded inside the parallel region.
    constexpr std::size_t large_product_flops = std::size_t{1} << 22U;
    if (batch == 1 || m * n * k >= large_product_flops) {
        for (std::size_t index = 0; index < batch; ++index)
            multiply(index);
    } else {
        parallel_for(batch, items_per_thread_for(m * n * k / 16),
                     [&](std::size_t begin, std::size_t end) {
                         for (std::size_t index = begin; index < end; ++index)
                             multiply(index);
                     });
    }
}

}  // namespace riftco_transformer::detail
