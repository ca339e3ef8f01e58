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
// Prefix caching (docs/ARCHITECTURE.md, 'Prefix caching'; opt-in at create()): a page that a
// cache fills completely is *published* under the identity of every token up to its end: its
// own block_size tokens plus the published page that holds the tokens before them (page id and
// publication number, so the identity is exact, not a hash that could collide), plus the
// cache's prefix version (the model content its keys and values came from). A cache that starts
// a sequence adopts the longest run of published pages matching its tokens (adopt_prefix),
// holding them by reference: full pages are never written again, so sharing needs no copy. A
// page's references count the caches holding it; an unreferenced published page stays cached
// (still counted free, since lease() may take it) until lease() finds no never-used or
// given-back page and evicts the least recently released one. Caches release their pages last
// page first, so a prefix's deeper pages are evicted before the pages they extend.
//
// Reservations (docs/ARCHITECTURE.md, 'Admission'): the pool is the serving engine's one page
// ledger. A cache made with a reservation of R pages (reserved_pages, normally
// blocks_for(token budget)) is admitted only if the reservations and the pages held by caches
// without one leave R pages. It then never holds more than R pages (a step needing more is
// std::length_error) and never meets "pool exhausted": even when every page it shares is let go
// by the others and it needs all R of its own, they are there. Sharing prefix pages saves
// physical pages and prefill, not reservations. A cache without a reservation leases and adopts
// only beyond the reservations. Reservations end with their cache.
//
// Threading: a pool and its caches are one unit; the caller serialises calls on them (the C
// ABI's rule for everything derived from one model).

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
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
    // zero-filled on `backend`. `prefix_caching` publishes full pages for reuse (see above).
    [[nodiscard]] static std::shared_ptr<KeyValueCachePool> create(
        const KeyValueCacheDimensions& dimensions, ExecutionBackend backend,
        std::size_t block_size = default_key_value_block_size, std::size_t block_count = 0,
        bool prefix_caching = false);

    [[nodiscard]] const KeyValueCacheDimensions& dimensions() const noexcept { return dimensions_; }
    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
    [[nodiscard]] std::size_t block_count() const noexcept { return block_count_; }
    // Pages one cache needs for a full context: ceil(maximum_context / block_size).
    [[nodiscard]] std::size_t blocks_per_full_cache() const noexcept;
    // Pages lease() can hand out: never used or given back, plus cached ones it may evict.
    [[nodiscard]] std::size_t free_block_count() const noexcept {
        return free_.size() + evictable_.size();
    }
    // Pages some cache holds (a page shared by several caches counts once).
    [[nodiscard]] std::size_t leased_block_count() const noexcept {
        return block_count_ - free_block_count();
    }
    [[nodiscard]] bool prefix_caching() const noexcept { return prefix_caching_; }

    // Reservations. blocks_for: the pages a token budget reserves, ceil(min(budget, C) /
    // block_size) (std::invalid_argument for 0). admission: Admit when that many pages are
    // available now, Wait when they will be once others end, Reject when they exceed the pool.
    enum class Admission : std::uint32_t { Admit = 0, Wait = 1, Reject = 2 };
    [[nodiscard]] std::size_t blocks_for(std::size_t token_budget) const;
    [[nodiscard]] Admission admission(std::size_t blocks) const noexcept;
    // Pages reserved by living caches, in all.
    [[nodiscard]] std::size_t reserved_block_count() const noexcept { return reserved_; }
    // Pages a new reservation can take now: those neither reserved nor held by caches
    // without a reservation.
    [[nodiscard]] std::size_t available_block_count() const noexcept {
        return block_count_ - reserved_ - unreserved_held_;
    }
    // Published pages no cache holds: reusable prefixes that lease() evicts when it must.
    [[nodiscard]] std::size_t cached_block_count() const noexcept { return evictable_.size(); }
    // Unpublishes every page (cached ones become plain free pages; held ones stay with their
    // caches). Nothing is adopted from before afterwards.
    void clear_prefix_cache() noexcept;
    // Bytes of K/V storage (both pools, every layer).
    [[nodiscard]] std::size_t storage_bytes() const noexcept;

    // The lowest free page id, else the least recently released cached page (evicted: it is
    // unpublished), for a cache with a reservation (`reserved`: a page promised to it) or
    // without. std::runtime_error "... pool exhausted ..." when every page is held, or every
    // free one is promised to reserved caches (for a cache without a reservation).
    [[nodiscard]] std::uint32_t lease(bool reserved = false);
    // Drops one reference to a held page (ids not held are a logic error the caches never
    // make). Unreferenced, it becomes free, or cached when it is published. A reserved
    // cache's page is promised to it again.
    void give_back(std::uint32_t page, bool reserved = false) noexcept;

    // The K/V pools of a layer, [block_count, Hkv, block_size, d_h]. The caches' transactions
    // write into them through tensor_ops::write_paged_key_value.
    [[nodiscard]] Tensor& keys(std::size_t layer) { return keys_.at(layer); }
    [[nodiscard]] Tensor& values(std::size_t layer) { return values_.at(layer); }

  private:
    friend class KeyValueCache;
    static constexpr std::uint32_t no_page = 0xFFFFFFFFU;

    // What a published page holds: the identity of its tokens (see above).
    struct PublishedPage {
        std::uint64_t publication = 0;   // unique per publication (0: not published)
        std::uint32_t parent = no_page;  // the published page of the tokens before, if any
        std::uint64_t parent_publication = 0;
        std::uint64_t version = 0;
        std::uint64_t key = 0;  // hash of the above and the tokens (the index's key)
        std::vector<std::uint32_t> tokens;
    };
    // A published page's identity, as a cache tracks its chain: (page, publication).
    struct PrefixLink {
        std::uint32_t page = no_page;
        std::uint64_t publication = 0;
    };

    KeyValueCachePool(const KeyValueCacheDimensions& dimensions, ExecutionBackend backend,
                      std::size_t block_size, std::size_t block_count, bool prefix_caching);

    // The published page extending `parent` by `tokens` under `version`, if any.
    [[nodiscard]] PrefixLink find_published(PrefixLink parent, std::uint64_t version,
                                            std::span<const std::uint32_t> tokens) const;
    // Publishes the held, full `page` as `parent` + `tokens` unless an identical page is
    // published already; returns the link of the published page (the twin in that case).
    PrefixLink publish(std::uint32_t page, PrefixLink parent, std::uint64_t version,
                       std::span<const std::uint32_t> tokens);
    // One more reference to a published page (adoption); false, changing nothing, when a cache
    // without a reservation would hold a page beyond what the reservations leave.
    bool hold(std::uint32_t page, bool reserved) noexcept;
    // A cache's reservation of `blocks` pages (std::out_of_range: more than the pool;
    // std::runtime_error "... pool full ...": not available now), and its end (the cache
    // holds none of its pages any more).
    void reserve(std::size_t blocks);
    void end_reservation(std::size_t blocks) noexcept;
    void unpublish(std::uint32_t page) noexcept;

    KeyValueCacheDimensions dimensions_;
    ExecutionBackend backend_;
    std::size_t block_size_;
    std::size_t block_count_;
    bool prefix_caching_;
    std::vector<std::uint32_t> free_;        // descending, so the back is the lowest free id
    std::vector<std::uint32_t> references_;  // caches holding each page
    // Prefix caching only: per page, its publication; the index by key; the unreferenced
    // published pages, least recently released first, and each one's place in that list.
    std::vector<PublishedPage> published_;
    std::unordered_multimap<std::uint64_t, std::uint32_t> index_;
    std::list<std::uint32_t> evictable_;
    std::vector<std::list<std::uint32_t>::iterator> evictable_place_;
    std::uint64_t publications_ = 0;
    std::size_t reserved_ = 0;         // pages reserved by living caches
    std::size_t unreserved_held_ = 0;  // pages held by caches without one (each holding)
    std::vector<Tensor> keys_;
    std::vector<Tensor> values_;
};

class KeyValueCache {
  public:
    // A cache leasing from `pool` (shared with other caches). `kind` is what the cache
    // reports; a Contiguous cache is normally made by contiguous() below. A nonzero
    // `reserved_pages` reserves that many pages for the cache's life (see 'Reservations'
    // above; std::out_of_range or std::runtime_error when the pool cannot).
    explicit KeyValueCache(std::shared_ptr<KeyValueCachePool> pool,
                           KeyValueCacheKind kind = KeyValueCacheKind::Paged,
                           std::size_t reserved_pages = 0);
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
    // Pages reserved for this cache (0: none; it leases only pages nobody was promised).
    [[nodiscard]] std::size_t reserved_pages() const noexcept { return reserved_pages_; }
    [[nodiscard]] const std::shared_ptr<KeyValueCachePool>& pool() const noexcept { return pool_; }
    // Logical page -> physical page, for every page leased (those of an open transaction too).
    [[nodiscard]] std::span<const std::uint32_t> page_table() const noexcept { return pages_; }

    // Reserves positions [size, size + count). std::logic_error: a transaction is open or
    // count is 0; std::length_error: size + count > capacity (the cache is full), or the
    // positions need more pages than the cache's reservation;
    // std::runtime_error: the pool ran out of pages. On any error nothing changed (pages
    // leased by this call are given back). With prefix caching, `tokens` (empty, or `count`
    // ids: std::invalid_argument otherwise) are the ids of the reserved positions; commit()
    // publishes the pages they complete. A cache stepped once without its tokens publishes
    // nothing more until reset().
    void begin(std::size_t count, std::span<const std::uint32_t> tokens = {});
    [[nodiscard]] bool in_transaction() const noexcept { return pending_ != 0; }
    // Where position `position` (< size + pending) is stored. std::out_of_range otherwise.
    [[nodiscard]] tensor_ops::PagedSlot slot(std::size_t position) const;
    void commit() noexcept;  // the reserved positions become visible
    void abort() noexcept;   // gives back the pages begin leased; size() unchanged
    // Forgets every position and returns every page, last page first (aborting an open
    // transaction).
    void reset() noexcept;
    // reset(), then takes a new prefix version (see set_prefix_version).
    void reset(std::uint64_t new_prefix_version) noexcept;

    // Prefix caching. The version names the model content the cache's keys and values come
    // from: pages are adopted only by a cache of the same version. std::logic_error unless
    // the cache is empty and no transaction is open.
    void set_prefix_version(std::uint64_t version);
    [[nodiscard]] std::uint64_t prefix_version() const noexcept { return prefix_version_; }
    // Takes, by reference, the longest run of published pages that hold tokens[0, k·block_size)
    // (only whole pages of `tokens`), and returns the positions now visible (0 without prefix
    // caching or a match). std::logic_error unless the cache is empty and no transaction is
    // open.
    std::size_t adopt_prefix(std::span<const std::uint32_t> tokens);

  private:
    void require_empty(const char* operation) const;
    void release_pages() noexcept;

    std::shared_ptr<KeyValueCachePool> pool_;
    KeyValueCacheKind kind_;
    std::size_t reserved_pages_ = 0;
    std::vector<std::uint32_t> pages_;
    std::size_t size_ = 0;
    std::size_t pending_ = 0;
    std::size_t pages_before_ = 0;  // pages_.size() when the open transaction began
    // Prefix caching: the ids of every position (visible and pending) while they are known,
    // and for each full page the published page that holds its tokens (its own or a twin).
    std::uint64_t prefix_version_ = 0;
    bool tokens_known_ = true;
    std::vector<std::uint32_t> tokens_;
    std::vector<KeyValueCachePool::PrefixLink> chain_;
};

}  // namespace riftco_transformer
