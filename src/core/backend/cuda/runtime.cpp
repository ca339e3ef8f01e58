#include "core/backend/cuda/runtime.hpp"

#include <cublas_v2.h>

#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/backend/cuda/kernels.hpp"
#include "core/backend/synchronization.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// The adapter drives the first visible device (multi-GPU selection is not part of it).
constexpr int device_index = 0;

// Deferred checks outstanding between two sync points before they are read early.
constexpr std::size_t check_capacity = 4096;

constexpr unsigned long long no_failure = std::numeric_limits<unsigned long long>::max();

std::string version_text(int version) {
    // CUDA encodes versions as 1000·major + 10·minor.
    return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

// A stream and (made on first matmul) a cuBLAS handle bound to it. Leased to one thread at a
// time and never destroyed (see runtime.hpp, "Streams").
struct ThreadResources {
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
};

std::mutex& resource_mutex() {
    static auto* mutex = new std::mutex;
    return *mutex;
}

std::vector<ThreadResources>& free_resources() {
    static auto* resources = new std::vector<ThreadResources>;
    return *resources;
}

// The calling thread's lease; gives the resources back to the free list at thread exit.
class ResourceLease {
  public:
    ResourceLease() = default;
    ResourceLease(const ResourceLease&) = delete;
    ResourceLease& operator=(const ResourceLease&) = delete;
    ~ResourceLease() {
        if (resources_.stream != nullptr) {
            const std::lock_guard<std::mutex> lock(resource_mutex());
            free_resources().push_back(resources_);
        }
    }

    ThreadResources& get() {
        if (resources_.stream == nullptr) {
            {
                const std::lock_guard<std::mutex> lock(resource_mutex());
                if (!free_resources().empty()) {
                    resources_ = free_resources().back();
                    free_resources().pop_back();
                }
            }
            if (resources_.stream == nullptr) {
                check(cudaSetDevice(device_index), "cudaSetDevice");
                cudaStream_t stream = nullptr;
                check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
                resources_.stream = stream;
            }
        }
        return resources_;
    }

  private:
    ThreadResources resources_;
};

ThreadResources& thread_resources() {
    thread_local ResourceLease lease;
    return lease.get();
}

void check_blas(cublasStatus_t status, std::string_view what) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        std::ostringstream message;
        message << "cuBLAS " << what << " failed: " << cublasGetStatusName(status) << ": "
                << cublasGetStatusString(status);
        throw std::runtime_error(message.str());
    }
}

}  // namespace

void check(cudaError_t status, std::string_view what) {
    if (status == cudaSuccess) {
        return;
    }
    std::ostringstream message;
    message << "CUDA " << what << " failed: " << cudaGetErrorName(status) << ": "
            << cudaGetErrorString(status);
    throw std::runtime_error(message.str());
}

void check_launch(const char* kernel) {
    check(cudaGetLastError(), std::string("launch of ") + kernel);
}

cudaStream_t current_stream() {
    return thread_resources().stream;
}

bool tf32_requested_by_environment() {
    const char* value = std::getenv("RIFTCO_TRANSFORMER_CUDA_MATMUL");
    if (value == nullptr || *value == '\0' || std::string_view(value) == "fp32") {
        return false;
    }
    if (std::string_view(value) == "tf32") {
        return true;
    }
    throw std::invalid_argument(std::string("RIFTCO_TRANSFORMER_CUDA_MATMUL='") + value +
                                "' is not one of fp32, tf32");
}

// ---- device buffers --------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(std::size_t bytes, cudaStream_t stream)
    : bytes_(bytes), last_stream_(stream) {
    if (bytes == 0) {
        return;
    }
    const cudaError_t status = cudaMallocAsync(&data_, bytes, stream);
    if (status != cudaSuccess) {
        static_cast<void>(cudaGetLastError());  // an allocation failure is not sticky
        check(status, "cudaMallocAsync of " + std::to_string(bytes) + " bytes");
    }
}

DeviceBuffer::~DeviceBuffer() {
    if (data_ != nullptr) {
        // Errors here (the runtime unloading at process exit) leave nothing to recover.
        static_cast<void>(cudaFreeAsync(data_, last_stream_));
    }
}

void DeviceBuffer::use_on(cudaStream_t stream) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (stream == last_stream_) {
        return;
    }
    cudaEvent_t last_use = nullptr;
    check(cudaEventCreateWithFlags(&last_use, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t recorded = cudaEventRecord(last_use, last_stream_);
    const cudaError_t waited =
        recorded == cudaSuccess ? cudaStreamWaitEvent(stream, last_use, 0) : recorded;
    // The wait keeps what it needs; the event may go at once.
    static_cast<void>(cudaEventDestroy(last_use));
    check(waited, "stream hand-off (cudaEventRecord/cudaStreamWaitEvent)");
    last_stream_ = stream;
}

// ---- the device probe ------------------------------------------------------------------------

Runtime* Runtime::probe(std::string& reason) {
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    static_cast<void>(cudaGetLastError());
    if (counted == cudaErrorNoDevice || (counted == cudaSuccess && count == 0)) {
        reason = "no CUDA device visible";
        return nullptr;
    }
    if (counted == cudaErrorInsufficientDriver) {
        int driver = 0;
        int runtime = 0;
        static_cast<void>(cudaDriverGetVersion(&driver));
        static_cast<void>(cudaRuntimeGetVersion(&runtime));
        if (driver == 0) {
            // No NVIDIA driver is installed at all: no device can be visible.
            reason = "no CUDA device visible";
        } else {
            reason = "the NVIDIA driver supports CUDA " + version_text(driver) +
                     ", older than this build's CUDA runtime " + version_text(runtime) +
                     " (cudaErrorInsufficientDriver): update the driver";
        }
        return nullptr;
    }
    if (counted != cudaSuccess) {
        reason = std::string("CUDA device discovery failed: ") + cudaGetErrorName(counted) + ": " +
                 cudaGetErrorString(counted);
        return nullptr;
    }
    try {
        check(cudaSetDevice(device_index), "cudaSetDevice");
        cudaDeviceProp properties{};
        check(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties");
        const cudaError_t image = probe_kernel_image();
        static_cast<void>(cudaGetLastError());
        if (image != cudaSuccess) {
            reason = "CUDA device 0 (" + std::string(properties.name) + ", compute capability " +
                     std::to_string(properties.major) + "." + std::to_string(properties.minor) +
                     ") cannot run this build's kernels (built for CMAKE_CUDA_ARCHITECTURES " +
                     RIFTCO_TRANSFORMER_CUDA_ARCHITECTURES + "): " + cudaGetErrorName(image);
            return nullptr;
        }
        // Freed blocks stay in the pool for reuse instead of going back to the driver.
        cudaMemPool_t pool = nullptr;
        check(cudaDeviceGetDefaultMemPool(&pool, device_index), "cudaDeviceGetDefaultMemPool");
        std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();  // cuuint64_t
        check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
              "cudaMemPoolSetAttribute(release threshold)");
        auto* runtime = new Runtime;
        runtime->device_ = device_index;
        runtime->device_name_ = properties.name;
        runtime->tf32_matmul_ = tf32_requested_by_environment();
        void* slots = nullptr;
        check(cudaMalloc(&slots, check_capacity * sizeof(unsigned long long)),
              "cudaMalloc of the deferred-check slots");
        runtime->check_slots_ = static_cast<unsigned long long*>(slots);
        return runtime;
    } catch (const std::exception& error) {
        reason = std::string("CUDA initialisation failed: ") + error.what();
        return nullptr;
    }
}

// ---- deferred checks -------------------------------------------------------------------------

void Runtime::checked_launch(cudaStream_t stream,
                             std::function<std::exception_ptr(std::size_t position)> raise,
                             const std::function<void(unsigned long long* slot)>& launch) const {
    const std::lock_guard<std::mutex> lock(check_mutex_);
    if (pending_.size() == check_capacity) {
        // Read early (not a sync point of the caller: the first failure stays deferred).
        collect_locked();
    }
    unsigned long long* slot = check_slots_ + pending_.size();
    check(cudaMemsetAsync(slot, 0xFF, sizeof(unsigned long long), stream),
          "cudaMemsetAsync of a check slot");
    launch(slot);
    pending_.push_back({slot, stream, std::move(raise)});
}

void Runtime::collect_locked() const {
    if (pending_.empty()) {
        return;
    }
    const cudaStream_t stream = current_stream();
    // The checking kernels may have run on other threads' streams: wait for them here.
    std::vector<cudaStream_t> waited;
    for (const PendingCheck& pending : pending_) {
        if (pending.stream == stream) {
            continue;
        }
        bool seen = false;
        for (const cudaStream_t other : waited) {
            seen = seen || other == pending.stream;
        }
        if (seen) {
            continue;
        }
        waited.push_back(pending.stream);
        cudaEvent_t done = nullptr;
        check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        const cudaError_t recorded = cudaEventRecord(done, pending.stream);
        const cudaError_t status =
            recorded == cudaSuccess ? cudaStreamWaitEvent(stream, done, 0) : recorded;
        static_cast<void>(cudaEventDestroy(done));
        check(status, "waiting for the deferred checks of another stream");
    }
    std::vector<unsigned long long> positions(pending_.size(), no_failure);
    check(cudaMemcpyAsync(positions.data(), check_slots_,
                          positions.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                          stream),
          "cudaMemcpyAsync of the deferred-check slots");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (deferred checks)");
    std::vector<PendingCheck> checks = std::exchange(pending_, {});
    for (std::size_t i = 0; i < checks.size(); ++i) {
        if (positions[i] == no_failure) {
            continue;
        }
        std::exception_ptr error;
        try {
            error = checks[i].raise(static_cast<std::size_t>(positions[i]));
        } catch (...) {
            error = std::current_exception();
        }
        defer_error(ExecutionBackend::Cuda, error);
        break;
    }
}

void Runtime::collect() const {
    const std::lock_guard<std::mutex> lock(check_mutex_);
    collect_locked();
}

// ---- cuBLAS ----------------------------------------------------------------------------------

cublasContext* Runtime::blas_handle() const {
    ThreadResources& resources = thread_resources();
    if (resources.blas == nullptr) {
        cublasHandle_t handle = nullptr;
        check_blas(cublasCreate(&handle), "cublasCreate");
        // Pedantic float32 keeps the CPU parity (docs/ARCHITECTURE.md, 'Numeric parity');
        // TF32 only when asked for.
        check_blas(cublasSetMathMode(
                       handle, tf32_matmul_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH),
                   "cublasSetMathMode");
        check_blas(cublasSetStream(handle, resources.stream), "cublasSetStream");
        resources.blas = handle;
    }
    return resources.blas;
}

}  // namespace riftco_transformer::detail::cuda
