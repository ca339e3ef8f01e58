// GEMM through OpenBLAS (CBLAS interface).

#include <cblas.h>

#include <climits>
#include <stdexcept>

#include "core/backend/cpu/gemm.hpp"

namespace riftco_transformer::detail {
namespace {
blasint as_blas_int(std::size_t value) {
    if (value > static_cast<std::size_t>(INT_MAX)) {
        throw std::overflow_error("matmul: dimension " + std::to_string(value) +
                                  " exceeds the BLAS integer range");
    }
    return static_cast<blasint>(value);
}
}  // namespace

void gemm(const GemmArguments& g) {
    cblas_sgemm(CblasRowMajor, g.transpose_a ? CblasTrans : CblasNoTrans,
                g.transpose_b ? CblasTrans : CblasNoTrans, as_blas_int(g.m), as_blas_int(g.n),
                as_blas_int(g.k), 1.0F, g.a, as_blas_int(g.lda), g.b, as_blas_int(g.ldb), 0.0F, g.c,
                as_blas_int(g.ldc));
}

void gemm_set_thread_count(std::size_t thread_count) {
    openblas_set_num_threads(static_cast<int>(thread_count));
}

const char* gemm_implementation_name() noexcept {
    return "openblas";
}

}  // namespace riftco_transformer::detail
