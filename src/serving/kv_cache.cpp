#include "riftco_transformer/serving/kv_cache.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace riftco_transformer {
namespace {

constexpr const char* pool_operation = "KeyValueCachePool";

std::size_t pages_for(std::size_t positions, std::size_t block_size) {
    return positions / block_size + (positions % block_size != 0 ? 1 : 0);
}

void require_pool_arguments(const KeyValueCacheDimensions& d, std::size_t block_size,
                            std::size_t block_count) {
    if (d.layer_count == 0 || d.head_count == 0 || d.head_width == 0 || d.maximum_context == 0) {
        std::ostringstream message;
        message << pool_operation << ": every dimension must be positive (layer_count "
                << d.layer_count << ", head_count " << d.head_count << ", head_width "
                << d.head_width << ", maximum_context " << d.maximum_context << ")";
        throw std::invalid_argument(message.str());
    }
    if (block_size == 0) {
        throw std::invalid_argument(std::string(pool_operation) + ": block_size must be positive");
    }
    const std::size_t full = pages_for(d.maximum_context, block_size);
    if (block_count != 0 && block_count < full) {
        std::ostringstream message;
        message << pool_operation << ": block_count " << block_count
                << " is smaller than one full context (" << full << " pages of " << block_size
                << " for maximum_context " << d.maximum_context << "); pass 0 for exactly one";
        throw std::invalid_argument(message.str());
    }
    const std::size_t pages = block_count == 0 ? full : block_count;
    if (pages - 1 > std::numeric_limits<std::uint32_t>::max()) {
        std::ostringstream message;
        message << pool_operation << ": block_count " << pages
                << " pages do not fit uint32 page ids";
        throw std::overflow_error(message.str());
    }
    // pages · H · block_size · d_h floats per layer and pool, overflow-checked.
    std::size_t elements = pages;
    for (const std::size_t factor :
         {d.head_count, block_size, d.head_width, d.layer_count, std::size_t{2}, sizeof(float)}) {
        if (elements > std::numeric_limits<std::size_t>::max() / factor) {
            std::ostringstream message;
            message << pool_operation << ": " << pages << " pages of " << block_size
                    << " positions (" << d.layer_count << " layers, " << d.head_count
                    << " heads of " << d.head_width << ") overflow the addressable size";
            throw std::overflow_error(message.str());
        }
        elements *= factor;
    }
}

}  // namespace

std::string_view key_value_cache_kind_name(KeyValueCacheKind kind) noexcept {
    switch (kind) {
        case KeyValueCacheKind::Contiguous:
            return "contiguous";
        case KeyValueCacheKind::Paged:
            return "paged";
    }
    return "unknown";
}

std::shared_ptr<KeyValueCachePool> KeyValueCachePool::create(
    const KeyValueCacheDimensions& dimensions, ExecutionBackend backend, std::size_t block_size,
    std::size_t block_count, bool prefix_caching) {
    require_pool_arguments(dimensions, block_size, block_count);
    if (block_count == 0) {
        block_count = pages_for(dimensions.maximum_context, block_size);
    }
    return std::shared_ptr<KeyValueCachePool>(
        new KeyValueCachePool(dimensions, backend, block_size, block_count, prefix_caching));
}

KeyValueCachePool::KeyValueCachePool(const KeyValueCacheDimensions& dimensions,
                                     ExecutionBackend backend, std::size_t block_size,
                                     std::size_t block_count, bool prefix_caching)
    : dimensions_(dimensions),
      backend_(backend),
      block_size_(block_size),
      block_count_(block_count),
      prefix_caching_(prefix_caching),
      references_(block_count, 0) {
    free_.reserve(block_count);
    for (std::size_t page = block_count; page-- > 0;) {
        free_.push_back(static_cast<std::uint32_t>(page));
    }
    if (prefix_caching) {
        published_.resize(block_count);
        evictable_place_.resize(block_count, evictable_.end());
    }
    const Shape shape{block_count, dimensions.head_count, block_size, dimensions.head_width};
    keys_.reserve(dimensions.layer_count);
    values_.reserve(dimensions.layer_count);
    for (std::size_t layer = 0; layer < dimensions.layer_count; ++layer) {
        keys_.push_back(Tensor::zeros(shape, backend));
        values_.push_back(Tensor::zeros(shape, backend));
    }
}

std::size_t KeyValueCachePool::blocks_per_full_cache() const noexcept {
    return pages_for(dimensions_.maximum_context, block_size_);
}

std::size_t KeyValueCachePool::storage_bytes() const noexcept {
    return 2 * dimensions_.layer_count * block_count_ * dimensions_.head_count * block_size_ *
           dimensions_.head_width * sizeof(float);
}

std::size_t KeyValueCachePool::blocks_for(std::size_t token_budget) const {
    if (token_budget == 0) {
        throw std::invalid_argument(std::string(pool_operation) +
                                    ": a token budget must be positive");
    }
    return pages_for(std::min(token_budget, dimensions_.maximum_context), block_size_);
}

KeyValueCachePool::Admission KeyValueCachePool::admission(std::size_t blocks) const noexcept {
    if (blocks > block_count_) {
        return Admission::Reject;
    }
    return blocks <= available_block_count() ? Admission::Admit : Admission::Wait;
}

void KeyValueCachePool::reserve(std::size_t blocks) {
    switch (admission(blocks)) {
        case Admission::Admit:
            break;
        case Admission::Reject: {
            std::ostringstream message;
            message << pool_operation << ": a reservation of " << blocks << " pages of "
                    << block_size_ << " positions is more than the whole pool of " << block_count_;
            throw std::out_of_range(message.str());
        }
        case Admission::Wait: {
            std::ostringstream message;
            message << pool_operation << ": pool full: a reservation of " << blocks
                    << " pages, only " << available_block_count() << " of " << block_count_
                    << " are available now (" << reserved_ << " reserved)";
            throw std::runtime_error(message.str());
        }
    }
    reserved_ += blocks;
}

void KeyValueCachePool::end_reservation(std::size_t blocks) noexcept {
    reserved_ -= blocks;
}

std::uint32_t KeyValueCachePool::lease(bool reserved) {
    if (!reserved && reserved_ + unreserved_held_ >= block_count_ && free_block_count() != 0) {
        std::ostringstream message;
        message << pool_operation << ": pool exhausted (the " << free_block_count()
                << " free pages are promised to sessions with reservations)";
        throw std::runtime_error(message.str());
    }
    std::uint32_t page = 0;
    if (!free_.empty()) {
        page = free_.back();
        free_.pop_back();
    } else if (!evictable_.empty()) {
        page = evictable_.front();  // the least recently released cached page
        unpublish(page);
    } else {
        std::ostringstream message;
        message << pool_operation << ": pool exhausted (all " << block_count_ << " pages of "
                << block_size_ << " positions are leased)";
        throw std::runtime_error(message.str());
    }
    references_[page] = 1;
    if (!reserved) {
        ++unreserved_held_;
    }
    return page;
}

void KeyValueCachePool::give_back(std::uint32_t page, bool reserved) noexcept {
    if (!reserved) {
        --unreserved_held_;
    }
    if (--references_[page] != 0) {
        return;  // another cache still holds it
    }
    if (prefix_caching_ && published_[page].publication != 0) {
        evictable_place_[page] = evictable_.insert(evictable_.end(), page);
        return;
    }
    // Keep the free list descending so lease() hands out the lowest id (deterministic).
    free_.insert(std::upper_bound(free_.begin(), free_.end(), page, std::greater<>()), page);
}

bool KeyValueCachePool::hold(std::uint32_t page, bool reserved) noexcept {
    if (!reserved && reserved_ + unreserved_held_ >= block_count_) {
        return false;  // every page beyond the held ones is promised to reservations
    }
    if (references_[page] == 0) {  // cached: it leaves the eviction order
        evictable_.erase(evictable_place_[page]);
        evictable_place_[page] = evictable_.end();
    }
    ++references_[page];
    if (!reserved) {
        ++unreserved_held_;
    }
    return true;
}

// Removes a page from the index (the caller decides where the page goes next). A cached page
// leaves the eviction order too.
void KeyValueCachePool::unpublish(std::uint32_t page) noexcept {
    PublishedPage& entry = published_[page];
    const auto [first, last] = index_.equal_range(entry.key);
    for (auto it = first; it != last; ++it) {
        if (it->second == page) {
            index_.erase(it);
            break;
        }
    }
    if (evictable_place_[page] != evictable_.end()) {
        evictable_.erase(evictable_place_[page]);
        evictable_place_[page] = evictable_.end();
    }
    entry.publication = 0;
    entry.tokens.clear();
}

void KeyValueCachePool::clear_prefix_cache() noexcept {
    if (!prefix_caching_) {
        return;
    }
    while (!evictable_.empty()) {  // cached pages become plain free pages
        const std::uint32_t page = evictable_.front();
        unpublish(page);
        // free_ has capacity for every page (reserved at construction): no allocation here.
        free_.insert(std::upper_bound(free_.begin(), free_.end(), page, std::greater<>()), page);
    }
    for (std::uint32_t page = 0; page < block_count_; ++page) {
        if (published_[page].publication != 0) {
            unpublish(page);  // held: freed when its caches let it go
        }
    }
}

namespace {

// FNV-1a over 64-bit words: the index's bucket key (identity is checked in full on lookup).
std::uint64_t prefix_key(std::uint32_t parent, std::uint64_t parent_publication,
                         std::uint64_t version, std::span<const std::uint32_t> tokens) {
    std::uint64_t hash = 0xcbf29ce484222325ULL;
    const auto mix = [&hash](std::uint64_t word) {
        for (int byte = 0; byte < 8; ++byte) {
            hash ^= (word >> (8 * byte)) & 0xFFU;
            hash *= 0x100000001b3ULL;
        }
    };
    mix(parent);
    mix(parent_publication);
    mix(version);
    for (const std::uint32_t token : tokens) {
        mix(token);
    }
    return hash;
}

}  // namespace

KeyValueCachePool::PrefixLink KeyValueCachePool::find_published(
    PrefixLink parent, std::uint64_t version, std::span<const std::uint32_t> tokens) const {
    const std::uint64_t key = prefix_key(parent.page, parent.publication, version, tokens);
    const auto [first, last] = index_.equal_range(key);
    for (auto it = first; it != last; ++it) {
        const PublishedPage& entry = published_[it->second];
        if (entry.parent == parent.page && entry.parent_publication == parent.publication &&
            entry.version == version &&
            std::equal(tokens.begin(), tokens.end(), entry.tokens.begin(), entry.tokens.end())) {
            return {it->second, entry.publication};
        }
    }
    return {};
}

KeyValueCachePool::PrefixLink KeyValueCachePool::publish(std::uint32_t page, PrefixLink parent,
                                                         std::uint64_t version,
                                                         std::span<const std::uint32_t> tokens) {
    if (const PrefixLink twin = find_published(parent, version, tokens); twin.page != no_page) {
        return twin;  // this page stays private and is freed when its cache lets it go
    }
    PublishedPage& entry = published_[page];
    entry.publication = ++publications_;
    entry.parent = parent.page;
    entry.parent_publication = parent.publication;
    entry.version = version;
    entry.key = prefix_key(parent.page, parent.publication, version, tokens);
    entry.tokens.assign(tokens.begin(), tokens.end());
    index_.emplace(entry.key, page);
    return {page, entry.publication};
}

KeyValueCache::KeyValueCache(std::shared_ptr<KeyValueCachePool> pool, KeyValueCacheKind kind,
                             std::size_t reserved_pages)
    : pool_(std::move(pool)), kind_(kind) {
    if (!pool_) {
        throw std::invalid_argument("KeyValueCache: pool is null");
    }
    if (kind != KeyValueCacheKind::Paged && kind != KeyValueCacheKind::Contiguous) {
        throw std::invalid_argument("KeyValueCache: unknown cache kind value " +
                                    std::to_string(static_cast<std::uint32_t>(kind)));
    }
    if (reserved_pages != 0) {
        pool_->reserve(reserved_pages);
        reserved_pages_ = reserved_pages;
    }
}

KeyValueCache KeyValueCache::with_private_pool(const KeyValueCacheDimensions& dimensions,
                                               ExecutionBackend backend, KeyValueCacheKind kind,
                                               std::size_t block_size) {
    if (kind == KeyValueCacheKind::Contiguous) {
        // (A zero maximum_context is named by create's dimension check, which runs first.)
        return KeyValueCache(
            KeyValueCachePool::create(dimensions, backend, dimensions.maximum_context, 1), kind);
    }
    if (kind != KeyValueCacheKind::Paged) {
        throw std::invalid_argument("KeyValueCache: unknown cache kind value " +
                                    std::to_string(static_cast<std::uint32_t>(kind)));
    }
    return KeyValueCache(KeyValueCachePool::create(dimensions, backend, block_size, 0), kind);
}

KeyValueCache::~KeyValueCache() {
    if (pool_) {
        reset();
        pool_->end_reservation(reserved_pages_);
    }
}

KeyValueCache::KeyValueCache(KeyValueCache&& other) noexcept
    : pool_(std::move(other.pool_)),
      kind_(other.kind_),
      reserved_pages_(other.reserved_pages_),
      pages_(std::move(other.pages_)),
      size_(other.size_),
      pending_(other.pending_),
      pages_before_(other.pages_before_),
      prefix_version_(other.prefix_version_),
      tokens_known_(other.tokens_known_),
      tokens_(std::move(other.tokens_)),
      chain_(std::move(other.chain_)) {
    other.pages_.clear();
    other.reserved_pages_ = 0;
    other.size_ = 0;
    other.pending_ = 0;
    other.tokens_.clear();
    other.chain_.clear();
}

void KeyValueCache::begin(std::size_t count, std::span<const std::uint32_t> tokens) {
    if (pending_ != 0) {
        throw std::logic_error("KeyValueCache::begin: a transaction is already open");
    }
    if (count == 0) {
        throw std::logic_error("KeyValueCache::begin: count must be positive");
    }
    if (!tokens.empty() && tokens.size() != count) {
        std::ostringstream message;
        message << "KeyValueCache::begin: " << tokens.size() << " token ids given for " << count
                << " positions";
        throw std::invalid_argument(message.str());
    }
    if (count > capacity() - size_) {
        std::ostringstream message;
        message << "KeyValueCache::begin: the cache is full (" << size_ << " of " << capacity()
                << " positions used, " << count << " more asked)";
        throw std::length_error(message.str());
    }
    const std::size_t needed = pages_for(size_ + count, block_size());
    const bool reserved = reserved_pages_ != 0;
    if (reserved && needed > reserved_pages_) {
        std::ostringstream message;
        message << "KeyValueCache::begin: " << size_ + count << " positions need " << needed
                << " pages, more than the cache's reservation of " << reserved_pages_;
        throw std::length_error(message.str());
    }
    pages_before_ = pages_.size();
    try {
        pages_.reserve(needed);
        while (pages_.size() < needed) {
            pages_.push_back(pool_->lease(reserved));
        }
    } catch (...) {
        while (pages_.size() > pages_before_) {
            pool_->give_back(pages_.back(), reserved);
            pages_.pop_back();
        }
        throw;
    }
    pending_ = count;
    if (pool_->prefix_caching() && tokens_known_) {
        if (tokens.empty()) {
            tokens_known_ = false;  // this sequence's later pages cannot be identified
            tokens_.clear();
        } else {
            tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
        }
    }
}

tensor_ops::PagedSlot KeyValueCache::slot(std::size_t position) const {
    if (position >= size_ + pending_) {
        std::ostringstream message;
        message << "KeyValueCache::slot: position " << position << " is not reserved ("
                << size_ + pending_ << " positions)";
        throw std::out_of_range(message.str());
    }
    return {pages_[position / block_size()], static_cast<std::uint32_t>(position % block_size())};
}

void KeyValueCache::commit() noexcept {
    size_ += pending_;
    pending_ = 0;
    if (!pool_->prefix_caching() || !tokens_known_) {
        return;
    }
    // Publish every page this step completed, as long as the chain before it is published.
    const std::size_t block = block_size();
    try {
        while (chain_.size() < size_ / block) {
            const std::size_t page = chain_.size();
            const KeyValueCachePool::PrefixLink parent =
                page == 0 ? KeyValueCachePool::PrefixLink{} : chain_.back();
            if (page != 0 && parent.page == KeyValueCachePool::no_page) {
                break;
            }
            chain_.push_back(pool_->publish(
                pages_[page], parent, prefix_version_,
                std::span<const std::uint32_t>(tokens_).subspan(page * block, block)));
        }
    } catch (...) {  // allocation failure: stop publishing this sequence; nothing is wrong
        tokens_known_ = false;
    }
}

void KeyValueCache::abort() noexcept {
    if (pending_ == 0) {
        return;
    }
    while (pages_.size() > pages_before_) {
        pool_->give_back(pages_.back(), reserved_pages_ != 0);
        pages_.pop_back();
    }
    if (tokens_known_ && tokens_.size() > size_) {
        tokens_.resize(size_);
    }
    pending_ = 0;
}

void KeyValueCache::release_pages() noexcept {
    // Last page first: the deepest pages of a prefix become the first eviction candidates.
    while (!pages_.empty()) {
        pool_->give_back(pages_.back(), reserved_pages_ != 0);
        pages_.pop_back();
    }
}

void KeyValueCache::reset() noexcept {
    abort();
    release_pages();
    size_ = 0;
    tokens_known_ = true;
    tokens_.clear();
    chain_.clear();
}

void KeyValueCache::reset(std::uint64_t new_prefix_version) noexcept {
    reset();
    prefix_version_ = new_prefix_version;
}

void KeyValueCache::require_empty(const char* operation) const {
    if (size_ != 0 || pending_ != 0) {
        std::ostringstream message;
        message << "KeyValueCache::" << operation << ": the cache must be empty (it holds " << size_
                << " positions" << (pending_ != 0 ? " and an open transaction" : "")
                << "); reset() it first";
        throw std::logic_error(message.str());
    }
}

void KeyValueCache::set_prefix_version(std::uint64_t version) {
    require_empty("set_prefix_version");
    prefix_version_ = version;
}

std::size_t KeyValueCache::adopt_prefix(std::span<const std::uint32_t> tokens) {
    require_empty("adopt_prefix");
    if (!pool_->prefix_caching()) {
        return 0;
    }
    const std::size_t block = block_size();
    std::size_t whole_pages = std::min(tokens.size(), capacity()) / block;
    if (reserved_pages_ != 0) {
        whole_pages = std::min(whole_pages, reserved_pages_);
    }
    KeyValueCachePool::PrefixLink parent;
    std::vector<KeyValueCachePool::PrefixLink> found;
    for (std::size_t page = 0; page < whole_pages; ++page) {
        const KeyValueCachePool::PrefixLink link =
            pool_->find_published(parent, prefix_version_, tokens.subspan(page * block, block));
        if (link.page == KeyValueCachePool::no_page) {
            break;
        }
        found.push_back(link);
        parent = link;
    }
    if (found.empty()) {
        return 0;
    }
    pages_.reserve(found.size());
    tokens_.reserve(found.size() * block);
    for (std::size_t page = 0; page < found.size(); ++page) {
        if (!pool_->hold(found[page].page, reserved_pages_ != 0)) {
            found.resize(page);  // the rest is promised to reserved caches: stop here
            break;
        }
        pages_.push_back(found[page].page);
    }
    const std::size_t positions = found.size() * block;
    tokens_.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(positions));
    chain_ = std::move(found);
    size_ = positions;
    tokens_known_ = true;
    return positions;
}

}  // namespace riftco_transformer
