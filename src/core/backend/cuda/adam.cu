// Adam kernels: the gradients' statistics and the two passes of a step, each one launch over
// every tensor of the request (multi-tensor: a flat element index is mapped to its tensor or
// slice by a binary search over the records' bases).
//
// Statistics: one block per partial (a block of adam_norm_block elements of one tensor, the
// CPU's blocks): max |x| as the largest magnitude bit pattern, Σ x² in double, and the first
// NaN/±inf (atomicMin of its flat position). One block then merges the partials in order with
// the CPU's scaled-pair rule (a fixed tree of contiguous runs), takes ‖g‖ = scale·√Σ and the
// clip factor, on the device, so the check that follows needs no host round trip.
//
// Every scalar of a step is the CPU's double formula with round-to-nearest intrinsics (never
// contracted), so the check and the write compute the same bits:
//   g̃ = s·g;  m' = β1·m + (1−β1)·g̃;  v' = β2·v + (1−β2)·g̃²;
//   θ' = θ·(1 − lr·λ) − (lr·(m'/c1))/(√(v'/c2) + ε)

#include <cfloat>
#include <climits>

#include "core/backend/cuda/attention_nf4_adam_kernels.hpp"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr unsigned long long none = ULLONG_MAX;

__device__ inline bool finite_float(float x) {
    return fabsf(x) <= FLT_MAX;  // false for NaN and ±inf
}

// The largest index s with base(s) <= position (records sorted by base, the first at 0).
template <typename Record>
__device__ inline std::size_t record_of(const Record* records, std::size_t count,
                                        std::uint64_t position) {
    std::size_t low = 0;
    std::size_t high = count;
    while (high - low > 1) {
        const std::size_t middle = low + (high - low) / 2;
        if (records[middle].element_base <= position) {
            low = middle;
        } else {
            high = middle;
        }
    }
    return low;
}

// The tensor of partial p: the largest t with partial_base(t) <= p.
__device__ inline std::size_t tensor_of_partial(const AdamTensorRecord* tensors, std::size_t count,
                                                std::uint64_t partial) {
    std::size_t low = 0;
    std::size_t high = count;
    while (high - low > 1) {
        const std::size_t middle = low + (high - low) / 2;
        if (tensors[middle].partial_base <= partial) {
            low = middle;
        } else {
            high = middle;
        }
    }
    return low;
}

// a.merge(b) of ScaledSumOfSquares (tensor_ops/optimizer.hpp).
__device__ inline void merge_squares(double& scale, double& squares, double other_scale,
                                     double other_squares) {
    if (other_scale == 0.0) {
        return;
    }
    if (scale < other_scale) {
        const double ratio = __ddiv_rn(scale, other_scale);
        squares = __dadd_rn(other_squares, __dmul_rn(__dmul_rn(squares, ratio), ratio));
        scale = other_scale;
    } else {
        const double ratio = __ddiv_rn(other_scale, scale);
        squares = __dadd_rn(squares, __dmul_rn(__dmul_rn(other_squares, ratio), ratio));
    }
}

__global__ void reset_kernel(AdamDeviceResult* result) {
    result->first_gradient = none;
    result->first_value = none;
    result->first_update = none;
    result->scale = 0.0;
    result->scaled_squares = 0.0;
    result->clip_scale = 1.0;
}

__global__ void partials_kernel(const AdamTensorRecord* tensors, std::size_t tensor_count,
                                std::size_t partial_count, double* partials,
                                AdamDeviceResult* result) {
    __shared__ unsigned int largest[threads_per_block];
    __shared__ double sum[threads_per_block];
    __shared__ unsigned long long bad[threads_per_block];
    for (std::size_t p = blockIdx.x; p < partial_count; p += gridDim.x) {
        const AdamTensorRecord& tensor = tensors[tensor_of_partial(tensors, tensor_count, p)];
        const std::uint64_t first = (p - tensor.partial_base) * adam_norm_block;
        const std::uint64_t end =
            first + adam_norm_block < tensor.count ? first + adam_norm_block : tensor.count;
        unsigned int my_largest = 0;
        double my_sum = 0.0;
        unsigned long long my_bad = none;
        for (std::uint64_t i = first + threadIdx.x; i < end; i += threads_per_block) {
            const float x = tensor.data[i];
            if (!finite_float(x) && my_bad == none) {
                my_bad = i;
            }
            my_largest = max(my_largest, __float_as_uint(x) & 0x7FFFFFFFU);
            my_sum = __dadd_rn(my_sum, __dmul_rn(static_cast<double>(x), static_cast<double>(x)));
        }
        largest[threadIdx.x] = my_largest;
        sum[threadIdx.x] = my_sum;
        bad[threadIdx.x] = my_bad;
        __syncthreads();
        for (unsigned int half = threads_per_block / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) {
                largest[threadIdx.x] = max(largest[threadIdx.x], largest[threadIdx.x + half]);
                sum[threadIdx.x] = __dadd_rn(sum[threadIdx.x], sum[threadIdx.x + half]);
                bad[threadIdx.x] = min(bad[threadIdx.x], bad[threadIdx.x + half]);
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            if (bad[0] != none) {
                atomicMin(&result->first_gradient, tensor.element_base + bad[0]);
            }
            double scale = 0.0;
            double squares = 0.0;
            if (largest[0] != 0) {
                scale = static_cast<double>(__uint_as_float(largest[0]));
                squares = __ddiv_rn(sum[0], __dmul_rn(scale, scale));
            }
            partials[2 * p] = scale;
            partials[2 * p + 1] = squares;
        }
        __syncthreads();
    }
}

// One block: thread k merges a contiguous run of partials in order, then the runs merge in a
// fixed tree (left run first), then thread 0 finishes the norm and the clip factor.
__global__ void merge_kernel(const double* partials, std::size_t partial_count, double maximum_norm,
                             AdamDeviceResult* result) {
    __shared__ double scales[threads_per_block];
    __shared__ double squares[threads_per_block];
    const std::size_t per_thread = (partial_count + threads_per_block - 1) / threads_per_block;
    const std::size_t begin = threadIdx.x * per_thread;
    const std::size_t end = begin + per_thread < partial_count ? begin + per_thread : partial_count;
    double scale = 0.0;
    double sum = 0.0;
    for (std::size_t p = begin; p < end; ++p) {
        merge_squares(scale, sum, partials[2 * p], partials[2 * p + 1]);
    }
    scales[threadIdx.x] = scale;
    squares[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int stride = 1; stride < threads_per_block; stride *= 2) {
        if (threadIdx.x % (2 * stride) == 0) {
            double s = scales[threadIdx.x];
            double q = squares[threadIdx.x];
            merge_squares(s, q, scales[threadIdx.x + stride], squares[threadIdx.x + stride]);
            scales[threadIdx.x] = s;
            squares[threadIdx.x] = q;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        result->scale = scales[0];
        result->scaled_squares = squares[0];
        if (maximum_norm >= 0.0 && result->first_gradient == none) {
            const double norm = __dmul_rn(scales[0], __dsqrt_rn(squares[0]));
            result->clip_scale = norm > maximum_norm ? __ddiv_rn(maximum_norm, norm) : 1.0;
        }
    }
}

struct Candidate {
    double value;
    double first_moment;
    double second_moment;
};

__device__ inline Candidate candidate(const AdamDeviceScalars& k, double clip, float value,
                                      float gradient, float first_moment, float second_moment) {
    const double g = __dmul_rn(clip, static_cast<double>(gradient));
    const double m = __dadd_rn(__dmul_rn(k.beta1, static_cast<double>(first_moment)),
                               __dmul_rn(k.one_minus_beta1, g));
    const double v = __dadd_rn(__dmul_rn(k.beta2, static_cast<double>(second_moment)),
                               __dmul_rn(k.one_minus_beta2, __dmul_rn(g, g)));
    const double update =
        __ddiv_rn(__dmul_rn(k.learning_rate, __ddiv_rn(m, k.bias_correction1)),
                  __dadd_rn(__dsqrt_rn(__ddiv_rn(v, k.bias_correction2)), k.epsilon));
    return {__dsub_rn(__dmul_rn(static_cast<double>(value), k.decay_factor), update), m, v};
}

__global__ void check_kernel(const AdamSliceRecord* slices, std::size_t slice_count,
                             std::size_t total, AdamDeviceScalars k, bool clip_from_result,
                             AdamDeviceResult* result) {
    if (clip_from_result && result->first_gradient != none) {
        return;  // a non-finite gradient: the step is refused, nothing more to check
    }
    const double clip = clip_from_result ? result->clip_scale : k.clip_scale;
    for (std::size_t e = first_index(); e < total; e += grid_stride()) {
        const AdamSliceRecord& slice = slices[record_of(slices, slice_count, e)];
        const std::uint64_t i = e - slice.element_base;
        const float value = slice.value[slice.offset + i];
        const float gradient = slice.gradient != nullptr ? slice.gradient[slice.offset + i] : 0.0F;
        const Candidate c =
            candidate(k, clip, value, gradient, slice.first_moment[i], slice.second_moment[i]);
        if (!finite_float(value)) {
            atomicMin(&result->first_value, static_cast<unsigned long long>(e));
        }
        if (!finite_float(static_cast<float>(c.value)) ||
            !finite_float(static_cast<float>(c.first_moment)) ||
            !finite_float(static_cast<float>(c.second_moment))) {
            atomicMin(&result->first_update, static_cast<unsigned long long>(e));
        }
    }
}

__global__ void apply_kernel(const AdamSliceRecord* slices, std::size_t slice_count,
                             std::size_t total, AdamDeviceScalars k) {
    for (std::size_t e = first_index(); e < total; e += grid_stride()) {
        const AdamSliceRecord& slice = slices[record_of(slices, slice_count, e)];
        const std::uint64_t i = e - slice.element_base;
        float* value = slice.value + slice.offset + i;
        const float gradient = slice.gradient != nullptr ? slice.gradient[slice.offset + i] : 0.0F;
        const Candidate c = candidate(k, k.clip_scale, *value, gradient, slice.first_moment[i],
                                      slice.second_moment[i]);
        *value = static_cast<float>(c.value);
        slice.first_moment[i] = static_cast<float>(c.first_moment);
        slice.second_moment[i] = static_cast<float>(c.second_moment);
    }
}

}  // namespace

void adam_reset(AdamDeviceResult* result, cudaStream_t stream) {
    reset_kernel<<<1, 1, 0, stream>>>(result);
    check_launch("adam reset_kernel");
}

void adam_statistics(const AdamTensorRecord* tensors, std::size_t tensor_count,
                     std::size_t partial_count, double* partials, double maximum_norm,
                     AdamDeviceResult* result, cudaStream_t stream) {
    if (tensor_count == 0 || partial_count == 0) {
        return;
    }
    const auto blocks =
        static_cast<unsigned int>(partial_count < max_blocks ? partial_count : max_blocks);
    partials_kernel<<<blocks, threads_per_block, 0, stream>>>(tensors, tensor_count, partial_count,
                                                              partials, result);
    check_launch("adam partials_kernel");
    merge_kernel<<<1, threads_per_block, 0, stream>>>(partials, partial_count, maximum_norm,
                                                      result);
    check_launch("adam merge_kernel");
}

void adam_check(const AdamSliceRecord* slices, std::size_t slice_count, std::size_t total,
                const AdamDeviceScalars& scalars, bool clip_from_result, AdamDeviceResult* result,
                cudaStream_t stream) {
    if (slice_count == 0 || total == 0) {
        return;
    }
    check_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(
        slices, slice_count, total, scalars, clip_from_result, result);
    check_launch("adam check_kernel");
}

void adam_apply(const AdamSliceRecord* slices, std::size_t slice_count, std::size_t total,
                const AdamDeviceScalars& scalars, cudaStream_t stream) {
    if (slice_count == 0 || total == 0) {
        return;
    }
    apply_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(slices, slice_count, total,
                                                                      scalars);
    check_launch("adam apply_kernel");
}

}  // namespace riftco_transformer::detail::cuda
