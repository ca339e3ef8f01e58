#include "core/backend/cpu/cpu_adapter.hpp"

#include <algorithm>

#include "core/backend/cpu/cpu_storage.hpp"

namespace riftco_transformer::detail {

std::shared_ptr<Storage> CpuStorageCapability::allocate(std::size_t element_count) const {
    return std::make_shared<CpuStorage>(backend_, element_count);
}

std::shared_ptr<Storage> CpuStorageCapability::clone(const Storage& source) const {
    auto copy = std::make_shared<CpuStorage>(backend_, source.element_count());
    const float* from = static_cast<const CpuStorage&>(source).data();
    std::copy_n(from, source.element_count(), copy->data());
    return copy;
}

void CpuStorageCapability::fill(Storage& storage, float value) const {
    std::fill_n(static_cast<CpuStorage&>(storage).data(), storage.element_count(), value);
}

const BackendAdapter& cpu_adapter() noexcept {
    static const HostAdapter adapter(ExecutionBackend::Cpu);
    return adapter;
}

}  // namespace riftco_transformer::detail
