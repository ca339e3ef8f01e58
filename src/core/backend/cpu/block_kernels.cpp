// The portable inner loops of the GGUF block kernels, their dispatch and drivers
// (block_kernels.hpp).

#include "core/backend/cpu/block_kernels.hpp"

#include <algorithm>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "core/backend/cpu/packed_linear_driver.hpp"

namespace riftco_transformer::detail {
namespace {

void portable_decode_range(const BlockView& view, std::size_t begin, std::size_t count,
                           float* out) {
    dequantize_block_range(view, begin, {out, count});
}

// y[r, o] = Σ_i x[r, i]·w[o, i]: each block decoded once, eight partial sums per row.
void portable_gemv_forward(const BlockView& view, const float* x, std::size_t rows,
                           std::size_t o_begin, std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    float w[gguf_block_elements];
    for (std::size_t o = o_begin; o < o_end; ++o) {
        float partial[4][8] = {};
        for (std::size_t c = 0; c < in; c += gguf_block_elements) {
            decode_block_chunk(view.layout.format, view.block(o, c), view.chunk(c), w);
            for (std::size_t r = 0; r < rows; ++r) {
                const float* xr = x + r * in + c;
                for (std::size_t j = 0; j < gguf_block_elements; ++j) {
                    partial[r][j % 8] += w[j] * xr[j];
                }
            }
        }
        for (std::size_t r = 0; r < rows; ++r) {
            float total = 0.0F;
            for (const float value : partial[r]) {
                total += value;
            }
            y[r * out_features + o] = total;
        }
    }
}

// dx[r, c] = Σ_o g[r, o]·w[o, c] for the 32-column blocks of [c_begin, c_end).
void portable_gemv_backward(const BlockView& view, const float* g, std::size_t rows,
                            std::size_t c_begin, std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    for (std::size_t r = 0; r < rows; ++r) {
        std::fill(dx + r * in + c_begin, dx + r * in + c_end, 0.0F);
    }
    float w[gguf_block_elements];
    for (std::size_t o = 0; o < out_features; ++o) {
        for (std::size_t c = c_begin; c < c_end; c += gguf_block_elements) {
            decode_block_chunk(view.layout.format, view.block(o, c), view.chunk(c), w);
            for (std::size_t r = 0; r < rows; ++r) {
                const float upstream = g[r * out_features + o];
                float* dx_row = dx + r * in + c;
                for (std::size_t j = 0; j < gguf_block_elements; ++j) {
                    dx_row[j] += upstream * w[j];
                }
            }
        }
    }
}

const BlockKernelSet portable_set{"portable", portable_decode_range, portable_gemv_forward,
                                  portable_gemv_backward};

}  // namespace

bool cpu_has_f16c() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned eax = 0;
    unsigned ebx = 0;
    unsigned ecx = 0;
    unsigned edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1U << 29U)) != 0;
#else
    return false;
#endif
}

const BlockKernelSet& portable_block_kernels() noexcept {
    return portable_set;
}

const BlockKernelSet& block_kernel_set_for(Nf4KernelChoice choice) noexcept {
    if (choice == Nf4KernelChoice::Automatic || choice == Nf4KernelChoice::Avx512) {
        if (const BlockKernelSet* set = avx512_block_kernels(); set != nullptr) {
            return *set;
        }
    }
    if (choice != Nf4KernelChoice::Portable) {
        if (const BlockKernelSet* set = avx2_block_kernels(); set != nullptr) {
            return *set;
        }
    }
    return portable_set;
}

const BlockKernelSet& active_block_kernels() noexcept {
    return block_kernel_set_for(requested_nf4_kernel_choice());
}

void block_linear_forward(const BlockView& view, const float* x, std::size_t rows, float* y) {
    packed_linear_forward(active_block_kernels(), view, x, rows, y);
}

void block_linear_input_backward(const BlockView& view, const float* g, std::size_t rows,
                                 float* dx) {
    packed_linear_input_backward(active_block_kernels(), view, g, rows, dx);
}

std::string block_kernel_description(const PackedLayout& layout, std::size_t rows,
                                     bool input_backward) {
    return packed_kernel_description(std::string(active_block_kernels().name) + " " +
                                         std::string(weight_format_name(layout.format)),
                                     layout, rows, input_backward);
}

}  // namespace riftco_transformer::detail
