// Tokenizers of pretrained models (byte-level BPE, SentencePiece BPE) and GGUF metadata
// strings.

#include <bit>
#include <memory>
#include <span>
#include <string>

#include "c_api/boundary.hpp"
#include "riftco_transformer/data/pretrained_tokenizer.hpp"
#include "riftco_transformer/interchange/gguf.hpp"
#include "riftco_transformer/interchange/gguf_tokenizer.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

struct rt_pretrained_tokenizer {
    std::shared_ptr<const PretrainedTokenizer> tokenizer;
};

namespace {

constexpr rt_pretrained_vocabulary default_vocabulary() {
    rt_pretrained_vocabulary vocabulary{};
    vocabulary.struct_size = sizeof(rt_pretrained_vocabulary);
    vocabulary.bos_id = -1;
    vocabulary.eos_id = -1;
    vocabulary.unknown_id = -1;
    vocabulary.add_dummy_prefix = 1;
    return vocabulary;
}

// count strings packed in bytes with count + 1 offsets.
std::vector<std::string> unpack_strings(const uint8_t* bytes, const uint64_t* offsets,
                                        uint64_t count, const char* name) {
    const std::string argument = std::string("vocabulary->") + name;
    const auto offset_list =
        input_array(offsets, count == 0 ? 0 : count + 1, (argument + "_offsets").c_str());
    std::vector<std::string> strings;
    if (count == 0)
        return strings;
    if (offset_list.front() != 0) {
        throw std::invalid_argument(argument + "_offsets[0] must be 0 (got " +
                                    std::to_string(offset_list.front()) + ")");
    }
    const auto all = input_array(bytes, offset_list.back(), (argument + "_bytes").c_str());
    strings.reserve(static_cast<std::size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
        if (offset_list[i + 1] < offset_list[i]) {
            throw std::invalid_argument(argument + "_offsets must not decrease (index " +
                                        std::to_string(i + 1) + ")");
        }
        strings.emplace_back(reinterpret_cast<const char*>(all.data()) + offset_list[i],
                             static_cast<std::size_t>(offset_list[i + 1] - offset_list[i]));
    }
    return strings;
}

std::optional<TokenId> optional_id(int64_t value, const char* name) {
    if (value < 0)
        return std::nullopt;
    if (value > static_cast<int64_t>(std::numeric_limits<TokenId>::max()))
        throw std::invalid_argument(std::string("vocabulary->") + name + " " +
                                    std::to_string(value) + " does not fit uint32");
    return static_cast<TokenId>(value);
}

int64_t id_or_none(std::optional<TokenId> id) {
    return id ? static_cast<int64_t>(*id) : -1;
}

const PretrainedTokenizer& tokenizer_of(const rt_pretrained_tokenizer* tokenizer) {
    return *require_handle(tokenizer, "tokenizer").tokenizer;
}

SpecialTokens special_from_value(int32_t value) {
    if (value != RT_SPECIAL_TOKENS_PARSE && value != RT_SPECIAL_TOKENS_AS_TEXT)
        throw std::invalid_argument("special: unknown value " + std::to_string(value));
    return static_cast<SpecialTokens>(value);
}

void write_bytes(std::string_view bytes, uint8_t* out, uint64_t capacity, uint64_t* required) {
    write_output(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), out,
                 capacity, required);
}

}  // namespace

extern "C" {

rt_status rt_pretrained_tokenizer_create(const rt_pretrained_vocabulary* vocabulary,
                                         rt_pretrained_tokenizer** out) {
    return guarded(__func__, [&] {
        const rt_pretrained_vocabulary given = read_struct(
            vocabulary, sizeof(rt_pretrained_vocabulary), default_vocabulary(), "vocabulary");
        require_pointer(out, "out");
        if (given.model != RT_PRETRAINED_MODEL_BYTE_LEVEL_BPE &&
            given.model != RT_PRETRAINED_MODEL_SENTENCEPIECE_BPE) {
            throw std::invalid_argument("vocabulary->model: unknown value " +
                                        std::to_string(given.model));
        }
        if (given.pretokenizer < RT_PRETOKENIZER_GPT2 ||
            given.pretokenizer > RT_PRETOKENIZER_QWEN2) {
            throw std::invalid_argument("vocabulary->pretokenizer: unknown value " +
                                        std::to_string(given.pretokenizer));
        }
        if (given.ignore_merges > 1 || given.add_dummy_prefix > 1)
            throw std::invalid_argument(
                "vocabulary->ignore_merges and add_dummy_prefix are 0 or 1");
        PretrainedVocabulary engine;
        engine.model = static_cast<PretrainedModelKind>(given.model);
        engine.pretokenizer = static_cast<PretokenizerKind>(given.pretokenizer);
        engine.tokens =
            unpack_strings(given.token_bytes, given.token_offsets, given.token_count, "token");
        if (given.token_types != nullptr) {
            for (const int32_t value :
                 input_array(given.token_types, given.token_count, "vocabulary->token_types")) {
                engine.token_types.push_back(token_type_from_value(value));
            }
        }
        if (given.scores != nullptr) {
            const auto scores = input_array(given.scores, given.token_count, "vocabulary->scores");
            engine.scores.assign(scores.begin(), scores.end());
        }
        engine.merges = parse_merges(
            unpack_strings(given.merge_bytes, given.merge_offsets, given.merge_count, "merge"));
        engine.bos_id = optional_id(given.bos_id, "bos_id");
        engine.eos_id = optional_id(given.eos_id, "eos_id");
        engine.unknown_id = optional_id(given.unknown_id, "unknown_id");
        engine.ignore_merges = given.ignore_merges != 0;
        engine.add_dummy_prefix = given.add_dummy_prefix != 0;
        *out = new rt_pretrained_tokenizer{std::make_shared<const PretrainedTokenizer>(engine)};
    });
}

rt_status rt_pretrained_tokenizer_load_gguf(const char* path, rt_pretrained_tokenizer** out) {
    return guarded(__func__, [&] {
        require_pointer(path, "path");
        require_pointer(out, "out");
        const GgufFile file = GgufFile::open(path);
        *out = new rt_pretrained_tokenizer{
            std::make_shared<const PretrainedTokenizer>(vocabulary_from_gguf(file))};
    });
}

void rt_pretrained_tokenizer_release(rt_pretrained_tokenizer* tokenizer) {
    delete tokenizer;
}

rt_status rt_pretrained_tokenizer_vocabulary_size(const rt_pretrained_tokenizer* tokenizer,
                                                  uint64_t* out) {
    return guarded(__func__,
                   [&] { set_output(out, tokenizer_of(tokenizer).vocabulary_size(), "out"); });
}

rt_status rt_pretrained_tokenizer_special_ids(const rt_pretrained_tokenizer* tokenizer,
                                              int64_t* out_bos, int64_t* out_eos,
                                              int64_t* out_unknown) {
    return guarded(__func__, [&] {
        const PretrainedTokenizer& native = tokenizer_of(tokenizer);
        require_pointer(out_bos, "out_bos");
        require_pointer(out_eos, "out_eos");
        require_pointer(out_unknown, "out_unknown");
        *out_bos = id_or_none(native.bos_id());
        *out_eos = id_or_none(native.eos_id());
        *out_unknown = id_or_none(native.unknown_id());
    });
}

rt_status rt_pretrained_tokenizer_encode(const rt_pretrained_tokenizer* tokenizer, const char* text,
                                         uint64_t length, int32_t special, uint32_t* out,
                                         uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const PretrainedTokenizer& native = tokenizer_of(tokenizer);
        const auto bytes = input_array(text, length, "text");
        const std::vector<TokenId> ids = native.encode(std::string_view(bytes.data(), bytes.size()),
                                                       special_from_value(special));
        write_output(std::span<const uint32_t>(ids), out, capacity, required);
    });
}

rt_status rt_pretrained_tokenizer_decode(const rt_pretrained_tokenizer* tokenizer,
                                         const uint32_t* ids, uint64_t count, uint8_t* out,
                                         uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const PretrainedTokenizer& native = tokenizer_of(tokenizer);
        const auto id_list = input_array(ids, count, "ids");
        write_bytes(native.decode(id_list), out, capacity, required);
    });
}

rt_status rt_pretrained_tokenizer_token_bytes(const rt_pretrained_tokenizer* tokenizer, uint32_t id,
                                              uint8_t* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        write_bytes(tokenizer_of(tokenizer).token_bytes(id), out, capacity, required);
    });
}

rt_status rt_pretrained_tokenizer_token_text(const rt_pretrained_tokenizer* tokenizer, uint32_t id,
                                             uint8_t* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        write_bytes(tokenizer_of(tokenizer).token_text(id), out, capacity, required);
    });
}

rt_status rt_pretrained_tokenizer_info_get(const rt_pretrained_tokenizer* tokenizer,
                                           rt_pretrained_tokenizer_info* out) {
    return guarded(__func__, [&] {
        const PretrainedVocabulary& vocabulary = tokenizer_of(tokenizer).vocabulary();
        rt_pretrained_tokenizer_info info{};
        info.struct_size = sizeof(rt_pretrained_tokenizer_info);
        info.model = static_cast<int32_t>(vocabulary.model);
        info.pretokenizer = vocabulary.model == PretrainedModelKind::ByteLevelBpe
                                ? static_cast<int32_t>(vocabulary.pretokenizer)
                                : -1;
        info.token_count = vocabulary.tokens.size();
        info.merge_count = vocabulary.merges.size();
        info.bos_id = id_or_none(vocabulary.bos_id);
        info.eos_id = id_or_none(vocabulary.eos_id);
        info.unknown_id = id_or_none(vocabulary.unknown_id);
        info.ignore_merges = vocabulary.ignore_merges ? 1U : 0U;
        info.add_dummy_prefix = vocabulary.add_dummy_prefix ? 1U : 0U;
        write_struct(out, info, sizeof(rt_pretrained_tokenizer_info), "out");
    });
}

rt_status rt_pretrained_tokenizer_export(const rt_pretrained_tokenizer* tokenizer, int32_t part,
                                         uint8_t* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const PretrainedVocabulary& vocabulary = tokenizer_of(tokenizer).vocabulary();
        std::string bytes;
        const auto put_u32 = [&](std::uint32_t value) {
            for (int shift = 0; shift < 32; shift += 8)
                bytes.push_back(static_cast<char>((value >> shift) & 0xFFU));
        };
        const auto put_string = [&](std::string_view text) {
            put_u32(static_cast<std::uint32_t>(text.size()));
            bytes.append(text);
        };
        switch (part) {
            case RT_PRETRAINED_PART_TOKENS:
                for (const std::string& token : vocabulary.tokens)
                    put_string(token);
                break;
            case RT_PRETRAINED_PART_MERGES:
                for (const auto& [left, right] : vocabulary.merges) {
                    std::string merge = left;
                    merge += ' ';
                    merge += right;
                    put_string(merge);
                }
                break;
            case RT_PRETRAINED_PART_TOKEN_TYPES:
                for (std::size_t i = 0; i < vocabulary.tokens.size(); ++i) {
                    const TokenType type = vocabulary.token_types.empty()
                                               ? TokenType::Normal
                                               : vocabulary.token_types[i];
                    put_u32(static_cast<std::uint32_t>(type));
                }
                break;
            case RT_PRETRAINED_PART_SCORES:
                for (const float score : vocabulary.scores)
                    put_u32(std::bit_cast<std::uint32_t>(score));
                break;
            default:
                throw std::invalid_argument("part: unknown value " + std::to_string(part));
        }
        write_bytes(bytes, out, capacity, required);
    });
}

rt_status rt_pretrained_tokenizer_find_token(const rt_pretrained_tokenizer* tokenizer,
                                             const char* text, uint64_t length, int64_t* out) {
    return guarded(__func__, [&] {
        const PretrainedTokenizer& native = tokenizer_of(tokenizer);
        const auto bytes = input_array(text, length, "text");
        require_pointer(out, "out");
        *out = id_or_none(native.find_token(std::string_view(bytes.data(), bytes.size())));
    });
}

rt_status rt_gguf_metadata_string(const char* path, const char* key, int32_t* present, uint8_t* out,
                                  uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        require_pointer(path, "path");
        require_pointer(key, "key");
        require_pointer(present, "present");
        require_pointer(required, "required");
        const GgufFile file = GgufFile::open(path);
        if (!file.contains(key)) {
            *present = 0;
            *required = 0;
            return;
        }
        const std::string& value = file.get_string(key);
        write_bytes(value, out, capacity, required);
        *present = 1;
    });
}

}  // extern "C"
