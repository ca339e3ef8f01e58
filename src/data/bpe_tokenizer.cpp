#include "riftco_transformer/data/bpe_tokenizer.hpp"

#include <cstddef>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "data/bpe_fast.hpp"
#include "data/bpe_validation.hpp"
#include "data/tokenizer_errors.hpp"

namespace riftco_transformer {
namespace detail {

// Everything derived from one valid merge table. Pieces are kept two ways: the pieces of the
// first ids, concatenated, up to a total of piece_cache_bytes (that covers every real
// vocabulary); and the rules themselves, which expand any longer piece. Restored tables can
// double a piece per rule, so a piece may be too long to ever hold: its length is then
// `unrepresentable`.
class BpeTables {
  public:
    static constexpr std::uint64_t unrepresentable = std::numeric_limits<std::uint64_t>::max();
    static constexpr std::size_t piece_cache_bytes = std::size_t{16} << 20U;

    explicit BpeTables(std::vector<BpeMergeRule> merge_rules)
        : rules(std::move(merge_rules)), ranks(rules) {
        piece_length.assign(first_merged_id, 1);
        piece_length.reserve(first_merged_id + rules.size());
        for (const BpeMergeRule& rule : rules) {
            const std::uint64_t left = piece_length[rule.left];
            const std::uint64_t right = piece_length[rule.right];
            const bool fits = left != unrepresentable && right != unrepresentable &&
                              left <= max_bytes() && right <= max_bytes() - left;
            piece_length.push_back(fits ? left + right : unrepresentable);
        }
        piece_offset.push_back(0);
        for (TokenId id = 0; id < piece_length.size(); ++id) {
            const std::uint64_t length = piece_length[id];
            if (length == unrepresentable || piece_bytes.size() + length > piece_cache_bytes) {
                break;
            }
            if (id < first_merged_id) {
                piece_bytes.push_back(static_cast<std::uint8_t>(id));
            } else {
                const BpeMergeRule& rule = rules[id - first_merged_id];
                append_cached(rule.left);
                append_cached(rule.right);
            }
            piece_offset.push_back(piece_bytes.size());
        }
    }

    [[nodiscard]] std::size_t vocabulary_size() const noexcept { return piece_length.size(); }
    [[nodiscard]] std::size_t cached_count() const noexcept { return piece_offset.size() - 1; }

    // Largest byte count a decoded result may have.
    [[nodiscard]] static std::uint64_t max_bytes() noexcept {
        return std::vector<std::uint8_t>().max_size();
    }

    // Appends the piece of a known id whose length is representable.
    void append_piece(TokenId id, std::vector<std::uint8_t>& out) const {
        std::vector<TokenId> pending{id};
        while (!pending.empty()) {
            const TokenId next = pending.back();
            pending.pop_back();
            if (next < cached_count()) {
                out.insert(
                    out.end(),
                    piece_bytes.begin() + static_cast<std::ptrdiff_t>(piece_offset[next]),
                    piece_bytes.begin() + static_cast<std::ptrdiff_t>(piece_offset[next + 1]));
            } else {
                const BpeMergeRule& rule = rules[next - first_merged_id];
                pending.push_back(rule.right);
                pending.push_back(rule.left);
            }
        }
    }

    std::vector<BpeMergeRule> rules;
    BpeRankTable ranks;
    std::vector<std::uint64_t> piece_length;  // [vocabulary] bytes, or unrepresentable
    std::vector<std::size_t> piece_offset;    // [cached_count + 1] into piece_bytes
    std::vector<std::uint8_t> piece_bytes;    // pieces of ids 0..cached_count-1, concatenated

  private:
    void append_cached(TokenId id) {
        // Copy through indices: the insertion may reallocate piece_bytes.
        const std::size_t begin = piece_offset[id];
        const std::size_t end = piece_offset[id + 1];
        for (std::size_t i = begin; i < end; ++i) {
            piece_bytes.push_back(piece_bytes[i]);
        }
    }
};

}  // namespace detail

namespace {

// Total decoded size of `ids` (all known), or std::overflow_error naming `operation`.
std::size_t decoded_size(std::string_view operation, const detail::BpeTables& tables,
                         std::span<const TokenId> ids) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::uint64_t length = tables.piece_length[ids[i]];
        if (length == detail::BpeTables::unrepresentable ||
            length > detail::BpeTables::max_bytes() - total) {
            std::ostringstream message;
            message << operation << ": decoded size overflows at ids[" << i << "] = " << ids[i]
                    << " (more than " << detail::BpeTables::max_bytes() << " bytes)";
            throw std::overflow_error(message.str());
        }
        total += length;
    }
    return static_cast<std::size_t>(total);
}

}  // namespace

BpeTokenizer::BpeTokenizer(std::span<const std::uint8_t> corpus, const BpeTrainingOptions& options)
    : tables_(std::make_shared<const detail::BpeTables>(learn_bpe_merges(corpus, options))) {}

BpeTokenizer::BpeTokenizer(std::shared_ptr<const detail::BpeTables> tables)
    : tables_(std::move(tables)) {}

BpeTokenizer BpeTokenizer::from_merge_rules(std::span<const BpeMergeRule> rules) {
    detail::validate_merge_rules("BpeTokenizer::from_merge_rules", rules);
    return BpeTokenizer(std::make_shared<const detail::BpeTables>(
        std::vector<BpeMergeRule>(rules.begin(), rules.end())));
}

std::size_t BpeTokenizer::vocabulary_size() const noexcept {
    return tables_->vocabulary_size();
}

std::vector<TokenId> BpeTokenizer::encode_bytes(std::span<const std::uint8_t> bytes) const {
    if (detail::positions_fit<std::uint32_t>(bytes.size())) {
        return detail::encode_with_merge_queue<std::uint32_t>(bytes, tables_->rules,
                                                              tables_->ranks);
    }
    return detail::encode_with_merge_queue<std::uint64_t>(bytes, tables_->rules, tables_->ranks);
}

std::vector<std::uint8_t> BpeTokenizer::decode_bytes(std::span<const TokenId> ids) const {
    constexpr std::string_view op = "BpeTokenizer::decode_bytes";
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= vocabulary_size()) {
            detail::throw_unknown_id(op, detail::indexed("ids", i), ids[i], vocabulary_size());
        }
    }
    std::vector<std::uint8_t> bytes;
    bytes.reserve(decoded_size(op, *tables_, ids));
    for (const TokenId id : ids) {
        tables_->append_piece(id, bytes);
    }
    return bytes;
}

std::vector<std::uint8_t> BpeTokenizer::token_bytes(TokenId id) const {
    constexpr std::string_view op = "BpeTokenizer::token_bytes";
    if (id >= vocabulary_size()) {
        detail::throw_unknown_id(op, "id", id, vocabulary_size());
    }
    std::vector<std::uint8_t> bytes;
    bytes.reserve(decoded_size(op, *tables_, std::span<const TokenId>(&id, 1)));
    tables_->append_piece(id, bytes);
    return bytes;
}

std::vector<std::uint8_t> BpeTokenizer::byte_vocabulary() const {
    detail::throw_method_mismatch("BpeTokenizer::byte_vocabulary", TokenizerMethod::Byte,
                                  TokenizerMethod::Bpe);
}

std::size_t BpeTokenizer::merge_count() const {
    return tables_->rules.size();
}

BpeMergeRule BpeTokenizer::merge_rule(std::size_t index) const {
    if (index >= tables_->rules.size()) {
        std::ostringstream message;
        message << "BpeTokenizer::merge_rule: index " << index << " is out of range ("
                << tables_->rules.size() << " merge rules)";
        throw std::out_of_range(message.str());
    }
    return tables_->rules[index];
}

std::vector<BpeMergeRule> BpeTokenizer::merge_rules() const {
    return tables_->rules;
}

TokenizerState BpeTokenizer::state() const {
    return TokenizerState{TokenizerMethod::Bpe, {}, tables_->rules};
}

}  // namespace riftco_transformer
