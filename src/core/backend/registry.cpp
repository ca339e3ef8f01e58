// The fixed backend registry: exactly one entry per ExecutionBackend value.

#include <sstream>
#include <stdexcept>
#include <string>

#include "core/backend/adapter.hpp"
#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/synchronization.hpp"
#include "core/backend/unavailable/unavailable_adapter.hpp"

namespace riftco_transformer::detail {

const BackendAdapter* find_backend_adapter(ExecutionBackend backend) noexcept {
    switch (backend) {
        case ExecutionBackend::Cpu:
            return &cpu_adapter();
        case ExecutionBackend::Metal:
            return &metal_adapter();
        case ExecutionBackend::Cuda:
            return &cuda_adapter();
        case ExecutionBackend::Tpu:
            return &tpu_adapter();
        case ExecutionBackend::Pjrt:
            return &pjrt_adapter();
    }
    return nullptr;
}

std::string_view BackendAdapter::name() const noexcept {
    // Every adapter's backend() is a recognised value, so this cannot throw.
    switch (backend()) {
        case ExecutionBackend::Cpu:
            return "cpu";
        case ExecutionBackend::Metal:
            return "metal";
        case ExecutionBackend::Cuda:
            return "cuda";
        case ExecutionBackend::Tpu:
            return "tpu";
        case ExecutionBackend::Pjrt:
            return "pjrt";
    }
    return "unknown";
}

const BackendAdapter& require_available_adapter(ExecutionBackend backend,
                                                std::string_view operation) {
    const BackendAdapter* adapter = find_backend_adapter(backend);
    if (adapter == nullptr) {
        std::ostringstream message;
        message << operation << ": unknown execution backend value "
                << static_cast<std::uint32_t>(backend);
        throw std::invalid_argument(message.str());
    }
    if (!adapter->is_available()) {
        std::ostringstream message;
        message << operation << ": execution backend '" << adapter->name()
                << "' is unavailable: " << adapter->unavailability_reason();
        throw BackendUnavailableError(backend, message.str());
    }
    return *adapter;
}

void throw_missing_capability(const BackendAdapter& adapter, std::string_view operation,
                              std::string_view family) {
    std::ostringstream message;
    message << operation << ": execution backend '" << adapter.name() << "' does not provide the "
            << family << " capability";
    throw std::runtime_error(message.str());
}

const StorageCapability& require_storage(ExecutionBackend backend, std::string_view operation) {
    const BackendAdapter& adapter = require_available_adapter(backend, operation);
    return require_capability(adapter.storage(), adapter, operation, "storage");
}

std::shared_ptr<Storage> import_storage(const Storage& source, ExecutionBackend target,
                                        std::string_view operation) {
    std::shared_ptr<Storage> copied = require_storage(target, operation).import_from(source);
    if (copied != nullptr && target == ExecutionBackend::Cpu) {
        synchronize(source.backend());
    }
    return copied;
}

}  // namespace riftco_transformer::detail
