#include "riftco_transformer/data/tokenizer_factory.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

#include "riftco_transformer/data/bpe_tokenizer.hpp"
#include "riftco_transformer/data/byte_tokenizer.hpp"

namespace riftco_transformer {

std::shared_ptr<const Tokenizer> create_tokenizer(std::span<const std::uint8_t> corpus,
                                                  const TokenizerOptions& options) {
    constexpr std::string_view op = "create_tokenizer";
    // Unknown method values are rejected before anything else is looked at.
    const TokenizerMethod method =
        tokenizer_method_from_value(static_cast<std::int32_t>(options.method));
    switch (method) {
        case TokenizerMethod::Byte:
            if (options.vocabulary_size.has_value()) {
                std::ostringstream message;
                message << op << ": vocabulary_size is " << *options.vocabulary_size
                        << " but the byte method takes none (its vocabulary is the corpus bytes)";
                throw std::invalid_argument(message.str());
            }
            if (options.minimum_pair_frequency != default_minimum_pair_frequency) {
                std::ostringstream message;
                message << op << ": minimum_pair_frequency is " << options.minimum_pair_frequency
                        << " but the byte method accepts only the default "
                        << default_minimum_pair_frequency;
                throw std::invalid_argument(message.str());
            }
            return std::make_shared<const ByteTokenizer>(corpus);
        case TokenizerMethod::Bpe:
            return std::make_shared<const BpeTokenizer>(
                corpus,
                BpeTrainingOptions{options.vocabulary_size.value_or(default_bpe_vocabulary_size),
                                   options.minimum_pair_frequency});
    }
    throw std::logic_error("create_tokenizer: unhandled method");  // unreachable
}

std::shared_ptr<const Tokenizer> restore_tokenizer(const TokenizerState& state) {
    constexpr std::string_view op = "restore_tokenizer";
    const TokenizerMethod method =
        tokenizer_method_from_value(static_cast<std::int32_t>(state.method));
    switch (method) {
        case TokenizerMethod::Byte:
            if (!state.merge_rules.empty()) {
                std::ostringstream message;
                message << op << ": byte state has " << state.merge_rules.size()
                        << " merge_rules (merge rules belong to the bpe method)";
                throw std::invalid_argument(message.str());
            }
            return std::make_shared<const ByteTokenizer>(
                ByteTokenizer::from_byte_vocabulary(state.byte_vocabulary));
        case TokenizerMethod::Bpe:
            if (!state.byte_vocabulary.empty()) {
                std::ostringstream message;
                message << op << ": bpe state has " << state.byte_vocabulary.size()
                        << " byte_vocabulary entries (a byte vocabulary belongs to the byte "
                           "method)";
                throw std::invalid_argument(message.str());
            }
            return std::make_shared<const BpeTokenizer>(
                BpeTokenizer::from_merge_rules(state.merge_rules));
    }
    throw std::logic_error("restore_tokenizer: unhandled method");  // unreachable
}

}  // namespace riftco_transformer
