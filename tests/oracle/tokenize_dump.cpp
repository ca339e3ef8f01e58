// Encodes text with a PretrainedTokenizer built from a spec file, for the comparison with
// Hugging Face `tokenizers` (tests/python/test_pretrained_tokenizer_oracle.py) and the speed
// comparison (bench/bench_pretrained_tokenizer.py).
//
//   riftco_tokenize_dump [OPTIONS] SPEC_FILE TEXT_FILE
//
// Prints the ids of the text, space-separated, on one line. Options:
//   --texts            TEXT_FILE holds several texts, each as LENGTH\n then LENGTH bytes;
//                      one output line per text
//   --special-as-text  encode with SpecialTokens::AsText
//   --pretokens        print the byte lengths of the Pretokenizer's pieces instead of ids
//   --decode           TEXT_FILE holds ids (whitespace-separated); write decode(ids) raw
//   --repeat N         encode (every text) N times; print the ids of the first pass (unless
//                      --quiet) and timing JSON of the best pass on stderr
//
// SPEC_FILE, one item per line (escapes in token text: \\ \s(space) \n \r \t \xHH):
//   riftco-pretrained-tokenizer 1
//   model byte_level_bpe | sentencepiece_bpe      (or the GGUF names gpt2 | llama)
//   pretokenizer NAME                             (GGUF tokenizer.ggml.pre: gpt-2, llama-bpe,
//                                                  smollm; byte-level only)
//   ignore_merges 0|1        add_dummy_prefix 0|1
//   bos ID     eos ID     unknown ID              (each optional)
//   tokens N                 then N lines: TYPE SCORE TEXT  (TYPE: GGUF value 1..6)
//   merges M                 then M lines: LEFT RIGHT       (escaped, one space between)
//   end

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/data/pretokenizer.hpp"
#include "riftco_transformer/data/pretrained_tokenizer.hpp"

namespace {

using namespace riftco_transformer;

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw std::runtime_error("cannot open " + path);
    }
    std::ostringstream content;
    content << in.rdbuf();
    return content.str();
}

int hex_digit(char digit) {
    if (digit >= '0' && digit <= '9') {
        return digit - '0';
    }
    if (digit >= 'a' && digit <= 'f') {
        return digit - 'a' + 10;
    }
    if (digit >= 'A' && digit <= 'F') {
        return digit - 'A' + 10;
    }
    throw std::runtime_error(std::string("bad hex digit '") + digit + "'");
}

std::string unescape(std::string_view text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\') {
            out.push_back(text[i]);
            continue;
        }
        if (++i == text.size()) {
            throw std::runtime_error("dangling backslash in \"" + std::string(text) + "\"");
        }
        switch (text[i]) {
            case '\\':
                out.push_back('\\');
                break;
            case 's':
                out.push_back(' ');
                break;
            case 'n':
                out.push_back('\n');
                break;
            case 'r':
                out.push_back('\r');
                break;
            case 't':
                out.push_back('\t');
                break;
            case 'x': {
                if (i + 2 >= text.size()) {
                    throw std::runtime_error("short \\x escape in \"" + std::string(text) + "\"");
                }
                out.push_back(
                    static_cast<char>(hex_digit(text[i + 1]) * 16 + hex_digit(text[i + 2])));
                i += 2;
                break;
            }
            default:
                throw std::runtime_error("unknown escape in \"" + std::string(text) + "\"");
        }
    }
    return out;
}

class SpecReader {
  public:
    explicit SpecReader(const std::string& content) : in_(content) {}

    std::string line() {
        std::string text;
        if (!std::getline(in_, text)) {
            throw std::runtime_error("spec ends early (line " + std::to_string(number_) + ")");
        }
        ++number_;
        return text;
    }

  private:
    std::istringstream in_;
    std::size_t number_ = 0;
};

std::pair<std::string, std::string> key_value(const std::string& line) {
    const std::size_t space = line.find(' ');
    if (space == std::string::npos) {
        return {line, ""};
    }
    return {line.substr(0, space), line.substr(space + 1)};
}

std::size_t count_of(const std::string& value) {
    return static_cast<std::size_t>(std::stoull(value));
}

PretrainedVocabulary read_spec(const std::string& path) {
    SpecReader reader(read_file(path));
    if (reader.line() != "riftco-pretrained-tokenizer 1") {
        throw std::runtime_error(path + ": not a riftco-pretrained-tokenizer 1 spec");
    }
    PretrainedVocabulary vocabulary;
    while (true) {
        const auto [key, value] = key_value(reader.line());
        if (key == "end") {
            break;
        }
        if (key == "model") {
            vocabulary.model = value == "byte_level_bpe" ? PretrainedModelKind::ByteLevelBpe
                               : value == "sentencepiece_bpe"
                                   ? PretrainedModelKind::SentencePieceBpe
                                   : pretrained_model_kind_from_gguf(value);
        } else if (key == "pretokenizer") {
            vocabulary.pretokenizer = pretokenizer_kind_from_gguf(value);
        } else if (key == "ignore_merges") {
            vocabulary.ignore_merges = value == "1";
        } else if (key == "add_dummy_prefix") {
            vocabulary.add_dummy_prefix = value == "1";
        } else if (key == "bos") {
            vocabulary.bos_id = static_cast<TokenId>(count_of(value));
        } else if (key == "eos") {
            vocabulary.eos_id = static_cast<TokenId>(count_of(value));
        } else if (key == "unknown") {
            vocabulary.unknown_id = static_cast<TokenId>(count_of(value));
        } else if (key == "tokens") {
            const std::size_t count = count_of(value);
            for (std::size_t i = 0; i < count; ++i) {
                const std::string entry = reader.line();
                const std::size_t first = entry.find(' ');
                const std::size_t second = entry.find(' ', first + 1);
                if (first == std::string::npos || second == std::string::npos) {
                    throw std::runtime_error("bad token line \"" + entry + "\"");
                }
                vocabulary.token_types.push_back(
                    token_type_from_value(std::stoi(entry.substr(0, first))));
                vocabulary.scores.push_back(
                    static_cast<float>(std::strtod(entry.c_str() + first + 1, nullptr)));
                vocabulary.tokens.push_back(unescape(std::string_view(entry).substr(second + 1)));
            }
        } else if (key == "merges") {
            const std::size_t count = count_of(value);
            for (std::size_t i = 0; i < count; ++i) {
                const auto [left, right] = parse_merge(reader.line());
                vocabulary.merges.emplace_back(unescape(left), unescape(right));
            }
        } else {
            throw std::runtime_error("unknown spec key \"" + key + "\"");
        }
    }
    if (vocabulary.model == PretrainedModelKind::ByteLevelBpe) {
        vocabulary.scores.clear();  // unused; the file carries them only for uniformity
    }
    return vocabulary;
}

// --texts: each text is its byte length in decimal, a '\n', then its bytes.
std::vector<std::string_view> split_texts(std::string_view content, bool several) {
    std::vector<std::string_view> texts;
    if (!several) {
        texts.push_back(content);
        return texts;
    }
    for (std::size_t at = 0; at < content.size();) {
        const std::size_t newline = content.find('\n', at);
        if (newline == std::string_view::npos) {
            throw std::runtime_error("--texts: no length line at byte " + std::to_string(at));
        }
        const std::size_t length = count_of(std::string(content.substr(at, newline - at)));
        if (length > content.size() - newline - 1) {
            throw std::runtime_error("--texts: text at byte " + std::to_string(at) +
                                     " is shorter than its length");
        }
        texts.push_back(content.substr(newline + 1, length));
        at = newline + 1 + length;
    }
    return texts;
}

template <typename Values>
void print_line(const Values& values) {
    std::string line;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i != 0) {
            line.push_back(' ');
        }
        line += std::to_string(values[i]);
    }
    line.push_back('\n');
    std::cout << line;
}

int run(int argc, char** argv) {
    bool several = false;
    bool as_text = false;
    bool pretokens = false;
    bool decode = false;
    bool quiet = false;
    std::size_t repeat = 0;
    std::vector<std::string> paths;
    for (int i = 1; i < argc; ++i) {
        const std::string_view argument = argv[i];
        if (argument == "--texts") {
            several = true;
        } else if (argument == "--special-as-text") {
            as_text = true;
        } else if (argument == "--pretokens") {
            pretokens = true;
        } else if (argument == "--decode") {
            decode = true;
        } else if (argument == "--quiet") {
            quiet = true;
        } else if (argument == "--repeat" && i + 1 < argc) {
            repeat = count_of(argv[++i]);
        } else {
            paths.emplace_back(argument);
        }
    }
    if (paths.size() != 2) {
        std::cerr << "usage: riftco_tokenize_dump [--texts] [--special-as-text] [--pretokens] "
                     "[--decode] [--repeat N [--quiet]] SPEC_FILE TEXT_FILE\n";
        return 2;
    }
    const auto build_begin = std::chrono::steady_clock::now();
    const PretrainedVocabulary vocabulary = read_spec(paths[0]);
    const PretrainedTokenizer tokenizer(vocabulary);
    const double build_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - build_begin).count();
    const std::string content = read_file(paths[1]);
    const SpecialTokens special = as_text ? SpecialTokens::AsText : SpecialTokens::Parse;

    if (decode) {
        std::vector<TokenId> ids;
        std::istringstream in(content);
        for (std::uint64_t id = 0; in >> id;) {
            ids.push_back(static_cast<TokenId>(id));
        }
        std::cout << tokenizer.decode(ids);
        return 0;
    }
    if (pretokens) {
        const Pretokenizer pretokenizer(vocabulary.pretokenizer);
        for (const std::string_view text : split_texts(content, several)) {
            std::vector<std::size_t> lengths;
            for (const std::string_view piece : pretokenizer.split(text)) {
                lengths.push_back(piece.size());
            }
            print_line(lengths);
        }
        return 0;
    }
    if (repeat > 0) {
        // Each repetition encodes every text (one call each); the best repetition counts.
        const std::vector<std::string_view> texts = split_texts(content, several);
        std::size_t text_bytes = 0;
        for (const std::string_view text : texts) {
            text_bytes += text.size();
        }
        double best = 1e300;
        std::size_t token_count = 0;
        for (std::size_t r = 0; r < repeat; ++r) {
            token_count = 0;
            const auto begin = std::chrono::steady_clock::now();
            for (const std::string_view text : texts) {
                const std::vector<TokenId> ids = tokenizer.encode(text, special);
                token_count += ids.size();
                if (!quiet && r == 0) {
                    print_line(ids);
                }
            }
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
            best = std::min(best, seconds);
        }
        std::cerr << "{\"bytes\": " << text_bytes << ", \"texts\": " << texts.size()
                  << ", \"tokens\": " << token_count << ", \"best_seconds\": " << best
                  << ", \"build_seconds\": " << build_seconds
                  << ", \"mb_per_s\": " << static_cast<double>(text_bytes) / 1e6 / best << "}\n";
        return 0;
    }
    for (const std::string_view text : split_texts(content, several)) {
        print_line(tokenizer.encode(text, special));
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& error) {
        std::cerr << "riftco_tokenize_dump: " << error.what() << "\n";
        return 1;
    }
}
