#pragma once
// Aligned host blocks for CPU storage; large ones recycled through a bounded cache
// (include/riftco_transformer/core/memory.hpp describes the policy).

#include <cstddef>

namespace riftco_transformer::detail {

// A block of at least `bytes` bytes, 64-byte aligned (2 MiB aligned and advised for huge
// pages when large). Release it with the same byte count.
[[nodiscard]] void* acquire_host_block(std::size_t bytes);
void release_host_block(void* block, std::size_t bytes) noexcept;

}  // namespace riftco_transformer::detail
