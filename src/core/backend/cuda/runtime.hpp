#pragma once
// The CUDA runtime behind the "cuda" identity: the device probe, one non-blocking stream per
// host thread, stream-ordered device memory from a caching pool, the hand-off of a buffer
// between streams, deferred value-domain checks, and one cuBLAS handle per thread.
//
// Execution model (docs/ARCHITECTURE.md, 'Execution model'): every capability enqueues its kernels
// on the calling thread's stream and returns; host copies (Storage::copy_to_host and the uploads)
// and the deferred-check collection at a sync point are the only places the host waits.
//
// Memory: cudaMallocAsync/cudaFreeAsync on the device's default memory pool with its release
// threshold raised to "never", so freed blocks stay cached in the pool and are reused by later
// allocations without a cudaMalloc. Never managed memory.
//
// Streams: a thread takes a stream from a process-wide free list the first time it touches the
// device and gives it back when it exits; streams are never destroyed, so a buffer may keep
// naming the stream that last used it after that thread has gone. A buffer used on a stream
// other than its last one first makes the new stream wait on an event recorded on the old one
// (DeviceBuffer::use_on), so the uses of one buffer form a chain in stream order, and freeing
// it on its last stream is ordered after all of them.
//
// Only this file and the adapter's other sources see the CUDA headers' types through
// cuda_runtime_api.h; the rest of the library never includes them.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/backend.hpp"

struct cublasContext;  // cublasHandle_t is cublasContext*

namespace riftco_transformer::detail::cuda {

// runtime_error "CUDA <what> failed: <error name>: <error text>" unless `status` is success.
void check(cudaError_t status, std::string_view what);

// The stream of the calling thread (created or taken from the free list on first use).
[[nodiscard]] cudaStream_t current_stream();

// One device allocation of `bytes` bytes, freed in stream order on the last stream that used it.
class DeviceBuffer {
  public:
    DeviceBuffer(std::size_t bytes, cudaStream_t stream);
    ~DeviceBuffer();
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    [[nodiscard]] void* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

    // Makes work enqueued on `stream` from now on run after every use of this buffer so far
    // (an event wait when the last use was on another stream); `stream` becomes the last.
    void use_on(cudaStream_t stream) const;

  private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    mutable std::mutex mutex_;
    mutable cudaStream_t last_stream_;
};

// A value-domain check a kernel carries out: it lowers `slot` (device memory, one uint64 set to
// UINT64_MAX before the kernel) to the first failing element position with atomicMin. `raise`
// builds the CPU reference's exception from that position, at the sync point (it may read the
// buffers it captured).
struct PendingCheck {
    unsigned long long* slot = nullptr;
    cudaStream_t stream = nullptr;
    std::function<std::exception_ptr(std::size_t position)> raise;
};

// Process-wide device state; made once by Runtime::probe and never destroyed (the CUDA
// runtime may already be torn down when static destructors run).
class Runtime {
  public:
    // The runtime of the first visible device, or null with `reason` set: "no CUDA device
    // visible" when the driver reports no device (or no driver is installed at all).
    [[nodiscard]] static Runtime* probe(std::string& reason);

    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] const std::string& device_name() const noexcept { return device_name_; }

    // Enqueues a checking kernel: `launch(slot)` runs it on `stream` with a slot (device
    // memory) set to UINT64_MAX beforehand; `raise` words the failure at the sync point.
    // Slot reservation and launch happen under one lock, so concurrent threads never share a
    // slot and an early read never skips a kernel not yet enqueued.
    void checked_launch(cudaStream_t stream,
                        std::function<std::exception_ptr(std::size_t position)> raise,
                        const std::function<void(unsigned long long* slot)>& launch) const;
    // A sync point: reads every pending slot and hands the first failing check (in the order
    // the checks were enqueued) to detail::defer_error.
    void collect() const;

    // The calling thread's cuBLAS handle, bound to its stream.
    [[nodiscard]] cublasContext* blas_handle() const;
    // TF32 tensor-core products (RIFTCO_TRANSFORMER_CUDA_MATMUL=tf32) instead of the default
    // pedantic float32 (=fp32), read once at load.
    [[nodiscard]] bool tf32_matmul() const noexcept { return tf32_matmul_; }

  private:
    Runtime() = default;
    void collect_locked() const;

    int device_ = 0;
    std::string device_name_;
    bool tf32_matmul_ = false;
    unsigned long long* check_slots_ = nullptr;  // check_capacity slots of device memory
    mutable std::mutex check_mutex_;
    mutable std::vector<PendingCheck> pending_;
};

// Whether RIFTCO_TRANSFORMER_CUDA_MATMUL selects TF32 ("tf32"), pedantic float32 ("fp32" or
// unset); anything else is invalid_argument naming the variable and its value.
[[nodiscard]] bool tf32_requested_by_environment();

}  // namespace riftco_transformer::detail::cuda
