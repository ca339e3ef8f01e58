// Elementwise kernels: one grid-stride kernel per operation (templated on it). The formulas
// follow the CPU reference (cpu/elementwise.cpp) term by term, including its limits at ±inf:
// GELU as 0.5·x·erfc(−x/√2), tanh-GELU as x·σ(2u), SiLU as x·σ(x) with the stable sigmoid.
// CUDA's expf/erfcf/logf are within a few ulps of the CPU's (no fast-math anywhere).

#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr float inverse_sqrt_two = 0.707106781186547524F;
constexpr float inverse_sqrt_two_pi = 0.398942280401432678F;
constexpr float gelu_tanh_scale = 0.797884560802865356F;  // √(2/π)
constexpr float gelu_tanh_cubic = 0.044715F;

// σ(x) = 1/(1 + e^{−x}) for x >= 0 and e^{x}/(1 + e^{x}) otherwise, so nothing overflows.
__device__ float sigmoid(float x) {
    const float e = expf(x >= 0.0F ? -x : x);
    return x >= 0.0F ? 1.0F / (1.0F + e) : e / (1.0F + e);
}

// gelu(x) = 0.5·x·erfc(−x/√2); the limits at ±inf are +inf and −0.
__device__ float gelu_value(float x) {
    const float tail = erfcf(-x * inverse_sqrt_two);
    return tail == 0.0F ? -0.0F : 0.5F * x * tail;
}

// gelu'(x) = 0.5·erfc(−x/√2) + x·φ(x), the second term 0 where φ underflows.
__device__ float gelu_derivative(float x) {
    const float density = inverse_sqrt_two_pi * expf(-0.5F * x * x);
    return 0.5F * erfcf(-x * inverse_sqrt_two) + (density == 0.0F ? 0.0F : x * density);
}

// tanh-GELU = x·σ(2u), u = √(2/π)·(x + 0.044715·x³).
__device__ float gelu_tanh_value(float x) {
    const float s = sigmoid(2.0F * gelu_tanh_scale * (x + gelu_tanh_cubic * x * x * x));
    return s == 0.0F ? -0.0F : x * s;
}

// d/dx x·σ(2u) = σ(2u) + x·2σ(2u)(1 − σ(2u))·u'(x); the second term 0 where σ saturates.
__device__ float gelu_tanh_derivative(float x) {
    const float z = 2.0F * gelu_tanh_scale * (x + gelu_tanh_cubic * x * x * x);
    const float s = sigmoid(z);
    const float one_minus = sigmoid(-z);
    if (s == 0.0F || one_minus == 0.0F) {
        return s;
    }
    const float slope = gelu_tanh_scale * (1.0F + 3.0F * gelu_tanh_cubic * x * x);
    return s + 2.0F * x * s * one_minus * slope;
}

// a, b, y [count]; Divide lowers *first_failure to the first zero denominator.
template <BinaryKernel operation>
__global__ void binary_kernel(const float* a, const float* b, float* y, std::size_t count,
                              unsigned long long* first_failure) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        if constexpr (operation == BinaryKernel::Add) {
            y[i] = a[i] + b[i];
        } else if constexpr (operation == BinaryKernel::Subtract) {
            y[i] = a[i] - b[i];
        } else if constexpr (operation == BinaryKernel::Multiply) {
            y[i] = a[i] * b[i];
        } else {
            const float denominator = b[i];
            if (denominator == 0.0F) {
                atomicMin(first_failure, static_cast<unsigned long long>(i));
            }
            y[i] = a[i] / denominator;
        }
    }
}

// x, y [count]; Log/Sqrt lower *first_failure to the first value outside their domain.
template <UnaryKernel operation>
__global__ void unary_kernel(const float* x, float* y, std::size_t count,
                             unsigned long long* first_failure) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        const float v = x[i];
        if constexpr (operation == UnaryKernel::Negate) {
            y[i] = -v;
        } else if constexpr (operation == UnaryKernel::Exp) {
            y[i] = expf(v);
        } else if constexpr (operation == UnaryKernel::Log) {
            if (!(v > 0.0F)) {
                atomicMin(first_failure, static_cast<unsigned long long>(i));
            }
            y[i] = logf(v);
        } else if constexpr (operation == UnaryKernel::Sqrt) {
            if (!(v >= 0.0F)) {
                atomicMin(first_failure, static_cast<unsigned long long>(i));
            }
            y[i] = sqrtf(v);
        } else if constexpr (operation == UnaryKernel::Erf) {
            y[i] = erff(v);
        } else if constexpr (operation == UnaryKernel::Gelu) {
            y[i] = gelu_value(v);
        } else if constexpr (operation == UnaryKernel::GeluTanh) {
            y[i] = gelu_tanh_value(v);
        } else if constexpr (operation == UnaryKernel::Relu) {
            y[i] = v <= 0.0F ? 0.0F : v;  // NaN fails the comparison and passes through
        } else if constexpr (operation == UnaryKernel::Tanh) {
            y[i] = tanhf(v);
        } else {
            const float s = sigmoid(v);
            y[i] = s == 0.0F ? -0.0F : v * s;  // silu(−inf) = −0
        }
    }
}

// x, y [count]
__global__ void affine_kernel(const float* x, float multiplier, float addend, float* y,
                              std::size_t count) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        y[i] = x[i] * multiplier + addend;
    }
}

// x, upstream, y [count]: y = upstream · f'(x)
template <DerivativeKernel derivative>
__global__ void unary_backward_kernel(const float* x, const float* upstream, float* y,
                                      std::size_t count) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        const float v = x[i];
        const float g = upstream[i];
        if constexpr (derivative == DerivativeKernel::Gelu) {
            y[i] = g * gelu_derivative(v);
        } else if constexpr (derivative == DerivativeKernel::GeluTanh) {
            y[i] = g * gelu_tanh_derivative(v);
        } else if constexpr (derivative == DerivativeKernel::Relu) {
            // Derivative 0 at exactly 0; NaN inputs give NaN.
            y[i] = v > 0.0F ? g : (v <= 0.0F ? 0.0F : v);
        } else {
            const float s = sigmoid(v);
            const float one_minus = 1.0F - s;
            const float tail = one_minus == 0.0F || s == 0.0F ? 0.0F : v * one_minus;
            y[i] = g * s * (1.0F + tail);
        }
    }
}

template <BinaryKernel operation>
void launch_binary(const float* a, const float* b, float* y, std::size_t count,
                   unsigned long long* first_failure, cudaStream_t stream) {
    binary_kernel<operation>
        <<<blocks_for(count), threads_per_block, 0, stream>>>(a, b, y, count, first_failure);
}

template <UnaryKernel operation>
void launch_unary(const float* x, float* y, std::size_t count, unsigned long long* first_failure,
                  cudaStream_t stream) {
    unary_kernel<operation>
        <<<blocks_for(count), threads_per_block, 0, stream>>>(x, y, count, first_failure);
}

template <DerivativeKernel derivative>
void launch_backward(const float* x, const float* upstream, float* y, std::size_t count,
                     cudaStream_t stream) {
    unary_backward_kernel<derivative>
        <<<blocks_for(count), threads_per_block, 0, stream>>>(x, upstream, y, count);
}

}  // namespace

void binary(BinaryKernel operation, const float* a, const float* b, float* y, std::size_t count,
            unsigned long long* first_failure, cudaStream_t stream) {
    if (count == 0) {
        return;
    }
    switch (operation) {
        case BinaryKernel::Add:
            launch_binary<BinaryKernel::Add>(a, b, y, count, first_failure, stream);
            break;
        case BinaryKernel::Subtract:
            launch_binary<BinaryKernel::Subtract>(a, b, y, count, first_failure, stream);
            break;
        case BinaryKernel::Multiply:
            launch_binary<BinaryKernel::Multiply>(a, b, y, count, first_failure, stream);
            break;
        case BinaryKernel::Divide:
            launch_binary<BinaryKernel::Divide>(a, b, y, count, first_failure, stream);
            break;
    }
    check_launch("binary elementwise");
}

void unary(UnaryKernel operation, const float* x, float* y, std::size_t count,
           unsigned long long* first_failure, cudaStream_t stream) {
    if (count == 0) {
        return;
    }
    switch (operation) {
        case UnaryKernel::Negate:
            launch_unary<UnaryKernel::Negate>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Exp:
            launch_unary<UnaryKernel::Exp>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Log:
            launch_unary<UnaryKernel::Log>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Sqrt:
            launch_unary<UnaryKernel::Sqrt>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Erf:
            launch_unary<UnaryKernel::Erf>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Gelu:
            launch_unary<UnaryKernel::Gelu>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::GeluTanh:
            launch_unary<UnaryKernel::GeluTanh>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Relu:
            launch_unary<UnaryKernel::Relu>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Silu:
            launch_unary<UnaryKernel::Silu>(x, y, count, first_failure, stream);
            break;
        case UnaryKernel::Tanh:
            launch_unary<UnaryKernel::Tanh>(x, y, count, first_failure, stream);
            break;
    }
    check_launch("unary elementwise");
}

void affine(const float* x, float multiplier, float addend, float* y, std::size_t count,
            cudaStream_t stream) {
    if (count == 0) {
        return;
    }
    affine_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(x, multiplier, addend, y,
                                                                       count);
    check_launch("affine");
}

void unary_backward(DerivativeKernel derivative, const float* x, const float* upstream, float* y,
                    std::size_t count, cudaStream_t stream) {
    if (count == 0) {
        return;
    }
    switch (derivative) {
        case DerivativeKernel::Gelu:
            launch_backward<DerivativeKernel::Gelu>(x, upstream, y, count, stream);
            break;
        case DerivativeKernel::GeluTanh:
            launch_backward<DerivativeKernel::GeluTanh>(x, upstream, y, count, stream);
            break;
        case DerivativeKernel::Relu:
            launch_backward<DerivativeKernel::Relu>(x, upstream, y, count, stream);
            break;
        case DerivativeKernel::Silu:
            launch_backward<DerivativeKernel::Silu>(x, upstream, y, count, stream);
            break;
    }
    check_launch("unary backward");
}

}  // namespace riftco_transformer::detail::cuda
