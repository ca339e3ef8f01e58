#pragma once
// The CPU backend's one shared worker pool (OpenMP; OpenBLAS uses the same threads).
// Its size comes from RIFTCO_TRANSFORMER_NUM_THREADS (a positive integer) and defaults to
// every hardware thread.

#include <cstddef>
#include <string>

namespace riftco_transformer {

// Number of threads CPU kernels and the BLAS may use. Throws std::invalid_argument naming
// the variable and its value when RIFTCO_TRANSFORMER_NUM_THREADS is set but not a positive
// integer.
[[nodiscard]] std::size_t cpu_thread_count();

// Overrides the pool size for the whole process (0 is std::invalid_argument).
void set_cpu_thread_count(std::size_t thread_count);

// What the CPU backend runs, for reports: "gemm=<library and kernel family>; packed=<the
// instruction set of the packed-weight kernels per format>; threads=<n>", e.g.
// "gemm=onednn 2.6.3 jit sgemm (isa avx512_core); packed=nf4 avx512,
// q8_0/q4_0/q4_1/q5_0/q4_k/q5_k/q6_k/f16/bf16 avx512; threads=2".
[[nodiscard]] std::string cpu_info();

}  // namespace riftco_transformer
