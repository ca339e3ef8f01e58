#pragma once
// Numbers in error messages: the shortest text that reads back as the same double
// (0.9 -> "0.9", not "0.90000000000000002"; NaN -> "nan").

#include <charconv>
#include <string>

namespace riftco_transformer::detail {

[[nodiscard]] inline std::string number_text(double value) {
    char buffer[32];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
    return {buffer, result.ptr};
}

}  // namespace riftco_transformer::detail
