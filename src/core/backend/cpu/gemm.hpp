#pragma once
// The GEMM seam: C[M,N] = op(A)·op(B) (beta = 0) in row-major storage, where op transposes
// when asked. One implementation is linked, chosen at configure time (RIFTCO_TRANSFORMER_GEMM):
// oneDNN's dnnl_sgemm, OpenBLAS's cblas_sgemm, or the blocked fallback.

#include <cstddef>

namespace riftco_transformer::detail {

struct GemmArguments {
    bool transpose_a = false;
    bool transpose_b = false;
    std::size_t m = 0;
    std::size_t n = 0;
    std::size_t k = 0;
    const float* a = nullptr;  // op(A) is [m,k]; leading dimension lda
    std::size_t lda = 0;
    const float* b = nullptr;  // op(B) is [k,n]; leading dimension ldb
    std::size_t ldb = 0;
    float* c = nullptr;  // [m,n]; leading dimension ldc
    std::size_t ldc = 0;
};

// Multithreaded on the shared pool when called outside a parallel region.
void gemm(const GemmArguments& arguments);

// The portable blocked kernel (always compiled: also the oracle for the BLAS path's tests).
void gemm_blocked(const GemmArguments& arguments);

// Tells the BLAS how many threads it may use (no-op for the fallback).
void gemm_set_thread_count(std::size_t thread_count);

// Which library and kernel family runs: "onednn 2.6.3 jit sgemm (isa avx512_core)",
// "openblas <config> (<corename> kernels)" or "blocked fallback".
[[nodiscard]] const char* gemm_implementation_name() noexcept;

}  // namespace riftco_transformer::detail
