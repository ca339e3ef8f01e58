#include "core/backend/cpu/cpu_adapter.hpp"

#include <algorithm>
#include <cstring>

#include "core/backend/cpu/cpu_storage.hpp"

namespace riftco_transformer::detail {

std::shared_ptr<Storage> CpuStorageCapability::allocate(std::size_t element_count) const {
    return std::make_shared<CpuStorage>(backend_, element_count);
}

std::shared_ptr<Storage> CpuStorageCapability::clone(const Storage& source) const {
    auto copy = std::make_shared<CpuStorage>(backend_, source.element_count());
    // Bytes, not floats: index storage holds uint32 ids in the same 4-byte elements.
    std::memcpy(copy->data(), static_cast<const CpuStorage&>(source).data(),
                source.element_count() * sizeof(float));
    return copy;
}

void CpuStorageCapability::fill(Storage& storage, float value) const {
    std::fill_n(static_cast<CpuStorage&>(storage).data(), storage.element_count(), value);
}

void CpuStorageCapability::write_range(Tensor& tensor, std::size_t offset,
                                       std::span<const float> values) const {
    TensorAccess::unique_storage(tensor).copy_from_host(offset, values);
}

std::shared_ptr<Storage> CpuStorageCapability::import_from(const Storage& source) const {
    const auto* host = dynamic_cast<const CpuStorage*>(&source);
    if (host == nullptr) {
        return nullptr;
    }
    auto copy = std::make_shared<CpuStorage>(backend_, source.element_count());
    std::memcpy(copy->data(), host->data(), source.element_count() * sizeof(float));
    return copy;
}

const BackendAdapter& cpu_adapter() noexcept {
    static const HostAdapter adapter(ExecutionBackend::Cpu);
    return adapter;
}

}  // namespace riftco_transformer::detail
