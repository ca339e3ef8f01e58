#include "data/bpe_validation.hpp"

#include <cstddef>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "data/pair_map.hpp"

namespace riftco_transformer::detail {

void validate_bpe_training(std::string_view operation, std::span<const std::uint8_t> corpus,
                           const BpeTrainingOptions& options) {
    if (corpus.empty()) {
        throw std::invalid_argument(std::string(operation) + ": corpus is empty");
    }
    constexpr std::uint64_t largest_vocabulary = std::numeric_limits<TokenId>::max();
    if (options.vocabulary_size < first_merged_id || options.vocabulary_size > largest_vocabulary) {
        std::ostringstream message;
        message << operation << ": vocabulary_size is " << options.vocabulary_size
                << " (must be in [" << first_merged_id << ", " << largest_vocabulary << "])";
        throw std::invalid_argument(message.str());
    }
    if (options.minimum_pair_frequency == 0) {
        throw std::invalid_argument(std::string(operation) +
                                    ": minimum_pair_frequency is 0 (must be at least 1)");
    }
}

void validate_merge_rules(std::string_view operation, std::span<const BpeMergeRule> rules) {
    // Results are 256+i < 2^32, so a table longer than that cannot be valid.
    constexpr std::uint64_t largest_rule_count =
        std::uint64_t{std::numeric_limits<TokenId>::max()} - first_merged_id;
    if (rules.size() > largest_rule_count) {
        std::ostringstream message;
        message << operation << ": merge_rules has " << rules.size() << " rules (at most "
                << largest_rule_count << ")";
        throw std::invalid_argument(message.str());
    }
    PairMap<std::uint32_t> index_of_pair(rules.size());
    for (std::size_t i = 0; i < rules.size(); ++i) {
        const BpeMergeRule& rule = rules[i];
        const TokenId expected = first_merged_id + static_cast<TokenId>(i);
        if (rule.result != expected) {
            std::ostringstream message;
            message << operation << ": merge_rules[" << i << "] result is " << rule.result
                    << " (expected " << expected << ")";
            throw std::invalid_argument(message.str());
        }
        if (rule.left >= rule.result || rule.right >= rule.result) {
            std::ostringstream message;
            message << operation << ": merge_rules[" << i << "] operands (" << rule.left << ", "
                    << rule.right << ") are not both below its result " << rule.result;
            throw std::invalid_argument(message.str());
        }
        const auto [first, inserted] = index_of_pair.try_insert(pair_key(rule.left, rule.right),
                                                                static_cast<std::uint32_t>(i));
        if (!inserted) {
            std::ostringstream message;
            message << operation << ": merge_rules[" << i << "] pair (" << rule.left << ", "
                    << rule.right << ") repeats merge_rules[" << first << "]";
            throw std::invalid_argument(message.str());
        }
    }
}

}  // namespace riftco_transformer::detail
