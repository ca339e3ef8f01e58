// CPU batched matmul over the GEMM seam: out[b] = op(left[b]) · op(right[b]).

#include <algorithm>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/gemv.hpp"
#include "core/backend/cpu/host_block_cache.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/strided.hpp"

namespace riftco_transformer::detail {
namespace {

// dst[c, r] = src[r, c] for a rows x cols row-major src: the layout family's strided copy
// (contiguous writes, threaded over output rows).
void transpose_into(const float* src, std::size_t rows, std::size_t cols, float* dst) {
    const std::size_t shape[2] = {cols, rows};
    const std::size_t strides[2] = {1, cols};
    strided_copy(src, shape, strides, dst);
}

// A·Bᵀ with a few dozen rows of A against a large B [n,k] (a prefill chunk through a
// projection, or a batch of streams above the GEMV's row limit): the BLAS's transposed-B path
// runs these shapes at a fraction of its no-transpose speed (oneDNN 2.6, 2 cores: 28-170
// against 230-330 GFLOP/s for m = 16..128 on GPT-2's projections), so compute
// Cᵀ = B·(Aᵀ) without transposes and transpose the small operands instead.
bool prefers_flipped(const GemmArguments& g) {
    const bool shape = !g.transpose_a && g.transpose_b && g.m > gemv_max_rows &&
                       g.n * g.k >= (std::size_t{1} << 18U);
    return shape && (g.m <= 128 || (g.m <= 256 && g.k > g.n));
}

// Scratch floats from the host block cache (recycled, so no fresh pages per call).
class Scratch {
  public:
    explicit Scratch(std::size_t count)
        : bytes_(count * sizeof(float)), data_(static_cast<float*>(acquire_host_block(bytes_))) {}
    ~Scratch() { release_host_block(data_, bytes_); }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    [[nodiscard]] float* get() const noexcept { return data_; }

  private:
    std::size_t bytes_;
    float* data_;
};

void flipped_gemm(const GemmArguments& g) {
    // Dense rows only (lda == k, ldc == n): the callers below pass packed operands.
    const Scratch a_transposed(g.k * g.m);
    const Scratch c_transposed(g.n * g.m);
    transpose_into(g.a, g.m, g.k, a_transposed.get());  // [k, m]
    GemmArguments flipped;
    flipped.m = g.n;
    flipped.n = g.m;
    flipped.k = g.k;
    flipped.a = g.b;  // [n, k]
    flipped.lda = g.ldb;
    flipped.b = a_transposed.get();  // [k, m]
    flipped.ldb = g.m;
    flipped.c = c_transposed.get();  // [n, m]
    flipped.ldc = g.m;
    gemm(flipped);
    transpose_into(c_transposed.get(), g.n, g.m, g.c);
}

}  // namespace

void CpuMatmul::batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                               bool transpose_right, Tensor& out) const {
    const MatmulExtents extents = MatmulExtents::of(left, right, transpose_left, out);
    // Plain copies, not structured bindings, so the lambdas below may capture them (C++20
    // allows capturing bindings; clang 14, which clang-tidy runs on, does not yet).
    const std::size_t left_rows = extents.left_rows;
    const std::size_t left_columns = extents.left_columns;
    const std::size_t right_rows = extents.right_rows;
    const std::size_t right_columns = extents.right_columns;
    const std::size_t m = extents.m;
    const std::size_t n = extents.n;
    const std::size_t k = extents.k;
    const std::size_t batch = extents.batch;

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
        } else if (batch == 1 && prefers_flipped(g)) {
            flipped_gemm(g);
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

void CpuMatmul::project_many(const Tensor& x, std::span<const Tensor* const> weights,
                             std::span<Tensor* const> outs) const {
    // One GEMV pass over every weight when each product has the decode shape (a few rows of
    // x); otherwise (a prefill chunk, say) one product after the other.
    const std::size_t rows = x.shape()[0];
    const std::size_t k = x.shape()[1];
    std::vector<GemmArguments> problems(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
        GemmArguments& g = problems[i];
        g.transpose_b = true;
        g.m = rows;
        g.n = weights[i]->shape()[0];
        g.k = k;
        g.a = cpu_data(x);
        g.lda = k;
        g.b = cpu_data(*weights[i]);
        g.ldb = k;
        g.c = cpu_output(*outs[i]);
        g.ldc = g.n;
        if (!gemv_applies(g)) {
            MatmulCapability::project_many(x, weights, outs);
            return;
        }
    }
    gemv_rows_many(problems);
}

}  // namespace riftco_transformer::detail
