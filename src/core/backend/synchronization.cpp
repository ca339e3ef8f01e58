#include "core/backend/synchronization.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/index_tensor.hpp"

namespace riftco_transformer {
namespace {

constexpr std::size_t backend_count = 5;  // ExecutionBackend {Cpu, Metal, Cuda, Tpu, Pjrt}

std::atomic<std::uint64_t> host_reads{0};

// One pending error per backend, as a device keeps one error state per context.
struct DeferredErrors {
    std::mutex mutex;
    std::array<std::exception_ptr, backend_count> pending;
};

DeferredErrors& deferred_errors() {
    static DeferredErrors errors;
    return errors;
}

std::size_t slot(ExecutionBackend backend) noexcept {
    const auto value = static_cast<std::size_t>(backend);
    return value < backend_count ? value : 0;
}

}  // namespace

std::uint64_t host_read_count() noexcept {
    return host_reads.load(std::memory_order_relaxed);
}

namespace detail {

void defer_error(ExecutionBackend backend, std::exception_ptr error) noexcept {
    DeferredErrors& errors = deferred_errors();
    const std::lock_guard<std::mutex> lock(errors.mutex);
    std::exception_ptr& pending = errors.pending[slot(backend)];
    if (!pending) {
        pending = std::move(error);
    }
}

void synchronize(ExecutionBackend backend) {
    host_reads.fetch_add(1, std::memory_order_relaxed);
    // A device that checks values on the device reads its pending checks now.
    if (const BackendAdapter* adapter = find_backend_adapter(backend); adapter != nullptr) {
        adapter->collect_deferred_errors();
    }
    std::exception_ptr error;
    {
        DeferredErrors& errors = deferred_errors();
        const std::lock_guard<std::mutex> lock(errors.mutex);
        error = std::exchange(errors.pending[slot(backend)], nullptr);
    }
    if (error) {
        std::rethrow_exception(error);
    }
}

}  // namespace detail
}  // namespace riftco_transformer
