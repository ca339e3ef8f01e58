#pragma once
// The drivers of every packed-weight product on the CPU (NF4 in nf4_kernels.hpp, the GGUF
// block formats in block_kernels.hpp): threads, panels and the GEMM seam, over a kernel set
// that supplies the format's inner loops. A kernel set has
//   decode_range(view, begin, count, out)        out[j] = deq(W)_flat[begin + j]
//   gemv_forward(view, x, rows, o_begin, o_end, y)   rows <= 4
//   gemv_backward(view, g, rows, c_begin, c_end, dx) rows <= 4, c_begin a multiple of 32
// and a view has a `layout` (PackedLayout).
//
// - few rows (R <= packed_direct_row_limit, decoding): matrix-vector products straight on the
//   packed codes, threaded over output rows (forward) or 32-column chunks (backward);
// - many rows (prefill, training): a bounded panel of W is decoded into per-thread float32
//   scratch (<= packed_panel_floats, and narrow enough that the panels of all threads together
//   stay under about half the matrix) and fed to the GEMM seam, one single-threaded GEMM per
//   panel inside each thread. The forward uses row panels of W (K = I stays whole), the input
//   backward column panels (K = O stays whole), so no output is ever accumulated over split
//   reductions.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>

#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/packed_linear_limits.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/quantized_storage.hpp"

namespace riftco_transformer::detail {

// Panel of W rows (forward) or columns (backward): as wide as packed_panel_floats allows, but
// at most ceil(limit / (2·threads)), so the panels decoded at one time never add up to more
// than about half of the matrix whatever the thread count; a multiple of 32 when it can be
// (the vector loops then run on whole 32-element chunks).
[[nodiscard]] inline std::size_t packed_panel_width(std::size_t other_dimension,
                                                    std::size_t limit) {
    const std::size_t threads = std::max<std::size_t>(1, cpu_thread_count());
    std::size_t width = std::max<std::size_t>(1, packed_panel_floats / other_dimension);
    width = std::min(width, std::max<std::size_t>(1, (limit + 2 * threads - 1) / (2 * threads)));
    if (width >= 32) {
        width -= width % 32;
    }
    return std::min(width, limit);
}

// x [R, I] -> y [R, O] = x·deq(W)ᵀ
template <typename KernelSet, typename View>
void packed_linear_forward(const KernelSet& kernels, const View& view, const float* x,
                           std::size_t rows, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    if (rows <= packed_direct_row_limit) {
        // Threads over W rows; each runs every group of up to 4 x rows over its W rows.
        parallel_for(
            out_features, items_per_thread_for(in * rows), [&](std::size_t begin, std::size_t end) {
                for (std::size_t r = 0; r < rows; r += 4) {
                    kernels.gemv_forward(view, x + r * in, std::min<std::size_t>(4, rows - r),
                                         begin, end, y + r * out_features);
                }
            });
        return;
    }
    // Row panels of W: Y[:, o0:o0+P] = X · deq(W[o0:o0+P, :])ᵀ, one single-threaded GEMM per
    // panel inside each thread (K = I whole).
    const std::size_t panel = packed_panel_width(in, out_features);
    const std::size_t panel_count = (out_features + panel - 1) / panel;
    parallel_for(panel_count, 1, [&](std::size_t begin, std::size_t end) {
        const auto scratch = std::make_unique_for_overwrite<float[]>(panel * in);
        for (std::size_t p = begin; p < end; ++p) {
            const std::size_t o0 = p * panel;
            const std::size_t width = std::min(panel, out_features - o0);
            kernels.decode_range(view, o0 * in, width * in, scratch.get());
            GemmArguments g;
            g.transpose_b = true;
            g.m = rows;
            g.n = width;
            g.k = in;
            g.a = x;
            g.lda = in;
            g.b = scratch.get();
            g.ldb = in;
            g.c = y + o0;
            g.ldc = out_features;
            gemm(g);
        }
    });
}

// g [R, O] -> dx [R, I] = g·deq(W)
template <typename KernelSet, typename View>
void packed_linear_input_backward(const KernelSet& kernels, const View& view, const float* g,
                                  std::size_t rows, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    if (rows <= packed_direct_row_limit) {
        // Threads over 32-column chunks of dX; each reads its columns of every W row.
        const std::size_t chunks = (in + 31) / 32;
        parallel_for(chunks, items_per_thread_for(out_features * 32 * rows),
                     [&](std::size_t begin, std::size_t end) {
                         const std::size_t c_begin = begin * 32;
                         const std::size_t c_end = std::min(in, end * 32);
                         for (std::size_t r = 0; r < rows; r += 4) {
                             kernels.gemv_backward(view, g + r * out_features,
                                                   std::min<std::size_t>(4, rows - r), c_begin,
                                                   c_end, dx + r * in);
                         }
                     });
        return;
    }
    // Column panels of W: dX[:, c0:c0+P] = G · deq(W[:, c0:c0+P]) (K = O whole).
    const std::size_t panel = packed_panel_width(out_features, in);
    const std::size_t panel_count = (in + panel - 1) / panel;
    parallel_for(panel_count, 1, [&](std::size_t begin, std::size_t end) {
        const auto scratch = std::make_unique_for_overwrite<float[]>(panel * out_features);
        for (std::size_t p = begin; p < end; ++p) {
            const std::size_t c0 = p * panel;
            const std::size_t width = std::min(panel, in - c0);
            for (std::size_t o = 0; o < out_features; ++o) {
                kernels.decode_range(view, o * in + c0, width, scratch.get() + o * width);
            }
            GemmArguments arguments;
            arguments.m = rows;
            arguments.n = width;
            arguments.k = out_features;
            arguments.a = g;
            arguments.lda = out_features;
            arguments.b = scratch.get();
            arguments.ldb = width;
            arguments.c = dx + c0;
            arguments.ldc = in;
            gemm(arguments);
        }
    });
}

// What runs for R rows, e.g. "avx2 direct row-split gemv on packed codes" or
// "avx512 row-panel decode (64 rows) + onednn ... sgemm" (it starts with the set's name).
[[nodiscard]] inline std::string packed_kernel_description(const std::string& isa,
                                                           const PackedLayout& layout,
                                                           std::size_t rows, bool input_backward) {
    if (rows <= packed_direct_row_limit) {
        return isa + (input_backward ? " direct column-split gemv" : " direct row-split gemv") +
               " on packed codes";
    }
    if (input_backward) {
        return isa + " column-panel decode (" +
               std::to_string(packed_panel_width(layout.out_features, layout.in_features)) +
               " columns) + " + gemm_implementation_name();
    }
    return isa + " row-panel decode (" +
           std::to_string(packed_panel_width(layout.in_features, layout.out_features)) +
           " rows) + " + gemm_implementation_name();
}

}  // namespace riftco_transformer::detail
