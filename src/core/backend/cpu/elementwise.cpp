// CPU elementwise kernels: one vectorisable loop per operation, threaded over chunks.

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr float inverse_sqrt_two = 0.707106781186547524F;

// Applies `kernel(begin, end)` over [0, count) in parallel chunks.
template <typename Kernel>
void for_chunks(std::size_t count, Kernel&& kernel) {
    parallel_for(count, items_per_thread_for(1), kernel);
}

// The first index in [0, count) where `bad` holds, or count.
template <typename Predicate>
std::size_t first_violation(const float* values, std::size_t count, Predicate bad) {
    for (std::size_t i = 0; i < count; ++i) {
        if (bad(values[i])) {
            return i;
        }
    }
    return count;
}

[[noreturn]] void throw_domain(const char* operation, const char* argument, std::size_t index,
                               float value, const char* requirement) {
    std::ostringstream message;
    message << operation << ": " << argument << " element " << index << " is " << value << " ("
            << requirement << ")";
    throw std::domain_error(message.str());
}

// gelu(x) = 0.5·x·erfc(−x/√2); the limits at ±inf are +inf and −0 (not −inf·0 = NaN).
float gelu_value(float x) {
    const float tail = fast_erfc(-x * inverse_sqrt_two);
    return tail == 0.0F ? -0.0F : 0.5F * x * tail;
}

// gelu'(x) = 0.5·erfc(−x/√2) + x·φ(x); x·φ(x) vanishes where φ underflows (|x| >= ~14),
// which makes the limits 0 at −inf and 1 at +inf.
float gelu_derivative(float x) {
    const float density = normal_density(x);
    return 0.5F * fast_erfc(-x * inverse_sqrt_two) + (density == 0.0F ? 0.0F : x * density);
}

// σ(x) = 1/(1 + e^{−x}) for x >= 0 and e^{x}/(1 + e^{x}) otherwise, so nothing overflows.
// Written with one exponential of −|x| and a select of the numerator (the same values as the
// two-branch form, NaN included), and inlined, so the loops over it vectorise.
[[gnu::always_inline]] inline float sigmoid(float x) {
    const float e = fast_exp(-std::fabs(x));
    const float numerator = x >= 0.0F ? 1.0F : e;
    return numerator / (1.0F + e);
}

// GELU in its tanh form (GPT-2's "gelu_new"): 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³).
// Since 1 + tanh(u) = 2·σ(2u), it is computed as x·σ(2u), which never overflows: where x³
// is ±inf, σ is exactly 0 or 1. The limits are −0 at −inf and +inf at +inf; NaN propagates.
constexpr float gelu_tanh_scale = 0.797884560802865356F;  // √(2/π)
constexpr float gelu_tanh_cubic = 0.044715F;

float gelu_tanh_value(float x) {
    const float s = sigmoid(2.0F * gelu_tanh_scale * (x + gelu_tanh_cubic * x * x * x));
    return s == 0.0F ? -0.0F : x * s;
}

// d/dx x·σ(2u) = σ(2u) + x·2σ(2u)(1 − σ(2u))·u'(x), u'(x) = √(2/π)·(1 + 3·0.044715·x²).
// The second term vanishes where σ saturates (|x| large), instead of becoming inf·0.
float gelu_tanh_derivative(float x) {
    const float z = 2.0F * gelu_tanh_scale * (x + gelu_tanh_cubic * x * x * x);
    const float s = sigmoid(z);
    const float one_minus = sigmoid(-z);  // 1 − σ(z) without cancellation where σ(z) ≈ 1
    if (s == 0.0F || one_minus == 0.0F) {
        return s;
    }
    const float slope = gelu_tanh_scale * (1.0F + 3.0F * gelu_tanh_cubic * x * x);
    return s + 2.0F * x * s * one_minus * slope;
}

}  // namespace

void CpuElementwise::binary(BinaryOperation operation, const Tensor& left, const Tensor& right,
                            Tensor& out) const {
    const float* a = cpu_data(left);
    const float* b = cpu_data(right);
    float* y = cpu_output(out);
    const std::size_t count = out.numel();
    if (operation == BinaryOperation::Divide) {
        const std::size_t zero = first_violation(b, count, [](float v) { return v == 0.0F; });
        if (zero != count) {
            throw_domain("divide", "denominator", zero, b[zero], "must be non-zero");
        }
    }
    for_chunks(count, [&](std::size_t begin, std::size_t end) {
        switch (operation) {
            case BinaryOperation::Add:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = a[i] + b[i];
                break;
            case BinaryOperation::Subtract:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = a[i] - b[i];
                break;
            case BinaryOperation::Multiply:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = a[i] * b[i];
                break;
            case BinaryOperation::Divide:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = a[i] / b[i];
                break;
        }
    });
}

void CpuElementwise::unary(UnaryOperation operation, const Tensor& x, Tensor& out) const {
    const float* v = cpu_data(x);
    float* y = cpu_output(out);
    const std::size_t count = out.numel();
    if (operation == UnaryOperation::Log) {
        const std::size_t bad = first_violation(v, count, [](float e) { return !(e > 0.0F); });
        if (bad != count) {
            throw_domain("log", "x", bad, v[bad], "must be > 0");
        }
    } else if (operation == UnaryOperation::Sqrt) {
        const std::size_t bad = first_violation(v, count, [](float e) { return !(e >= 0.0F); });
        if (bad != count) {
            throw_domain("sqrt", "x", bad, v[bad], "must be >= 0");
        }
    }
    for_chunks(count, [&](std::size_t begin, std::size_t end) {
        switch (operation) {
            case UnaryOperation::Negate:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = -v[i];
                break;
            case UnaryOperation::Exp:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = fast_exp(v[i]);
                break;
            case UnaryOperation::Log:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = std::log(v[i]);
                break;
            case UnaryOperation::Sqrt:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = std::sqrt(v[i]);
                break;
            case UnaryOperation::Erf:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = std::erf(v[i]);
                break;
            case UnaryOperation::Gelu:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = gelu_value(v[i]);
                break;
            case UnaryOperation::GeluTanh:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = gelu_tanh_value(v[i]);
                break;
            case UnaryOperation::Relu:
                // NaN fails both comparisons and is passed through unchanged.
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = v[i] <= 0.0F ? 0.0F : v[i];
                break;
            case UnaryOperation::Silu:
                for (std::size_t i = begin; i < end; ++i) {
                    const float s = sigmoid(v[i]);
                    // silu(-inf) = -0 (not -inf·0 = NaN).
                    y[i] = s == 0.0F ? -0.0F : v[i] * s;
                }
                break;
            case UnaryOperation::Tanh:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = fast_tanh(v[i]);
                break;
        }
    });
}

void CpuElementwise::affine(const Tensor& x, float multiplier, float addend, Tensor& out) const {
    const float* v = cpu_data(x);
    float* y = cpu_output(out);
    for_chunks(out.numel(), [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i)
            y[i] = v[i] * multiplier + addend;
    });
}

void CpuElementwise::unary_backward(UnaryDerivative derivative, const Tensor& x,
                                    const Tensor& upstream, Tensor& out) const {
    const float* v = cpu_data(x);
    const float* g = cpu_data(upstream);
    float* y = cpu_output(out);
    for_chunks(out.numel(), [&](std::size_t begin, std::size_t end) {
        switch (derivative) {
            case UnaryDerivative::Gelu:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = g[i] * gelu_derivative(v[i]);
                break;
            case UnaryDerivative::GeluTanh:
                for (std::size_t i = begin; i < end; ++i)
                    y[i] = g[i] * gelu_tanh_derivative(v[i]);
                break;
            case UnaryDerivative::Relu:
                // Derivative 0 at exactly 0; NaN inputs give NaN.
                for (std::size_t i = begin; i < end; ++i) {
                    y[i] = v[i] > 0.0F ? g[i] : (v[i] <= 0.0F ? 0.0F : v[i]);
                }
                break;
            case UnaryDerivative::Silu:
                for (std::size_t i = begin; i < end; ++i) {
                    const float s = sigmoid(v[i]);
                    const float one_minus = 1.0F - s;
                    // The x·(1 − σ) term vanishes at ±inf instead of becoming inf·0.
                    const float tail = one_minus == 0.0F || s == 0.0F ? 0.0F : v[i] * one_minus;
                    y[i] = g[i] * s * (1.0F + tail);
                }
                break;
        }
    });
}

namespace {

// One row of d = 2h values. Products are rounded before each sum (fp-contract off), so the
// values are those of the composite's separate multiply, subtract and add kernels.
__attribute__((optimize("fp-contract=off"))) void rotate_row(const float* x, const float* c,
                                                             const float* s, std::size_t half,
                                                             float* out) {
    for (std::size_t i = 0; i < half; ++i) {
        const float first = x[i];
        const float second = x[i + half];
        const float first_cos = first * c[i];
        const float second_sin = second * s[i];
        const float second_cos = second * c[i];
        const float first_sin = first * s[i];
        out[i] = first_cos - second_sin;
        out[i + half] = second_cos + first_sin;
    }
}

}  // namespace

void CpuRotary::rotate(const Tensor& x, const Tensor& cosine, const Tensor& sine,
                       std::size_t table_axis, Tensor& out) const {
    const Shape& shape = x.shape();
    const std::size_t d = shape.back();
    const std::size_t half = d / 2;
    // x viewed as [outer, rows, inner, d]: the table row is the index along table_axis.
    std::size_t outer = 1;
    for (std::size_t axis = 0; axis < table_axis; ++axis)
        outer *= shape[axis];
    const std::size_t rows = shape[table_axis];
    std::size_t inner = 1;
    for (std::size_t axis = table_axis + 1; axis + 1 < shape.size(); ++axis)
        inner *= shape[axis];
    const float* v = cpu_data(x);
    const float* c = cpu_data(cosine);
    const float* s = cpu_data(sine);
    float* y = cpu_output(out);
    // Rows of d values, grouped for the workers by whole (outer, row) runs.
    parallel_for(
        outer * rows, items_per_thread_for(inner * d), [&](std::size_t begin, std::size_t end) {
            for (std::size_t run = begin; run < end; ++run) {
                const std::size_t row = run % rows;
                for (std::size_t j = 0; j < inner; ++j) {
                    const std::size_t offset = (run * inner + j) * d;
                    rotate_row(v + offset, c + row * half, s + row * half, half, y + offset);
                }
            }
        });
}

void CpuDropout::dropout_mask(std::uint64_t stream, std::uint64_t threshold, float kept_value,
                              Tensor& out) const {
    float* y = cpu_output(out);
    const std::size_t count = out.numel();
    // Branch-free over the counter, so the loop vectorises where 64-bit products do.
    parallel_for(count, std::size_t{1} << 15U, [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
            y[i] = tensor_ops::dropout_keeps(stream, i, threshold) ? kept_value : 0.0F;
        }
    });
}

}  // namespace riftco_transformer::detail
