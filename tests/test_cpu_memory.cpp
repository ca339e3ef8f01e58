// The CPU backend's large-block cache (include/riftco_transformer/core/memory.hpp).
// RIFTCO_TRANSFORMER_CPU_CACHE_BYTES is covered in test_environment.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/cpu/host_block_cache.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {
constexpr std::size_t large_elements = std::size_t{1} << 20U;  // 4 MiB of floats
}  // namespace

TEST(CpuMemoryCache, FreedLargeTensorIsReusedForTheNextAllocation) {
    release_cpu_memory_cache();
    { const Tensor first({large_elements}, 1.0F); }
    const CpuMemoryStatistics after_free = cpu_memory_statistics();
    EXPECT_GE(after_free.cached_bytes, large_elements * sizeof(float));
    const Tensor second({large_elements}, 2.0F);
    const CpuMemoryStatistics after_reuse = cpu_memory_statistics();
    EXPECT_EQ(after_reuse.cache_hits, after_free.cache_hits + 1);
    EXPECT_EQ(after_reuse.cache_misses, after_free.cache_misses);
    // Reused memory carries no stale values into the new tensor.
    EXPECT_EQ(second.flat(0), 2.0F);
    EXPECT_EQ(second.flat(large_elements - 1), 2.0F);
}

TEST(CpuMemoryCache, SlightlyDifferentSizesShareASizeClass) {
    release_cpu_memory_cache();
    { const Tensor first({large_elements}); }
    const std::size_t hits = cpu_memory_statistics().cache_hits;
    const Tensor smaller({large_elements - 1000});
    EXPECT_EQ(cpu_memory_statistics().cache_hits, hits + 1);
}

TEST(CpuMemoryCache, ReleaseReturnsEveryCachedBlock) {
    { const Tensor block({large_elements}); }
    EXPECT_GT(cpu_memory_statistics().cached_bytes, 0U);
    release_cpu_memory_cache();
    EXPECT_EQ(cpu_memory_statistics().cached_bytes, 0U);
}

TEST(CpuMemoryCache, SmallTensorsBypassTheCache) {
    release_cpu_memory_cache();
    const CpuMemoryStatistics before = cpu_memory_statistics();
    { const Tensor small({1024}); }
    const CpuMemoryStatistics after = cpu_memory_statistics();
    EXPECT_EQ(after.cached_bytes, 0U);
    EXPECT_EQ(after.cache_hits + after.cache_misses, before.cache_hits + before.cache_misses);
}

// Blocks under 256 KiB have free lists of their own (outside the statistics above): a freed
// row-sized block comes back for the next request of its size class, 64-byte aligned.
TEST(CpuMemoryCache, SmallBlocksOfOneSizeClassAreRecycled) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "small blocks are not recycled under AddressSanitizer";
#else
    if (std::getenv("RIFTCO_TRANSFORMER_CPU_CACHE_BYTES") != nullptr)
        GTEST_SKIP() << "RIFTCO_TRANSFORMER_CPU_CACHE_BYTES is set";
    void* first = detail::acquire_host_block(2304);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0U);
    detail::release_host_block(first, 2304);
    void* second = detail::acquire_host_block(2300);  // the same class as 2304
    EXPECT_EQ(second, first);
    void* other = detail::acquire_host_block(4096);  // another class: not that block
    EXPECT_NE(other, first);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(other) % 64, 0U);
    detail::release_host_block(other, 4096);
    detail::release_host_block(second, 2300);
    release_cpu_memory_cache();  // frees them; later requests are served fresh
    void* fresh = detail::acquire_host_block(2304);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(fresh) % 64, 0U);
    detail::release_host_block(fresh, 2304);
#endif
}

TEST(CpuMemoryCache, CachedBytesNeverExceedTheLimit) {
    release_cpu_memory_cache();
    const std::size_t limit = cpu_memory_statistics().cache_limit_bytes;
    // Free more distinct blocks than the limit can hold at once.
    std::vector<Tensor> live;
    const std::size_t elements = std::size_t{64} << 20U;  // 256 MiB each
    for (std::size_t bytes = 0; bytes <= limit + elements * sizeof(float);
         bytes += elements * sizeof(float)) {
        live.emplace_back(Shape{elements});
    }
    live.clear();
    EXPECT_LE(cpu_memory_statistics().cached_bytes, limit);
    release_cpu_memory_cache();
}

}  // namespace riftco_transformer

namespace riftco_transformer {

TEST(CpuMemoryAccounting, LiveBytesFollowTensorLifetimes) {
    const std::size_t before = cpu_memory_statistics().live_bytes;
    {
        const Tensor a({1000});
        EXPECT_EQ(cpu_memory_statistics().live_bytes, before + 1000 * sizeof(float));
        const Tensor shared = a;  // copy-on-write: no new storage yet
        EXPECT_EQ(cpu_memory_statistics().live_bytes, before + 1000 * sizeof(float));
    }
    EXPECT_EQ(cpu_memory_statistics().live_bytes, before);
}

TEST(CpuMemoryAccounting, PeakRecordsTheHighWaterMarkSinceReset) {
    reset_cpu_peak_memory();
    const std::size_t base = cpu_memory_statistics().live_bytes;
    EXPECT_EQ(cpu_memory_statistics().peak_live_bytes, base);
    { const Tensor transient({250000}); }
    const CpuMemoryStatistics after = cpu_memory_statistics();
    EXPECT_EQ(after.live_bytes, base);
    EXPECT_EQ(after.peak_live_bytes, base + 250000 * sizeof(float));
}

}  // namespace riftco_transformer
