#pragma once
// CPU kernels for weights in the GGUF block formats (q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k;
// quantized_weight.hpp gives the layouts). They work in 32-element chunks (a K-format block
// holds eight). They read the blocks themselves; no float32 copy of the whole matrix is
// ever made. The drivers (threads, panels, GEMM) are packed_linear_driver.hpp's; each inner
// loop has a portable, an AVX2 + FMA + F16C and an AVX-512 build, chosen at run time.
//
// Every build decodes a weight exactly as dequantize_block_range does (block_decode.hpp's
// rounding: q8_0, q4_0, q5_0: d·q; q4_1: d·n then + m; q4_k, q5_k: (d·sc)·q then − dmin·m;
// q6_k: (d·sc)·q), so the panel path feeds the GEMM the very values of the
// float32 dequantization; the matrix-vector loops then add the products in their own order.

#include <cstddef>
#include <string>

#include "core/backend/cpu/nf4_kernels.hpp"
#include "core/backend/cpu/packed_linear_limits.hpp"
#include "core/quantized/block_format.hpp"

namespace riftco_transformer::detail {

// The inner loops one instruction set provides (packed_linear_driver.hpp's contract).
struct BlockKernelSet {
    const char* name;
    void (*decode_range)(const BlockView& view, std::size_t begin, std::size_t count, float* out);
    void (*gemv_forward)(const BlockView& view, const float* x, std::size_t rows,
                         std::size_t o_begin, std::size_t o_end, float* y);
    void (*gemv_backward)(const BlockView& view, const float* g, std::size_t rows,
                          std::size_t c_begin, std::size_t c_end, float* dx);
};

[[nodiscard]] const BlockKernelSet& portable_block_kernels() noexcept;
// Whether the processor converts binary16 (CPUID leaf 1, ECX bit 29: F16C), which the vector
// sets use for the block scales. (Clang's __builtin_cpu_supports has no "f16c".)
[[nodiscard]] bool cpu_has_f16c() noexcept;
// Null when this build or this processor lacks avx512f (with f16c).
[[nodiscard]] const BlockKernelSet* avx512_block_kernels() noexcept;
// Null when this build or this processor lacks AVX2 + FMA + F16C.
[[nodiscard]] const BlockKernelSet* avx2_block_kernels() noexcept;

// The set a choice resolves to on this CPU (the NF4 choice: set_nf4_kernel_choice and
// RIFTCO_TRANSFORMER_NF4_KERNEL pick the instruction set of every packed format), falling
// through avx512 -> avx2 -> portable where the CPU or build lacks one.
[[nodiscard]] const BlockKernelSet& block_kernel_set_for(Nf4KernelChoice choice) noexcept;
[[nodiscard]] const BlockKernelSet& active_block_kernels() noexcept;

// x [R, I] -> y [R, O] = x·deq(W)ᵀ
void block_linear_forward(const BlockView& view, const float* x, std::size_t rows, float* y);
// g [R, O] -> dx [R, I] = g·deq(W)
void block_linear_input_backward(const BlockView& view, const float* g, std::size_t rows,
                                 float* dx);
[[nodiscard]] std::string block_kernel_description(const PackedLayout& layout, std::size_t rows,
                                                   bool input_backward);

}  // namespace riftco_transformer::detail
