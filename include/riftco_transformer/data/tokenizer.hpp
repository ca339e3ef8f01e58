#pragma once
// Tokenizer: the one interface behind which every tokenization method sits
// (docs/ARCHITECTURE.md, 'Tokenizers'). Input is raw bytes, output is uint32 token ids; there is no
// normalisation, pre-tokenisation or special token, and decode_bytes(encode_bytes(b)) == b exactly
// for every accepted input. Models, losses and optimizers see only ids and vocabulary_size().
//
// Tokenizers are immutable after construction: no member changes observable state, so a
// tokenizer may be shared freely (the factory hands out std::shared_ptr<const Tokenizer>).
// Their exact state (TokenizerState) is what artifacts persist; restore_tokenizer()
// (tokenizer_factory.hpp) rebuilds an identical tokenizer from it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace riftco_transformer {

using TokenId = std::uint32_t;

// Stable ABI values: never renumber, only append. Adding a method means a new strategy class,
// a factory entry and a new appended value here.
enum class TokenizerMethod : std::int32_t {
    Byte = 0,  // corpus byte vocabulary
    Bpe = 1,   // byte-level byte-pair encoding
};

// "byte" / "bpe". Unknown value: std::invalid_argument.
[[nodiscard]] std::string_view tokenizer_method_name(TokenizerMethod method);
// Inverse of tokenizer_method_name ("byte" / "bpe" exactly). Other text: std::invalid_argument.
[[nodiscard]] TokenizerMethod parse_tokenizer_method(std::string_view name);
// The method with the stable integer `value`. Unknown value: std::invalid_argument.
[[nodiscard]] TokenizerMethod tokenizer_method_from_value(std::int32_t value);

// One learned BPE merge: the adjacent pair (left, right) becomes `result`.
struct BpeMergeRule {
    TokenId left = 0;
    TokenId right = 0;
    TokenId result = 0;

    friend bool operator==(const BpeMergeRule&, const BpeMergeRule&) = default;
};

// Exact, restorable tokenizer state. Byte method: byte_vocabulary[id] is the byte of token id
// (merge_rules empty). BPE method: the ordered merge table (byte_vocabulary empty); ids
// 0..255 are always the 256 byte values.
struct TokenizerState {
    TokenizerMethod method = TokenizerMethod::Byte;
    std::vector<std::uint8_t> byte_vocabulary;
    std::vector<BpeMergeRule> merge_rules;

    friend bool operator==(const TokenizerState&, const TokenizerState&) = default;
};

// The bytes of a text, viewed without copying (binary-safe: embedded NULs are kept).
[[nodiscard]] inline std::span<const std::uint8_t> text_bytes(std::string_view text) noexcept {
    return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

class Tokenizer {
  public:
    virtual ~Tokenizer() = default;

    [[nodiscard]] virtual TokenizerMethod method() const noexcept = 0;
    // Number of ids: ids are exactly 0..vocabulary_size()-1.
    [[nodiscard]] virtual std::size_t vocabulary_size() const noexcept = 0;

    // Binary-safe encode: any byte string the method accepts (an empty input gives no ids).
    [[nodiscard]] virtual std::vector<TokenId> encode_bytes(
        std::span<const std::uint8_t> bytes) const = 0;
    // Binary-safe decode: the concatenated pieces. An id >= vocabulary_size() is
    // std::out_of_range (nothing is returned).
    [[nodiscard]] virtual std::vector<std::uint8_t> decode_bytes(
        std::span<const TokenId> ids) const = 0;

    // Strict UTF-8 conveniences. encode: text that is not well-formed UTF-8 (RFC 3629: no
    // overlong forms, surrogates, code points above U+10FFFF or truncated sequences) is
    // std::invalid_argument. decode: decoded bytes that are not well-formed UTF-8 are
    // std::invalid_argument; the errors of decode_bytes apply first.
    [[nodiscard]] std::vector<TokenId> encode(std::string_view utf8_text) const;
    [[nodiscard]] std::string decode(std::span<const TokenId> ids) const;

    // The bytes of one token. Unknown id: std::out_of_range.
    [[nodiscard]] virtual std::vector<std::uint8_t> token_bytes(TokenId id) const = 0;
    // Every token's bytes, index = id.
    [[nodiscard]] std::vector<std::vector<std::uint8_t>> vocabulary() const;

    // Byte method only (other methods: std::invalid_argument): byte of each id, index = id.
    [[nodiscard]] virtual std::vector<std::uint8_t> byte_vocabulary() const = 0;
    // BPE method only (other methods: std::invalid_argument). merge_rule: index >=
    // merge_count() is std::out_of_range.
    [[nodiscard]] virtual std::size_t merge_count() const = 0;
    [[nodiscard]] virtual BpeMergeRule merge_rule(std::size_t index) const = 0;
    [[nodiscard]] virtual std::vector<BpeMergeRule> merge_rules() const = 0;

    // Exact state; restore_tokenizer(state()) behaves identically.
    [[nodiscard]] virtual TokenizerState state() const = 0;

  protected:
    Tokenizer() = default;
    Tokenizer(const Tokenizer&) = default;
    Tokenizer& operator=(const Tokenizer&) = default;
    Tokenizer(Tokenizer&&) = default;
    Tokenizer& operator=(Tokenizer&&) = default;
};

}  // namespace riftco_transformer
