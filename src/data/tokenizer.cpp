#include "riftco_transformer/data/tokenizer.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

#include "data/utf8.hpp"

namespace riftco_transformer {

std::string_view tokenizer_method_name(TokenizerMethod method) {
    switch (method) {
        case TokenizerMethod::Byte:
            return "byte";
        case TokenizerMethod::Bpe:
            return "bpe";
    }
    throw std::invalid_argument("tokenizer_method_name: method value " +
                                std::to_string(static_cast<std::int32_t>(method)) +
                                " is unknown (byte = 0, bpe = 1)");
}

TokenizerMethod parse_tokenizer_method(std::string_view name) {
    if (name == "byte") {
        return TokenizerMethod::Byte;
    }
    if (name == "bpe") {
        return TokenizerMethod::Bpe;
    }
    throw std::invalid_argument("parse_tokenizer_method: name \"" + std::string(name) +
                                "\" is unknown (expected \"byte\" or \"bpe\")");
}

TokenizerMethod tokenizer_method_from_value(std::int32_t value) {
    if (value == static_cast<std::int32_t>(TokenizerMethod::Byte) ||
        value == static_cast<std::int32_t>(TokenizerMethod::Bpe)) {
        return static_cast<TokenizerMethod>(value);
    }
    throw std::invalid_argument("tokenizer_method_from_value: value " + std::to_string(value) +
                                " is unknown (byte = 0, bpe = 1)");
}

std::vector<TokenId> Tokenizer::encode(std::string_view utf8_text) const {
    const std::span<const std::uint8_t> bytes = text_bytes(utf8_text);
    if (const auto defect = detail::find_utf8_defect(bytes)) {
        std::ostringstream message;
        message << "Tokenizer::encode: text is not valid UTF-8 (" << defect->problem << " at byte "
                << defect->offset << ")";
        throw std::invalid_argument(message.str());
    }
    return encode_bytes(bytes);
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
    const std::vector<std::uint8_t> bytes = decode_bytes(ids);
    if (const auto defect = detail::find_utf8_defect(bytes)) {
        std::ostringstream message;
        message << "Tokenizer::decode: decoded bytes are not valid UTF-8 (" << defect->problem
                << " at byte " << defect->offset << ")";
        throw std::invalid_argument(message.str());
    }
    return {bytes.begin(), bytes.end()};
}

std::vector<std::vector<std::uint8_t>> Tokenizer::vocabulary() const {
    std::vector<std::vector<std::uint8_t>> pieces;
    pieces.reserve(vocabulary_size());
    for (std::size_t id = 0; id < vocabulary_size(); ++id) {
        pieces.push_back(token_bytes(static_cast<TokenId>(id)));
    }
    return pieces;
}

}  // namespace riftco_transformer
