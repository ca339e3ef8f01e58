#include "riftco_transformer/data/pretokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace riftco_transformer {
namespace {

// The patterns are written with three class bodies, filled in by expand_classes:
//   @S  White_Space, which Oniguruma's \s is. PCRE2's \s (with UCP) also takes U+180E
//       MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3.
//   @L  \p{L} and @N  \p{N}, plus the letters and numbers Unicode 15.0-16.0 assigned:
//       Debian 12's PCRE2 (10.42) knows Unicode 14.0, `tokenizers` (Oniguruma, and Rust's
//       char::is_numeric for Digits) 16.0. tools/pretokenizer_unicode_additions.py prints
//       these ranges and checks that no character assigned in both versions changed class,
//       so the union is exact (and redundant with a newer PCRE2).
//   @D  SmolLm's Digits stage: Rust's char::is_numeric, which in tokenizers 0.23.3 is
//       Unicode 17.0 (13 more numbers than Oniguruma's \p{N}, same script with unicodedata2
//       17.x).
constexpr std::string_view white_space_class =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view letter_class =
    R"(\p{L})"
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B})"
    R"(\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02})"
    R"(\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA})"
    R"(\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A})"
    R"(\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739})"
    R"(\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr std::string_view number_class =
    R"(\p{N})"
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59})"
    R"(\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3})"
    R"(\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";
constexpr std::string_view unicode17_numbers = R"(\x{11DE0}-\x{11DE9}\x{16FF4}-\x{16FF6})";

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?[@L]+| ?[@N]+| ?[^@S@L@N]+|[@S]+(?![^@S])|[@S]+)";

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
constexpr std::string_view llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n@L@N]?[@L]+|[@N]{1,3}| ?[^@S@L@N]+[\r\n]*)"
    R"(|[@S]*[\r\n]+|[@S]+(?![^@S])|[@S]+)";

// Qwen 2's: Llama 3's with every number character a pre-token of its own.
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n@L@N]?[@L]+|[@N]| ?[^@S@L@N]+[\r\n]*)"
    R"(|[@S]*[\r\n]+|[@S]+(?![^@S])|[@S]+)";

// SmolLM's two stages as one pass. Cutting every \p{N} out first and running the Gpt2 pattern
// on each stretch between them is the Gpt2 pattern with (1) a lone \p{N} alternative in place
// of " ?\p{N}+" (no other alternative can start at a number, and none can run into one: \s,
// \p{L} and [^\s\p{L}\p{N}] all exclude \p{N}), and (2) "(?![^\s\p{N}])" in place of
// "(?!\S)", because at the end of a stretch the next character is a number, which (?!\S)
// would refuse but the end of the stretch accepts. The oracle test checks this against
// tokenizers' own Sequence[Digits, ByteLevel] on every code point. (@D, Digits' numbers,
// holds @N: every character @D adds is unassigned to the ByteLevel stage's \p{N}.)
constexpr std::string_view smollm_pattern =
    R"([@D]|'s|'t|'re|'ve|'m|'ll|'d| ?[@L]+| ?[^@S@L@D]+|[@S]+(?![^@S@D])|[@S]+)";

std::string expand_classes(std::string_view pattern) {
    std::string expanded;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] != '@') {
            expanded.push_back(pattern[i]);
            continue;
        }
        switch (pattern[++i]) {
            case 'S':
                expanded.append(white_space_class);
                break;
            case 'L':
                expanded.append(letter_class);
                break;
            case 'N':
                expanded.append(number_class);
                break;
            default:  // 'D'
                expanded.append(number_class);
                expanded.append(unicode17_numbers);
                break;
        }
    }
    return expanded;
}

std::string pattern_of(PretokenizerKind kind) {
    switch (kind) {
        case PretokenizerKind::Gpt2:
            return expand_classes(gpt2_pattern);
        case PretokenizerKind::Llama3:
            return expand_classes(llama3_pattern);
        case PretokenizerKind::SmolLm:
            return expand_classes(smollm_pattern);
        case PretokenizerKind::Qwen2:
            return expand_classes(qwen2_pattern);
    }
    throw std::invalid_argument("Pretokenizer: kind value " +
                                std::to_string(static_cast<std::int32_t>(kind)) +
                                " is unknown (gpt2 = 0, llama3 = 1, smollm = 2, qwen2 = 3)");
}

std::string pcre2_message(int error_code) {
    std::array<PCRE2_UCHAR, 256> buffer{};
    if (pcre2_get_error_message(error_code, buffer.data(), buffer.size()) < 0) {
        return "PCRE2 error " + std::to_string(error_code);
    }
    return {reinterpret_cast<const char*>(buffer.data())};
}

struct CodeDeleter {
    void operator()(pcre2_code* code) const noexcept { pcre2_code_free(code); }
};
struct MatchDataDeleter {
    void operator()(pcre2_match_data* data) const noexcept { pcre2_match_data_free(data); }
};
using CodePointer = std::unique_ptr<pcre2_code, CodeDeleter>;
using MatchDataPointer = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

CodePointer compile_pattern(std::string_view operation, std::string_view pattern) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    CodePointer code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr));
    if (!code) {
        std::ostringstream message;
        message << operation << ": PCRE2 refused the pattern at offset " << error_offset << ": "
                << pcre2_message(error_code);
        throw std::runtime_error(message.str());
    }
    return code;
}

// Where PCRE2's UTF-8 check (RFC 3629: no overlong forms, surrogates or values above
// U+10FFFF) first fails on `text`, and why; nothing when text is well-formed.
struct Utf8Problem {
    std::size_t offset = 0;
    std::string reason;
};

std::optional<Utf8Problem> find_utf8_problem(std::string_view text) {
    // Any pattern serves: pcre2_match checks the whole subject before it matches.
    static const CodePointer empty_pattern = compile_pattern("UTF-8 check", "");
    const MatchDataPointer match_data(pcre2_match_data_create(1, nullptr));
    if (!match_data) {
        throw std::bad_alloc();
    }
    const int rc = pcre2_match(empty_pattern.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                               text.size(), 0, 0, match_data.get(), nullptr);
    if (rc >= 0 || rc == PCRE2_ERROR_NOMATCH) {
        return std::nullopt;
    }
    return Utf8Problem{pcre2_get_startchar(match_data.get()), pcre2_message(rc)};
}

}  // namespace

namespace detail {

std::optional<std::size_t> ill_formed_utf8_offset(std::string_view text) {
    const std::optional<Utf8Problem> problem = find_utf8_problem(text);
    return problem ? std::optional<std::size_t>(problem->offset) : std::nullopt;
}

void require_well_formed_utf8(std::string_view operation, std::string_view text) {
    if (const std::optional<Utf8Problem> problem = find_utf8_problem(text)) {
        std::ostringstream message;
        message << operation << ": text is not well-formed UTF-8 at byte offset " << problem->offset
                << " (" << problem->reason << ")";
        throw std::invalid_argument(message.str());
    }
}

// One compiled pattern. Matching only reads it, so threads may share it.
class CompiledPretokenizer {
  public:
    explicit CompiledPretokenizer(std::string_view pattern)
        : code_(compile_pattern("Pretokenizer", pattern)) {
        // Without a JIT (a platform PCRE2 lacks it for), pcre2_match interprets the pattern.
        jit_ = pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE) == 0;
    }

    void split(std::string_view text, std::vector<std::string_view>& pieces) const {
        const MatchDataPointer match_data(
            pcre2_match_data_create_from_pattern(code_.get(), nullptr));
        if (!match_data) {
            throw std::bad_alloc();
        }
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
        std::size_t offset = 0;
        while (offset < text.size()) {
            const int rc = jit_ ? pcre2_jit_match(code_.get(), subject, text.size(), offset,
                                                  PCRE2_NO_UTF_CHECK, match_data.get(), nullptr)
                                : pcre2_match(code_.get(), subject, text.size(), offset,
                                              PCRE2_NO_UTF_CHECK, match_data.get(), nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) {
                break;
            }
            if (rc < 0) {
                throw std::runtime_error("Pretokenizer::split: PCRE2 failed at byte offset " +
                                         std::to_string(offset) + ": " + pcre2_message(rc));
            }
            const std::size_t begin = ovector[0];
            const std::size_t end = ovector[1];
            if (end <= begin) {
                // Every alternative of the three patterns consumes a character.
                throw std::logic_error("Pretokenizer::split: empty match at byte offset " +
                                       std::to_string(begin));
            }
            if (begin > offset) {
                pieces.push_back(text.substr(offset, begin - offset));  // text no rule matched
            }
            pieces.push_back(text.substr(begin, end - begin));
            offset = end;
        }
        if (offset < text.size()) {
            pieces.push_back(text.substr(offset));
        }
    }

  private:
    CodePointer code_;
    bool jit_ = false;
};

}  // namespace detail

std::string_view pretokenizer_kind_name(PretokenizerKind kind) {
    switch (kind) {
        case PretokenizerKind::Gpt2:
            return "gpt2";
        case PretokenizerKind::Llama3:
            return "llama3";
        case PretokenizerKind::SmolLm:
            return "smollm";
        case PretokenizerKind::Qwen2:
            return "qwen2";
    }
    throw std::invalid_argument("pretokenizer_kind_name: kind value " +
                                std::to_string(static_cast<std::int32_t>(kind)) +
                                " is unknown (gpt2 = 0, llama3 = 1, smollm = 2, qwen2 = 3)");
}

PretokenizerKind pretokenizer_kind_from_gguf(std::string_view gguf_pre) {
    if (gguf_pre == "gpt-2") {
        return PretokenizerKind::Gpt2;
    }
    if (gguf_pre == "llama-bpe" || gguf_pre == "llama3" || gguf_pre == "llama-v3") {
        return PretokenizerKind::Llama3;
    }
    if (gguf_pre == "smollm") {
        return PretokenizerKind::SmolLm;
    }
    if (gguf_pre == "qwen2") {
        return PretokenizerKind::Qwen2;
    }
    throw std::invalid_argument("pretokenizer_kind_from_gguf: tokenizer.ggml.pre \"" +
                                std::string(gguf_pre) +
                                "\" is not supported (known: \"gpt-2\", \"llama-bpe\", "
                                "\"llama3\", \"llama-v3\", \"smollm\", \"qwen2\")");
}

Pretokenizer::Pretokenizer(PretokenizerKind kind)
    : kind_(kind),
      compiled_(std::make_shared<const detail::CompiledPretokenizer>(pattern_of(kind))) {}

void Pretokenizer::split(std::string_view utf8_text, std::vector<std::string_view>& pieces) const {
    detail::require_well_formed_utf8("Pretokenizer::split", utf8_text);
    split_valid(utf8_text, pieces);
}

std::vector<std::string_view> Pretokenizer::split(std::string_view utf8_text) const {
    std::vector<std::string_view> pieces;
    split(utf8_text, pieces);
    return pieces;
}

void Pretokenizer::split_valid(std::string_view utf8_text,
                               std::vector<std::string_view>& pieces) const {
    compiled_->split(utf8_text, pieces);
}

}  // namespace riftco_transformer
