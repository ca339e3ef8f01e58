#pragma once
// Error messages shared by the tokenizer strategies, so each rule is worded once.

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer::detail {

// std::invalid_argument for a query that only `required` supports.
[[noreturn]] inline void throw_method_mismatch(std::string_view operation, TokenizerMethod required,
                                               TokenizerMethod actual) {
    std::ostringstream message;
    message << operation << ": only the " << tokenizer_method_name(required)
            << " method supports this query (method is " << tokenizer_method_name(actual) << ")";
    throw std::invalid_argument(message.str());
}

// std::out_of_range for ids[index] = id >= vocabulary_size.
[[noreturn]] inline void throw_unknown_id(std::string_view operation, std::string_view argument,
                                          TokenId id, std::size_t vocabulary_size) {
    std::ostringstream message;
    message << operation << ": " << argument << " = " << id << " is out of range (vocabulary size "
            << vocabulary_size << ")";
    throw std::out_of_range(message.str());
}

[[nodiscard]] inline std::string indexed(std::string_view name, std::size_t index) {
    return std::string(name) + "[" + std::to_string(index) + "]";
}

}  // namespace riftco_transformer::detail
