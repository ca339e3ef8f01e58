// Dumps what our GGUF reader sees, for the comparison with the `gguf` package
// (tests/python/test_gguf_oracle.py):
//
//   riftco_gguf_dump FILE OUTDIR
//
// OUTDIR/<index>.f32   the tensor dequantized (little-endian float32, ne0 fastest), for every
//                      tensor whose type dequantize supports
// OUTDIR/index.tsv     index, name, type id, dims (ne0 first, comma-separated), 1 when a .f32
//                      was written (0 otherwise), byte size
// OUTDIR/metadata.json [{"key", "type", "value"} ...] in file order; an array adds
//                      "element_type" and its value is a list. float32 values are printed
//                      with 9 significant digits and float64 with 17 (both round-trip); NaN
//                      and infinities as Python's json writes them.
// stdout               "key<TAB>type" per metadata entry, then one line with the
//                      dequantization time (writing excluded).
// Exit status 0; 1 with the message on stderr when the file is rejected.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "riftco_transformer/interchange/gguf.hpp"

namespace {

using namespace riftco_transformer;

std::string json_string(const std::string& text) {
    std::string result = "\"";
    for (const char character : text) {
        const auto byte = static_cast<unsigned char>(character);
        if (character == '"' || character == '\\') {
            result.push_back('\\');
            result.push_back(character);
        } else if (byte < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(byte));
            result += escaped;
        } else {
            result.push_back(character);
        }
    }
    result.push_back('"');
    return result;
}

std::string json_real(double value, int digits) {
    if (std::isnan(value)) {
        return "NaN";
    }
    if (std::isinf(value)) {
        return value > 0 ? "Infinity" : "-Infinity";
    }
    char text[40];
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    std::string result = text;
    if (result.find_first_of(".e") == std::string::npos) {
        result += ".0";  // a JSON reader would take "-0" for the integer 0
    }
    return result;
}

template <typename Value>
std::string json_scalar(const Value& value) {
    if constexpr (std::is_same_v<Value, bool>) {
        return value ? "true" : "false";
    } else if constexpr (std::is_same_v<Value, float>) {
        return json_real(value, 9);
    } else if constexpr (std::is_same_v<Value, double>) {
        return json_real(value, 17);
    } else if constexpr (std::is_same_v<Value, std::string>) {
        return json_string(value);
    } else {
        return std::to_string(+value);
    }
}

std::string json_value(const GgufValue& value) {
    return std::visit(
        [](const auto& stored) -> std::string {
            using Stored = std::decay_t<decltype(stored)>;
            if constexpr (std::is_same_v<Stored, GgufArray>) {
                return std::visit(
                    [](const auto& elements) -> std::string {
                        using Elements = std::decay_t<decltype(elements)>;
                        std::string text = "[";
                        if constexpr (!std::is_same_v<Elements, std::monostate>) {
                            for (std::size_t i = 0; i < elements.size(); ++i) {
                                text += (i == 0 ? "" : ",");
                                text += json_scalar<typename Elements::value_type>(elements[i]);
                            }
                        }
                        return text + "]";
                    },
                    stored.elements);
            } else {
                return json_scalar(stored);
            }
        },
        value.data);
}

std::string type_description(const GgufValue& value) {
    std::string text(gguf_value_type_name(value.type()));
    if (const auto* array = std::get_if<GgufArray>(&value.data)) {
        // Appended piece by piece: GCC 12's -Wrestrict misfires on "literal" + std::string.
        text += '[';
        text += gguf_value_type_name(array->element_type());
        text += "] ";
        text += std::to_string(array->size());
    }
    return text;
}

int dump(const std::filesystem::path& input, const std::filesystem::path& output) {
    const GgufFile file = GgufFile::open(input);
    std::filesystem::create_directories(output);

    std::ofstream metadata(output / "metadata.json");
    metadata << "[";
    for (std::size_t i = 0; i < file.metadata().size(); ++i) {
        const GgufMetadataEntry& entry = file.metadata()[i];
        metadata << (i == 0 ? "\n" : ",\n") << "{\"key\":" << json_string(entry.key)
                 << ",\"type\":\"" << gguf_value_type_name(entry.value.type()) << "\"";
        if (const auto* array = std::get_if<GgufArray>(&entry.value.data)) {
            metadata << ",\"element_type\":\"" << gguf_value_type_name(array->element_type())
                     << "\"";
        }
        metadata << ",\"value\":" << json_value(entry.value) << "}";
        std::cout << entry.key << '\t' << type_description(entry.value) << '\n';
    }
    metadata << "\n]\n";

    std::ofstream index(output / "index.tsv");
    double seconds = 0.0;
    std::size_t dequantized = 0;
    std::size_t values_total = 0;
    for (std::size_t i = 0; i < file.tensors().size(); ++i) {
        const GgufTensorInfo& tensor = file.tensors()[i];
        std::string dims;
        for (std::size_t d = 0; d < tensor.dims.size(); ++d) {
            if (d != 0)
                dims += ',';
            dims += std::to_string(tensor.dims[d]);
        }
        const bool supported = gguf_can_dequantize(tensor.type);
        index << i << '\t' << tensor.name << '\t' << static_cast<std::uint32_t>(tensor.type) << '\t'
              << dims << '\t' << (supported ? 1 : 0) << '\t' << tensor.byte_size << '\n';
        if (!supported) {
            continue;
        }
        const auto start = std::chrono::steady_clock::now();
        const std::vector<float> values = file.dequantize(tensor);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        ++dequantized;
        values_total += values.size();
        std::ofstream stream(output / (std::to_string(i) + ".f32"), std::ios::binary);
        stream.write(reinterpret_cast<const char*>(values.data()),
                     static_cast<std::streamsize>(values.size() * sizeof(float)));
        if (!stream) {
            throw std::runtime_error("cannot write tensor " + std::to_string(i));
        }
    }
    std::cout << "dequantized " << dequantized << " of " << file.tensors().size() << " tensors ("
              << values_total << " values) in " << seconds << " s\n";
    return index && metadata ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: riftco_gguf_dump FILE OUTDIR\n";
        return 2;
    }
    try {
        return dump(argv[1], argv[2]);
    } catch (const std::exception& error) {
        std::cerr << "riftco_gguf_dump: " << error.what() << '\n';
        return 1;
    }
}
