#pragma once
// Launchers of the row kernels (softmax.cu, normalization.cu, loss.cu, indexing.cu), seen by
// the adapter's host code. Like kernels.hpp: plain device pointers, counts and the stream;
// each returns at once and throws runtime_error when the launch fails. A `first_failure` slot
// is lowered with atomicMin to the smallest failing position (Runtime::checked_launch).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace riftco_transformer::detail::cuda {

// ---- softmax.cu ------------------------------------------------------------------------------
// Slices of x viewed as [outer, extent, inner] (one slice per (o, i), elements `inner` apart),
// or, when `causal`, `outer` rows of `extent` (inner ignored) where row r sees its first
// r % extent + 1 entries (the rest of the row is written 0). y = softmax(scale·x) over the
// visible entries; first_failure <- the first slice holding NaN/+inf, or with every visible
// entry -inf.
void softmax_rows(const float* x, std::size_t outer, std::size_t extent, std::size_t inner,
                  bool causal, float scale, float* y, unsigned long long* first_failure,
                  cudaStream_t stream);
// dx = scale · p ⊙ (g − Σ g ⊙ p) per slice (same geometry; invisible entries get 0).
void softmax_backward_rows(const float* p, const float* g, std::size_t outer, std::size_t extent,
                           std::size_t inner, bool causal, float scale, float* dx,
                           cudaStream_t stream);

// ---- normalization.cu ------------------------------------------------------------------------
// Rows per block of the parameter-gradient partial sums (the CPU reference's block too).
constexpr std::size_t gradient_row_block = 64;

// x [rows, width] -> y, mean [rows], inverse_deviation [rows]
void layer_norm_rows(const float* x, const float* gamma, const float* beta, std::size_t rows,
                     std::size_t width, float epsilon, float* y, float* mean, float* inverse,
                     cudaStream_t stream);
// dx [rows, width]; d_gamma, d_beta [width] through `partials` (2·⌈rows/64⌉·width doubles)
void layer_norm_backward_rows(const float* x, const float* gamma, const float* mean,
                              const float* inverse, const float* upstream, std::size_t rows,
                              std::size_t width, float* dx, float* d_gamma, float* d_beta,
                              double* partials, cudaStream_t stream);
// x [rows, width] -> y, inverse_rms [rows]
void rms_norm_rows(const float* x, const float* gamma, std::size_t rows, std::size_t width,
                   float epsilon, float* y, float* inverse, cudaStream_t stream);
// dx [rows, width]; d_gamma [width] through `partials` (⌈rows/64⌉·width doubles)
void rms_norm_backward_rows(const float* x, const float* gamma, const float* inverse,
                            const float* upstream, std::size_t rows, std::size_t width, float* dx,
                            float* d_gamma, double* partials, cudaStream_t stream);

// ---- loss.cu ---------------------------------------------------------------------------------
// logits [rows, vocabulary], rows = batch·time_extent; a row counts when its time index is in
// [offset, offset + count) and (with `selected`) its flag is 1. Counted rows:
// row_loss[r] = log Σ exp(z − max) + max − z_target (double), gradient = (softmax − onehot)·
// inverse_count; other rows: row_loss 0 and an exactly zero gradient.
// first_failure <- the first counted row whose target logit is not finite.
void cross_entropy_rows(const float* logits, const std::uint32_t* targets,
                        const std::uint32_t* selected, std::size_t rows, std::size_t vocabulary,
                        std::size_t time_extent, std::size_t offset, std::size_t count,
                        float inverse_count, double* row_loss, float* gradient,
                        unsigned long long* first_failure, cudaStream_t stream);
// mean = Σ row_loss / averaged (double, fixed order) -> loss[0] (float), mean_out[0];
// first_failure <- 0 when the mean is not a finite float.
void cross_entropy_mean(const double* row_loss, std::size_t rows, std::size_t averaged, float* loss,
                        double* mean_out, unsigned long long* first_failure, cudaStream_t stream);

// ---- indexing.cu -----------------------------------------------------------------------------
// out[i] = table[ids[i]] (rows of `width`); first_failure <- the first i with ids[i] >= rows
// (its output row is written 0).
void gather_rows(const float* table, std::size_t rows, std::size_t width, const std::uint32_t* ids,
                 std::size_t count, float* out, unsigned long long* first_failure,
                 cudaStream_t stream);
// Bytes of scratch scatter_add_rows needs for `count` ids, none above `max_id`.
[[nodiscard]] std::size_t scatter_add_scratch_bytes(std::size_t count, std::uint32_t max_id);
// out [rows, width] = 0, then out[ids[i]] += upstream[i] in index order (deterministic: the
// ids are stably sorted, then each destination element sums its run of sources in float, in
// index order, as the CPU reference does). `max_id` bounds the ids (radix-sort key bits);
// first_failure <- the first i with ids[i] >= rows (skipped).
void scatter_add_rows(const float* upstream, const std::uint32_t* ids, std::size_t count,
                      std::uint32_t max_id, std::size_t rows, std::size_t width, float* out,
                      void* scratch, std::size_t scratch_bytes, unsigned long long* first_failure,
                      cudaStream_t stream);

}  // namespace riftco_transformer::detail::cuda
