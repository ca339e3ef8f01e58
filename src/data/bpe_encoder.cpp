// Priority-queue BPE encode, equal to encode_bpe_reference (the argument is in
// bpe_tokenizer.hpp).
//
// State over the input (n bytes): symbol[i], previous[i], next[i] [n] as a linked list, and a
// queue of candidate merges ordered by (rank, position). The queue has two levels: a min-heap
// of the ranks that have candidates, and per rank a bucket of positions. Popping a rank takes
// its whole bucket, sorted by position, which is exactly the order the queue would pop those
// entries one by one: merging under rank r only creates pairs of higher rank, so no entry for
// r arrives while its bucket is processed. Compared with one heap entry per candidate this
// touches memory in order (the whole-corpus case has tens of millions of candidates).
// A candidate is stale when the pair at its position has changed since it was queued;
// processing checks it against the rule itself. Cost: O(n log n) for n bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <vector>

#include "data/bpe_fast.hpp"

namespace riftco_transformer::detail {
namespace {

constexpr TokenId removed_symbol = std::numeric_limits<TokenId>::max();  // never a real id

// Candidate positions grouped by rank, ranks popped in increasing order.
template <typename Position>
class RankBucketQueue {
  public:
    explicit RankBucketQueue(std::size_t expected_ranks) : bucket_of_rank_(expected_ranks) {}

    void push(TokenId rank, Position position) {
        const auto [bucket, inserted] =
            bucket_of_rank_.try_insert(rank, static_cast<std::uint32_t>(buckets_.size()));
        if (inserted) {
            buckets_.emplace_back();
            pending_ranks_.push(rank);
        }
        buckets_[bucket].push_back(position);
    }

    [[nodiscard]] bool empty() const noexcept { return pending_ranks_.empty(); }

    // Removes the lowest pending rank; returns it and its positions in increasing order.
    TokenId pop(std::vector<Position>& positions) {
        const TokenId rank = pending_ranks_.top();
        pending_ranks_.pop();
        positions.clear();
        positions.swap(buckets_[bucket_of_rank_.find(rank)]);
        if (!std::is_sorted(positions.begin(), positions.end())) {
            std::sort(positions.begin(), positions.end());
        }
        return rank;
    }

  private:
    PairMap<std::uint32_t> bucket_of_rank_;  // rank (as a key) -> index into buckets_
    std::vector<std::vector<Position>> buckets_;
    std::priority_queue<TokenId, std::vector<TokenId>, std::greater<>> pending_ranks_;
};

}  // namespace

BpeRankTable::BpeRankTable(std::span<const BpeMergeRule> rules)
    : byte_pair_rank_(std::size_t{256} * 256, no_rank), rank_of_pair_(rules.size()) {
    for (std::size_t rank = 0; rank < rules.size(); ++rank) {
        const BpeMergeRule& rule = rules[rank];
        if ((rule.left | rule.right) < 256U) {
            byte_pair_rank_[(rule.left << 8U) | rule.right] = static_cast<TokenId>(rank);
        } else {
            rank_of_pair_.try_insert(pair_key(rule.left, rule.right), static_cast<TokenId>(rank));
        }
    }
}

template <typename Position>
std::vector<TokenId> encode_with_merge_queue(std::span<const std::uint8_t> bytes,
                                             std::span<const BpeMergeRule> rules,
                                             const BpeRankTable& ranks) {
    constexpr Position none = std::numeric_limits<Position>::max();
    std::vector<TokenId> symbol(bytes.begin(), bytes.end());
    if (symbol.size() < 2 || rules.empty()) {
        return symbol;
    }
    const auto length = static_cast<Position>(symbol.size());
    std::vector<Position> previous(symbol.size());
    std::vector<Position> next(symbol.size());
    RankBucketQueue<Position> queue(std::min(rules.size(), symbol.size()));
    for (Position i = 0; i < length; ++i) {
        previous[i] = i == 0 ? none : i - 1;
        next[i] = i + 1 == length ? none : i + 1;
        if (i + 1 < length) {
            const TokenId rank = ranks.rank_of(symbol[i], symbol[i + 1]);
            if (rank != BpeRankTable::no_rank) {
                queue.push(rank, i);
            }
        }
    }
    std::size_t live_symbols = symbol.size();
    std::vector<Position> positions;
    while (!queue.empty()) {
        const BpeMergeRule& rule = rules[queue.pop(positions)];
        for (const Position at : positions) {
            if (symbol[at] != rule.left) {
                continue;  // rewritten or unlinked since it was queued
            }
            const Position right_at = next[at];
            if (right_at == none || symbol[right_at] != rule.right) {
                continue;
            }
            const Position after = next[right_at];
            symbol[at] = rule.result;
            symbol[right_at] = removed_symbol;
            next[at] = after;
            if (after != none) {
                previous[after] = at;
            }
            --live_symbols;
            // The only new adjacencies: (before, result) and (result, after).
            const Position before = previous[at];
            if (before != none) {
                const TokenId rank = ranks.rank_of(symbol[before], rule.result);
                if (rank != BpeRankTable::no_rank) {
                    queue.push(rank, before);
                }
            }
            if (after != none) {
                const TokenId rank = ranks.rank_of(rule.result, symbol[after]);
                if (rank != BpeRankTable::no_rank) {
                    queue.push(rank, at);
                }
            }
        }
    }
    std::vector<TokenId> ids;
    ids.reserve(live_symbols);
    for (Position at = 0; at != none; at = next[at]) {  // position 0 is never unlinked
        ids.push_back(symbol[at]);
    }
    return ids;
}

template std::vector<TokenId> encode_with_merge_queue<std::uint32_t>(std::span<const std::uint8_t>,
                                                                     std::span<const BpeMergeRule>,
                                                                     const BpeRankTable&);
template std::vector<TokenId> encode_with_merge_queue<std::uint64_t>(std::span<const std::uint8_t>,
                                                                     std::span<const BpeMergeRule>,
                                                                     const BpeRankTable&);

}  // namespace riftco_transformer::detail
