// Fast BPE training: the merges of learn_bpe_merges_reference, with pair counts kept up to
// date instead of recounted.
//
// State over the corpus (n = corpus bytes):
//   symbol[i], previous[i], next[i]   [n]  a doubly linked list of the current symbols; a merge
//                                          at i rewrites symbol[i] and unlinks next[i]
//   per distinct pair p: key (left,right), count (overlapping occurrences, exactly the
//   reference's recount), and candidate positions (where p started at some point; entries may
//   be stale and are checked when used)
//   an indexed max-heap of pairs by (count desc, key asc): its top is the reference's choice.
//   The heap orders by its own copy of each count, refreshed one pair at a time after a
//   pass, so it is a valid heap before every sift (sifting several stale keys at once is not).
//
// Merging (L,R) -> Z walks the candidate positions of (L,R) in increasing order and, where
// the pair is still there, rewrites L R -> Z like the reference's left-to-right pass: the
// neighbour pairs (x,L) and (R,y) lose one occurrence, (x,Z) and (Z,y) gain one. Only those
// pairs change, and the heap is repaired once per changed pair after the pass.
//
// Why the candidate list is complete: a pair appears at a position only at the start or when
// a merge creates it next to a new Z, and both events record the position. Why (L,R) is gone
// after its pass: the pass consumes every occurrence it does not skip, it skips one only
// inside a run L L L (L == R) where the next one is then consumed, and no later merge can
// recreate (L,R) because new adjacencies always contain a new id.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "data/bpe_fast.hpp"
#include "data/bpe_validation.hpp"
#include "data/pair_map.hpp"

namespace riftco_transformer {
namespace detail {
namespace {

constexpr TokenId removed_symbol = std::numeric_limits<TokenId>::max();  // never a real id

template <typename Position>
class IncrementalBpeTrainer {
  public:
    static constexpr Position none = std::numeric_limits<Position>::max();

    explicit IncrementalBpeTrainer(std::span<const std::uint8_t> corpus)
        : symbol_(corpus.begin(), corpus.end()),
          previous_(corpus.size()),
          next_(corpus.size()),
          live_symbols_(corpus.size()),
          pair_of_key_(std::min<std::size_t>(corpus.size(), std::size_t{1} << 16U)) {
        const auto length = static_cast<Position>(corpus.size());
        for (Position i = 0; i < length; ++i) {
            previous_[i] = i == 0 ? none : i - 1;
            next_[i] = i + 1 == length ? none : i + 1;
        }
        for (Position i = 0; i + 1 < length; ++i) {
            add_occurrence(symbol_[i], symbol_[i + 1], i);
        }
        repair_heap();
    }

    std::vector<BpeMergeRule> train(const BpeTrainingOptions& options) {
        std::vector<BpeMergeRule> rules;
        std::uint64_t vocabulary = first_merged_id;
        while (vocabulary < options.vocabulary_size && live_symbols_ >= 2) {
            // At least two symbols means at least one pair with a positive count.
            const Position best = heap_.front();
            if (count_[best] < options.minimum_pair_frequency) {
                break;
            }
            const BpeMergeRule rule{pair_left(key_[best]), pair_right(key_[best]),
                                    static_cast<TokenId>(vocabulary)};
            rules.push_back(rule);
            ++vocabulary;
            merge(best, rule);
            repair_heap();
        }
        return rules;
    }

  private:
    // ---- pair bookkeeping --------------------------------------------------------------

    Position pair_index(TokenId left, TokenId right) {
        const auto [index, inserted] =
            pair_of_key_.try_insert(pair_key(left, right), static_cast<Position>(key_.size()));
        if (inserted) {
            key_.push_back(pair_key(left, right));
            count_.push_back(0);
            candidates_.emplace_back();
            heap_count_.push_back(0);
            heap_slot_.push_back(none);
            dirty_.push_back(0);
        }
        return index;
    }

    void mark_dirty(Position pair) {
        if (dirty_[pair] == 0) {
            dirty_[pair] = 1;
            dirty_pairs_.push_back(pair);
        }
    }

    void add_occurrence(TokenId left, TokenId right, Position position) {
        const Position pair = pair_index(left, right);
        ++count_[pair];
        candidates_[pair].push_back(position);
        mark_dirty(pair);
    }

    void remove_occurrence(TokenId left, TokenId right) {
        const Position pair = pair_of_key_.find(pair_key(left, right));
        --count_[pair];
        mark_dirty(pair);
    }

    // ---- the merge pass ----------------------------------------------------------------

    void merge(Position pair, const BpeMergeRule& rule) {
        std::vector<Position> positions = std::move(candidates_[pair]);
        candidates_[pair] = {};
        std::sort(positions.begin(), positions.end());
        for (const Position at : positions) {
            if (symbol_[at] != rule.left) {
                continue;  // rewritten or unlinked since it was recorded
            }
            const Position right_at = next_[at];
            if (right_at == none || symbol_[right_at] != rule.right) {
                continue;
            }
            const Position before = previous_[at];
            const Position after = next_[right_at];
            if (before != none) {
                remove_occurrence(symbol_[before], rule.left);
            }
            remove_occurrence(rule.left, rule.right);
            if (after != none) {
                remove_occurrence(rule.right, symbol_[after]);
            }
            symbol_[at] = rule.result;
            symbol_[right_at] = removed_symbol;
            next_[at] = after;
            if (after != none) {
                previous_[after] = at;
            }
            --live_symbols_;
            if (before != none) {
                add_occurrence(symbol_[before], rule.result, before);
            }
            if (after != none) {
                add_occurrence(rule.result, symbol_[after], at);
            }
        }
    }

    // ---- indexed max-heap of pairs by (count desc, key asc) ----------------------------

    [[nodiscard]] bool ranks_before(Position a, Position b) const noexcept {
        return heap_count_[a] != heap_count_[b] ? heap_count_[a] > heap_count_[b]
                                                : key_[a] < key_[b];
    }

    void place(std::size_t slot, Position pair) {
        heap_[slot] = pair;
        heap_slot_[pair] = static_cast<Position>(slot);
    }

    void sift_up(std::size_t slot) {
        const Position pair = heap_[slot];
        while (slot > 0) {
            const std::size_t parent = (slot - 1) / 2;
            if (!ranks_before(pair, heap_[parent])) {
                break;
            }
            place(slot, heap_[parent]);
            slot = parent;
        }
        place(slot, pair);
    }

    void sift_down(std::size_t slot) {
        const Position pair = heap_[slot];
        for (;;) {
            std::size_t child = 2 * slot + 1;
            if (child >= heap_.size()) {
                break;
            }
            if (child + 1 < heap_.size() && ranks_before(heap_[child + 1], heap_[child])) {
                ++child;
            }
            if (!ranks_before(heap_[child], pair)) {
                break;
            }
            place(slot, heap_[child]);
            slot = child;
        }
        place(slot, pair);
    }

    void erase_from_heap(Position pair) {
        const std::size_t slot = heap_slot_[pair];
        heap_slot_[pair] = none;
        const Position last = heap_.back();
        heap_.pop_back();
        if (slot < heap_.size()) {
            place(slot, last);
            sift_up(slot);
            sift_down(heap_slot_[last]);
        }
    }

    // Moves every pair whose count changed since the last repair to its place.
    void repair_heap() {
        for (const Position pair : dirty_pairs_) {
            dirty_[pair] = 0;
            heap_count_[pair] = count_[pair];
            const bool in_heap = heap_slot_[pair] != none;
            if (count_[pair] == 0) {
                if (in_heap) {
                    erase_from_heap(pair);
                }
                candidates_[pair] = {};  // it cannot occur again before it is recreated
            } else if (!in_heap) {
                heap_.push_back(pair);
                sift_up(heap_.size() - 1);
            } else {
                sift_up(heap_slot_[pair]);
                sift_down(heap_slot_[pair]);
            }
        }
        dirty_pairs_.clear();
    }

    std::vector<TokenId> symbol_;                    // [n]; removed_symbol once unlinked
    std::vector<Position> previous_;                 // [n]
    std::vector<Position> next_;                     // [n]
    std::size_t live_symbols_;                       // current sequence length
    PairMap<Position> pair_of_key_;                  // (left,right) -> pair index
    std::vector<std::uint64_t> key_;                 // [pairs] pair_key(left, right)
    std::vector<Position> count_;                    // [pairs] overlapping occurrences now
    std::vector<std::vector<Position>> candidates_;  // [pairs] positions, possibly stale
    std::vector<Position> heap_count_;               // [pairs] count_ as the heap last saw it
    std::vector<Position> heap_slot_;                // [pairs] slot in heap_, or none
    std::vector<std::uint8_t> dirty_;                // [pairs] listed in dirty_pairs_
    std::vector<Position> dirty_pairs_;
    std::vector<Position> heap_;  // pair indices; heap_[0] ranks first
};

}  // namespace

template <typename Position>
std::vector<BpeMergeRule> learn_bpe_merges_incremental(std::span<const std::uint8_t> corpus,
                                                       const BpeTrainingOptions& options) {
    IncrementalBpeTrainer<Position> trainer(corpus);
    return trainer.train(options);
}

template std::vector<BpeMergeRule> learn_bpe_merges_incremental<std::uint32_t>(
    std::span<const std::uint8_t>, const BpeTrainingOptions&);
template std::vector<BpeMergeRule> learn_bpe_merges_incremental<std::uint64_t>(
    std::span<const std::uint8_t>, const BpeTrainingOptions&);

}  // namespace detail

std::vector<BpeMergeRule> learn_bpe_merges(std::span<const std::uint8_t> corpus,
                                           const BpeTrainingOptions& options) {
    detail::validate_bpe_training("learn_bpe_merges", corpus, options);
    if (detail::positions_fit<std::uint32_t>(corpus.size())) {
        return detail::learn_bpe_merges_incremental<std::uint32_t>(corpus, options);
    }
    return detail::learn_bpe_merges_incremental<std::uint64_t>(corpus, options);
}

}  // namespace riftco_transformer
