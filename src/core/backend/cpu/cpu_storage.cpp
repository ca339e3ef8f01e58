#include "core/backend/cpu/cpu_storage.hpp"

#include <algorithm>
#include <cstring>

#include "core/backend/cpu/host_block_cache.hpp"

namespace riftco_transformer::detail {

CpuStorage::CpuStorage(ExecutionBackend backend, std::size_t element_count)
    : Storage(backend, element_count),
      elements_(static_cast<float*>(acquire_host_block(element_count * sizeof(float)))) {}

CpuStorage::~CpuStorage() {
    release_host_block(elements_, element_count() * sizeof(float));
}

void CpuStorage::copy_to_host(std::size_t offset, std::span<float> destination) const {
    if (!destination.empty()) {
        std::memcpy(destination.data(), elements_ + offset, destination.size_bytes());
    }
}

void CpuStorage::copy_from_host(std::size_t offset, std::span<const float> source) {
    if (!source.empty()) {
        std::memcpy(elements_ + offset, source.data(), source.size_bytes());
    }
}

void CpuStorage::copy_indices_to_host(std::size_t offset,
                                      std::span<std::uint32_t> destination) const {
    if (!destination.empty()) {
        std::memcpy(destination.data(), indices() + offset, destination.size_bytes());
    }
}

void CpuStorage::copy_indices_from_host(std::size_t offset, std::span<const std::uint32_t> source) {
    if (!source.empty()) {
        std::memcpy(indices() + offset, source.data(), source.size_bytes());
    }
}

}  // namespace riftco_transformer::detail
