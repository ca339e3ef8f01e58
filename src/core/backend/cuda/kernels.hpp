#pragma once
// The CUDA kernels' launchers (the .cu files), seen by the adapter's host code. Plain device
// pointers, element counts and the stream to enqueue on; each launcher returns at once
// (asynchronous) and throws runtime_error when the launch itself fails. Nothing here includes
// the engine's tensor headers, so nvcc compiles only kernels.
//
// Checked kernels take `first_failure`: a device uint64 that they lower, with atomicMin, to the
// smallest element position violating the operation's domain (Runtime::checked_launch).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace riftco_transformer::detail::cuda {

// runtime_error naming `kernel` when the last launch on this thread failed (runtime.cpp).
void check_launch(const char* kernel);

// ---- storage.cu ------------------------------------------------------------------------------
// data[0, count) = value
void fill(float* data, std::size_t count, float value, cudaStream_t stream);
// cudaSuccess when this build's code (SASS or PTX) can run on the current device.
[[nodiscard]] cudaError_t probe_kernel_image();

// ---- elementwise.cu --------------------------------------------------------------------------
enum class BinaryKernel { Add, Subtract, Multiply, Divide };
enum class UnaryKernel { Negate, Exp, Log, Sqrt, Erf, Gelu, GeluTanh, Relu, Silu, Tanh };
enum class DerivativeKernel { Gelu, GeluTanh, Relu, Silu };

// y = a ∘ b. Divide: first_failure <- first zero denominator (not null for Divide).
void binary(BinaryKernel operation, const float* a, const float* b, float* y, std::size_t count,
            unsigned long long* first_failure, cudaStream_t stream);
// y = f(x). Log: first_failure <- first x that is not > 0; Sqrt: first x that is not >= 0
// (not null for those two).
void unary(UnaryKernel operation, const float* x, float* y, std::size_t count,
           unsigned long long* first_failure, cudaStream_t stream);
// y = x·multiplier + addend
void affine(const float* x, float multiplier, float addend, float* y, std::size_t count,
            cudaStream_t stream);
// y = upstream · f'(x)
void unary_backward(DerivativeKernel derivative, const float* x, const float* upstream, float* y,
                    std::size_t count, cudaStream_t stream);

// ---- layout.cu -------------------------------------------------------------------------------
// Up to this many axes (after merging axes that stay contiguous) per walk.
constexpr std::size_t max_walk_rank = 32;

// A row-major walk over `rank` axes of the given extents, reading through per-axis strides
// (in elements; 0 repeats along that axis).
struct AxisWalk {
    std::uint32_t rank = 0;
    std::uint64_t extent[max_walk_rank] = {};
    std::uint64_t stride[max_walk_rank] = {};
};

// dst[i] = src[offset(i)] for i in [0, count), offset(i) = Σ_d index_d(i)·stride[d] over `walk`.
void strided_copy(const float* src, const AxisWalk& walk, std::size_t count, float* dst,
                  cudaStream_t stream);
// src viewed as [outer, from_extent, inner], dst as [outer, to_extent, inner]:
// dst[o, to_start + l, i] = src[o, from_start + l, i] for l < length.
void copy_axis_window(const float* src, std::size_t from_extent, std::size_t from_start, float* dst,
                      std::size_t to_extent, std::size_t to_start, std::size_t length,
                      std::size_t outer, std::size_t inner, cudaStream_t stream);
// src [rows, width] -> dst [rows, total_width] at columns [column_offset, column_offset+width).
void copy_columns(const float* src, std::size_t rows, std::size_t width, float* dst,
                  std::size_t total_width, std::size_t column_offset, cudaStream_t stream);
// out[o] = Σ_r x[base(o) + reduced(r)] in double, r in row-major order: `kept` walks out's
// elements through x's strides, `reduced` walks the summed axes of x.
void sum_walk(const float* x, const AxisWalk& kept, std::size_t out_count, const AxisWalk& reduced,
              std::size_t reduced_count, float* out, cudaStream_t stream);

// ---- reduction.cu ----------------------------------------------------------------------------
// Elements per partial sum of sum_all (the CPU reference's block too).
constexpr std::size_t sum_block = 4096;
// out[0] = multiplier · Σ x in double: partials[b] = Σ of block b (sum_block elements), then
// the partials in block order. `partials` holds ⌈count/sum_block⌉ doubles.
void sum_all(const float* x, std::size_t count, double multiplier, double* partials, float* out,
             cudaStream_t stream);
// x [outer, extent, inner] -> out[o, i] = multiplier · Σ_e x[o, e, i] in double.
void sum_axis(const float* x, std::size_t outer, std::size_t extent, std::size_t inner,
              double multiplier, float* out, cudaStream_t stream);

}  // namespace riftco_transformer::detail::cuda
