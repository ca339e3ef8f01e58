#pragma once
// Execution backends: stable identities, availability, and the thread-local construction
// default used by tensors created without an explicit backend.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace riftco_transformer {

// Stable ABI values: never renumber, only append.
enum class ExecutionBackend : std::uint32_t {
    Cpu = 0,
    Metal = 1,
    Cuda = 2,
    Tpu = 3,
    Pjrt = 4,  // any PJRT plugin, named by RIFTCO_TRANSFORMER_PJRT_PLUGIN (C ABI 2.9)
};

// Stable lower-case name ("cpu", "metal", "cuda", "tpu", "pjrt"). Unknown value:
// std::invalid_argument.
[[nodiscard]] std::string_view execution_backend_name(ExecutionBackend backend);

// True only for a recognised backend that was compiled in and can run here. CPU always is.
[[nodiscard]] bool execution_backend_available(ExecutionBackend backend) noexcept;

// Why a recognised backend cannot run (process-lifetime text). Empty when the backend is
// available or the value is unknown.
[[nodiscard]] std::string_view execution_backend_unavailability_reason(
    ExecutionBackend backend) noexcept;

// Thrown whenever an operation needs a recognised backend that cannot run here (selection,
// tensor construction or transfer, a kernel call). It is a std::runtime_error, so callers that
// only know the standard categories still catch it; the C ABI maps it to
// RT_STATUS_BACKEND_UNAVAILABLE. The message names the backend and the reason.
class BackendUnavailableError : public std::runtime_error {
  public:
    BackendUnavailableError(ExecutionBackend backend, const std::string& message)
        : std::runtime_error(message), backend_(backend) {}
    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }

  private:
    ExecutionBackend backend_;
};

// The calling thread's construction default. Every thread starts on Cpu.
[[nodiscard]] ExecutionBackend current_execution_backend() noexcept;

// Changes the calling thread's construction default. Transactional: an unknown value throws
// std::invalid_argument, an unavailable backend BackendUnavailableError (with the reason), and in
// both cases the previous selection stays.
void set_execution_backend(ExecutionBackend backend);

// RAII selection for the current scope. Must be nested properly and destroyed on the thread
// that constructed it (a violation is reported and the process aborts: there is no safe way
// to restore another thread's state).
class ScopedExecutionBackend {
  public:
    explicit ScopedExecutionBackend(ExecutionBackend backend);
    ~ScopedExecutionBackend();

    ScopedExecutionBackend(const ScopedExecutionBackend&) = delete;
    ScopedExecutionBackend& operator=(const ScopedExecutionBackend&) = delete;
    ScopedExecutionBackend(ScopedExecutionBackend&&) = delete;
    ScopedExecutionBackend& operator=(ScopedExecutionBackend&&) = delete;

  private:
    ExecutionBackend previous_;
    const ScopedExecutionBackend* outer_;  // the guard this one is nested in, if any
    std::thread::id owner_;
};

}  // namespace riftco_transformer
