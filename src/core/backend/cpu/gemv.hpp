#pragma once
// Few-row products against a row-major right operand, C[m,n] = A[m,k]·B[n,k]ᵀ with m <= 8:
// the shape of every projection in a decode step (one row per active request), where the
// product is bound by the bandwidth of streaming B once. A BLAS GEMM blocks and packs for
// reuse that these shapes do not have; this kernel reads each B row exactly once, dotting it
// with all m rows of A from registers, threaded over B's rows (each thread streams a contiguous
// part, prefetched ahead; idle threads take over the rest of a slower one's part). Each output
// is one thread's fixed-order sum, so results do not depend on the thread count.

#include <cstddef>
#include <span>

#include "core/backend/cpu/gemm.hpp"

namespace riftco_transformer::detail {

inline constexpr std::size_t gemv_max_rows = 8;

// True when g has the shape above (no transpose of A, B transposed, 1 <= m <= gemv_max_rows,
// dense A rows) and enough work (n·k >= 2^16) for the kernel to pay.
[[nodiscard]] bool gemv_applies(const GemmArguments& g) noexcept;

// The inner loops: Detected is the best this processor runs (AVX-512, else AVX2+FMA, else
// portable C++); tests name the others to check each against the oracle.
enum class GemvKernel { Detected, Portable, Avx2, Avx512 };

// True when this processor can run `kernel`.
[[nodiscard]] bool gemv_kernel_supported(GemvKernel kernel) noexcept;

// Computes g (gemv_applies(g) must hold; `kernel` supported). Threaded on the shared pool
// outside a parallel region.
void gemv_rows(const GemmArguments& g, GemvKernel kernel = GemvKernel::Detected);

// Several such products in one threaded pass (gemv_applies must hold for each, and all share
// m): the projections of one input (q, k and v; a gate and an up projection) take one
// fork/join instead of one each. Every output gets exactly the sum gemv_rows gives it.
void gemv_rows_many(std::span<const GemmArguments> problems,
                    GemvKernel kernel = GemvKernel::Detected);

// Which inner loop Detected runs here: "avx512", "avx2" or "portable".
[[nodiscard]] const char* gemv_kernel_name() noexcept;

}  // namespace riftco_transformer::detail
