#pragma once
// Launchers of the quantized-linear, paged-attention and Adam kernels (quantized_linear.cu,
// paged_attention.cu, adam.cu), seen by the adapter's host code. Like kernels.hpp: plain
// device pointers, asynchronous on `stream`, runtime_error when a launch fails, and no engine
// tensor header, so nvcc compiles only kernels.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace riftco_transformer::detail::cuda {

// ---- quantized_linear.cu ---------------------------------------------------------------------
// A packed NF4 weight W [out, in] in device memory (docs/ARCHITECTURE.md, 'NF4'): flat
// row-major codes, two per byte (low nibble first), one scale per block of 2^block_shift elements;
// either float32 block scales or the double-quantized scale codes, second-level ranges (one per
// group of 2^group_shift blocks) and offset.
struct Nf4DeviceWeight {
    const std::uint8_t* codes = nullptr;
    const float* scales = nullptr;              // legacy
    const std::uint8_t* scale_codes = nullptr;  // double-quantized
    const float* scale_ranges = nullptr;        // double-quantized
    float scale_offset = 0.0F;                  // double-quantized μ
    bool double_quantized = false;
    std::uint64_t out_features = 0;
    std::uint64_t in_features = 0;
    unsigned block_shift = 0;
    unsigned group_shift = 0;
    float codebook[16] = {};
};

// x [rows, in] -> y [rows, out] = x·deq(W)ᵀ
void nf4_forward(const Nf4DeviceWeight& weight, const float* x, std::size_t rows, float* y,
                 cudaStream_t stream);
// g [rows, out] -> dx [rows, in] = g·deq(W)
void nf4_input_backward(const Nf4DeviceWeight& weight, const float* g, std::size_t rows, float* dx,
                        cudaStream_t stream);

// ---- paged_attention.cu ----------------------------------------------------------------------
// Pools [pages, kv_heads, page_size, head_width]; query/context [requests, query_heads, 1, d].
struct PagedGeometry {
    std::uint64_t kv_heads = 0;
    std::uint64_t page_size = 0;
    std::uint64_t head_width = 0;
    std::uint64_t group_size = 0;  // query heads per pool head
    std::uint64_t requests = 0;
    std::uint64_t longest_visible = 0;  // the largest visible count of any request
    float softcap = 0.0F;               // 0: none; c > 0: scores c·tanh(s/c) (Gemma 2)
};

// `requests` (device) holds 3 uint32 per request: offset of its page table in `tables`
// (device), its length and its first visible position. A score that is NaN or +inf lowers
// `first_failure` to 2·((r·Hq + h)·longest_visible + (t − first)) + (1 when NaN).
void paged_decode(const PagedGeometry& geometry, const float* query, const float* key_pool,
                  const float* value_pool, const std::uint32_t* requests,
                  const std::uint32_t* tables, float scale, float* context,
                  unsigned long long* first_failure, cudaStream_t stream);
// slots (device): 2 uint32 per row (page, offset); rows [rows, kv_heads, 1, d].
void paged_write(const PagedGeometry& geometry, const std::uint32_t* slots, std::size_t rows,
                 const float* key, const float* value, float* key_pool, float* value_pool,
                 cudaStream_t stream);

// ---- adam.cu ---------------------------------------------------------------------------------
// Elements per sum-of-squares partial of one tensor (the CPU's norm_block).
constexpr std::size_t adam_norm_block = 4096;

// One tensor of a statistics request: its elements, and where it starts in the flat order of
// the list (elements) and in the partials (blocks of adam_norm_block).
struct AdamTensorRecord {
    const float* data = nullptr;
    std::uint64_t count = 0;
    std::uint64_t element_base = 0;
    std::uint64_t partial_base = 0;
};

// One slice of a step: value[offset, offset + count) with its gradient (null: zeros) and the
// moments [count]; element_base is its start in the flat order of the slices.
struct AdamSliceRecord {
    float* value = nullptr;
    const float* gradient = nullptr;
    float* first_moment = nullptr;
    float* second_moment = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t count = 0;
    std::uint64_t element_base = 0;
};

struct AdamDeviceScalars {
    double beta1 = 0.0;
    double beta2 = 0.0;
    double one_minus_beta1 = 0.0;
    double one_minus_beta2 = 0.0;
    double bias_correction1 = 1.0;
    double bias_correction2 = 1.0;
    double learning_rate = 0.0;
    double epsilon = 0.0;
    double clip_scale = 1.0;
    double decay_factor = 1.0;
};

// The small result a step reads back (one host read). Positions are flat (element_base +
// element); UINT64_MAX when there is none.
struct AdamDeviceResult {
    unsigned long long first_gradient = 0;  // first NaN/±inf gradient element
    unsigned long long first_value = 0;     // first non-finite θ
    unsigned long long first_update = 0;    // first θ', m' or v' not finite as a float
    double scale = 0.0;                     // merged ScaledSumOfSquares
    double scaled_squares = 0.0;
    double clip_scale = 1.0;  // max_norm/‖g‖ when ‖g‖ > max_norm, else 1
};

// result <- no failure, empty squares, clip 1.
void adam_reset(AdamDeviceResult* result, cudaStream_t stream);
// Gradient statistics of `tensor_count` records (device) with `partial_count` partials in
// total: partials (device, 2 doubles each) per block, merged in order into result->scale and
// scaled_squares; the first non-finite element into result->first_gradient; and, when
// maximum_norm >= 0 and every element is finite, result->clip_scale.
void adam_statistics(const AdamTensorRecord* tensors, std::size_t tensor_count,
                     std::size_t partial_count, double* partials, double maximum_norm,
                     AdamDeviceResult* result, cudaStream_t stream);
// The check pass over `total` elements of `slice_count` records: first_value and
// first_update of result. With clip_from_result the clip factor is result->clip_scale and
// nothing is checked when result->first_gradient is set; otherwise scalars.clip_scale.
void adam_check(const AdamSliceRecord* slices, std::size_t slice_count, std::size_t total,
                const AdamDeviceScalars& scalars, bool clip_from_result, AdamDeviceResult* result,
                cudaStream_t stream);
// The write pass: θ', m', v' narrowed to float, in place.
void adam_apply(const AdamSliceRecord* slices, std::size_t slice_count, std::size_t total,
                const AdamDeviceScalars& scalars, cudaStream_t stream);

}  // namespace riftco_transformer::detail::cuda
