#include "riftco_transformer/interchange/gguf_tokenizer.hpp"

#include <cmath>
#include <limits>

namespace riftco_transformer {
namespace {

std::optional<TokenId> optional_id(const GgufFile& file, const char* key) {
    if (!file.contains(key))
        return std::nullopt;
    return static_cast<TokenId>(file.get_uint32(key));
}

}  // namespace

PretrainedVocabulary vocabulary_from_gguf(const GgufFile& file) {
    PretrainedVocabulary vocabulary;
    vocabulary.model = pretrained_model_kind_from_gguf(file.get_string("tokenizer.ggml.model"));
    vocabulary.tokens = file.get_string_array("tokenizer.ggml.tokens");
    if (file.contains("tokenizer.ggml.token_type")) {
        for (const std::int32_t value : file.get_int32_array("tokenizer.ggml.token_type"))
            vocabulary.token_types.push_back(token_type_from_value(value));
    }
    if (vocabulary.model == PretrainedModelKind::ByteLevelBpe) {
        vocabulary.pretokenizer = pretokenizer_kind_from_gguf(
            file.contains("tokenizer.ggml.pre")
                ? std::string_view(file.get_string("tokenizer.ggml.pre"))
                : std::string_view("gpt-2"));
        vocabulary.merges = parse_merges(file.get_string_array("tokenizer.ggml.merges"));
        // llama.cpp's llama-bpe family (Llama 3) emits a pre-token that is a whole token as it
        // is, like tokenizer.json's "ignore_merges".
        vocabulary.ignore_merges = vocabulary.pretokenizer == PretokenizerKind::Llama3;
    } else {
        vocabulary.scores = file.get_float32_array("tokenizer.ggml.scores");
        vocabulary.add_dummy_prefix = !file.contains("tokenizer.ggml.add_space_prefix") ||
                                      file.get_bool("tokenizer.ggml.add_space_prefix");
    }
    vocabulary.bos_id = optional_id(file, "tokenizer.ggml.bos_token_id");
    vocabulary.eos_id = optional_id(file, "tokenizer.ggml.eos_token_id");
    vocabulary.unknown_id = optional_id(file, "tokenizer.ggml.unknown_token_id");
    return vocabulary;
}

std::optional<std::string> chat_template_from_gguf(const GgufFile& file) {
    if (!file.contains("tokenizer.chat_template"))
        return std::nullopt;
    return file.get_string("tokenizer.chat_template");
}

}  // namespace riftco_transformer
