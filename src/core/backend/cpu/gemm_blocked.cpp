// Portable blocked GEMM: the fallback when no BLAS is configured, and the independent
// implementation the BLAS path is tested against.
//
// C[M,N] = op(A)[M,K] · op(B)[K,N]. op(B) is packed one [kc, nc] panel at a time into a
// contiguous buffer; each thread then owns a band of rows and updates four rows of C per pass
// (c_r[j] += a_r[p]·b_p[j]), a loop the compiler vectorises along j.

#include <algorithm>
#include <vector>

#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/parallel_for.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr std::size_t k_block = 256;
constexpr std::size_t n_block = 512;
constexpr std::size_t rows_per_pass = 4;

float a_element(const GemmArguments& g, std::size_t row, std::size_t p) {
    return g.transpose_a ? g.a[p * g.lda + row] : g.a[row * g.lda + p];
}

// panel[p, j] = op(B)[k0 + p, n0 + j]
void pack_b_panel(const GemmArguments& g, std::size_t k0, std::size_t kc, std::size_t n0,
                  std::size_t nc, float* panel) {
    for (std::size_t p = 0; p < kc; ++p) {
        float* destination = panel + p * nc;
        if (g.transpose_b) {
            for (std::size_t j = 0; j < nc; ++j) {
                destination[j] = g.b[(n0 + j) * g.ldb + (k0 + p)];
            }
        } else {
            std::copy_n(g.b + (k0 + p) * g.ldb + n0, nc, destination);
        }
    }
}

// C[rows, n0:n0+nc] += op(A)[rows, k0:k0+kc] · panel
void update_rows(const GemmArguments& g, std::size_t row_begin, std::size_t row_end, std::size_t k0,
                 std::size_t kc, std::size_t n0, std::size_t nc, const float* panel) {
    std::size_t row = row_begin;
    for (; row + rows_per_pass <= row_end; row += rows_per_pass) {
        float* c0 = g.c + (row + 0) * g.ldc + n0;
        float* c1 = g.c + (row + 1) * g.ldc + n0;
        float* c2 = g.c + (row + 2) * g.ldc + n0;
        float* c3 = g.c + (row + 3) * g.ldc + n0;
        for (std::size_t p = 0; p < kc; ++p) {
            const float a0 = a_element(g, row + 0, k0 + p);
            const float a1 = a_element(g, row + 1, k0 + p);
            const float a2 = a_element(g, row + 2, k0 + p);
            const float a3 = a_element(g, row + 3, k0 + p);
            const float* b = panel + p * nc;
            for (std::size_t j = 0; j < nc; ++j) {
                c0[j] += a0 * b[j];
                c1[j] += a1 * b[j];
                c2[j] += a2 * b[j];
                c3[j] += a3 * b[j];
            }
        }
    }
    for (; row < row_end; ++row) {
        float* c_row = g.c + row * g.ldc + n0;
        for (std::size_t p = 0; p < kc; ++p) {
            const float a = a_element(g, row, k0 + p);
            const float* b = panel + p * nc;
            for (std::size_t j = 0; j < nc; ++j) {
                c_row[j] += a * b[j];
            }
        }
    }
}

}  // namespace

void gemm_blocked(const GemmArguments& g) {
    for (std::size_t row = 0; row < g.m; ++row) {
        std::fill_n(g.c + row * g.ldc, g.n, 0.0F);
    }
    std::vector<float> panel(std::min(k_block, g.k) * std::min(n_block, g.n));
    for (std::size_t n0 = 0; n0 < g.n; n0 += n_block) {
        const std::size_t nc = std::min(n_block, g.n - n0);
        for (std::size_t k0 = 0; k0 < g.k; k0 += k_block) {
            const std::size_t kc = std::min(k_block, g.k - k0);
            pack_b_panel(g, k0, kc, n0, nc, panel.data());
            const std::size_t bands = (g.m + rows_per_pass - 1) / rows_per_pass;
            parallel_for(bands, items_per_thread_for(rows_per_pass * kc * nc / 64),
                         [&](std::size_t band_begin, std::size_t band_end) {
                             update_rows(g, band_begin * rows_per_pass,
                                         std::min(g.m, band_end * rows_per_pass), k0, kc, n0, nc,
                                         panel.data());
                         });
        }
    }
}

#if !RIFTCO_TRANSFORMER_HAVE_BLAS
void gemm(const GemmArguments& arguments) {
    gemm_blocked(arguments);
}
void gemm_set_thread_count(std::size_t /*thread_count*/) {}
const char* gemm_implementation_name() noexcept {
    return "blocked fallback";
}
#endif

}  // namespace riftco_transformer::detail
