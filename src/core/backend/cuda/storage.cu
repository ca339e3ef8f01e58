// Storage kernels: fill, and the kernel-image probe the device check runs.

#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"

namespace riftco_transformer::detail::cuda {
namespace {

// data [count] <- value
__global__ void fill_kernel(float* data, std::size_t count, float value) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        data[i] = value;
    }
}

}  // namespace

void fill(float* data, std::size_t count, float value, cudaStream_t stream) {
    if (count == 0) {
        return;
    }
    fill_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(data, count, value);
    check_launch("fill");
}

cudaError_t probe_kernel_image() {
    // Fails with cudaErrorNoKernelImageForDevice (or cudaErrorInvalidDeviceFunction) when
    // neither the SASS nor the PTX of this build can be loaded on the current device.
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, fill_kernel);
}

}  // namespace riftco_transformer::detail::cuda
