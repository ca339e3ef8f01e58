#include "core/backend/cpu/host_block_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/memory.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr std::size_t small_alignment = 64;
constexpr std::size_t page = 4096;
constexpr std::size_t huge_page = std::size_t{2} << 20U;
constexpr std::size_t large_block_threshold = std::size_t{256} << 10U;
constexpr std::size_t default_cache_limit = std::size_t{512} << 20U;

// Blocks of at least one huge page are huge-page aligned (and madvised) when rounding them up
// to whole huge pages costs at most a quarter more: from 4 MiB always, between 2 and 4 MiB
// for sizes near a multiple (SmolLM2's 3.4 MiB FFN weights, say). Decoding streams every
// weight once per token, and weights in 4 KiB pages stall the hardware prefetcher at every
// page boundary.
constexpr std::size_t huge_page_worthy = std::size_t{4} << 20U;

constexpr std::size_t whole_huge_pages(std::size_t bytes) {
    return (bytes + huge_page - 1) / huge_page * huge_page;
}

constexpr bool huge_page_aligned(std::size_t rounded) {
    return rounded >= huge_page_worthy ||
           (rounded >= huge_page && whole_huge_pages(rounded) - rounded <= rounded / 4);
}

// Large requests are rounded up to one of four classes per power of two (at most 25%
// slack), so slightly different sizes still share cached blocks; huge-page-aligned classes
// are also whole multiples of the huge page (aligned_alloc requires a multiple of the
// alignment).
std::size_t size_class(std::size_t bytes) {
    const std::size_t step = std::bit_floor(bytes) / 4;
    const std::size_t rounded = (bytes + step - 1) / step * step;
    return huge_page_aligned(rounded) ? whole_huge_pages(rounded) : rounded;
}

constexpr const char* cache_limit_variable = "RIFTCO_TRANSFORMER_CPU_CACHE_BYTES";

// The limit, or an error message when the variable is set but not a byte count.
std::size_t cache_limit_from_environment(std::string& error) {
    const char* text = std::getenv(cache_limit_variable);
    if (text == nullptr || *text == '\0')
        return default_cache_limit;
    errno = 0;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || *text == '-') {
        error = std::string("CPU storage: ") + cache_limit_variable + "='" + text +
                "' is not a byte count (a non-negative integer; 0 disables the cache)";
        return 0;
    }
    return static_cast<std::size_t>(value);
}

// Free blocks by size class under one mutex: the bookkeeping of both caches below.
class FreeLists {
  public:
    // A cached block of exactly `rounded` bytes, or null.
    void* take(std::size_t rounded) noexcept {
        const std::lock_guard<std::mutex> lock(mutex_);
        auto found = blocks_.find(rounded);
        if (found == blocks_.end() || found->second.empty())
            return nullptr;
        void* block = found->second.back();
        found->second.pop_back();
        cached_bytes_ -= rounded;
        return block;
    }

    // Keeps the block while the cached total stays within `limit`; false when the caller
    // must free it (over the limit, or no memory to record it).
    bool keep(void* block, std::size_t rounded, std::size_t limit) noexcept {
        const std::lock_guard<std::mutex> lock(mutex_);
        if (cached_bytes_ + rounded > limit)
            return false;
        try {
            blocks_[rounded].push_back(block);
        } catch (...) {
            return false;
        }
        cached_bytes_ += rounded;
        return true;
    }

    // Every cached block, handed to `free_block` outside the lock; the lists end empty.
    template <typename Free>
    void release_all(Free free_block) noexcept {
        std::map<std::size_t, std::vector<void*>> blocks;
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            blocks.swap(blocks_);
            cached_bytes_ = 0;
        }
        for (auto& [size, list] : blocks) {
            for (void* block : list)
                free_block(block);
        }
    }

    std::size_t cached_bytes() noexcept {
        const std::lock_guard<std::mutex> lock(mutex_);
        return cached_bytes_;
    }

  private:
    std::mutex mutex_;
    std::map<std::size_t, std::vector<void*>> blocks_;  // size class -> free blocks
    std::size_t cached_bytes_ = 0;
};

class HostBlockCache {
  public:
    void* acquire(std::size_t bytes) {
        if (!limit_error_.empty())
            throw std::invalid_argument(limit_error_);
        const std::size_t rounded = size_class(bytes);
        if (void* block = free_.take(rounded)) {
            hits_.fetch_add(1, std::memory_order_relaxed);
            return block;
        }
        misses_.fetch_add(1, std::memory_order_relaxed);
        const std::size_t alignment = huge_page_aligned(rounded) ? huge_page : page;
        void* block = std::aligned_alloc(alignment, rounded);
        if (block == nullptr) {
            // Memory pressure: give the cache back and try once more.
            release_all();
            block = std::aligned_alloc(alignment, rounded);
            if (block == nullptr)
                throw std::bad_alloc();
        }
#ifdef MADV_HUGEPAGE
        if (alignment == huge_page) {
            // Best effort: with transparent huge pages in "madvise" mode this turns thousands
            // of 4 KiB first-touch faults into a few 2 MiB ones.
            static_cast<void>(madvise(block, rounded, MADV_HUGEPAGE));
        }
#endif
        return block;
    }

    void release(void* block, std::size_t bytes) noexcept {
        if (!free_.keep(block, size_class(bytes), limit_))
            std::free(block);
    }

    void release_all() noexcept {
        free_.release_all([](void* block) { std::free(block); });
    }

    [[nodiscard]] std::size_t limit() const noexcept {
        return limit_;
    }

    CpuMemoryStatistics statistics() {
        CpuMemoryStatistics result;
        result.cached_bytes = free_.cached_bytes();
        result.cache_limit_bytes = limit_;
        result.cache_hits = hits_.load(std::memory_order_relaxed);
        result.cache_misses = misses_.load(std::memory_order_relaxed);
        return result;
    }

  private:
    FreeLists free_;
    std::string limit_error_;
    std::size_t limit_ = cache_limit_from_environment(limit_error_);
    std::atomic<std::size_t> hits_{0};
    std::atomic<std::size_t> misses_{0};
};

// Intentionally leaked: storage released during static destruction must still find it.
HostBlockCache& cache() {
    static auto* instance = new HostBlockCache();
    return *instance;
}

// Blocks under large_block_threshold: free lists per size class (64-byte multiples, at most
// 1/8 slack), at most small_cache_limit bytes in all, not counted in CpuMemoryStatistics.
// Decoding one token allocates about a thousand such blocks (activations of one row), and
// 64-byte-aligned operator new goes through glibc's memalign path, which consolidates the
// heap: about 3% of a SmolLM2 token. The cache is off when RIFTCO_TRANSFORMER_CPU_CACHE_BYTES
// is 0 and under AddressSanitizer (recycled blocks would hide a use after free of a small
// tensor), and release_cpu_memory_cache empties it too.
constexpr std::size_t small_cache_limit = std::size_t{16} << 20U;

std::size_t small_size_class(std::size_t bytes) {
    const std::size_t step = std::max(small_alignment, std::bit_floor(bytes) / 8);
    return (bytes + step - 1) / step * step;
}

void free_small(void* block) noexcept {
    ::operator delete (block, std::align_val_t{small_alignment});
}

class SmallBlockCache {
  public:
    explicit SmallBlockCache(bool enabled) : limit_(enabled ? small_cache_limit : 0) {}

    void* acquire(std::size_t bytes) {
        const std::size_t rounded = small_size_class(bytes == 0 ? 1 : bytes);
        if (void* block = free_.take(rounded))
            return block;
        return ::operator new (rounded, std::align_val_t{small_alignment});
    }

    void release(void* block, std::size_t bytes) noexcept {
        if (!free_.keep(block, small_size_class(bytes == 0 ? 1 : bytes), limit_))
            free_small(block);
    }

    void release_all() noexcept { free_.release_all(free_small); }

  private:
    FreeLists free_;
    std::size_t limit_;
};

#if defined(__SANITIZE_ADDRESS__)
constexpr bool small_cache_allowed = false;
#else
constexpr bool small_cache_allowed = true;
#endif

// Intentionally leaked, like cache().
SmallBlockCache& small_cache() {
    static auto* instance = new SmallBlockCache(small_cache_allowed && cache().limit() != 0);
    return *instance;
}

// Bytes of live tensor storage (requested sizes) and their high-water mark.
std::atomic<std::size_t> live_bytes{0};
std::atomic<std::size_t> peak_live_bytes{0};

void count_acquired(std::size_t bytes) noexcept {
    const std::size_t now = live_bytes.fetch_add(bytes) + bytes;
    std::size_t peak = peak_live_bytes.load();
    while (now > peak && !peak_live_bytes.compare_exchange_weak(peak, now)) {
    }
}

void* acquire_untracked(std::size_t bytes) {
    if (bytes < large_block_threshold) {
        return small_cache().acquire(bytes);
    }
    return cache().acquire(bytes);
}

void release_untracked(void* block, std::size_t bytes) noexcept {
    if (bytes < large_block_threshold) {
        small_cache().release(block, bytes);
        return;
    }
    cache().release(block, bytes);
}

}  // namespace

void* acquire_host_block(std::size_t bytes) {
    void* block = acquire_untracked(bytes);
    count_acquired(bytes);
    return block;
}

void release_host_block(void* block, std::size_t bytes) noexcept {
    if (block == nullptr) {
        return;
    }
    live_bytes.fetch_sub(bytes);
    release_untracked(block, bytes);
}

}  // namespace riftco_transformer::detail

namespace riftco_transformer {

CpuMemoryStatistics cpu_memory_statistics() {
    CpuMemoryStatistics statistics = detail::cache().statistics();
    statistics.live_bytes = detail::live_bytes.load();
    statistics.peak_live_bytes = detail::peak_live_bytes.load();
    return statistics;
}

void reset_cpu_peak_memory() {
    detail::peak_live_bytes.store(detail::live_bytes.load());
}

void release_cpu_memory_cache() {
    detail::cache().release_all();
    detail::small_cache().release_all();
}

}  // namespace riftco_transformer
