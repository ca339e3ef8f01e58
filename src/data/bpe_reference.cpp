// The BPE contract written out literally (docs/ARCHITECTURE.md, 'Tokenizers'): a full recount
// per merge with an ordered map, and one replacement pass per rule. No shortcut may be taken here:
// this file is the oracle the fast trainer and the heap encoder are tested against.
#include "riftco_transformer/data/bpe_reference.hpp"

#include <cstddef>
#include <map>
#include <utility>

#include "data/bpe_validation.hpp"

namespace riftco_transformer {
namespace {

// One left-to-right pass: each (left, right) occurrence becomes `result`; after a match both
// tokens are consumed, so overlapping occurrences ("aaa") are replaced once.
std::vector<TokenId> replace_pair(const std::vector<TokenId>& sequence, const BpeMergeRule& rule) {
    std::vector<TokenId> rewritten;
    rewritten.reserve(sequence.size());
    std::size_t i = 0;
    while (i < sequence.size()) {
        if (i + 1 < sequence.size() && sequence[i] == rule.left && sequence[i + 1] == rule.right) {
            rewritten.push_back(rule.result);
            i += 2;
        } else {
            rewritten.push_back(sequence[i]);
            i += 1;
        }
    }
    return rewritten;
}

std::vector<TokenId> byte_ids(std::span<const std::uint8_t> bytes) {
    return {bytes.begin(), bytes.end()};
}

}  // namespace

std::vector<BpeMergeRule> learn_bpe_merges_reference(std::span<const std::uint8_t> corpus,
                                                     const BpeTrainingOptions& options) {
    detail::validate_bpe_training("learn_bpe_merges_reference", corpus, options);
    std::vector<TokenId> sequence = byte_ids(corpus);
    std::vector<BpeMergeRule> rules;
    std::uint64_t vocabulary = detail::first_merged_id;
    while (vocabulary < options.vocabulary_size && sequence.size() >= 2) {
        // 1. Count every adjacent pair, overlapping windows included.
        std::map<std::pair<TokenId, TokenId>, std::uint64_t> counts;
        for (std::size_t i = 0; i + 1 < sequence.size(); ++i) {
            ++counts[{sequence[i], sequence[i + 1]}];
        }
        // 2. Highest count; the map iterates pairs in ascending order, so keeping the first
        // maximum breaks ties towards the smallest (left, right).
        auto best = counts.begin();
        for (auto it = counts.begin(); it != counts.end(); ++it) {
            if (it->second > best->second) {
                best = it;
            }
        }
        // 3. Stop below the frequency threshold.
        if (best->second < options.minimum_pair_frequency) {
            break;
        }
        // 4. Record the rule under the next id.
        const BpeMergeRule rule{best->first.first, best->first.second,
                                static_cast<TokenId>(vocabulary)};
        rules.push_back(rule);
        ++vocabulary;
        // 5. Rewrite the working sequence.
        sequence = replace_pair(sequence, rule);
    }
    return rules;
}

std::vector<TokenId> encode_bpe_reference(std::span<const std::uint8_t> bytes,
                                          std::span<const BpeMergeRule> rules) {
    detail::validate_merge_rules("encode_bpe_reference", rules);
    std::vector<TokenId> sequence = byte_ids(bytes);
    for (const BpeMergeRule& rule : rules) {
        sequence = replace_pair(sequence, rule);
    }
    return sequence;
}

}  // namespace riftco_transformer
