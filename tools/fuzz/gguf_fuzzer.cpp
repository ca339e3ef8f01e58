// libFuzzer target: the GGUF reader (GgufFile::from_bytes), every typed metadata getter,
// the dequantizer, and the tokenizer path (vocabulary_from_gguf -> PretrainedTokenizer ->
// encode/decode). Built and run by tools/fuzz/gguf_smoke.sh (see tools/fuzz/README.md).
//
// The contract under test: on any input each function either succeeds or throws one of the
// exception types its header documents for bad input, and nothing crashes, leaks or hits
// undefined behaviour (ASan + UBSan). Only those documented types are caught; any other
// exception escapes, std::terminate aborts, and libFuzzer reports the input.
//
//   GgufFile::from_bytes                 GgufFormatError
//   typed getters, at, tensor            GgufFormatError
//   dequantize of an unsupported type    GgufFormatError
//   tensor_bytes of a foreign info       std::invalid_argument
//   dequantize_into of a wrong size      std::invalid_argument
//   dequantize_gguf_blocks (bad type)    std::invalid_argument
//   vocabulary_from_gguf                 GgufFormatError, std::invalid_argument
//   chat_template_from_gguf              GgufFormatError
//   PretrainedTokenizer(vocabulary)      std::invalid_argument
//   encode (ill-formed UTF-8)            std::invalid_argument
//   decode, token_text... (bad id)       std::out_of_range
//
// Oracles beyond "no crash, only documented exceptions" (a violation prints ORACLE and
// aborts, so libFuzzer keeps the input):
// - integer getters succeed exactly when the stored integer fits the requested type (then
//   with the same value), per element for the array getters; getters of another type throw;
// - every tensor's bytes lie inside the file and have byte_size bytes; dequantize gives
//   element_count floats, bit-identical to dequantize_gguf_blocks over the same bytes;
// - the tokenizer reports the vocabulary it was built from; encode only gives ids below
//   vocabulary_size(); and decode(encode(text)) == text where that must hold: byte-level BPE
//   whose 256 byte symbols are all Normal tokens and whose merges all produce Normal
//   tokens; SentencePiece with the 256 <0xXX> byte tokens, add_space_prefix false and text
//   without U+2581 (which decodes to ' ').
//
// Work per input is capped so runs stay fast: at most 1 << 22 dequantized floats (larger
// tensors are skipped), the first 2048 token ids checked one by one, the first 64 token
// texts and 4096 bytes of the chat template encoded.
//
// RIFTCO_GGUF_FUZZ_VERBOSE=1 prints one line per input saying how far it got (the smoke
// script checks with it that the seeds still parse and build tokenizers).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "riftco_transformer/data/pretokenizer.hpp"
#include "riftco_transformer/data/pretrained_tokenizer.hpp"
#include "riftco_transformer/interchange/gguf.hpp"
#include "riftco_transformer/interchange/gguf_tokenizer.hpp"

namespace rt = riftco_transformer;

namespace {

constexpr std::uint64_t dequantize_budget = std::uint64_t{1} << 22U;  // floats per input
constexpr std::size_t checked_ids = 2048;
constexpr std::size_t encoded_token_texts = 64;
constexpr std::size_t template_bytes = 4096;

bool verbose() {
    static const bool on = [] {
        const char* value = std::getenv("RIFTCO_GGUF_FUZZ_VERBOSE");
        return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
    }();
    return on;
}

[[noreturn]] void oracle(const std::string& what) {
    std::fprintf(stderr, "ORACLE: %s\n", what.c_str());
    std::abort();
}

// Runs `call`, which must throw `Expected` (any other exception propagates).
template <typename Expected, typename Call>
void expect_throw(const Call& call, const std::string& what) {
    try {
        call();
    } catch (const Expected&) {
        return;
    }
    oracle(what + ": did not throw");
}

// ---- Metadata.

template <typename Target, typename Stored>
std::optional<Target> fitting(Stored value) {
    if constexpr (std::is_integral_v<Stored> && !std::is_same_v<Stored, bool>) {
        if (std::in_range<Target>(value)) {
            return static_cast<Target>(value);
        }
    }
    return std::nullopt;
}

// get(key) must succeed with `expected` when set, and throw GgufFormatError otherwise.
template <typename Target, typename Get>
void check_integer_getter(const Get& get, const std::optional<Target>& expected,
                          const std::string& what) {
    std::optional<Target> got;
    try {
        got = get();
    } catch (const rt::GgufFormatError&) {
    }
    if (got != expected) {
        oracle(what + ": integer getter disagrees with std::in_range");
    }
}

void check_scalar_integers(const rt::GgufFile& file, const std::string& key,
                           const rt::GgufValue& value) {
    std::visit(
        [&](const auto& stored) {
            using Stored = std::decay_t<decltype(stored)>;
            if constexpr (std::is_integral_v<Stored> && !std::is_same_v<Stored, bool>) {
                check_integer_getter<std::uint32_t>([&] { return file.get_uint32(key); },
                                                    fitting<std::uint32_t>(stored), key);
                check_integer_getter<std::int32_t>([&] { return file.get_int32(key); },
                                                   fitting<std::int32_t>(stored), key);
                check_integer_getter<std::uint64_t>([&] { return file.get_uint64(key); },
                                                    fitting<std::uint64_t>(stored), key);
                check_integer_getter<std::int64_t>([&] { return file.get_int64(key); },
                                                   fitting<std::int64_t>(stored), key);
            } else {
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_uint32(key); },
                                                  key + " get_uint32 of a non-integer");
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_int64(key); },
                                                  key + " get_int64 of a non-integer");
            }
        },
        value.data);
}

template <typename Target>
std::optional<std::vector<Target>> fitting_array(const rt::GgufArray& array) {
    return std::visit(
        [](const auto& elements) -> std::optional<std::vector<Target>> {
            using Elements = std::decay_t<decltype(elements)>;
            if constexpr (std::is_same_v<Elements, std::monostate>) {
                return std::nullopt;
            } else {
                using Element = typename Elements::value_type;
                if constexpr (std::is_integral_v<Element> && !std::is_same_v<Element, bool>) {
                    std::vector<Target> result;
                    for (const Element element : elements) {
                        const std::optional<Target> value = fitting<Target>(element);
                        if (!value) {
                            return std::nullopt;
                        }
                        result.push_back(*value);
                    }
                    return result;
                } else {
                    return std::nullopt;
                }
            }
        },
        array.elements);
}

template <typename Target, typename Get>
void check_array_getter(const Get& get, const std::optional<std::vector<Target>>& expected,
                        const std::string& what) {
    std::optional<std::vector<Target>> got;
    try {
        got = get();
    } catch (const rt::GgufFormatError&) {
    }
    if (got != expected) {
        oracle(what + ": integer array getter disagrees with std::in_range");
    }
}

void check_metadata(const rt::GgufFile& file) {
    for (const rt::GgufMetadataEntry& entry : file.metadata()) {
        const std::string& key = entry.key;
        const rt::GgufValue& value = entry.value;
        if (file.find(key) != &value || &file.at(key) != &value || !file.contains(key)) {
            oracle("find/at of key '" + key + "' does not give its entry");
        }
        (void)rt::gguf_value_type_name(value.type());
        check_scalar_integers(file, key, value);
        switch (value.type()) {
            case rt::GgufValueType::Float32:
                (void)file.get_float32(key);
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_float64(key); },
                                                  key + " get_float64 of a float32");
                break;
            case rt::GgufValueType::Float64:
                (void)file.get_float64(key);
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_float32(key); },
                                                  key + " get_float32 of a float64");
                break;
            case rt::GgufValueType::Bool:
                if (file.get_bool(key) != std::get<bool>(value.data)) {
                    oracle(key + ": get_bool gives another value");
                }
                break;
            case rt::GgufValueType::String:
                if (&file.get_string(key) != &std::get<std::string>(value.data)) {
                    oracle(key + ": get_string gives another string");
                }
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_array(key); },
                                                  key + " get_array of a string");
                break;
            case rt::GgufValueType::Array: {
                const rt::GgufArray& array = file.get_array(key);
                (void)array.size();
                (void)rt::gguf_value_type_name(array.element_type());
                check_array_getter<std::int32_t>([&] { return file.get_int32_array(key); },
                                                 fitting_array<std::int32_t>(array), key);
                check_array_getter<std::uint32_t>([&] { return file.get_uint32_array(key); },
                                                  fitting_array<std::uint32_t>(array), key);
                check_array_getter<std::int64_t>([&] { return file.get_int64_array(key); },
                                                 fitting_array<std::int64_t>(array), key);
                if (array.element_type() == rt::GgufValueType::String) {
                    (void)file.get_string_array(key).size();
                } else {
                    expect_throw<rt::GgufFormatError>([&] { (void)file.get_string_array(key); },
                                                      key + " get_string_array of another array");
                }
                if (array.element_type() == rt::GgufValueType::Float32) {
                    (void)file.get_float32_array(key).size();
                } else {
                    expect_throw<rt::GgufFormatError>([&] { (void)file.get_float32_array(key); },
                                                      key + " get_float32_array of another array");
                }
                break;
            }
            default:  // integers: checked above
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_bool(key); },
                                                  key + " get_bool of an integer");
                expect_throw<rt::GgufFormatError>([&] { (void)file.get_string(key); },
                                                  key + " get_string of an integer");
                break;
        }
    }
    const std::string absent = "\x01riftco.fuzz.absent";
    if (file.find(absent) == nullptr) {
        expect_throw<rt::GgufFormatError>([&] { (void)file.at(absent); }, "at of an absent key");
        expect_throw<rt::GgufFormatError>([&] { (void)file.get_string(absent); },
                                          "get_string of an absent key");
    }
}

// ---- Tensors.

std::uint64_t check_tensors(const rt::GgufFile& file) {
    std::uint64_t budget = dequantize_budget;
    std::uint64_t dequantized = 0;
    for (const rt::GgufTensorInfo& tensor : file.tensors()) {
        if (file.find_tensor(tensor.name) != &tensor || &file.tensor(tensor.name) != &tensor) {
            oracle("find_tensor of '" + tensor.name + "' does not give its info");
        }
        const std::optional<rt::GgmlTypeLayout> layout = rt::ggml_type_layout(tensor.type);
        if (!layout || tensor.dims.empty() || tensor.dims.size() > 4) {
            oracle("tensor '" + tensor.name + "': no layout or a bad dim count was accepted");
        }
        std::uint64_t elements = 1;
        for (const std::uint64_t dim : tensor.dims) {
            elements *= dim;
        }
        if (elements != tensor.element_count || tensor.dims[0] % layout->block_elements != 0 ||
            tensor.byte_size != elements / layout->block_elements * layout->block_bytes) {
            oracle("tensor '" + tensor.name + "': element_count or byte_size is inconsistent");
        }
        const std::span<const std::uint8_t> bytes = file.tensor_bytes(tensor);
        if (bytes.size() != tensor.byte_size ||
            file.data_offset() + tensor.offset + tensor.byte_size > file.file_size() ||
            tensor.offset % file.alignment() != 0) {
            oracle("tensor '" + tensor.name + "': data outside the file or misaligned");
        }
        (void)rt::ggml_type_name(tensor.type);
        const rt::GgufTensorInfo copy = tensor;
        expect_throw<std::invalid_argument>([&] { (void)file.tensor_bytes(copy); },
                                            "tensor_bytes of a copied tensor info");
        if (!rt::gguf_can_dequantize(tensor.type)) {
            expect_throw<rt::GgufFormatError>([&] { (void)file.dequantize(tensor); },
                                              "dequantize of an unsupported type");
            expect_throw<std::invalid_argument>(
                [&] { rt::dequantize_gguf_blocks(tensor.type, bytes, {}); },
                "dequantize_gguf_blocks of an unsupported type");
            continue;
        }
        expect_throw<std::invalid_argument>([&] { file.dequantize_into(tensor, {}); },
                                            "dequantize_into a span of the wrong size");
        if (tensor.element_count > budget / 2) {
            continue;  // too big for this input's budget
        }
        budget -= 2 * tensor.element_count;
        const std::vector<float> values = file.dequantize(tensor);
        std::vector<float> blocks(values.size());
        rt::dequantize_gguf_blocks(tensor.type, bytes, blocks);
        if (values.size() != tensor.element_count ||
            std::memcmp(values.data(), blocks.data(), values.size() * sizeof(float)) != 0) {
            oracle("tensor '" + tensor.name + "': dequantize and dequantize_gguf_blocks disagree");
        }
        dequantized += values.size();
    }
    return dequantized;
}

// ---- Tokenizer.

std::string byte_symbol_utf8(std::uint8_t byte) {
    const char32_t symbol = rt::byte_level_symbol(byte);
    std::string text;
    if (symbol < 0x80) {
        text.push_back(static_cast<char>(symbol));
    } else {  // every symbol is below U+0800
        text.push_back(static_cast<char>(0xC0U | (symbol >> 6U)));
        text.push_back(static_cast<char>(0x80U | (symbol & 0x3FU)));
    }
    return text;
}

bool has_type(const rt::PretrainedTokenizer& tokenizer, std::string_view text, rt::TokenType type) {
    const std::optional<rt::TokenId> id = tokenizer.find_token(text);
    return id && tokenizer.token_type(*id) == type;
}

// Whether decode(encode(text)) == text must hold for every text (see the file comment);
// SentencePiece also needs text without U+2581, checked per text.
bool round_trips(const rt::PretrainedTokenizer& tokenizer) {
    const rt::PretrainedVocabulary& vocabulary = tokenizer.vocabulary();
    if (vocabulary.model == rt::PretrainedModelKind::ByteLevelBpe) {
        for (unsigned byte = 0; byte < 256; ++byte) {
            if (!has_type(tokenizer, byte_symbol_utf8(static_cast<std::uint8_t>(byte)),
                          rt::TokenType::Normal)) {
                return false;
            }
        }
        for (const auto& [left, right] : vocabulary.merges) {
            if (!has_type(tokenizer, left + right, rt::TokenType::Normal)) {
                return false;
            }
        }
        return true;
    }
    return !vocabulary.add_dummy_prefix && has_type(tokenizer, "<0x00>", rt::TokenType::Byte);
}

void check_tokenizer(const rt::PretrainedTokenizer& tokenizer,
                     const rt::PretrainedVocabulary& vocabulary,
                     const std::optional<std::string>& chat_template) {
    const std::size_t size = tokenizer.vocabulary_size();
    if (size != vocabulary.tokens.size() || tokenizer.model() != vocabulary.model ||
        tokenizer.pretokenizer().has_value() !=
            (vocabulary.model == rt::PretrainedModelKind::ByteLevelBpe) ||
        tokenizer.bos_id() != vocabulary.bos_id || tokenizer.eos_id() != vocabulary.eos_id ||
        tokenizer.unknown_id() != vocabulary.unknown_id) {
        oracle("the tokenizer does not report the vocabulary it was built from");
    }
    for (std::size_t i = 0; i < size && i < checked_ids; ++i) {
        const auto id = static_cast<rt::TokenId>(i);
        if (tokenizer.token_text(id) != vocabulary.tokens[i] ||
            tokenizer.find_token(vocabulary.tokens[i]) != id) {
            oracle("token_text/find_token of id " + std::to_string(i));
        }
        (void)tokenizer.token_type(id);
        (void)tokenizer.token_bytes(id);
    }
    const auto past_end = static_cast<rt::TokenId>(size);
    expect_throw<std::out_of_range>([&] { (void)tokenizer.token_text(past_end); },
                                    "token_text past the vocabulary");
    expect_throw<std::out_of_range>(
        [&] {
            (void)tokenizer.decode({&past_end, 1});
        },
        "decode of an id past the vocabulary");

    std::vector<std::string> texts = {
        "",
        "Hello, world! It's 42 o'clock.\n\tTabs  and   spaces   \r\n",
        "the quick brown fox; I'll've 1234567 don't",
        "Grüße aus Köln — ½ ٣ Привет, мир! 世界你好 こんにちは 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 "
        "🙂👍🏽 "
        "e\xCC\x81",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<s></s><unk><|endoftext|>",
        "<0x41><0xFF>▁the ▁▁x Ġthe Ċ <|tool|><|user|>[INST] <<SYS>>",
        std::string("nul\0byte\x7F\x01", sizeof("nul\0byte\x7F\x01") - 1),
    };
    // Runs of more than 48 symbols take the merger's heap path (SymbolMerger::merge_long):
    // one long byte-level pre-token (letters; digits for gpt-2), and for SentencePiece a long
    // run of characters that all have tokens (' ' becomes '▁').
    std::string letters;
    std::string words;
    std::string digits;
    for (int i = 0; i < 12; ++i) {
        letters += "hellothe";
        words += " hello the";
        digits += "0123456789";
    }
    texts.push_back(letters);
    texts.push_back(words);
    texts.push_back(digits);
    for (std::size_t i = 0; i < size && i < encoded_token_texts; ++i) {
        texts.push_back(vocabulary.tokens[i]);
    }
    if (chat_template) {
        texts.push_back(chat_template->substr(0, template_bytes));
    }
    const bool exact = round_trips(tokenizer);
    for (const std::string& text : texts) {
        const bool well_formed = !rt::detail::ill_formed_utf8_offset(text).has_value();
        for (const rt::SpecialTokens mode : {rt::SpecialTokens::Parse, rt::SpecialTokens::AsText}) {
            if (!well_formed) {
                expect_throw<std::invalid_argument>([&] { (void)tokenizer.encode(text, mode); },
                                                    "encode of ill-formed UTF-8");
                continue;
            }
            const std::vector<rt::TokenId> ids = tokenizer.encode(text, mode);
            for (const rt::TokenId id : ids) {
                if (id >= size) {
                    oracle("encode gave id " + std::to_string(id) + " for a vocabulary of " +
                           std::to_string(size));
                }
            }
            const std::string decoded = tokenizer.decode(ids);
            if (exact && decoded != text &&
                (vocabulary.model == rt::PretrainedModelKind::ByteLevelBpe ||
                 text.find("\xE2\x96\x81") == std::string::npos)) {
                oracle("decode(encode(text)) != text for text of " + std::to_string(text.size()) +
                       " bytes (mode " + std::to_string(static_cast<int>(mode)) + ")");
            }
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::optional<rt::GgufFile> file;
    try {
        file.emplace(
            rt::GgufFile::from_bytes(std::vector<std::uint8_t>(data, data + size), "fuzz"));
    } catch (const rt::GgufFormatError& error) {
        if (verbose()) {
            std::fprintf(stderr, "gguf-fuzz: rejected: %s\n", error.what());
        }
        return 0;
    }
    check_metadata(*file);
    const std::uint64_t dequantized = check_tensors(*file);

    std::string stage = "no vocabulary";
    std::optional<rt::PretrainedVocabulary> vocabulary;
    try {
        vocabulary = rt::vocabulary_from_gguf(*file);
    } catch (const rt::GgufFormatError& error) {
        stage = std::string("vocabulary: ") + error.what();
    } catch (const std::invalid_argument& error) {
        stage = std::string("vocabulary: ") + error.what();
    }
    std::optional<std::string> chat_template;
    try {
        chat_template = rt::chat_template_from_gguf(*file);
    } catch (const rt::GgufFormatError&) {
    }
    if (vocabulary) {
        std::optional<rt::PretrainedTokenizer> tokenizer;
        try {
            tokenizer.emplace(*vocabulary);
        } catch (const std::invalid_argument& error) {
            stage = std::string("tokenizer: ") + error.what();
        }
        if (tokenizer) {
            check_tokenizer(*tokenizer, *vocabulary, chat_template);
            stage = "tokenizer: built (" + std::to_string(tokenizer->vocabulary_size()) +
                    " tokens, " + std::string(rt::pretrained_model_kind_name(tokenizer->model())) +
                    (round_trips(*tokenizer) ? ", round trip checked" : "") + ")";
        }
    }
    if (verbose()) {
        std::fprintf(stderr, "gguf-fuzz: parsed: %zu metadata, %zu tensors, %llu floats; %s\n",
                     file->metadata().size(), file->tensors().size(),
                     static_cast<unsigned long long>(dequantized), stage.c_str());
    }
    return 0;
}
