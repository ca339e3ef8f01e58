#include "riftco_transformer/data/byte_tokenizer.hpp"

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

#include "data/tokenizer_errors.hpp"

namespace riftco_transformer {
namespace {

std::string hex_byte(std::uint8_t value) {
    char text[8];
    std::snprintf(text, sizeof(text), "0x%02x", static_cast<unsigned>(value));
    return text;
}

}  // namespace

ByteTokenizer::ByteTokenizer(std::span<const std::uint8_t> corpus) {
    if (corpus.empty()) {
        throw std::invalid_argument("ByteTokenizer: corpus is empty");
    }
    std::array<bool, 256> present{};
    for (const std::uint8_t byte : corpus) {
        present[byte] = true;
    }
    for (std::size_t value = 0; value < present.size(); ++value) {
        if (present[value]) {
            byte_of_id_.push_back(static_cast<std::uint8_t>(value));
        }
    }
    index_vocabulary();
}

ByteTokenizer ByteTokenizer::from_byte_vocabulary(std::span<const std::uint8_t> byte_vocabulary) {
    constexpr std::string_view op = "ByteTokenizer::from_byte_vocabulary";
    if (byte_vocabulary.empty()) {
        throw std::invalid_argument(std::string(op) + ": byte_vocabulary is empty");
    }
    if (byte_vocabulary.size() > 256) {
        std::ostringstream message;
        message << op << ": byte_vocabulary has " << byte_vocabulary.size()
                << " entries (at most 256)";
        throw std::invalid_argument(message.str());
    }
    std::array<std::size_t, 256> first_index{};
    first_index.fill(byte_vocabulary.size());
    for (std::size_t i = 0; i < byte_vocabulary.size(); ++i) {
        const std::uint8_t byte = byte_vocabulary[i];
        if (first_index[byte] != byte_vocabulary.size()) {
            std::ostringstream message;
            message << op << ": byte_vocabulary[" << i << "] repeats byte " << hex_byte(byte)
                    << " of byte_vocabulary[" << first_index[byte] << "]";
            throw std::invalid_argument(message.str());
        }
        first_index[byte] = i;
    }
    ByteTokenizer tokenizer;
    tokenizer.byte_of_id_.assign(byte_vocabulary.begin(), byte_vocabulary.end());
    tokenizer.index_vocabulary();
    return tokenizer;
}

void ByteTokenizer::index_vocabulary() {
    id_of_byte_.fill(absent);
    for (std::size_t id = 0; id < byte_of_id_.size(); ++id) {
        id_of_byte_[byte_of_id_[id]] = static_cast<TokenId>(id);
    }
}

std::vector<TokenId> ByteTokenizer::encode_bytes(std::span<const std::uint8_t> bytes) const {
    std::vector<TokenId> ids(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        const TokenId id = id_of_byte_[bytes[i]];
        if (id == absent) {
            std::ostringstream message;
            message << "ByteTokenizer::encode_bytes: bytes[" << i << "] = " << hex_byte(bytes[i])
                    << " is not in the vocabulary (" << byte_of_id_.size() << " bytes)";
            throw std::invalid_argument(message.str());
        }
        ids[i] = id;
    }
    return ids;
}

std::vector<std::uint8_t> ByteTokenizer::decode_bytes(std::span<const TokenId> ids) const {
    std::vector<std::uint8_t> bytes(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= byte_of_id_.size()) {
            detail::throw_unknown_id("ByteTokenizer::decode_bytes", detail::indexed("ids", i),
                                     ids[i], byte_of_id_.size());
        }
        bytes[i] = byte_of_id_[ids[i]];
    }
    return bytes;
}

std::vector<std::uint8_t> ByteTokenizer::token_bytes(TokenId id) const {
    if (id >= byte_of_id_.size()) {
        detail::throw_unknown_id("ByteTokenizer::token_bytes", "id", id, byte_of_id_.size());
    }
    return {byte_of_id_[id]};
}

std::size_t ByteTokenizer::merge_count() const {
    detail::throw_method_mismatch("ByteTokenizer::merge_count", TokenizerMethod::Bpe,
                                  TokenizerMethod::Byte);
}

BpeMergeRule ByteTokenizer::merge_rule(std::size_t /*index*/) const {
    detail::throw_method_mismatch("ByteTokenizer::merge_rule", TokenizerMethod::Bpe,
                                  TokenizerMethod::Byte);
}

std::vector<BpeMergeRule> ByteTokenizer::merge_rules() const {
    detail::throw_method_mismatch("ByteTokenizer::merge_rules", TokenizerMethod::Bpe,
                                  TokenizerMethod::Byte);
}

TokenizerState ByteTokenizer::state() const {
    return TokenizerState{TokenizerMethod::Byte, byte_of_id_, {}};
}

}  // namespace riftco_transformer
