// The portable NF4 inner loops, the instruction-set dispatch and the drivers
// (nf4_kernels.hpp).

#include "core/backend/cpu/nf4_kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/parallel_for.hpp"

namespace riftco_transformer::detail {
namespace {

void portable_decode_range(const Nf4View& view, std::size_t begin, std::size_t count, float* out) {
    dequantize_nf4_range(view, begin, {out, count});
}

// Σ a_i·b_i in float with eight independent partial sums (so the compiler can vectorise it).
float dot(const float* a, const float* b, std::size_t count) noexcept {
    float partial[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        for (std::size_t lane = 0; lane < 8; ++lane) {
            partial[lane] += a[i + lane] * b[i + lane];
        }
    }
    float total = 0.0F;
    for (; i < count; ++i) {
        total += a[i] * b[i];
    }
    for (const float value : partial) {
        total += value;
    }
    return total;
}

// One W row at a time is decoded into a row buffer (I floats), then dotted with each x row.
void portable_gemv_forward(const Nf4View& view, const float* x, std::size_t rows,
                           std::size_t o_begin, std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    std::vector<float> row(in);
    for (std::size_t o = o_begin; o < o_end; ++o) {
        dequantize_nf4_range(view, o * in, row);
        for (std::size_t r = 0; r < rows; ++r) {
            y[r * out_features + o] = dot(row.data(), x + r * in, in);
        }
    }
}

// The columns [c_begin, c_end) of each W row are decoded, then added g[r, o] times to dx.
void portable_gemv_backward(const Nf4View& view, const float* g, std::size_t rows,
                            std::size_t c_begin, std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const std::size_t width = c_end - c_begin;
    std::vector<float> segment(width);
    for (std::size_t r = 0; r < rows; ++r) {
        std::fill(dx + r * in + c_begin, dx + r * in + c_end, 0.0F);
    }
    for (std::size_t o = 0; o < out_features; ++o) {
        dequantize_nf4_range(view, o * in + c_begin, segment);
        for (std::size_t r = 0; r < rows; ++r) {
            const float upstream = g[r * out_features + o];
            float* dx_row = dx + r * in + c_begin;
            for (std::size_t c = 0; c < width; ++c) {
                dx_row[c] += upstream * segment[c];
            }
        }
    }
}

const Nf4KernelSet portable_set{"portable", portable_decode_range, portable_gemv_forward,
                                portable_gemv_backward};

std::atomic<Nf4KernelChoice> kernel_choice{Nf4KernelChoice::Automatic};

// RIFTCO_TRANSFORMER_NF4_KERNEL, read once; unset or unknown means Automatic.
Nf4KernelChoice environment_choice() noexcept {
    static const Nf4KernelChoice choice = [] {
        const char* value = std::getenv("RIFTCO_TRANSFORMER_NF4_KERNEL");
        if (value == nullptr) {
            return Nf4KernelChoice::Automatic;
        }
        if (std::strcmp(value, "portable") == 0) {
            return Nf4KernelChoice::Portable;
        }
        if (std::strcmp(value, "avx2") == 0) {
            return Nf4KernelChoice::Avx2;
        }
        if (std::strcmp(value, "avx512") == 0) {
            return Nf4KernelChoice::Avx512;
        }
        return Nf4KernelChoice::Automatic;
    }();
    return choice;
}

// Panel of W rows (forward) or columns (backward): as wide as nf4_panel_floats allows, but
// at most ceil(limit / (2·threads)), so the panels decoded at one time never add up to more
// than about half of the matrix whatever the thread count; a multiple of 32 when it can be
// (the AVX-512 loops then run on whole 32-element chunks).
std::size_t panel_width(std::size_t other_dimension, std::size_t limit) {
    const std::size_t threads = std::max<std::size_t>(1, cpu_thread_count());
    std::size_t width = std::max<std::size_t>(1, nf4_panel_floats / other_dimension);
    width = std::min(width, std::max<std::size_t>(1, (limit + 2 * threads - 1) / (2 * threads)));
    if (width >= 32) {
        width -= width % 32;
    }
    return std::min(width, limit);
}

struct Scratch {
    explicit Scratch(std::size_t count) : values(std::make_unique_for_overwrite<float[]>(count)) {}
    std::unique_ptr<float[]> values;
};

}  // namespace

const Nf4KernelSet& portable_nf4_kernels() noexcept {
    return portable_set;
}

void set_nf4_kernel_choice(Nf4KernelChoice choice) noexcept {
    kernel_choice.store(choice);
}

const Nf4KernelSet* nf4_kernel_set_if_supported(Nf4KernelChoice choice) noexcept {
    switch (choice) {
        case Nf4KernelChoice::Avx512:
            return avx512_nf4_kernels();
        case Nf4KernelChoice::Avx2:
            return avx2_nf4_kernels();
        case Nf4KernelChoice::Portable:
            return &portable_set;
        case Nf4KernelChoice::Automatic:
            break;
    }
    return &nf4_kernel_set_for(Nf4KernelChoice::Automatic);
}

const Nf4KernelSet& nf4_kernel_set_for(Nf4KernelChoice choice) noexcept {
    // Each choice falls through to the next set down when the CPU or build lacks it.
    if (choice == Nf4KernelChoice::Automatic || choice == Nf4KernelChoice::Avx512) {
        if (const Nf4KernelSet* set = avx512_nf4_kernels(); set != nullptr) {
            return *set;
        }
    }
    if (choice != Nf4KernelChoice::Portable) {
        if (const Nf4KernelSet* set = avx2_nf4_kernels(); set != nullptr) {
            return *set;
        }
    }
    return portable_set;
}

const Nf4KernelSet& active_nf4_kernels() noexcept {
    const Nf4KernelChoice forced = kernel_choice.load();
    return nf4_kernel_set_for(forced != Nf4KernelChoice::Automatic ? forced : environment_choice());
}

void nf4_linear_forward(const Nf4View& view, const float* x, std::size_t rows, float* y) {
    const Nf4KernelSet& kernels = active_nf4_kernels();
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    if (rows <= nf4_direct_row_limit) {
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
    const std::size_t panel = panel_width(in, out_features);
    const std::size_t panel_count = (out_features + panel - 1) / panel;
    parallel_for(panel_count, 1, [&](std::size_t begin, std::size_t end) {
        Scratch scratch(panel * in);
        for (std::size_t p = begin; p < end; ++p) {
            const std::size_t o0 = p * panel;
            const std::size_t width = std::min(panel, out_features - o0);
            kernels.decode_range(view, o0 * in, width * in, scratch.values.get());
            GemmArguments g;
            g.transpose_b = true;
            g.m = rows;
            g.n = width;
            g.k = in;
            g.a = x;
            g.lda = in;
            g.b = scratch.values.get();
            g.ldb = in;
            g.c = y + o0;
            g.ldc = out_features;
            gemm(g);
        }
    });
}

void nf4_linear_input_backward(const Nf4View& view, const float* g, std::size_t rows, float* dx) {
    const Nf4KernelSet& kernels = active_nf4_kernels();
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    if (rows <= nf4_direct_row_limit) {
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
    const std::size_t panel = panel_width(out_features, in);
    const std::size_t panel_count = (in + panel - 1) / panel;
    parallel_for(panel_count, 1, [&](std::size_t begin, std::size_t end) {
        Scratch scratch(panel * out_features);
        for (std::size_t p = begin; p < end; ++p) {
            const std::size_t c0 = p * panel;
            const std::size_t width = std::min(panel, in - c0);
            for (std::size_t o = 0; o < out_features; ++o) {
                kernels.decode_range(view, o * in + c0, width, scratch.values.get() + o * width);
            }
            GemmArguments arguments;
            arguments.m = rows;
            arguments.n = width;
            arguments.k = out_features;
            arguments.a = g;
            arguments.lda = out_features;
            arguments.b = scratch.values.get();
            arguments.ldb = width;
            arguments.c = dx + c0;
            arguments.ldc = in;
            gemm(arguments);
        }
    });
}

std::string nf4_kernel_description(const Nf4Layout& layout, std::size_t rows, bool input_backward) {
    const std::string isa = active_nf4_kernels().name;
    if (rows <= nf4_direct_row_limit) {
        return isa + (input_backward ? " direct column-split gemv" : " direct row-split gemv") +
               " on packed codes";
    }
    if (input_backward) {
        return isa + " column-panel decode (" +
               std::to_string(panel_width(layout.out_features, layout.in_features)) +
               " columns) + " + gemm_implementation_name();
    }
    return isa + " row-panel decode (" +
           std::to_string(panel_width(layout.in_features, layout.out_features)) + " rows) + " +
           gemm_implementation_name();
}

}  // namespace riftco_transformer::detail
