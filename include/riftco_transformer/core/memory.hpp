#pragma once
// CPU memory accounting, and the backend's cache of large host blocks. Tensor storage of 256 KiB or
// more is taken from and returned to this cache, so a training loop that allocates the same
// activation sizes every step reuses warm, already-faulted memory instead of mapping fresh pages
// from the kernel each time (for a 32 MiB tensor: thousands of page faults per allocation). The
// cache holds at most RIFTCO_TRANSFORMER_CPU_CACHE_BYTES (default 512 MiB) of free blocks. Smaller
// blocks are recycled through free lists of their own (at most 16 MiB, outside these statistics); a
// limit of 0 turns both off.

#include <cstddef>

namespace riftco_transformer {

struct CpuMemoryStatistics {
    std::size_t live_bytes = 0;       // bytes held by live CPU tensor storage right now
    std::size_t peak_live_bytes = 0;  // high-water mark of live_bytes since the last reset
    std::size_t cached_bytes = 0;     // free blocks kept for reuse
    std::size_t cache_limit_bytes = 0;
    std::size_t cache_hits = 0;    // allocations served from the cache
    std::size_t cache_misses = 0;  // large allocations that had to map new memory
};

[[nodiscard]] CpuMemoryStatistics cpu_memory_statistics();

// Restarts peak_live_bytes from the current live_bytes (to measure one phase of a program).
void reset_cpu_peak_memory();

// Returns every cached free block to the operating system.
void release_cpu_memory_cache();

}  // namespace riftco_transformer
