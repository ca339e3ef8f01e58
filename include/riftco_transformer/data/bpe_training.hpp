#pragma once
// Byte-pair-encoding training (docs/ARCHITECTURE.md, 'Tokenizers'). The algorithm is bit-exact by
// contract, because artifacts store its output. Starting from the corpus as one sequence of byte
// ids (0..255; the whole corpus is one sequence, so merges may span spaces and newlines), repeat
// while the vocabulary is below `vocabulary_size` and the sequence has at least two tokens:
//   1. count every adjacent pair, overlapping windows included ("aaa" holds (a,a) twice);
//   2. take the pair with the highest count, ties to the smallest (left, right);
//   3. stop if that count is below `minimum_pair_frequency`;
//   4. record the rule (left, right, result = current vocabulary size, starting at 256);
//   5. rewrite the sequence, replacing non-overlapping occurrences left to right.
// The vocabulary size is a cap: training may stop earlier.
//
// learn_bpe_merges is the fast trainer used by BpeTokenizer: it keeps pair counts up to date
// incrementally (only the neighbourhoods of the merged occurrences change) and picks the best
// pair from an indexed max-heap, so one merge costs time proportional to the occurrences it
// rewrites. learn_bpe_merges_reference (bpe_reference.hpp) is the literal algorithm; both
// return identical rules for every input.

#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer {

inline constexpr std::uint64_t default_bpe_vocabulary_size = 512;
inline constexpr std::uint64_t default_minimum_pair_frequency = 2;

struct BpeTrainingOptions {
    // Maximum final vocabulary size (256 byte tokens plus merges), in [256, 2^32-1].
    std::uint64_t vocabulary_size = default_bpe_vocabulary_size;
    // A pair is merged only when it occurs at least this often; at least 1.
    std::uint64_t minimum_pair_frequency = default_minimum_pair_frequency;
};

// Errors (both trainers): empty corpus, vocabulary_size outside [256, 2^32-1] or
// minimum_pair_frequency 0 are std::invalid_argument.
[[nodiscard]] std::vector<BpeMergeRule> learn_bpe_merges(std::span<const std::uint8_t> corpus,
                                                         const BpeTrainingOptions& options = {});

}  // namespace riftco_transformer
