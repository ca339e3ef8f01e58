#pragma once
// Regex pre-tokenization of pretrained byte-level BPE models: the text is cut into pre-tokens
// (their concatenation is the text) and BPE merges never cross a pre-token boundary. The three
// patterns in use (and Qwen's, below), as Hugging Face `tokenizers` applies them (verified against
// tokenizers 0.23.3, see tests/python/test_pretrained_tokenizer_oracle.py):
//
//   Gpt2   ByteLevel(use_regex=true):
//          's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama3 Split(pattern, Isolated), then ByteLevel(use_regex=false):
//          (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2  Split(pattern, Isolated), then ByteLevel(use_regex=false) (Qwen 2, 2.5 and 3):
//          Llama3's pattern with single digits, \p{N} in place of \p{N}{1,3}
//   SmolLm Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]: every \p{N}
//          character is a pre-token of its own, and the Gpt2 pattern cuts each stretch between
//          them (its (?!\S) sees the end of the stretch, not the digit after it).
//
// Example: Gpt2 cuts "I'll  go 42" into "I" "'ll" " " " go" " 42"; SmolLm cuts it into "I"
// "'ll" " " " go" " " "4" "2".
//
// Matching uses PCRE2 (UTF + UCP, JIT-compiled). A Pretokenizer is immutable and may be used
// from several threads at once; copies share the compiled pattern.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace riftco_transformer {

// Stable values: never renumber, only append.
enum class PretokenizerKind : std::int32_t {
    Gpt2 = 0,
    Llama3 = 1,
    SmolLm = 2,
    Qwen2 = 3,  // C ABI 2.10
};

// "gpt2" / "llama3" / "smollm" / "qwen2". Unknown value: std::invalid_argument.
[[nodiscard]] std::string_view pretokenizer_kind_name(PretokenizerKind kind);

// The kind a GGUF file's `tokenizer.ggml.pre` value names, as llama.cpp reads it: "gpt-2" is
// Gpt2; "llama-bpe", "llama3" and "llama-v3" are Llama3 (llama.cpp and Llama 3's
// tokenizer.json also set ignore_merges for these, see PretrainedVocabulary); "smollm" is
// SmolLm; "qwen2" is Qwen2. Any other value: std::invalid_argument naming it.
[[nodiscard]] PretokenizerKind pretokenizer_kind_from_gguf(std::string_view gguf_pre);

namespace detail {
class CompiledPretokenizer;

// The byte offset where `text` stops being well-formed UTF-8 (RFC 3629: no overlong forms,
// surrogates, values above U+10FFFF or truncated sequences), as PCRE2 checks it; nothing when
// all of it is well-formed.
[[nodiscard]] std::optional<std::size_t> ill_formed_utf8_offset(std::string_view text);
// std::invalid_argument "<operation>: text is not well-formed UTF-8 at byte offset N (...)"
// unless `text` is well-formed.
void require_well_formed_utf8(std::string_view operation, std::string_view text);
}  // namespace detail

class Pretokenizer {
  public:
    // Compiles the pattern of `kind`. Unknown kind: std::invalid_argument; PCRE2 refusing the
    // pattern (a broken PCRE2 build): std::runtime_error.
    explicit Pretokenizer(PretokenizerKind kind);

    [[nodiscard]] PretokenizerKind kind() const noexcept { return kind_; }

    // Appends the pre-tokens of `utf8_text` to `pieces` (views into utf8_text, in order, none
    // empty, concatenating to utf8_text). Text that is not well-formed UTF-8:
    // std::invalid_argument naming the byte offset (pieces unchanged).
    void split(std::string_view utf8_text, std::vector<std::string_view>& pieces) const;
    [[nodiscard]] std::vector<std::string_view> split(std::string_view utf8_text) const;

    // split() for text the caller has already checked is well-formed UTF-8 (ill-formed text
    // here is undefined behaviour: PCRE2 is told not to check).
    void split_valid(std::string_view utf8_text, std::vector<std::string_view>& pieces) const;

  private:
    PretokenizerKind kind_;
    std::shared_ptr<const detail::CompiledPretokenizer> compiled_;
};

}  // namespace riftco_transformer
