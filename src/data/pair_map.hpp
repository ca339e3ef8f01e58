#pragma once
// Insert-only open-addressing hash map from a token pair to a dense value (a pair index or a
// rule rank). BPE training and encoding look pairs up tens of millions of times, so this is a
// flat linear-probing table rather than std::unordered_map's node per entry.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer::detail {

// (left, right) as one integer whose order is the lexicographic order of the pair.
[[nodiscard]] constexpr std::uint64_t pair_key(TokenId left, TokenId right) noexcept {
    return (static_cast<std::uint64_t>(left) << 32U) | right;
}
[[nodiscard]] constexpr TokenId pair_left(std::uint64_t key) noexcept {
    return static_cast<TokenId>(key >> 32U);
}
[[nodiscard]] constexpr TokenId pair_right(std::uint64_t key) noexcept {
    return static_cast<TokenId>(key & 0xFFFFFFFFU);
}

template <typename Value>
class PairMap {
  public:
    static constexpr Value missing = std::numeric_limits<Value>::max();

    explicit PairMap(std::size_t expected_size = 0) { rehash(capacity_for(expected_size)); }

    // The value stored for `key`, or `missing`.
    [[nodiscard]] Value find(std::uint64_t key) const noexcept {
        for (std::size_t slot = home_slot(key);; slot = (slot + 1) & mask_) {
            if (keys_[slot] == key) {
                return values_[slot];
            }
            if (keys_[slot] == empty_key) {
                return missing;
            }
        }
    }

    // The value of `key`, inserting `value` first when the key is new: {stored value, inserted}.
    std::pair<Value, bool> try_insert(std::uint64_t key, Value value) {
        if ((size_ + 1) * 2 > keys_.size()) {
            rehash(keys_.size() * 2);
        }
        std::size_t slot = home_slot(key);
        for (; keys_[slot] != empty_key; slot = (slot + 1) & mask_) {
            if (keys_[slot] == key) {
                return {values_[slot], false};
            }
        }
        keys_[slot] = key;
        values_[slot] = value;
        ++size_;
        return {value, true};
    }

    [[nodiscard]] std::size_t size() const noexcept { return size_; }

  private:
    // No valid pair has both ids 0xFFFFFFFF: ids are below the vocabulary cap 2^32-1.
    static constexpr std::uint64_t empty_key = std::numeric_limits<std::uint64_t>::max();

    static std::size_t capacity_for(std::size_t expected_size) {
        return std::bit_ceil(std::max<std::size_t>(16, expected_size * 2));
    }

    [[nodiscard]] std::size_t home_slot(std::uint64_t key) const noexcept {
        // Fibonacci hashing: the high bits of key * 2^64/phi.
        return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
    }

    void rehash(std::size_t capacity) {
        std::vector<std::uint64_t> old_keys(capacity, empty_key);
        std::vector<Value> old_values(capacity);
        old_keys.swap(keys_);
        old_values.swap(values_);
        mask_ = capacity - 1;
        shift_ = 64U - static_cast<unsigned>(std::countr_zero(capacity));
        for (std::size_t i = 0; i < old_keys.size(); ++i) {
            if (old_keys[i] == empty_key) {
                continue;
            }
            std::size_t slot = home_slot(old_keys[i]);
            while (keys_[slot] != empty_key) {
                slot = (slot + 1) & mask_;
            }
            keys_[slot] = old_keys[i];
            values_[slot] = old_values[i];
        }
    }

    std::vector<std::uint64_t> keys_;
    std::vector<Value> values_;
    std::size_t mask_ = 0;
    unsigned shift_ = 64;
    std::size_t size_ = 0;
};

}  // namespace riftco_transformer::detail
