#pragma once
// KV caches of the decode path (docs/ARCHITECTURE.md, 'Decoding and KV caches'): where the keys and
// values of the positions a request has seen live between decode steps.
//
// A KeyValueCachePool owns, for every layer, one key and one value tensor
//   [physical_page, key_value_head, page_offset, head_width]
// (Hkv heads: a grouped-query model's query heads share them, nothing is stored repeated)
// and leases physical pages to request-local KeyValueCaches; one page id indexes the same
// page in every layer. A KeyValueCache maps its logical pages (position / block_size) to the
// physical pages it leased, lazily: a page is leased when the sequence first crosses into it,
// and all its pages go back on reset() or destruction. Many caches share one pool (the
// continuous-batching scheduler's), or a cache has a private pool sized for one context:
//   Paged       a pool of block_size-position pages (default 16);
//   Contiguous  the reference strategy: one page of maximum_context positions, reported
//               block_size = maximum_context. Both reach the same paged-attention kernel.
//
// Each step is one transaction over all layers: begin(count) reserves the next `count`
// positions (leasing any page they need), the layers write their keys and values at
// slot(position), then commit() makes the positions visible, or abort() gives the new pages
// back and leaves size() unchanged. One transaction at a time.
//
// Threading: a pool and its caches are one unit; the caller serialises calls on them (the C
// ABI's rule for everything derived from one model).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"

namespace riftco_transformer {

// Values are the C ABI's RT_KV_CACHE_* (docs/ARCHITECTURE.md, 'The C ABI').
enum class KeyValueCacheKind : std::uint32_t { Contiguous = 0, Paged = 1 };
[[nodiscard]] std::string_view key_value_cache_kind_name(KeyValueCacheKind kind) noexcept;

inline constexpr std::size_t default_key_value_block_size = 16;

struct KeyValueCacheDimensions {
    std::size_t layer_count = 0;
    std::size_t head_count = 0;  // key/value heads Hkv (the model's query heads may be Hkv·r)
    std::size_t head_width = 0;
    std::size_t maximum_context = 0;  // the capacity of every cache of the pool
};

class KeyValueCachePool {
  public:
    // block_size positions per page; block_count pages, 0 meaning exactly one full context
    // (ceil(maximum_context / block_size)). std::invalid_argument: a zero dimension, a block
    // size of 0, a nonzero block_count below one full context; std::overflow_error: page ids
    // that would not fit uint32, or a pool whose element count overflows. The pools are
    // zero-filled on `backend`.
    [[nodiscard]] static std::shared_ptr<KeyValueCachePool> create(
        const KeyValueCacheDimensions& dimensions, ExecutionBackend backend,
        std::size_t block_size = default_key_value_block_size, std::size_t block_count = 0);

    [[nodiscard]] const KeyValueCacheDimensions& dimensions() const noexcept { return dimensions_; }
    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
    [[nodiscard]] std::size_t block_count() const noexcept { return block_count_; }
    // Pages one cache needs for a full context: ceil(maximum_context / block_size).
    [[nodiscard]] std::size_t blocks_per_full_cache() const noexcept;
    [[nodiscard]] std::size_t free_block_count() const noexcept { return free_.size(); }
    [[nodiscard]] std::size_t leased_block_count() const noexcept {
        return block_count_ - free_.size();
    }
    // Bytes of K/V storage (both pools, every layer).
    [[nodiscard]] std::size_t storage_bytes() const noexcept;

    // The lowest free page id. std::runtime_error "... pool exhausted ..." when none is free.
    [[nodiscard]] std::uint32_t lease();
    // Returns a leased page (ids not leased are a logic error the caches never make).
    void give_back(std::uint32_t page) noexcept;

    // The K/V pools of a layer, [block_count, Hkv, block_size, d_h]. The caches' transactions
    // write into them through tensor_ops::write_paged_key_value.
    [[nodiscard]] Tensor& keys(std::size_t layer) { return keys_.at(layer); }
    [[nodiscard]] Tensor& values(std::size_t layer) { return values_.at(layer); }

  private:
    KeyValueCachePool(const KeyValueCacheDimensions& dimensions, ExecutionBackend backend,
                      std::size_t block_size, std::size_t block_count);

    KeyValueCacheDimensions dimensions_;
    ExecutionBackend backend_;
    std::size_t block_size_;
    std::size_t block_count_;
    std::vector<std::uint32_t> free_;  // descending, so the back is the lowest free id
    std::vector<Tensor> keys_;
    std::vector<Tensor> values_;
};

class KeyValueCache {
  public:
    // A cache leasing from `pool` (shared with other caches). `kind` is what the cache
    // reports; a Contiguous cache is normally made by contiguous() below.
    explicit KeyValueCache(std::shared_ptr<KeyValueCachePool> pool,
                           KeyValueCacheKind kind = KeyValueCacheKind::Paged);
    // A cache with a private pool: Paged of ceil(C / block_size) pages, or Contiguous (one
    // page of C positions; block_size is ignored).
    [[nodiscard]] static KeyValueCache with_private_pool(
        const KeyValueCacheDimensions& dimensions, ExecutionBackend backend, KeyValueCacheKind kind,
        std::size_t block_size = default_key_value_block_size);
    ~KeyValueCache();
    KeyValueCache(KeyValueCache&& other) noexcept;
    KeyValueCache& operator=(KeyValueCache&&) = delete;
    KeyValueCache(const KeyValueCache&) = delete;
    KeyValueCache& operator=(const KeyValueCache&) = delete;

    [[nodiscard]] std::size_t size() const noexcept { return size_; }  // visible positions
    [[nodiscard]] std::size_t capacity() const noexcept {
        return pool_->dimensions().maximum_context;
    }
    [[nodiscard]] std::size_t block_size() const noexcept { return pool_->block_size(); }
    [[nodiscard]] KeyValueCacheKind kind() const noexcept { return kind_; }
    [[nodiscard]] const std::shared_ptr<KeyValueCachePool>& pool() const noexcept { return pool_; }
    // Logical page -> physical page, for every page leased (those of an open transaction too).
    [[nodiscard]] std::span<const std::uint32_t> page_table() const noexcept { return pages_; }

    // Reserves positions [size, size + count). std::logic_error: a transaction is open or
    // count is 0; std::length_error: size + count > capacity (the cache is full);
    // std::runtime_error: the pool ran out of pages. On any error nothing changed (pages
    // leased by this call are given back).
    void begin(std::size_t count);
    [[nodiscard]] bool in_transaction() const noexcept { return pending_ != 0; }
    // Where position `position` (< size + pending) is stored. std::out_of_range otherwise.
    [[nodiscard]] tensor_ops::PagedSlot slot(std::size_t position) const;
    void commit() noexcept;  // the reserved positions become visible
    void abort() noexcept;   // gives back the pages begin leased; size() unchanged
    // Forgets every position and returns every page (aborting an open transaction).
    void reset() noexcept;

  private:
    std::shared_ptr<KeyValueCachePool> pool_;
    KeyValueCacheKind kind_;
    std::vector<std::uint32_t> pages_;
    std::size_t size_ = 0;
    std::size_t pending_ = 0;
    std::size_t pages_before_ = 0;  // pages_.size() when the open transaction began
};

}  // namespace riftco_transformer
