#include "data/utf8.hpp"

#include <cstdio>

namespace riftco_transformer::detail {
namespace {

std::string hex_byte(std::uint8_t value) {
    char text[8];
    std::snprintf(text, sizeof(text), "0x%02x", static_cast<unsigned>(value));
    return text;
}

}  // namespace

std::optional<Utf8Defect> find_utf8_defect(std::span<const std::uint8_t> bytes) {
    std::size_t offset = 0;
    while (offset < bytes.size()) {
        const std::uint8_t lead = bytes[offset];
        if (lead < 0x80U) {
            ++offset;
            continue;
        }
        // Sequence length and the allowed range of the second byte (Unicode Table 3-7); the
        // narrowed ranges exclude overlong forms (E0, F0), surrogates (ED) and code points
        // above U+10FFFF (F4).
        std::size_t length = 0;
        std::uint8_t second_min = 0x80U;
        std::uint8_t second_max = 0xBFU;
        const char* narrowed_problem = "";
        if (lead < 0xC0U) {
            return Utf8Defect{offset, "unexpected continuation byte " + hex_byte(lead)};
        }
        if (lead < 0xC2U) {
            return Utf8Defect{offset, "overlong two-byte lead byte " + hex_byte(lead)};
        }
        if (lead < 0xE0U) {
            length = 2;
        } else if (lead < 0xF0U) {
            length = 3;
            if (lead == 0xE0U) {
                second_min = 0xA0U;
                narrowed_problem = "overlong three-byte encoding";
            } else if (lead == 0xEDU) {
                second_max = 0x9FU;
                narrowed_problem = "surrogate code point";
            }
        } else if (lead < 0xF5U) {
            length = 4;
            if (lead == 0xF0U) {
                second_min = 0x90U;
                narrowed_problem = "overlong four-byte encoding";
            } else if (lead == 0xF4U) {
                second_max = 0x8FU;
                narrowed_problem = "code point above U+10FFFF";
            }
        } else {
            return Utf8Defect{offset, "invalid lead byte " + hex_byte(lead)};
        }
        for (std::size_t k = 1; k < length; ++k) {
            if (offset + k >= bytes.size()) {
                return Utf8Defect{offset, "truncated sequence after lead byte " + hex_byte(lead)};
            }
            const std::uint8_t next = bytes[offset + k];
            const std::uint8_t minimum = k == 1 ? second_min : std::uint8_t{0x80U};
            const std::uint8_t maximum = k == 1 ? second_max : std::uint8_t{0xBFU};
            if (next < minimum || next > maximum) {
                if (k == 1 && next >= 0x80U && next <= 0xBFU) {
                    return Utf8Defect{offset, std::string(narrowed_problem) + " (" +
                                                  hex_byte(lead) + " " + hex_byte(next) + ")"};
                }
                return Utf8Defect{offset, "missing continuation byte after lead byte " +
                                              hex_byte(lead) + " (found " + hex_byte(next) + ")"};
            }
        }
        offset += length;
    }
    return std::nullopt;
}

}  // namespace riftco_transformer::detail
