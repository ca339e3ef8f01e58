// Backend names, availability queries and the thread-local construction default.

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/backend.hpp"

namespace riftco_transformer {
namespace {

thread_local ExecutionBackend thread_construction_default = ExecutionBackend::Cpu;
thread_local const ScopedExecutionBackend* innermost_scope = nullptr;

[[noreturn]] void abort_with(const char* message) {
    std::fputs(message, stderr);
    std::abort();
}

}  // namespace

std::string_view execution_backend_name(ExecutionBackend backend) {
    const detail::BackendAdapter* adapter = detail::find_backend_adapter(backend);
    if (adapter == nullptr) {
        std::ostringstream message;
        message << "execution_backend_name: unknown execution backend value "
                << static_cast<std::uint32_t>(backend);
        throw std::invalid_argument(message.str());
    }
    return adapter->name();
}

bool execution_backend_available(ExecutionBackend backend) noexcept {
    const detail::BackendAdapter* adapter = detail::find_backend_adapter(backend);
    return adapter != nullptr && adapter->is_available();
}

std::string_view execution_backend_unavailability_reason(ExecutionBackend backend) noexcept {
    const detail::BackendAdapter* adapter = detail::find_backend_adapter(backend);
    if (adapter == nullptr || adapter->is_available()) {
        return {};
    }
    return adapter->unavailability_reason();
}

ExecutionBackend current_execution_backend() noexcept {
    return thread_construction_default;
}

void set_execution_backend(ExecutionBackend backend) {
    // Validates (throws) before the only write.
    static_cast<void>(detail::require_available_adapter(backend, "set_execution_backend"));
    thread_construction_default = backend;
}

ScopedExecutionBackend::ScopedExecutionBackend(ExecutionBackend backend)
    : previous_(current_execution_backend()),
      outer_(innermost_scope),
      owner_(std::this_thread::get_id()) {
    set_execution_backend(backend);
    innermost_scope = this;
}

ScopedExecutionBackend::~ScopedExecutionBackend() {
    if (std::this_thread::get_id() != owner_) {
        abort_with(
            "riftco_transformer: ScopedExecutionBackend destroyed on a thread other than "
            "the one that created it\n");
    }
    if (innermost_scope != this) {
        abort_with(
            "riftco_transformer: ScopedExecutionBackend guards were not destroyed in "
            "reverse order of construction\n");
    }
    innermost_scope = outer_;
    thread_construction_default = previous_;
}

}  // namespace riftco_transformer
