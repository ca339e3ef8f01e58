#pragma once
// The one architecture table (docs/ARCHITECTURE.md, 'Checkpoint names'): for every family of the
// decoder and every checkpoint format we read, the tensor that holds each of our parameters.
// The GGUF loader (llama_gguf.cpp) and the Hugging Face importers (Python, through
// rt_checkpoint_tensor_name) both read it, so a family's names live in one place.
//
// Our names are the decoder's parameter names ("blocks.3.attention.query.weight"); a block's
// tensors carry its index in the checkpoint's own scheme ("blk.3.attn_q.weight",
// "model.layers.3.self_attn.q_proj.weight"). Fused checkpoint tensors hold several of our
// parameters as row ranges, in a fixed order: q, k, v (Phi-3's qkv_proj and attn_qkv, GPT-2's
// c_attn) or gate, up (Phi-3's gate_up_proj and fused ffn_up); the table gives the part's index
// in that order and the importer, which knows the widths, cuts the rows. GPT-2's Hugging Face
// names are given without the optional "transformer." prefix, and its Conv1D weights are stored
// transposed ([in, out]): the importer's business, not a name.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "riftco_transformer/model/decoder.hpp"

namespace riftco_transformer {

// Stable ABI values (C ABI 2.12).
enum class CheckpointFormat : std::uint32_t { Gguf = 0, HuggingFace = 1 };

struct CheckpointTensorName {
    std::string name;
    std::optional<std::size_t> part;  // the index in its fused tensor; none: the whole tensor
};

// Where `format`'s checkpoints of `architecture` keep our parameter `parameter`.
// `alternative` 0 is the format's usual layout; 1 is a second layout the format also allows
// (Phi-3 GGUF files with fused attn_qkv / ffn_up instead of separate tensors); nullopt when the
// format has no such alternative for that parameter.
// std::invalid_argument, naming the value: an unknown architecture or format, a format the
// architecture is not read from (GPT-2 from GGUF), or a name that is not one of the decoder's
// parameter names (or whose block index does not fit 64 bits).
[[nodiscard]] std::optional<CheckpointTensorName> checkpoint_tensor_name(
    DecoderArchitecture architecture, CheckpointFormat format, std::string_view parameter,
    std::size_t alternative = 0);

}  // namespace riftco_transformer
