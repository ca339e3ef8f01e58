// The portable NF4 inner loops and the instruction-set dispatch (nf4_kernels.hpp); the
// drivers are packed_linear_driver.hpp's.

#include "core/backend/cpu/nf4_kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/backend/cpu/packed_linear_driver.hpp"

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

Nf4KernelChoice requested_nf4_kernel_choice() noexcept {
    const Nf4KernelChoice forced = kernel_choice.load();
    return forced != Nf4KernelChoice::Automatic ? forced : environment_choice();
}

const Nf4KernelSet& active_nf4_kernels() noexcept {
    return nf4_kernel_set_for(requested_nf4_kernel_choice());
}

void nf4_linear_forward(const Nf4View& view, const float* x, std::size_t rows, float* y) {
    packed_linear_forward(active_nf4_kernels(), view, x, rows, y);
}

void nf4_linear_input_backward(const Nf4View& view, const float* g, std::size_t rows, float* dx) {
    packed_linear_input_backward(active_nf4_kernels(), view, g, rows, dx);
}

std::string nf4_kernel_description(const PackedLayout& layout, std::size_t rows,
                                   bool input_backward) {
    return packed_kernel_description(active_nf4_kernels().name, layout, rows, input_backward);
}

}  // namespace riftco_transformer::detail
