#pragma once
// Byte-level BPE tokenizer (docs/ARCHITECTURE.md, 'Tokenizers'). Ids 0..255 are the 256 byte values
// (so every byte string is encodable); merge rule i creates id 256+i, whose bytes are the left
// piece followed by the right piece. Example: one merge learned from repeated "ab" gives 256 =
// "ab", and "abababab" encodes to four 256s.
//
// Encoding is defined as: apply every rule in training order, each as one left-to-right pass
// replacing non-overlapping occurrences (encode_bpe_reference). encode_bytes computes exactly
// that with a priority queue instead: it repeatedly merges the adjacent pair of lowest rule
// index, leftmost first. The two agree because a merge only creates pairs that contain its
// new id, and every rule using that id has a higher index, so the queue finishes each rule
// before the next one and, within a rule, walks its occurrences left to right.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "riftco_transformer/data/bpe_training.hpp"
#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer {

namespace detail {
class BpeTables;
}  // namespace detail

class BpeTokenizer final : public Tokenizer {
  public:
    // Learns the merge table of `corpus` with learn_bpe_merges (same errors).
    explicit BpeTokenizer(std::span<const std::uint8_t> corpus,
                          const BpeTrainingOptions& options = {});

    // Restore from an ordered merge table. Rule i must have result 256+i, both operands below
    // its result, and a (left, right) pair no earlier rule has; zero rules is valid (the pure
    // 256-byte vocabulary). Violations: std::invalid_argument.
    [[nodiscard]] static BpeTokenizer from_merge_rules(std::span<const BpeMergeRule> rules);

    [[nodiscard]] TokenizerMethod method() const noexcept override { return TokenizerMethod::Bpe; }
    [[nodiscard]] std::size_t vocabulary_size() const noexcept override;

    // Accepts every byte string.
    [[nodiscard]] std::vector<TokenId> encode_bytes(
        std::span<const std::uint8_t> bytes) const override;
    // Unknown id: std::out_of_range. A total size beyond what a byte vector can hold (merge
    // tables can double piece lengths per rule): std::overflow_error.
    [[nodiscard]] std::vector<std::uint8_t> decode_bytes(
        std::span<const TokenId> ids) const override;
    // Unknown id: std::out_of_range; a piece too long to hold: std::overflow_error.
    [[nodiscard]] std::vector<std::uint8_t> token_bytes(TokenId id) const override;

    [[nodiscard]] std::vector<std::uint8_t> byte_vocabulary() const override;
    [[nodiscard]] std::size_t merge_count() const override;
    [[nodiscard]] BpeMergeRule merge_rule(std::size_t index) const override;
    [[nodiscard]] std::vector<BpeMergeRule> merge_rules() const override;

    [[nodiscard]] TokenizerState state() const override;

  private:
    explicit BpeTokenizer(std::shared_ptr<const detail::BpeTables> tables);

    // Immutable once built, so copies of a tokenizer may share it.
    std::shared_ptr<const detail::BpeTables> tables_;
};

}  // namespace riftco_transformer
