#pragma once
// The tokenizer factory (docs/ARCHITECTURE.md, 'Tokenizers'): one entry point keyed by the stable
// method value, so callers (artifacts, the C ABI, pipelines) never name a strategy class.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "riftco_transformer/data/bpe_training.hpp"
#include "riftco_transformer/data/tokenizer.hpp"

namespace riftco_transformer {

struct TokenizerOptions {
    TokenizerMethod method = TokenizerMethod::Byte;
    // BPE only: maximum vocabulary size in [256, 2^32-1]; absent means
    // default_bpe_vocabulary_size. The byte method rejects any value.
    std::optional<std::uint64_t> vocabulary_size;
    // BPE only: at least 1. The byte method accepts only the default.
    std::uint64_t minimum_pair_frequency = default_minimum_pair_frequency;
};

// Builds a tokenizer of options.method from `corpus` (raw bytes). Errors, all
// std::invalid_argument: empty corpus, an unknown method value, byte method with a
// vocabulary_size or a minimum_pair_frequency other than the default, BPE options out of
// range (bpe_training.hpp).
[[nodiscard]] std::shared_ptr<const Tokenizer> create_tokenizer(
    std::span<const std::uint8_t> corpus, const TokenizerOptions& options = {});

// Rebuilds the tokenizer whose state() is `state`, validating it first (every violation is
// std::invalid_argument): an unknown method; byte state with merge rules or BPE state with a
// byte vocabulary; then the method's own restore rules (ByteTokenizer::from_byte_vocabulary,
// BpeTokenizer::from_merge_rules).
[[nodiscard]] std::shared_ptr<const Tokenizer> restore_tokenizer(const TokenizerState& state);

}  // namespace riftco_transformer
