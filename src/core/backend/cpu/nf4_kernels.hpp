#pragma once
// CPU kernels for packed NF4 weights W [O, I] (flat row-major codes, blocks of B elements).
// They decode nibbles themselves; no float32 copy of the whole matrix is ever made.
//
// The drivers (threads, panels, GEMM) are packed_linear_driver.hpp's; each inner loop has a
// portable, an AVX2 + FMA and an AVX-512 build (the vector ones are compiled with target
// attributes and chosen at run time, so a build without -march=native still uses them).

#include <cstddef>
#include <string>

#include "core/backend/cpu/packed_linear_limits.hpp"
#include "core/quantized/nf4_format.hpp"

namespace riftco_transformer::detail {

inline constexpr std::size_t nf4_direct_row_limit = packed_direct_row_limit;
inline constexpr std::size_t nf4_panel_floats = packed_panel_floats;

// The inner loops one instruction set provides.
struct Nf4KernelSet {
    const char* name;
    // out[j] = deq(W)_flat[begin + j] for j < count.
    void (*decode_range)(const Nf4View& view, std::size_t begin, std::size_t count, float* out);
    // y[r, o] = Σ_i x[r, i]·deq(W)[o, i] for r < rows (<= 4), o in [o_begin, o_end);
    // x [rows, I], y [rows, O] row-major.
    void (*gemv_forward)(const Nf4View& view, const float* x, std::size_t rows, std::size_t o_begin,
                         std::size_t o_end, float* y);
    // dx[r, c] = Σ_o g[r, o]·deq(W)[o, c] for r < rows (<= 4), c in [c_begin, c_end);
    // g [rows, O], dx [rows, I] row-major; c_begin even.
    void (*gemv_backward)(const Nf4View& view, const float* g, std::size_t rows,
                          std::size_t c_begin, std::size_t c_end, float* dx);
};

[[nodiscard]] const Nf4KernelSet& portable_nf4_kernels() noexcept;
// Null when this build or this processor has no AVX-512 (avx512f) path.
[[nodiscard]] const Nf4KernelSet* avx512_nf4_kernels() noexcept;
// Null when this build or this processor has no AVX2 + FMA path.
[[nodiscard]] const Nf4KernelSet* avx2_nf4_kernels() noexcept;

// Which set runs. Automatic: AVX-512 when the CPU has it, else AVX2 + FMA when it has those,
// else the portable loops. A forced set (this hook, for tests and benchmarks; or else
// RIFTCO_TRANSFORMER_NF4_KERNEL=avx512|avx2|portable|auto in the environment, read once, other
// values meaning auto) that the CPU or build lacks is never run: the next set down that it has
// runs instead (avx512 -> avx2 -> portable). nf4_kernel_set_for tells which set that is, and
// active_nf4_kernels().name which set runs now.
enum class Nf4KernelChoice { Automatic, Avx512, Avx2, Portable };
void set_nf4_kernel_choice(Nf4KernelChoice choice) noexcept;
// The set a choice resolves to on this CPU (ignores the hook and the environment).
[[nodiscard]] const Nf4KernelSet& nf4_kernel_set_for(Nf4KernelChoice choice) noexcept;
// Null when the CPU or build lacks that set (Automatic and Portable always have one).
[[nodiscard]] const Nf4KernelSet* nf4_kernel_set_if_supported(Nf4KernelChoice choice) noexcept;
[[nodiscard]] const Nf4KernelSet& active_nf4_kernels() noexcept;
// The choice in force: the hook's when it forces one, else the environment's.
[[nodiscard]] Nf4KernelChoice requested_nf4_kernel_choice() noexcept;

// The drivers (threads, panels, GEMM).
// x [R, I] -> y [R, O] = x·deq(W)ᵀ
void nf4_linear_forward(const Nf4View& view, const float* x, std::size_t rows, float* y);
// g [R, O] -> dx [R, I] = g·deq(W)
void nf4_linear_input_backward(const Nf4View& view, const float* g, std::size_t rows, float* dx);

// What runs for R rows, e.g. "avx2 direct row-split gemv on packed codes" or
// "avx512 row-panel decode (64 rows) + onednn ... sgemm" (it starts with the set's name).
[[nodiscard]] std::string nf4_kernel_description(const PackedLayout& layout, std::size_t rows,
                                                 bool input_backward);

}  // namespace riftco_transformer::detail
