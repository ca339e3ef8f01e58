#pragma once
// Strict UTF-8 well-formedness (RFC 3629 / Unicode Table 3-7), used by the text conveniences
// of Tokenizer.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace riftco_transformer::detail {

struct Utf8Defect {
    std::size_t offset = 0;  // byte offset where the ill-formed sequence starts
    std::string problem;     // e.g. "overlong encoding of lead byte 0xc0"
};

// The first ill-formed sequence of `bytes`, or nothing when all of it is well-formed UTF-8.
[[nodiscard]] std::optional<Utf8Defect> find_utf8_defect(std::span<const std::uint8_t> bytes);

}  // namespace riftco_transformer::detail
