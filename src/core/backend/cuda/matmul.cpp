// Matmul capability through cuBLAS: one strided-batched GEMM per call, float32 in and out,
// accumulated in float32 with pedantic math by default (parity with the CPU:
// docs/ARCHITECTURE.md, 'Numeric parity'); TF32 tensor cores only when
// RIFTCO_TRANSFORMER_CUDA_MATMUL=tf32.
//
// cuBLAS is column-major. A row-major [M,N] result C = op(A)·op(B) is, read column-major, the
// [N,M] matrix Cᵀ = op(B)ᵀ·op(A)ᵀ, so the call passes the right operand first: row-major right
// [R_r, C_r] read column-major is its transpose with leading dimension C_r, and the transpose
// flag carries over unchanged.

#include <cublas_v2.h>

#include <climits>
#include <sstream>
#include <stdexcept>

#include "core/backend/cuda/cuda_device.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

int as_blas_int(std::size_t value, const char* what) {
    if (value > static_cast<std::size_t>(INT_MAX)) {
        std::ostringstream message;
        message << "matmul: " << what << " " << value << " exceeds cuBLAS's int limit " << INT_MAX;
        throw std::overflow_error(message.str());
    }
    return static_cast<int>(value);
}

class CudaMatmul final : public MatmulCapability {
  public:
    explicit CudaMatmul(const Runtime& runtime) : runtime_(runtime) {}

    // left [B, R_l, C_l], right [B, R_r, C_r] -> out [B, M, N]
    void batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                        bool transpose_right, Tensor& out) const override {
        const auto [left_rows, left_columns, right_rows, right_columns, m, n, k, batch] =
            MatmulExtents::of(left, right, transpose_left, out);

        const int blas_m = as_blas_int(n, "output columns N");
        const int blas_n = as_blas_int(m, "output rows M");
        const int blas_k = as_blas_int(k, "inner dimension K");
        const int right_leading = as_blas_int(right_columns, "right operand columns");
        const int left_leading = as_blas_int(left_columns, "left operand columns");
        const int batch_count = as_blas_int(batch, "batch count");

        const cudaStream_t stream = current_stream();
        const float* a = device_input(left, stream);
        const float* b = device_input(right, stream);
        float* c = device_output(out, stream);
        cublasHandle_t handle = runtime_.blas_handle();
        const float one = 1.0F;
        const float zero = 0.0F;
        // A matrix's element stride in cuBLAS's 64-bit type (tensor sizes fit it).
        const auto stride = [](std::size_t rows, std::size_t columns) {
            return static_cast<long long>(rows) * static_cast<long long>(columns);
        };
        const cublasStatus_t status = cublasGemmStridedBatchedEx(
            handle, transpose_right ? CUBLAS_OP_T : CUBLAS_OP_N,
            transpose_left ? CUBLAS_OP_T : CUBLAS_OP_N, blas_m, blas_n, blas_k, &one, b, CUDA_R_32F,
            right_leading, stride(right_rows, right_columns), a, CUDA_R_32F, left_leading,
            stride(left_rows, left_columns), &zero, c, CUDA_R_32F, blas_m, stride(m, n),
            batch_count, runtime_.tf32_matmul() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        if (status != CUBLAS_STATUS_SUCCESS) {
            std::ostringstream message;
            message << "matmul: cublasGemmStridedBatchedEx (M=" << m << ", N=" << n << ", K=" << k
                    << ", batch " << batch << ") failed: " << cublasGetStatusName(status) << ": "
                    << cublasGetStatusString(status);
            throw std::runtime_error(message.str());
        }
    }

  private:
    const Runtime& runtime_;
};

}  // namespace

std::unique_ptr<MatmulCapability> make_matmul(const Runtime& runtime) {
    return std::make_unique<CudaMatmul>(runtime);
}

}  // namespace riftco_transformer::detail::cuda
