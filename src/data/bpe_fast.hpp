#pragma once
// Internals of the fast BPE trainer and encoder, exposed for their tests. Both are written
// over a Position type (the index of a symbol in the input): std::uint32_t whenever the input
// is short enough, std::uint64_t beyond, so no input length is refused. The public entry
// points (learn_bpe_merges, BpeTokenizer::encode_bytes) pick the type; tests call both
// instantiations directly.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "data/pair_map.hpp"
#include "riftco_transformer/data/bpe_training.hpp"
#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer::detail {

// True when positions 0..length-1 and the "no position" marker all fit in Position.
template <typename Position>
[[nodiscard]] constexpr bool positions_fit(std::size_t length) noexcept {
    return length < std::numeric_limits<Position>::max();
}

// learn_bpe_merges without validation (the caller validated corpus and options).
template <typename Position>
[[nodiscard]] std::vector<BpeMergeRule> learn_bpe_merges_incremental(
    std::span<const std::uint8_t> corpus, const BpeTrainingOptions& options);

extern template std::vector<BpeMergeRule> learn_bpe_merges_incremental<std::uint32_t>(
    std::span<const std::uint8_t>, const BpeTrainingOptions&);
extern template std::vector<BpeMergeRule> learn_bpe_merges_incremental<std::uint64_t>(
    std::span<const std::uint8_t>, const BpeTrainingOptions&);

// Rank (rule index) of each merged pair of a valid merge table.
class BpeRankTable {
  public:
    static constexpr TokenId no_rank = std::numeric_limits<TokenId>::max();

    explicit BpeRankTable(std::span<const BpeMergeRule> rules);

    [[nodiscard]] TokenId rank_of(TokenId left, TokenId right) const noexcept {
        if ((left | right) < 256U) {
            return byte_pair_rank_[(left << 8U) | right];
        }
        return rank_of_pair_.find(pair_key(left, right));
    }

  private:
    std::vector<TokenId> byte_pair_rank_;  // [256*256]: pairs of two byte ids, the common case
    PairMap<TokenId> rank_of_pair_;        // every other merged pair
};

// Priority-queue encode of `bytes` with the valid merge table `rules` (see bpe_tokenizer.hpp).
template <typename Position>
[[nodiscard]] std::vector<TokenId> encode_with_merge_queue(std::span<const std::uint8_t> bytes,
                                                           std::span<const BpeMergeRule> rules,
                                                           const BpeRankTable& ranks);

extern template std::vector<TokenId> encode_with_merge_queue<std::uint32_t>(
    std::span<const std::uint8_t>, std::span<const BpeMergeRule>, const BpeRankTable&);
extern template std::vector<TokenId> encode_with_merge_queue<std::uint64_t>(
    std::span<const std::uint8_t>, std::span<const BpeMergeRule>, const BpeRankTable&);

}  // namespace riftco_transformer::detail
