// GEMM through OpenBLAS (CBLAS interface).

#include <cblas.h>

#include <climits>
#include <stdexcept>
#include <string>

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

// "openblas <config> (<corename> kernels)": the kernel family OpenBLAS's dispatch chose, so a
// generic fallback (Prescott, on CPUs newer than its model table) shows in every report.
const char* gemm_implementation_name() noexcept {
    static const std::string name = std::string("openblas ") + openblas_get_config() + " (" +
                                    openblas_get_corename() + " kernels)";
    return name.c_str();
}

}  // namespace riftco_transformer::detail
