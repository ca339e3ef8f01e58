#pragma once
// The validation rules of BPE, in one place for every entry point that needs them.

#include <cstdint>
#include <span>
#include <string_view>

#include "riftco_transformer/data/bpe_training.hpp"
#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer::detail {

inline constexpr TokenId first_merged_id = 256;  // ids 0..255 are the byte values

// Training inputs: nonempty corpus, vocabulary_size in [256, 2^32-1], minimum_pair_frequency
// >= 1. std::invalid_argument naming `operation`.
void validate_bpe_training(std::string_view operation, std::span<const std::uint8_t> corpus,
                           const BpeTrainingOptions& options);

// Restore rules of a merge table: rule i has result 256+i, both operands below its result, and
// a pair no earlier rule has. std::invalid_argument naming `operation`.
void validate_merge_rules(std::string_view operation, std::span<const BpeMergeRule> rules);

}  // namespace riftco_transformer::detail
