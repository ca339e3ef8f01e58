#include "riftco_transformer/data/pretrained_tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pair_map.hpp"  // src/data/pair_map.hpp (header-only)

namespace riftco_transformer {
namespace {

constexpr std::string_view constructor_name = "PretrainedTokenizer";
constexpr TokenId no_token = std::numeric_limits<TokenId>::max();
constexpr std::string_view metaspace = "\xE2\x96\x81";  // U+2581 '▁', SentencePiece's space

// ---- UTF-8 of text already known to be well-formed.

// The length of the UTF-8 sequence whose lead byte is `lead`.
[[nodiscard]] std::size_t utf8_length(unsigned char lead) noexcept {
    if (lead < 0x80U) {
        return 1;
    }
    if (lead < 0xE0U) {
        return 2;
    }
    return lead < 0xF0U ? 3 : 4;
}

[[nodiscard]] char32_t utf8_code_point(std::string_view character) noexcept {
    const auto byte = [&](std::size_t i) {
        return static_cast<char32_t>(static_cast<unsigned char>(character[i]));
    };
    switch (character.size()) {
        case 1:
            return byte(0);
        case 2:
            return ((byte(0) & 0x1FU) << 6U) | (byte(1) & 0x3FU);
        case 3:
            return ((byte(0) & 0x0FU) << 12U) | ((byte(1) & 0x3FU) << 6U) | (byte(2) & 0x3FU);
        default:
            return ((byte(0) & 0x07U) << 18U) | ((byte(1) & 0x3FU) << 12U) |
                   ((byte(2) & 0x3FU) << 6U) | (byte(3) & 0x3FU);
    }
}

void append_utf8(char32_t code_point, std::string& out) {
    const auto unit = [](char32_t value) { return static_cast<char>(value); };
    if (code_point < 0x80U) {
        out.push_back(unit(code_point));
    } else if (code_point < 0x800U) {
        out.push_back(unit(0xC0U | (code_point >> 6U)));
        out.push_back(unit(0x80U | (code_point & 0x3FU)));
    } else if (code_point < 0x10000U) {
        out.push_back(unit(0xE0U | (code_point >> 12U)));
        out.push_back(unit(0x80U | ((code_point >> 6U) & 0x3FU)));
        out.push_back(unit(0x80U | (code_point & 0x3FU)));
    } else {
        out.push_back(unit(0xF0U | (code_point >> 18U)));
        out.push_back(unit(0x80U | ((code_point >> 12U) & 0x3FU)));
        out.push_back(unit(0x80U | ((code_point >> 6U) & 0x3FU)));
        out.push_back(unit(0x80U | (code_point & 0x3FU)));
    }
}

// ---- The byte-level alphabet.

[[nodiscard]] constexpr bool stands_for_itself(unsigned byte) noexcept {
    return (byte >= 0x21U && byte <= 0x7EU) || (byte >= 0xA1U && byte <= 0xACU) ||
           (byte >= 0xAEU && byte <= 0xFFU);
}

constexpr std::array<char32_t, 256> byte_symbols = [] {
    std::array<char32_t, 256> symbols{};
    char32_t next_shifted = 0x100;
    for (unsigned byte = 0; byte < 256; ++byte) {
        symbols[byte] = stands_for_itself(byte) ? char32_t{byte} : next_shifted++;
    }
    return symbols;
}();

// Every symbol is below U+0144 (256 + 68 shifted bytes), so the inverse is a small table.
constexpr std::size_t symbol_table_size = 0x144;
constexpr std::array<std::int16_t, symbol_table_size> symbol_bytes = [] {
    std::array<std::int16_t, symbol_table_size> bytes{};
    bytes.fill(-1);
    for (unsigned byte = 0; byte < 256; ++byte) {
        bytes[byte_symbols[byte]] = static_cast<std::int16_t>(byte);
    }
    return bytes;
}();

[[nodiscard]] std::string quoted(std::string_view text) {
    // Appended piece by piece: GCC 12's -Wrestrict misfires on "literal" + std::string at -O3.
    std::string result;
    result.reserve(text.size() + 2);
    result += '"';
    result += text;
    result += '"';
    return result;
}

[[nodiscard]] std::string indexed(std::string_view name, std::size_t index) {
    return std::string(name) + "[" + std::to_string(index) + "]";
}

[[noreturn]] void reject(std::string_view what) {
    throw std::invalid_argument(std::string(constructor_name) + ": " + std::string(what));
}

// Byte-level symbols back to bytes; on a character outside the alphabet: nothing, and
// `bad_offset` its byte offset. `symbols` is well-formed UTF-8.
[[nodiscard]] std::optional<std::string> decode_symbols(std::string_view symbols,
                                                        std::size_t& bad_offset) {
    std::string bytes;
    bytes.reserve(symbols.size());
    for (std::size_t offset = 0; offset < symbols.size();) {
        const std::size_t length = utf8_length(static_cast<unsigned char>(symbols[offset]));
        const std::optional<std::uint8_t> byte =
            byte_level_byte(utf8_code_point(symbols.substr(offset, length)));
        if (!byte) {
            bad_offset = offset;
            return std::nullopt;
        }
        bytes.push_back(static_cast<char>(*byte));
        offset += length;
    }
    return bytes;
}

// "<0xAB>" as 0xAB; anything else (lower-case hex included): nothing.
[[nodiscard]] std::optional<std::uint8_t> byte_token_value(std::string_view text) noexcept {
    if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') {
        return std::nullopt;
    }
    unsigned value = 0;
    for (const char digit : text.substr(3, 2)) {
        value <<= 4U;
        if (digit >= '0' && digit <= '9') {
            value |= static_cast<unsigned>(digit - '0');
        } else if (digit >= 'A' && digit <= 'F') {
            value |= static_cast<unsigned>(digit - 'A' + 10);
        } else {
            return std::nullopt;
        }
    }
    return static_cast<std::uint8_t>(value);
}

// ---- Merging.

// A merge as one integer: (rank << 32) | merged id. Lower rank merges first; equal ranks
// (SentencePiece tokens of equal score) merge leftmost first.
using PackedMerge = std::uint64_t;
using MergeTable = detail::PairMap<PackedMerge>;
constexpr PackedMerge no_merge = MergeTable::missing;

[[nodiscard]] constexpr PackedMerge pack_merge(std::uint32_t rank, TokenId merged) noexcept {
    return (static_cast<std::uint64_t>(rank) << 32U) | merged;
}
[[nodiscard]] constexpr std::uint32_t merge_rank(PackedMerge merge) noexcept {
    return static_cast<std::uint32_t>(merge >> 32U);  // no_merge: the largest rank of all
}
[[nodiscard]] constexpr TokenId merged_id(PackedMerge merge) noexcept {
    return static_cast<TokenId>(merge & 0xFFFFFFFFU);
}

// Reusable buffers of one encode call.
class SymbolMerger {
  public:
    // Merges `symbols` in place: while some adjacent pair has a merge, the pair of lowest rank
    // (leftmost among equal ranks) becomes its merged id.
    void merge(std::vector<TokenId>& symbols, const MergeTable& merges) {
        if (symbols.size() < 2) {
            return;
        }
        if (symbols.size() <= short_word_symbols) {
            merge_short(symbols, merges);
        } else {
            merge_long(symbols, merges);
        }
    }

  private:
    // Below this, rescanning the pending merges for the best one is cheaper than a heap; each
    // step still looks up only the two pairs it changes.
    static constexpr std::size_t short_word_symbols = 48;

    // symbols [n] -> pending[i] = merge of (symbols[i], symbols[i+1]) [n-1]. O(n^2) scans,
    // O(n) lookups.
    void merge_short(std::vector<TokenId>& symbols, const MergeTable& merges) {
        pending_.resize(symbols.size() - 1);
        for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
            pending_[i] = merges.find(detail::pair_key(symbols[i], symbols[i + 1]));
        }
        while (true) {
            std::size_t best = pending_.size();
            std::uint32_t best_rank = merge_rank(no_merge);
            for (std::size_t i = 0; i < pending_.size(); ++i) {
                if (merge_rank(pending_[i]) < best_rank) {
                    best_rank = merge_rank(pending_[i]);
                    best = i;
                }
            }
            if (best == pending_.size()) {
                return;
            }
            symbols[best] = merged_id(pending_[best]);
            symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(best));
            if (best > 0) {
                pending_[best - 1] =
                    merges.find(detail::pair_key(symbols[best - 1], symbols[best]));
            }
            if (best < pending_.size()) {
                pending_[best] = merges.find(detail::pair_key(symbols[best], symbols[best + 1]));
            }
        }
    }

    // A linked list over the symbols and a heap of candidate merges ordered by (rank, left
    // position); a candidate is stale once either symbol changed or they stopped being
    // adjacent (a position's id only ever grows into a longer token, never back). O(n log n).
    struct Candidate {
        std::uint32_t rank;
        std::uint32_t left;
        std::uint32_t right;
        TokenId left_id;
        TokenId right_id;
        TokenId merged;

        friend bool operator>(const Candidate& a, const Candidate& b) noexcept {
            return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
        }
    };

    void merge_long(std::vector<TokenId>& symbols, const MergeTable& merges) {
        constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
        if (symbols.size() >= none) {
            throw std::length_error("PretrainedTokenizer::encode: a stretch of " +
                                    std::to_string(symbols.size()) +
                                    " symbols is too long to merge (at most 2^32 - 2)");
        }
        const auto count = static_cast<std::uint32_t>(symbols.size());
        next_.resize(count);
        previous_.resize(count);
        for (std::uint32_t i = 0; i < count; ++i) {
            previous_[i] = i == 0 ? none : i - 1;
            next_[i] = i + 1 == count ? none : i + 1;
        }
        heap_.clear();
        const auto consider = [&](std::uint32_t left, std::uint32_t right) {
            const PackedMerge merge = merges.find(detail::pair_key(symbols[left], symbols[right]));
            if (merge != no_merge) {
                heap_.push_back({merge_rank(merge), left, right, symbols[left], symbols[right],
                                 merged_id(merge)});
                std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
            }
        };
        for (std::uint32_t i = 0; i + 1 < count; ++i) {
            consider(i, i + 1);
        }
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
            const Candidate candidate = heap_.back();
            heap_.pop_back();
            if (symbols[candidate.left] != candidate.left_id ||
                next_[candidate.left] != candidate.right ||
                symbols[candidate.right] != candidate.right_id) {
                continue;
            }
            symbols[candidate.left] = candidate.merged;
            symbols[candidate.right] = no_token;
            const std::uint32_t after = next_[candidate.right];
            next_[candidate.left] = after;
            if (after != none) {
                previous_[after] = candidate.left;
                consider(candidate.left, after);
            }
            if (previous_[candidate.left] != none) {
                consider(previous_[candidate.left], candidate.left);
            }
        }
        std::size_t kept = 0;
        for (std::uint32_t i = 0; i != none; i = next_[i]) {
            symbols[kept++] = symbols[i];
        }
        symbols.resize(kept);
    }

    std::vector<PackedMerge> pending_;
    std::vector<std::uint32_t> next_;
    std::vector<std::uint32_t> previous_;
    std::vector<Candidate> heap_;
};

// ---- Special tokens: a byte trie. The text is scanned left to right and the longest token
// starting at the first position where any starts is cut out, as tokenizers' leftmost-longest
// Aho-Corasick match does (llama.cpp instead cuts the longest tokens everywhere first; the two
// differ only when special tokens overlap).

class SpecialTokenTrie {
  public:
    void insert(std::string_view text, TokenId id, bool only_when_parsing) {
        std::uint32_t node = 0;
        for (const char unit : text) {
            const auto byte = static_cast<std::uint8_t>(unit);
            std::uint32_t child = child_of(node, byte);
            if (child == absent) {
                child = static_cast<std::uint32_t>(nodes_.size());
                nodes_.emplace_back();
                nodes_[node].children.emplace_back(byte, child);
                if (node == 0) {
                    root_children_[byte] = child;
                }
            }
            node = child;
        }
        nodes_[node].id = id;
        nodes_[node].only_when_parsing = only_when_parsing;
    }

    [[nodiscard]] bool empty() const noexcept { return nodes_.size() == 1; }

    // The longest token at text[position...] (those inserted only_when_parsing only when
    // `parsing`): {length in bytes, id}, or {0, no_token}.
    [[nodiscard]] std::pair<std::size_t, TokenId> longest_at(std::string_view text,
                                                             std::size_t position,
                                                             bool parsing) const noexcept {
        std::pair<std::size_t, TokenId> found{0, no_token};
        std::uint32_t node = root_children_[static_cast<std::uint8_t>(text[position])];
        for (std::size_t end = position + 1; node != absent; ++end) {
            const Node& current = nodes_[node];
            if (current.id != no_token && (parsing || !current.only_when_parsing)) {
                found = {end - position, current.id};
            }
            if (end == text.size()) {
                break;
            }
            node = child_of(node, static_cast<std::uint8_t>(text[end]));
        }
        return found;
    }

    // True when some token starts with `byte` (a cheap filter before longest_at).
    [[nodiscard]] bool may_start(char unit) const noexcept {
        return root_children_[static_cast<std::uint8_t>(unit)] != absent;
    }

  private:
    static constexpr std::uint32_t absent = std::numeric_limits<std::uint32_t>::max();

    struct Node {
        std::vector<std::pair<std::uint8_t, std::uint32_t>> children;
        TokenId id = no_token;
        bool only_when_parsing = false;
    };

    [[nodiscard]] std::uint32_t child_of(std::uint32_t node, std::uint8_t byte) const noexcept {
        for (const auto& [label, child] : nodes_[node].children) {
            if (label == byte) {
                return child;
            }
        }
        return absent;
    }

    std::vector<Node> nodes_ = std::vector<Node>(1);
    std::array<std::uint32_t, 256> root_children_ = [] {
        std::array<std::uint32_t, 256> children{};
        children.fill(absent);
        return children;
    }();
};

}  // namespace

namespace detail {

// Everything derived from one valid vocabulary; immutable once built.
class PretrainedTables {
  public:
    explicit PretrainedTables(const PretrainedVocabulary& vocabulary);

    PretrainedModelKind model;
    std::optional<Pretokenizer> pretokenizer;  // ByteLevelBpe
    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    std::vector<std::string> pieces;  // [vocabulary] bytes each token decodes to
    std::optional<TokenId> bos_id;
    std::optional<TokenId> eos_id;
    std::optional<TokenId> unknown_id;
    bool ignore_merges = false;
    bool add_dummy_prefix = false;

    std::unordered_map<std::string_view, TokenId> id_of_text;  // views into tokens
    MergeTable merges;
    SpecialTokenTrie specials;
    // ByteLevelBpe: the token of each byte's symbol. SentencePieceBpe: the <0xXX> token of
    // each byte, or all no_token when the vocabulary has none.
    std::array<TokenId, 256> byte_tokens{};
    // ByteLevelBpe with ignore_merges: Normal tokens by their bytes (views into pieces).
    std::unordered_map<std::string_view, TokenId> normal_id_of_bytes;
    // SentencePieceBpe: the Normal token of each single character.
    std::unordered_map<char32_t, TokenId> normal_id_of_character;

  private:
    void check_token_list(const PretrainedVocabulary& vocabulary);
    void build_byte_level(const PretrainedVocabulary& vocabulary);
    void build_sentencepiece(const PretrainedVocabulary& vocabulary);
    void build_specials();
    void check_special_ids();
};

PretrainedTables::PretrainedTables(const PretrainedVocabulary& vocabulary)
    : model(vocabulary.model),
      tokens(vocabulary.tokens),
      bos_id(vocabulary.bos_id),
      eos_id(vocabulary.eos_id),
      unknown_id(vocabulary.unknown_id),
      ignore_merges(vocabulary.ignore_merges),
      add_dummy_prefix(vocabulary.add_dummy_prefix) {
    (void)pretrained_model_kind_name(model);  // unknown kind: std::invalid_argument
    check_token_list(vocabulary);
    check_special_ids();
    byte_tokens.fill(no_token);
    pieces.resize(tokens.size());
    if (model == PretrainedModelKind::ByteLevelBpe) {
        build_byte_level(vocabulary);
    } else {
        build_sentencepiece(vocabulary);
    }
    build_specials();
}

void PretrainedTables::check_token_list(const PretrainedVocabulary& vocabulary) {
    if (tokens.empty()) {
        reject("tokens is empty");
    }
    if (tokens.size() >= no_token) {
        reject("tokens has " + std::to_string(tokens.size()) + " entries (at most " +
               std::to_string(no_token - 1) + ")");
    }
    if (!vocabulary.token_types.empty() && vocabulary.token_types.size() != tokens.size()) {
        reject("token_types has " + std::to_string(vocabulary.token_types.size()) +
               " entries for " + std::to_string(tokens.size()) + " tokens");
    }
    if (!vocabulary.scores.empty() && vocabulary.scores.size() != tokens.size()) {
        reject("scores has " + std::to_string(vocabulary.scores.size()) + " entries for " +
               std::to_string(tokens.size()) + " tokens");
    }
    types = vocabulary.token_types.empty()
                ? std::vector<TokenType>(tokens.size(), TokenType::Normal)
                : vocabulary.token_types;
    id_of_text.reserve(tokens.size());
    for (std::size_t id = 0; id < tokens.size(); ++id) {
        const std::string& text = tokens[id];
        const auto type_value = static_cast<std::int32_t>(types[id]);
        if (type_value < 1 || type_value > 6) {
            reject(indexed("token_types", id) + " = " + std::to_string(type_value) +
                   " is not a token type (1..6)");
        }
        if (text.empty()) {
            reject(indexed("tokens", id) + " is empty");
        }
        if (const auto offset = ill_formed_utf8_offset(text)) {
            reject(indexed("tokens", id) + " is not well-formed UTF-8 (at byte " +
                   std::to_string(*offset) + ")");
        }
        const auto [existing, inserted] = id_of_text.emplace(text, static_cast<TokenId>(id));
        if (!inserted) {
            reject(indexed("tokens", id) + " = " + quoted(text) + " repeats " +
                   indexed("tokens", existing->second));
        }
    }
}

void PretrainedTables::check_special_ids() {
    const auto check = [&](std::string_view name, const std::optional<TokenId>& id) {
        if (id && *id >= tokens.size()) {
            reject(std::string(name) + " = " + std::to_string(*id) +
                   " is out of range (vocabulary size " + std::to_string(tokens.size()) + ")");
        }
    };
    check("bos_id", bos_id);
    check("eos_id", eos_id);
    check("unknown_id", unknown_id);
}

void PretrainedTables::build_byte_level(const PretrainedVocabulary& vocabulary) {
    pretokenizer.emplace(vocabulary.pretokenizer);  // unknown kind: std::invalid_argument
    for (std::size_t id = 0; id < tokens.size(); ++id) {
        switch (types[id]) {
            case TokenType::Normal: {
                std::size_t bad_offset = 0;
                std::optional<std::string> bytes = decode_symbols(tokens[id], bad_offset);
                if (!bytes) {
                    reject(indexed("tokens", id) + " = " + quoted(tokens[id]) +
                           " is a normal token with a character outside the byte-level "
                           "alphabet (at byte " +
                           std::to_string(bad_offset) + ")");
                }
                pieces[id] = std::move(*bytes);
                break;
            }
            case TokenType::Byte:
                reject(indexed("tokens", id) + " = " + quoted(tokens[id]) +
                       " has type byte, which only SentencePiece vocabularies use");
            default:
                pieces[id] = tokens[id];
                break;
        }
    }
    // A byte whose symbol is no Normal token is dropped (SmolLM2 lacks 21, e.g. 0x04), as
    // tokenizers' BPE without unk_token and llama.cpp do.
    for (unsigned byte = 0; byte < 256; ++byte) {
        std::string symbol;
        append_utf8(byte_symbols[byte], symbol);
        const auto found = id_of_text.find(symbol);
        if (found != id_of_text.end() && types[found->second] == TokenType::Normal) {
            byte_tokens[byte] = found->second;
        }
    }
    if (vocabulary.merges.size() >= no_token) {
        reject("merges has " + std::to_string(vocabulary.merges.size()) + " entries (at most " +
               std::to_string(no_token - 1) + ")");
    }
    merges = MergeTable(vocabulary.merges.size());
    for (std::size_t rank = 0; rank < vocabulary.merges.size(); ++rank) {
        const std::string& left = vocabulary.merges[rank].first;
        const std::string& right = vocabulary.merges[rank].second;
        // "merges[r] = \"left right\"", for a message.
        const auto named = [&] {
            std::string pair = left;
            pair += ' ';
            pair += right;
            return indexed("merges", rank) + " = " + quoted(pair);
        };
        const auto id_of = [&](const std::string& text, std::string_view role) {
            const auto found = id_of_text.find(text);
            if (found == id_of_text.end()) {
                reject(named() + ": " + std::string(role) + " " + quoted(text) + " is not a token");
            }
            return found->second;
        };
        const TokenId left_id = id_of(left, "left");
        const TokenId right_id = id_of(right, "right");
        const TokenId result = id_of(left + right, "merged");
        const auto [stored, inserted] =
            merges.try_insert(detail::pair_key(left_id, right_id),
                              pack_merge(static_cast<std::uint32_t>(rank), result));
        if (!inserted) {
            reject(named() + " repeats " + indexed("merges", merge_rank(stored)));
        }
    }
    if (ignore_merges) {
        normal_id_of_bytes.reserve(tokens.size());
        for (std::size_t id = 0; id < tokens.size(); ++id) {
            if (types[id] == TokenType::Normal) {
                normal_id_of_bytes.emplace(pieces[id], static_cast<TokenId>(id));
            }
        }
    }
}

void PretrainedTables::build_sentencepiece(const PretrainedVocabulary& vocabulary) {
    if (!vocabulary.merges.empty()) {
        reject("merges has " + std::to_string(vocabulary.merges.size()) +
               " entries, but a SentencePiece vocabulary merges by scores");
    }
    if (vocabulary.scores.empty()) {
        reject("scores is empty (a SentencePiece vocabulary needs one score per token)");
    }
    std::size_t byte_token_count = 0;
    for (std::size_t id = 0; id < tokens.size(); ++id) {
        if (!std::isfinite(vocabulary.scores[id])) {
            reject(indexed("scores", id) + " is not finite");
        }
        const std::string& text = tokens[id];
        switch (types[id]) {
            case TokenType::Normal: {
                std::string& piece = pieces[id];
                for (std::size_t at = 0; at < text.size();) {
                    if (text.compare(at, metaspace.size(), metaspace) == 0) {
                        piece.push_back(' ');
                        at += metaspace.size();
                    } else {
                        piece.push_back(text[at++]);
                    }
                }
                const std::size_t first_length = utf8_length(static_cast<unsigned char>(text[0]));
                if (first_length == text.size()) {
                    normal_id_of_character.emplace(utf8_code_point(text), static_cast<TokenId>(id));
                }
                break;
            }
            case TokenType::Byte: {
                const std::optional<std::uint8_t> byte = byte_token_value(text);
                if (!byte) {
                    reject(indexed("tokens", id) + " = " + quoted(text) +
                           " has type byte but is not spelled <0xXX>");
                }
                byte_tokens[*byte] = static_cast<TokenId>(id);
                pieces[id] = std::string(1, static_cast<char>(*byte));
                ++byte_token_count;
                break;
            }
            default:
                pieces[id] = text;
                break;
        }
    }
    if (byte_token_count != 0 && byte_token_count != 256) {
        const auto missing = std::find(byte_tokens.begin(), byte_tokens.end(), no_token);
        std::ostringstream message;
        message << "byte fallback tokens cover " << byte_token_count
                << " of the 256 bytes (no token for byte 0x" << std::hex
                << (missing - byte_tokens.begin()) << ")";
        reject(message.str());
    }
    if (byte_token_count == 0 && !unknown_id) {
        reject("neither byte fallback tokens <0x00>..<0xFF> nor an unknown_id are given");
    }
    // Merge ranks: Normal tokens by score, highest first; equal scores share a rank.
    std::vector<float> distinct_scores;
    for (std::size_t id = 0; id < tokens.size(); ++id) {
        if (types[id] == TokenType::Normal) {
            distinct_scores.push_back(vocabulary.scores[id]);
        }
    }
    std::sort(distinct_scores.begin(), distinct_scores.end(), std::greater<>());
    distinct_scores.erase(std::unique(distinct_scores.begin(), distinct_scores.end()),
                          distinct_scores.end());
    const auto rank_of_score = [&](float score) {
        return static_cast<std::uint32_t>(std::lower_bound(distinct_scores.begin(),
                                                           distinct_scores.end(), score,
                                                           std::greater<>()) -
                                          distinct_scores.begin());
    };
    // Every split of a Normal token into two Normal tokens is a merge to it: that is exactly
    // "the pair whose concatenation is a token", with integer keys.
    const auto normal_id = [&](std::string_view text) {
        const auto found = id_of_text.find(text);
        return found != id_of_text.end() && types[found->second] == TokenType::Normal
                   ? found->second
                   : no_token;
    };
    for (std::size_t id = 0; id < tokens.size(); ++id) {
        if (types[id] != TokenType::Normal) {
            continue;
        }
        const std::string_view text = tokens[id];
        const std::uint32_t rank = rank_of_score(vocabulary.scores[id]);
        for (std::size_t split = utf8_length(static_cast<unsigned char>(text[0]));
             split < text.size(); split += utf8_length(static_cast<unsigned char>(text[split]))) {
            const TokenId left = normal_id(text.substr(0, split));
            const TokenId right = normal_id(text.substr(split));
            if (left != no_token && right != no_token) {
                merges.try_insert(detail::pair_key(left, right),
                                  pack_merge(rank, static_cast<TokenId>(id)));
            }
        }
    }
}

void PretrainedTables::build_specials() {
    for (std::size_t id = 0; id < tokens.size(); ++id) {
        const TokenType type = types[id];
        if (type == TokenType::Control || type == TokenType::Unknown ||
            type == TokenType::UserDefined) {
            specials.insert(tokens[id], static_cast<TokenId>(id), type != TokenType::UserDefined);
        }
    }
}

}  // namespace detail

namespace {

// The per-call state of PretrainedTokenizer::encode.
class Encoder {
  public:
    explicit Encoder(const detail::PretrainedTables& tables) : tables_(tables) {}

    // Appends the ids of `text`, a well-formed stretch with no special token in it.
    void encode_stretch(std::string_view text, std::vector<TokenId>& out) {
        if (text.empty()) {
            return;
        }
        if (tables_.model == PretrainedModelKind::ByteLevelBpe) {
            encode_byte_level(text, out);
        } else {
            encode_sentencepiece(text, out);
        }
    }

  private:
    void encode_byte_level(std::string_view text, std::vector<TokenId>& out) {
        pieces_.clear();
        tables_.pretokenizer->split_valid(text, pieces_);
        for (const std::string_view piece : pieces_) {
            if (piece.size() == 1) {
                const TokenId id = tables_.byte_tokens[static_cast<std::uint8_t>(piece[0])];
                if (id != no_token) {
                    out.push_back(id);
                }
                continue;
            }
            const auto [cached, inserted] = cache_.try_emplace(piece, CachedIds{});
            if (!inserted) {
                out.insert(out.end(), cached_ids_.begin() + cached->second.begin,
                           cached_ids_.begin() + cached->second.begin + cached->second.count);
                continue;
            }
            const std::size_t begin = out.size();
            encode_piece(piece, out);
            cached->second = {static_cast<std::ptrdiff_t>(cached_ids_.size()),
                              static_cast<std::ptrdiff_t>(out.size() - begin)};
            cached_ids_.insert(cached_ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(begin),
                               out.end());
        }
    }

    // The ids of one pre-token (its bytes).
    void encode_piece(std::string_view piece, std::vector<TokenId>& out) {
        if (tables_.ignore_merges) {
            const auto whole = tables_.normal_id_of_bytes.find(piece);
            if (whole != tables_.normal_id_of_bytes.end()) {
                out.push_back(whole->second);
                return;
            }
        }
        symbols_.clear();
        for (const char unit : piece) {
            const TokenId id = tables_.byte_tokens[static_cast<std::uint8_t>(unit)];
            if (id != no_token) {
                symbols_.push_back(id);  // a dropped byte lets its neighbours merge
            }
        }
        merger_.merge(symbols_, tables_.merges);
        out.insert(out.end(), symbols_.begin(), symbols_.end());
    }

    // Characters with a Normal token merge as runs; any other character ends the run and falls
    // back to bytes (no merge can reach across it, so each run merges on its own).
    void encode_sentencepiece(std::string_view text, std::vector<TokenId>& out) {
        normalized_.clear();
        if (tables_.add_dummy_prefix) {
            normalized_.append(metaspace);
        }
        for (const char unit : text) {
            if (unit == ' ') {
                normalized_.append(metaspace);
            } else {
                normalized_.push_back(unit);
            }
        }
        symbols_.clear();
        for (std::size_t offset = 0; offset < normalized_.size();) {
            const std::size_t length = utf8_length(static_cast<unsigned char>(normalized_[offset]));
            const std::string_view character = std::string_view(normalized_).substr(offset, length);
            offset += length;
            const auto found = tables_.normal_id_of_character.find(utf8_code_point(character));
            if (found != tables_.normal_id_of_character.end()) {
                symbols_.push_back(found->second);
                continue;
            }
            flush_run(out);
            if (tables_.byte_tokens[0] == no_token) {
                out.push_back(*tables_.unknown_id);
            } else {
                for (const char unit : character) {
                    out.push_back(tables_.byte_tokens[static_cast<std::uint8_t>(unit)]);
                }
            }
        }
        flush_run(out);
    }

    void flush_run(std::vector<TokenId>& out) {
        merger_.merge(symbols_, tables_.merges);
        out.insert(out.end(), symbols_.begin(), symbols_.end());
        symbols_.clear();
    }

    struct CachedIds {
        std::ptrdiff_t begin = 0;
        std::ptrdiff_t count = 0;
    };

    const detail::PretrainedTables& tables_;
    SymbolMerger merger_;
    std::vector<std::string_view> pieces_;
    std::vector<TokenId> symbols_;
    std::string normalized_;
    // Pre-token (a view into the text being encoded) -> its ids in cached_ids_.
    std::unordered_map<std::string_view, CachedIds> cache_;
    std::vector<TokenId> cached_ids_;
};

}  // namespace

std::string_view pretrained_model_kind_name(PretrainedModelKind kind) {
    switch (kind) {
        case PretrainedModelKind::ByteLevelBpe:
            return "byte_level_bpe";
        case PretrainedModelKind::SentencePieceBpe:
            return "sentencepiece_bpe";
    }
    throw std::invalid_argument("pretrained_model_kind_name: kind value " +
                                std::to_string(static_cast<std::int32_t>(kind)) +
                                " is unknown (byte_level_bpe = 0, sentencepiece_bpe = 1)");
}

PretrainedModelKind pretrained_model_kind_from_gguf(std::string_view gguf_model) {
    if (gguf_model == "gpt2") {
        return PretrainedModelKind::ByteLevelBpe;
    }
    if (gguf_model == "llama") {
        return PretrainedModelKind::SentencePieceBpe;
    }
    throw std::invalid_argument("pretrained_model_kind_from_gguf: tokenizer.ggml.model \"" +
                                std::string(gguf_model) +
                                "\" is not supported (known: \"gpt2\", \"llama\")");
}

TokenType token_type_from_value(std::int32_t value) {
    if (value < 1 || value > 6) {
        throw std::invalid_argument("token_type_from_value: value " + std::to_string(value) +
                                    " is not a GGUF token type (1 normal, 2 unknown, 3 control, "
                                    "4 user-defined, 5 unused, 6 byte)");
    }
    return static_cast<TokenType>(value);
}

std::pair<std::string, std::string> parse_merge(std::string_view line) {
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
        throw std::invalid_argument("parse_merge: " + quoted(line) +
                                    " is not \"left right\" (two non-empty tokens, one space)");
    }
    return {std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}

std::vector<std::pair<std::string, std::string>> parse_merges(std::span<const std::string> lines) {
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(lines.size());
    for (std::size_t i = 0; i < lines.size(); ++i) {
        try {
            merges.push_back(parse_merge(lines[i]));
        } catch (const std::invalid_argument& error) {
            throw std::invalid_argument("parse_merges: " + indexed("lines", i) + ": " +
                                        error.what());
        }
    }
    return merges;
}

char32_t byte_level_symbol(std::uint8_t byte) noexcept {
    return byte_symbols[byte];
}

std::optional<std::uint8_t> byte_level_byte(char32_t symbol) noexcept {
    if (symbol >= symbol_table_size || symbol_bytes[symbol] < 0) {
        return std::nullopt;
    }
    return static_cast<std::uint8_t>(symbol_bytes[symbol]);
}

std::string byte_level_encode(std::string_view bytes) {
    std::string symbols;
    symbols.reserve(bytes.size() * 2);
    for (const char unit : bytes) {
        append_utf8(byte_symbols[static_cast<std::uint8_t>(unit)], symbols);
    }
    return symbols;
}

std::string byte_level_decode(std::string_view symbols) {
    detail::require_well_formed_utf8("byte_level_decode", symbols);
    std::size_t bad_offset = 0;
    std::optional<std::string> bytes = decode_symbols(symbols, bad_offset);
    if (!bytes) {
        throw std::invalid_argument("byte_level_decode: the character at byte offset " +
                                    std::to_string(bad_offset) +
                                    " is outside the byte-level alphabet");
    }
    return std::move(*bytes);
}

PretrainedTokenizer::PretrainedTokenizer(const PretrainedVocabulary& vocabulary)
    : tables_(std::make_shared<const detail::PretrainedTables>(vocabulary)),
      vocabulary_(std::make_shared<const PretrainedVocabulary>(vocabulary)) {}

PretrainedModelKind PretrainedTokenizer::model() const noexcept {
    return tables_->model;
}

std::optional<PretokenizerKind> PretrainedTokenizer::pretokenizer() const noexcept {
    if (!tables_->pretokenizer) {
        return std::nullopt;
    }
    return tables_->pretokenizer->kind();
}

std::size_t PretrainedTokenizer::vocabulary_size() const noexcept {
    return tables_->tokens.size();
}

std::optional<TokenId> PretrainedTokenizer::bos_id() const noexcept {
    return tables_->bos_id;
}

std::optional<TokenId> PretrainedTokenizer::eos_id() const noexcept {
    return tables_->eos_id;
}

std::optional<TokenId> PretrainedTokenizer::unknown_id() const noexcept {
    return tables_->unknown_id;
}

namespace {

void check_id(std::string_view operation, std::string_view argument, TokenId id,
              std::size_t vocabulary_size) {
    if (id >= vocabulary_size) {
        std::ostringstream message;
        message << operation << ": " << argument << " = " << id
                << " is out of range (vocabulary size " << vocabulary_size << ")";
        throw std::out_of_range(message.str());
    }
}

}  // namespace

const std::string& PretrainedTokenizer::token_text(TokenId id) const {
    check_id("PretrainedTokenizer::token_text", "id", id, vocabulary_size());
    return tables_->tokens[id];
}

TokenType PretrainedTokenizer::token_type(TokenId id) const {
    check_id("PretrainedTokenizer::token_type", "id", id, vocabulary_size());
    return tables_->types[id];
}

std::optional<TokenId> PretrainedTokenizer::find_token(std::string_view text) const {
    const auto found = tables_->id_of_text.find(text);
    if (found == tables_->id_of_text.end()) {
        return std::nullopt;
    }
    return found->second;
}

std::vector<TokenId> PretrainedTokenizer::encode(std::string_view utf8_text,
                                                 SpecialTokens special) const {
    if (special != SpecialTokens::Parse && special != SpecialTokens::AsText) {
        throw std::invalid_argument("PretrainedTokenizer::encode: special value " +
                                    std::to_string(static_cast<std::int32_t>(special)) +
                                    " is unknown (parse = 0, as_text = 1)");
    }
    detail::require_well_formed_utf8("PretrainedTokenizer::encode", utf8_text);
    const detail::PretrainedTables& tables = *tables_;
    const bool parsing = special == SpecialTokens::Parse;
    std::vector<TokenId> ids;
    ids.reserve(utf8_text.size() / 3 + 1);
    Encoder encoder(tables);
    std::size_t stretch_begin = 0;
    if (!tables.specials.empty()) {
        for (std::size_t position = 0; position < utf8_text.size(); ++position) {
            if (!tables.specials.may_start(utf8_text[position])) {
                continue;
            }
            const auto [length, id] = tables.specials.longest_at(utf8_text, position, parsing);
            if (length == 0) {
                continue;
            }
            encoder.encode_stretch(utf8_text.substr(stretch_begin, position - stretch_begin), ids);
            ids.push_back(id);
            position += length - 1;
            stretch_begin = position + 1;
        }
    }
    encoder.encode_stretch(utf8_text.substr(stretch_begin), ids);
    return ids;
}

std::string PretrainedTokenizer::decode(std::span<const TokenId> ids) const {
    std::size_t total = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        check_id("PretrainedTokenizer::decode", indexed("ids", i), ids[i], vocabulary_size());
        total += tables_->pieces[ids[i]].size();
    }
    std::string text;
    text.reserve(total);
    for (const TokenId id : ids) {
        text.append(tables_->pieces[id]);
    }
    if (tables_->model == PretrainedModelKind::SentencePieceBpe && tables_->add_dummy_prefix &&
        !text.empty() && text.front() == ' ') {
        text.erase(0, 1);
    }
    return text;
}

const std::string& PretrainedTokenizer::token_bytes(TokenId id) const {
    check_id("PretrainedTokenizer::token_bytes", "id", id, vocabulary_size());
    return tables_->pieces[id];
}

}  // namespace riftco_transformer
