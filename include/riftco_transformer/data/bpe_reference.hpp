#pragma once
// Readable references for BPE: the documented algorithms written out literally, with no
// incremental state. They are the oracles the fast trainer and the heap encoder are tested
// against, and they define the expected output; they are far too slow for real corpora
// (training recounts every pair per merge: O(merges x corpus); encoding runs one pass per
// rule: O(rules x length)).

#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/data/bpe_training.hpp"
#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer {

// The training loop of bpe_training.hpp, step by step. Same errors as learn_bpe_merges.
[[nodiscard]] std::vector<BpeMergeRule> learn_bpe_merges_reference(
    std::span<const std::uint8_t> corpus, const BpeTrainingOptions& options = {});

// Encode as the contract states it: start from the byte ids, then apply every rule in order,
// each as one left-to-right pass replacing non-overlapping occurrences of its pair. `rules`
// must be a valid merge table (the restore rules of BpeTokenizer::from_merge_rules, same
// std::invalid_argument errors).
[[nodiscard]] std::vector<TokenId> encode_bpe_reference(std::span<const std::uint8_t> bytes,
                                                        std::span<const BpeMergeRule> rules);

}  // namespace riftco_transformer
