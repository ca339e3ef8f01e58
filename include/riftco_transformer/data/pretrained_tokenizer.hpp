#pragma once
// Tokenizers of pretrained models, given their vocabulary as plain data (GGUF `tokenizer.ggml.*`
// metadata or a Hugging Face tokenizer.json read elsewhere). Token ids are identical to those of
// Hugging Face `tokenizers` (and llama.cpp) for the two model kinds in use:
//
// ByteLevelBpe (GGUF tokenizer.ggml.model = "gpt2": GPT-2, Llama 3, SmolLM, Qwen...). Every byte
//   is first spelled as one character of a 256-character alphabet (byte_level_symbol: the
//   printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, the other 68
//   bytes take U+0100, U+0101, ... in byte order, so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ'
//   U+010A); token strings are written in that alphabet. The text is cut into pre-tokens by a
//   Pretokenizer, and each pre-token's bytes merged by the ordered merge list: repeatedly the
//   adjacent pair with the lowest merge rank, leftmost first, becomes one symbol. Example: with
//   merges ["a b", "ab c"], "abc" is one token "abc", and "abd" is "ab" "d". A byte whose
//   symbol is no Normal token is dropped before merging (SmolLM2 has none for 21 bytes, e.g.
//   0x04; tokenizers without an unk_token and llama.cpp do the same).
//
// SentencePieceBpe (GGUF tokenizer.ggml.model = "llama": Llama 2, Mistral v0.1, TinyLlama).
//   No pre-tokenizer: each stretch of text between special tokens is normalised (a ' '
//   prepended when add_dummy_prefix, then every ' ' replaced by U+2581 '▁'), split into UTF-8
//   characters, and merged by scores: repeatedly the adjacent pair whose concatenation is a
//   Normal token of the highest score, leftmost first, becomes that token. A character that is
//   no Normal token becomes its UTF-8 bytes' `<0xXX>` tokens (byte fallback), or the unknown
//   token when the vocabulary has no byte tokens.
//
// Special tokens (types Control, Unknown and UserDefined, as llama.cpp's special-token cache)
// are cut out of the text before anything else, the longest one at the leftmost position
// where one starts, and emitted as their own id: they never merge and never join a pre-token.
// Control and Unknown tokens can instead be read as plain text (SpecialTokens::AsText, Hugging
// Face's `encode_special_tokens`); UserDefined tokens are always cut out. encode never adds
// BOS/EOS: bos_id() and eos_id() are for the caller.
//
// A PretrainedTokenizer is immutable; copies share their tables and any thread may use one.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "riftco_transformer/data/pretokenizer.hpp"
#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer {

// Stable values: never renumber, only append.
enum class PretrainedModelKind : std::int32_t {
    ByteLevelBpe = 0,
    SentencePieceBpe = 1,
};

// "byte_level_bpe" / "sentencepiece_bpe". Unknown value: std::invalid_argument.
[[nodiscard]] std::string_view pretrained_model_kind_name(PretrainedModelKind kind);
// GGUF tokenizer.ggml.model: "gpt2" is ByteLevelBpe, "llama" SentencePieceBpe; any other value
// (e.g. "bert", "t5", "rwkv"): std::invalid_argument naming it.
[[nodiscard]] PretrainedModelKind pretrained_model_kind_from_gguf(std::string_view gguf_model);

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : std::int32_t {
    Normal = 1,       // produced by merges (and by byte-level symbols)
    Unknown = 2,      // e.g. "<unk>": special, cut out of text unless AsText
    Control = 3,      // e.g. "<|im_start|>", "<s>": special, cut out of text unless AsText
    UserDefined = 4,  // added tokens: always cut out of text
    Unused = 5,       // never produced by encode
    Byte = 6,         // SentencePieceBpe byte fallback "<0x00>".."<0xFF>"
};

// The type with GGUF value `value` (1..6). Other values: std::invalid_argument naming it.
[[nodiscard]] TokenType token_type_from_value(std::int32_t value);

enum class SpecialTokens : std::int32_t {
    Parse = 0,   // Control, Unknown and UserDefined tokens in the text become their ids
    AsText = 1,  // only UserDefined ones do; Control and Unknown token text is plain text
};

// One model's vocabulary as plain data. Token strings are UTF-8, index = id.
struct PretrainedVocabulary {
    PretrainedModelKind model = PretrainedModelKind::ByteLevelBpe;
    PretokenizerKind pretokenizer = PretokenizerKind::Gpt2;  // ByteLevelBpe only
    std::vector<std::string> tokens;
    // Empty (all Normal) or one per token.
    std::vector<TokenType> token_types;
    // ByteLevelBpe: ordered merges, rank = index (GGUF "left right" strings: parse_merges).
    // SentencePieceBpe: must be empty (its merges follow from the scores).
    std::vector<std::pair<std::string, std::string>> merges;
    // SentencePieceBpe: one finite score per token (higher merges first). ByteLevelBpe: empty or
    // one per token, and unused.
    std::vector<float> scores;
    std::optional<TokenId> bos_id;
    std::optional<TokenId> eos_id;
    // SentencePieceBpe without byte tokens: the id of each character that has no token.
    // ByteLevelBpe: only reported (a byte without a token is dropped, as llama.cpp does).
    std::optional<TokenId> unknown_id;
    // ByteLevelBpe: a pre-token that is itself a Normal token is emitted whole, without merges
    // (Llama 3's tokenizer.json "ignore_merges": true; llama.cpp for the llama-bpe family).
    bool ignore_merges = false;
    // SentencePieceBpe: prepend ' ' to each stretch of text between special tokens before
    // encoding, and drop one leading ' ' from decoded text (GGUF tokenizer.ggml.add_space_prefix,
    // default true for "llama").
    bool add_dummy_prefix = true;
};

// "left right" (a GGUF merge) as {left, right}. Anything but exactly one ' ' with text on both
// sides: std::invalid_argument naming the line.
[[nodiscard]] std::pair<std::string, std::string> parse_merge(std::string_view line);
// parse_merge of each line; the error names the index of the first bad line.
[[nodiscard]] std::vector<std::pair<std::string, std::string>> parse_merges(
    std::span<const std::string> lines);

// The byte-level alphabet: the character that stands for `byte`, and back (a code point
// outside the alphabet: nothing).
[[nodiscard]] char32_t byte_level_symbol(std::uint8_t byte) noexcept;
[[nodiscard]] std::optional<std::uint8_t> byte_level_byte(char32_t symbol) noexcept;
// Bytes spelled in the byte-level alphabet (UTF-8), and back. byte_level_decode of text with a
// character outside the alphabet, or ill-formed UTF-8: std::invalid_argument naming the offset.
[[nodiscard]] std::string byte_level_encode(std::string_view bytes);
[[nodiscard]] std::string byte_level_decode(std::string_view symbols);

namespace detail {
class PretrainedTables;
}  // namespace detail

class PretrainedTokenizer {
  public:
    // Validates `vocabulary`; violations are std::invalid_argument naming the entry:
    // - no tokens; token_types or scores of the wrong length; a token type outside 1..6;
    // - a token that is empty, not well-formed UTF-8, or equal to an earlier token;
    // - ByteLevelBpe: a Normal token with a character outside the byte-level alphabet, a
    //   Byte-type token; a merge naming a token that does not exist, whose concatenation is no
    //   token, or repeating an earlier pair;
    // - SentencePieceBpe: merges given, a score that is not finite, a Byte token not spelled
    //   <0xXX> (two upper-case hex digits), byte tokens for only some of the 256 bytes, or
    //   neither byte tokens nor an unknown_id;
    // - bos_id, eos_id or unknown_id not below the token count.
    explicit PretrainedTokenizer(const PretrainedVocabulary& vocabulary);

    [[nodiscard]] PretrainedModelKind model() const noexcept;
    // ByteLevelBpe only; SentencePieceBpe: nothing.
    [[nodiscard]] std::optional<PretokenizerKind> pretokenizer() const noexcept;
    [[nodiscard]] std::size_t vocabulary_size() const noexcept;
    [[nodiscard]] std::optional<TokenId> bos_id() const noexcept;
    [[nodiscard]] std::optional<TokenId> eos_id() const noexcept;
    [[nodiscard]] std::optional<TokenId> unknown_id() const noexcept;

    // The vocabulary string of `id` and its type. Unknown id: std::out_of_range.
    [[nodiscard]] const std::string& token_text(TokenId id) const;
    [[nodiscard]] TokenType token_type(TokenId id) const;
    // The id whose vocabulary string is exactly `text`, if any.
    [[nodiscard]] std::optional<TokenId> find_token(std::string_view text) const;

    // The ids of well-formed UTF-8 text (ill-formed: std::invalid_argument naming the byte
    // offset). The empty text has no ids.
    [[nodiscard]] std::vector<TokenId> encode(std::string_view utf8_text,
                                              SpecialTokens special = SpecialTokens::Parse) const;

    // The bytes the ids stand for, concatenated (not necessarily well-formed UTF-8: a
    // multi-byte character may be split across tokens). Normal tokens: their bytes (byte-level:
    // the alphabet decoded; SentencePiece: '▁' as ' '); Byte tokens: their byte; other types:
    // their vocabulary string. SentencePieceBpe with add_dummy_prefix drops one leading ' ' of
    // the result. An id >= vocabulary_size(): std::out_of_range naming it.
    [[nodiscard]] std::string decode(std::span<const TokenId> ids) const;
    // The bytes of one token as decode renders it inside a sequence (no leading ' ' dropped),
    // for streaming output. Unknown id: std::out_of_range.
    [[nodiscard]] const std::string& token_bytes(TokenId id) const;

    // The vocabulary the tokenizer was built from (validated; what artifacts persist to
    // rebuild an identical tokenizer).
    [[nodiscard]] const PretrainedVocabulary& vocabulary() const noexcept { return *vocabulary_; }

  private:
    std::shared_ptr<const detail::PretrainedTables> tables_;
    std::shared_ptr<const PretrainedVocabulary> vocabulary_;
};

}  // namespace riftco_transformer
