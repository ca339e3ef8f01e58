#include "core/backend/cpu/cpu_storage.hpp"

#include <algorithm>
#include <cstring>
#include <new>

namespace riftco_transformer::detail {
namespace {
constexpr std::align_val_t storage_alignment{64};
}  // namespace

CpuStorage::CpuStorage(ExecutionBackend backend, std::size_t element_count)
    : Storage(backend, element_count),
      elements_(static_cast<float*>(
          ::operator new[](std::max<std::size_t>(1, element_count) * sizeof(float),
                           storage_alignment))) {}

void CpuStorage::AlignedDelete::operator()(float* pointer) const noexcept {
    ::operator delete[](pointer, storage_alignment);
}

void CpuStorage::copy_to_host(std::size_t offset, std::span<float> destination) const {
    if (!destination.empty()) {
        std::memcpy(destination.data(), elements_.get() + offset, destination.size_bytes());
    }
}

void CpuStorage::copy_from_host(std::size_t offset, std::span<const float> source) {
    if (!source.empty()) {
        std::memcpy(elements_.get() + offset, source.data(), source.size_bytes());
    }
}

}  // namespace riftco_transformer::detail
