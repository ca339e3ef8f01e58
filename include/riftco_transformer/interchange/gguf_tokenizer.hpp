#pragma once
// Tokenizers and chat templates of GGUF checkpoints (the metadata llama.cpp's converter
// writes): tokenizer.ggml.model ("gpt2": byte-level BPE; "llama": SentencePiece-style BPE
// with byte fallback), .pre (the byte-level pre-tokenizer: gpt-2, llama-bpe, smollm, ...),
// .tokens, .token_type, .merges, .scores, .bos_token_id, .eos_token_id, .unknown_token_id,
// .add_space_prefix; tokenizer.chat_template.

#include <optional>
#include <string>

#include "riftco_transformer/data/pretrained_tokenizer.hpp"
#include "riftco_transformer/interchange/gguf.hpp"

namespace riftco_transformer {

// The vocabulary the metadata describes. Missing or ill-typed keys: GgufFormatError naming
// the key; an unsupported tokenizer.ggml.model or .pre: std::invalid_argument naming it.
[[nodiscard]] PretrainedVocabulary vocabulary_from_gguf(const GgufFile& file);

// tokenizer.chat_template, when the file has one.
[[nodiscard]] std::optional<std::string> chat_template_from_gguf(const GgufFile& file);

}  // namespace riftco_transformer
