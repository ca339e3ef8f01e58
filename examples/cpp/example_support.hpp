#pragma once
// Shared by the example programs: flag parsing with errors that name the flag and value, and
// reading the bundled corpus.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace riftco_transformer::examples {

// A positive integer, or std::invalid_argument "<flag> needs a positive integer (got '<text>')".
inline std::uint64_t parse_positive_integer(const std::string& flag, const std::string& text) {
    std::size_t used = 0;
    unsigned long long value = 0;
    try {
        value = std::stoull(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || value == 0 || text.front() == '-') {
        throw std::invalid_argument(flag + " needs a positive integer (got '" + text + "')");
    }
    return value;
}

// Any unsigned integer (seeds).
inline std::uint64_t parse_unsigned(const std::string& flag, const std::string& text) {
    return text == "0" ? 0 : parse_positive_integer(flag, text);
}

// A finite number > 0 (or >= 0 with allow_zero).
inline double parse_positive_number(const std::string& flag, const std::string& text,
                                    bool allow_zero = false) {
    std::size_t used = 0;
    double value = 0.0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || !std::isfinite(value) || value < 0.0 ||
        (value == 0.0 && !allow_zero)) {
        throw std::invalid_argument(flag + " needs a " +
                                    (allow_zero ? "non-negative" : "positive") + " number (got '" +
                                    text + "')");
    }
    return value;
}

// Every *.txt file of the directory, in name order, concatenated.
inline std::string read_corpus(const std::filesystem::path& directory) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
        if (entry.path().extension() == ".txt")
            files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& file : files) {
        std::ifstream stream(file, std::ios::binary);
        text.append(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
    }
    if (text.empty()) {
        throw std::runtime_error("no .txt corpus found in " + directory.string());
    }
    return text;
}

}  // namespace riftco_transformer::examples
