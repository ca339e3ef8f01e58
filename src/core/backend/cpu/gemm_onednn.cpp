// GEMM through oneDNN's sgemm (dnnl_sgemm, row-major).
//
// Why oneDNN: its CPU dispatch reads the processor's feature bits (AVX-512, AVX2, ...) and
// JIT-compiles a kernel for them, so a processor model it has never heard of still gets the
// widest kernel its features allow. OpenBLAS's dynamic dispatch maps family/model numbers to
// a core table instead, and Debian's 0.3.21 falls back to its generic Prescott kernel (5x
// slower) on CPUs newer than its table unless the user sets OPENBLAS_CORETYPE.

#include <dnnl.h>
#include <omp.h>

#include <atomic>
#include <climits>
#include <stdexcept>
#include <string>

#include "core/backend/cpu/gemm.hpp"

namespace riftco_transformer::detail {
namespace {

std::atomic<int> gemm_threads{0};  // 0: oneDNN's default (the OpenMP ICV)

dnnl_dim_t as_dim(std::size_t value) {
    if (value > static_cast<std::size_t>(INT64_MAX)) {
        throw std::overflow_error("matmul: dimension " + std::to_string(value) +
                                  " exceeds the GEMM integer range");
    }
    return static_cast<dnnl_dim_t>(value);
}

// The instruction-set family of the f32 sgemm kernels oneDNN JIT-generates here: the
// widest of its f32 families (avx512_core, avx2, avx, sse41) within the ISA oneDNN itself
// detected on this CPU (dnnl_get_effective_cpu_isa, which also honours ONEDNN_MAX_CPU_ISA).
// oneDNN's ISA values are bit sets: a family is available when all its bits are.
const char* jit_isa() noexcept {
    const auto effective = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const auto has = [effective](dnnl_cpu_isa_t isa) {
        const auto bits = static_cast<unsigned>(isa);
        return (effective & bits) == bits;
    };
    if (has(dnnl_cpu_isa_avx512_core)) {
        return "avx512_core";
    }
    if (has(dnnl_cpu_isa_avx2)) {
        return "avx2";
    }
    if (has(dnnl_cpu_isa_avx)) {
        return "avx";
    }
    if (has(dnnl_cpu_isa_sse41)) {
        return "sse41";
    }
    return "reference (no JIT ISA)";
}

}  // namespace

void gemm(const GemmArguments& g) {
    // oneDNN's OpenMP runtime sizes its team from the calling thread's ICV; outside a
    // parallel region, give it the pool size (inside one it runs single-threaded).
    const int wanted = gemm_threads.load(std::memory_order_relaxed);
    if (wanted > 0 && !omp_in_parallel() && omp_get_max_threads() != wanted) {
        omp_set_num_threads(wanted);
    }
    const dnnl_status_t status = dnnl_sgemm(
        g.transpose_a ? 'T' : 'N', g.transpose_b ? 'T' : 'N', as_dim(g.m), as_dim(g.n), as_dim(g.k),
        1.0F, g.a, as_dim(g.lda), g.b, as_dim(g.ldb), 0.0F, g.c, as_dim(g.ldc));
    if (status != dnnl_success) {
        throw std::runtime_error("matmul: oneDNN sgemm failed with status " +
                                 std::to_string(static_cast<int>(status)));
    }
}

void gemm_set_thread_count(std::size_t thread_count) {
    gemm_threads.store(thread_count > static_cast<std::size_t>(INT_MAX)
                           ? INT_MAX
                           : static_cast<int>(thread_count));
}

const char* gemm_implementation_name() noexcept {
    static const std::string name = [] {
        const dnnl_version_t* version = dnnl_version();
        return "onednn " + std::to_string(version->major) + "." + std::to_string(version->minor) +
               "." + std::to_string(version->patch) + " jit sgemm (isa " + jit_isa() + ")";
    }();
    return name.c_str();
}

}  // namespace riftco_transformer::detail
