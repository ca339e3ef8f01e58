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
    std::size_t block_count) {
    require_pool_arguments(dimensions, block_size, block_count);
    if (block_count == 0) {
        block_count = pages_for(dimensions.maximum_context, block_size);
    }
    return std::shared_ptr<KeyValueCachePool>(
        new KeyValueCachePool(dimensions, backend, block_size, block_count));
}

KeyValueCachePool::KeyValueCachePool(const KeyValueCacheDimensions& dimensions,
                                     ExecutionBackend backend, std::size_t block_size,
                                     std::size_t block_count)
    : dimensions_(dimensions),
      backend_(backend),
      block_size_(block_size),
      block_count_(block_count) {
    free_.reserve(block_count);
    for (std::size_t page = block_count; page-- > 0;) {
        free_.push_back(static_cast<std::uint32_t>(page));
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

std::uint32_t KeyValueCachePool::lease() {
    if (free_.empty()) {
        std::ostringstream message;
        message << pool_operation << ": pool exhausted (all " << block_count_ << " pages of "
                << block_size_ << " positions are leased)";
        throw std::runtime_error(message.str());
    }
    const std::uint32_t page = free_.back();
    free_.pop_back();
    return page;
}

void KeyValueCachePool::give_back(std::uint32_t page) noexcept {
    // Keep the free list descending so lease() hands out the lowest id (deterministic).
    free_.insert(std::upper_bound(free_.begin(), free_.end(), page, std::greater<>()), page);
}

KeyValueCache::KeyValueCache(std::shared_ptr<KeyValueCachePool> pool, KeyValueCacheKind kind)
    : pool_(std::move(pool)), kind_(kind) {
    if (!pool_) {
        throw std::invalid_argument("KeyValueCache: pool is null");
    }
    if (kind != KeyValueCacheKind::Paged && kind != KeyValueCacheKind::Contiguous) {
        throw std::invalid_argument("KeyValueCache: unknown cache kind value " +
                                    std::to_string(static_cast<std::uint32_t>(kind)));
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
    }
}

KeyValueCache::KeyValueCache(KeyValueCache&& other) noexcept
    : pool_(std::move(other.pool_)),
      kind_(other.kind_),
      pages_(std::move(other.pages_)),
      size_(other.size_),
      pending_(other.pending_),
      pages_before_(other.pages_before_) {
    other.pages_.clear();
    other.size_ = 0;
    other.pending_ = 0;
}

void KeyValueCache::begin(std::size_t count) {
    if (pending_ != 0) {
        throw std::logic_error("KeyValueCache::begin: a transaction is already open");
    }
    if (count == 0) {
        throw std::logic_error("KeyValueCache::begin: count must be positive");
    }
    if (count > capacity() - size_) {
        std::ostringstream message;
        message << "KeyValueCache::begin: the cache is full (" << size_ << " of " << capacity()
                << " positions used, " << count << " more asked)";
        throw std::length_error(message.str());
    }
    const std::size_t needed = pages_for(size_ + count, block_size());
    pages_before_ = pages_.size();
    try {
        pages_.reserve(needed);
        while (pages_.size() < needed) {
            pages_.push_back(pool_->lease());
        }
    } catch (...) {
        while (pages_.size() > pages_before_) {
            pool_->give_back(pages_.back());
            pages_.pop_back();
        }
        throw;
    }
    pending_ = count;
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
}

void KeyValueCache::abort() noexcept {
    if (pending_ == 0) {
        return;
    }
    while (pages_.size() > pages_before_) {
        pool_->give_back(pages_.back());
        pages_.pop_back();
    }
    pending_ = 0;
}

void KeyValueCache::reset() noexcept {
    abort();
    for (const std::uint32_t page : pages_) {
        pool_->give_back(page);
    }
    pages_.clear();
    size_ = 0;
}

}  // namespace riftco_transformer
