#pragma once
// Corpus-byte tokenizer (docs/ARCHITECTURE.md, 'Tokenizers'): the vocabulary is the set of distinct
// byte values of the construction corpus, ids assigned by ascending unsigned byte value (corpus
// bytes {0x0A,'a','b','c'} give ids 0,1,2,3). Each byte is one token; a byte outside the
// vocabulary cannot be encoded (there is no fallback or unknown token).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer {

class ByteTokenizer final : public Tokenizer {
  public:
    // Vocabulary of `corpus` (order and multiplicity are irrelevant). Empty corpus:
    // std::invalid_argument.
    explicit ByteTokenizer(std::span<const std::uint8_t> corpus);

    // Restore: `byte_vocabulary[id]` is the byte of id (any order). It must be nonempty, hold
    // at most 256 entries and no byte twice; otherwise std::invalid_argument.
    [[nodiscard]] static ByteTokenizer from_byte_vocabulary(
        std::span<const std::uint8_t> byte_vocabulary);

    [[nodiscard]] TokenizerMethod method() const noexcept override { return TokenizerMethod::Byte; }
    [[nodiscard]] std::size_t vocabulary_size() const noexcept override {
        return byte_of_id_.size();
    }

    // A byte absent from the vocabulary: std::invalid_argument.
    [[nodiscard]] std::vector<TokenId> encode_bytes(
        std::span<const std::uint8_t> bytes) const override;
    [[nodiscard]] std::vector<std::uint8_t> decode_bytes(
        std::span<const TokenId> ids) const override;
    [[nodiscard]] std::vector<std::uint8_t> token_bytes(TokenId id) const override;

    [[nodiscard]] std::vector<std::uint8_t> byte_vocabulary() const override { return byte_of_id_; }
    [[nodiscard]] std::size_t merge_count() const override;
    [[nodiscard]] BpeMergeRule merge_rule(std::size_t index) const override;
    [[nodiscard]] std::vector<BpeMergeRule> merge_rules() const override;

    [[nodiscard]] TokenizerState state() const override;

  private:
    ByteTokenizer() = default;
    void index_vocabulary();

    static constexpr TokenId absent = 0xFFFFFFFFU;  // id_of_byte_ entry of a byte not in use
    std::vector<std::uint8_t> byte_of_id_;          // [vocabulary_size]
    std::array<TokenId, 256> id_of_byte_{};         // [256]; `absent` when not in vocabulary
};

}  // namespace riftco_transformer
