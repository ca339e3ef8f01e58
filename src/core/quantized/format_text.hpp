#pragma once
// The message helpers every packed-format rule uses (nf4_format.cpp, block_format.cpp).

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace riftco_transformer::detail {

[[noreturn]] inline void invalid_format(std::string_view operation, const std::string& text) {
    throw std::invalid_argument(std::string(operation) + ": " + text);
}

// A float as a message shows it: nine significant digits (enough to tell any two apart).
[[nodiscard]] inline std::string format_float_text(float value) {
    std::ostringstream text;
    text.precision(9);
    text << value;
    return text.str();
}

}  // namespace riftco_transformer::detail
