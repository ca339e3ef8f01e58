// CPU softmax kernels: three passes per row (max, exp and sum, normalise), threaded over rows.

#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

[[noreturn]] void throw_bad_slice(const char* operation, std::size_t slice) {
    std::ostringstream message;
    message << operation << ": slice " << slice
            << " contains NaN or +inf, or has no finite value (every entry is -inf)";
    throw std::domain_error(message.str());
}

// y[0:n] = softmax(scale · x[0:n]); false (and y untouched) if the row is rejected.
bool softmax_row(const float* x, std::size_t n, float scale, float* y) {
    if (row_has_nan_or_positive_infinity(x, n)) {
        return false;
    }
    const float max = row_max(x, n);
    if (max == negative_infinity) {
        return false;
    }
    // scale·(x − max) <= 0 never overflows, even where scale·x alone would.
    for (std::size_t j = 0; j < n; ++j)
        y[j] = fast_exp(scale * (x[j] - max));
    const auto inverse = static_cast<float>(1.0 / row_sum(y, n));
    for (std::size_t j = 0; j < n; ++j)
        y[j] *= inverse;
    return true;
}

// dx[0:n] = scale · p ⊙ (g − Σ g ⊙ p)
void softmax_backward_row(const float* p, const float* g, std::size_t n, float scale, float* dx) {
    const auto dot = static_cast<float>(row_dot(g, p, n));
    for (std::size_t j = 0; j < n; ++j)
        dx[j] = scale * p[j] * (g[j] - dot);
}

// x viewed as [outer, extent, inner] for a reduction over `axis`.
struct AxisView {
    std::size_t outer = 1;
    std::size_t extent = 1;
    std::size_t inner = 1;
};

AxisView view_of(const Tensor& x, std::size_t axis) {
    AxisView view;
    for (std::size_t d = 0; d < axis; ++d)
        view.outer *= x.shape()[d];
    view.extent = x.shape()[axis];
    for (std::size_t d = axis + 1; d < x.rank(); ++d)
        view.inner *= x.shape()[d];
    return view;
}

}  // namespace

void CpuSoftmax::softmax(const Tensor& x, std::size_t axis, Tensor& out) const {
    const AxisView view = view_of(x, axis);
    const float* src = cpu_data(x);
    float* dst = cpu_output(out);
    FirstFailingRow failure;
    // Each slice is gathered into a contiguous row (a no-op copy when inner == 1).
    const std::size_t slices = view.outer * view.inner;
    parallel_for(slices, items_per_thread_for(4 * view.extent),
                 [&](std::size_t begin, std::size_t end) {
                     std::vector<float> row_in;
                     std::vector<float> row_out;
                     if (view.inner != 1) {
                         row_in.resize(view.extent);
                         row_out.resize(view.extent);
                     }
                     for (std::size_t slice = begin; slice < end; ++slice) {
                         const std::size_t o = slice / view.inner;
                         const std::size_t i = slice % view.inner;
                         const std::size_t base = o * view.extent * view.inner + i;
                         if (view.inner == 1) {
                             if (!softmax_row(src + base, view.extent, 1.0F, dst + base))
                                 failure.record(slice);
                             continue;
                         }
                         for (std::size_t e = 0; e < view.extent; ++e)
                             row_in[e] = src[base + e * view.inner];
                         if (!softmax_row(row_in.data(), view.extent, 1.0F, row_out.data())) {
                             failure.record(slice);
                             continue;
                         }
                         for (std::size_t e = 0; e < view.extent; ++e)
                             dst[base + e * view.inner] = row_out[e];
                     }
                 });
    if (failure.any())
        throw_bad_slice("softmax", failure.row());
}

void CpuSoftmax::softmax_backward(const Tensor& probabilities, const Tensor& upstream,
                                  std::size_t axis, Tensor& out) const {
    const AxisView view = view_of(probabilities, axis);
    const float* p = cpu_data(probabilities);
    const float* g = cpu_data(upstream);
    float* dx = cpu_output(out);
    const std::size_t slices = view.outer * view.inner;
    parallel_for(
        slices, items_per_thread_for(3 * view.extent), [&](std::size_t begin, std::size_t end) {
            std::vector<float> p_row(view.inner == 1 ? 0 : view.extent);
            std::vector<float> g_row(p_row.size());
            std::vector<float> dx_row(p_row.size());
            for (std::size_t slice = begin; slice < end; ++slice) {
                const std::size_t o = slice / view.inner;
                const std::size_t i = slice % view.inner;
                const std::size_t base = o * view.extent * view.inner + i;
                if (view.inner == 1) {
                    softmax_backward_row(p + base, g + base, view.extent, 1.0F, dx + base);
                    continue;
                }
                for (std::size_t e = 0; e < view.extent; ++e) {
                    p_row[e] = p[base + e * view.inner];
                    g_row[e] = g[base + e * view.inner];
                }
                softmax_backward_row(p_row.data(), g_row.data(), view.extent, 1.0F, dx_row.data());
                for (std::size_t e = 0; e < view.extent; ++e)
                    dx[base + e * view.inner] = dx_row[e];
            }
        });
}

void CpuSoftmax::causal_softmax(const Tensor& scores, float scale, Tensor& out) const {
    // scores [B,H,T,T] -> rows of length T; query t sees keys 0..t.
    const std::size_t t_count = scores.shape()[3];
    const std::size_t rows = scores.numel() / t_count;
    const float* src = cpu_data(scores);
    float* dst = cpu_output(out);
    FirstFailingRow failure;
    parallel_for(rows, items_per_thread_for(2 * t_count), [&](std::size_t begin, std::size_t end) {
        for (std::size_t row = begin; row < end; ++row) {
            const std::size_t visible = row % t_count + 1;
            const float* x = src + row * t_count;
            float* y = dst + row * t_count;
            if (!softmax_row(x, visible, scale, y)) {
                failure.record(row);
                continue;
            }
            std::fill(y + visible, y + t_count, 0.0F);
        }
    });
    if (failure.any())
        throw_bad_slice("causal_softmax", failure.row());
}

void CpuSoftmax::causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream,
                                         float scale, Tensor& out) const {
    const std::size_t t_count = probabilities.shape()[3];
    const std::size_t rows = probabilities.numel() / t_count;
    const float* p = cpu_data(probabilities);
    const float* g = cpu_data(upstream);
    float* dx = cpu_output(out);
    parallel_for(rows, items_per_thread_for(2 * t_count), [&](std::size_t begin, std::size_t end) {
        for (std::size_t row = begin; row < end; ++row) {
            const std::size_t visible = row % t_count + 1;
            const std::size_t offset = row * t_count;
            softmax_backward_row(p + offset, g + offset, visible, scale, dx + offset);
            std::fill(dx + offset + visible, dx + offset + t_count, 0.0F);
        }
    });
}

}  // namespace riftco_transformer::detail
