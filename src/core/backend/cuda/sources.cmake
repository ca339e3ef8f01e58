# The CUDA adapter's sources (RIFTCO_TRANSFORMER_ENABLE_CUDA=ON): host code (.cpp, compiled
# like every other engine source) and kernels (.cu, nvcc). CMakeLists.txt builds them into
# their own object libraries, so no other object sees the CUDA headers or flags.
set(RIFTCO_TRANSFORMER_CUDA_HOST_SOURCES
    src/core/backend/cuda/runtime.cpp
    src/core/backend/cuda/cuda_adapter.cpp
    src/core/backend/cuda/elementwise.cpp
    src/core/backend/cuda/layout.cpp
    src/core/backend/cuda/reduction.cpp
    src/core/backend/cuda/matmul.cpp
    src/core/backend/cuda/softmax.cpp
    src/core/backend/cuda/normalization.cpp
    src/core/backend/cuda/loss.cpp
    src/core/backend/cuda/indexing.cpp
    src/core/backend/cuda/quantized_linear.cpp
    src/core/backend/cuda/paged_attention.cpp
    src/core/backend/cuda/adam.cpp
    src/core/backend/cuda/attention.cpp
)
set(RIFTCO_TRANSFORMER_CUDA_KERNEL_SOURCES
    src/core/backend/cuda/storage.cu
    src/core/backend/cuda/elementwise.cu
    src/core/backend/cuda/layout.cu
    src/core/backend/cuda/reduction.cu
    src/core/backend/cuda/softmax.cu
    src/core/backend/cuda/normalization.cu
    src/core/backend/cuda/loss.cu
    src/core/backend/cuda/indexing.cu
    src/core/backend/cuda/quantized_linear.cu
    src/core/backend/cuda/paged_attention.cu
    src/core/backend/cuda/adam.cu
    src/core/backend/cuda/attention.cu
)
