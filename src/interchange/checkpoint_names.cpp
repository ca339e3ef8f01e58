#include "riftco_transformer/interchange/checkpoint_names.hpp"

#include <charconv>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

namespace riftco_transformer {
namespace {

// One of our parameters and the checkpoint tensor that holds it. `ours` is a global name or, for
// a block's parameter, its name inside the block; `tensor` then has "{i}" for the block index.
struct Row {
    std::string_view ours;
    std::string_view tensor;
    int part = -1;  // the index in a fused tensor, or -1
};

// Llama's names; every rotary family starts from these.
constexpr Row gguf_llama[] = {
    {"token_embedding.weight", "token_embd.weight"},
    {"final_norm.scale", "output_norm.weight"},
    {"language_model_head.weight", "output.weight"},
    {"attention_norm.scale", "blk.{i}.attn_norm.weight"},
    {"attention.query.weight", "blk.{i}.attn_q.weight"},
    {"attention.query.bias", "blk.{i}.attn_q.bias"},
    {"attention.key.weight", "blk.{i}.attn_k.weight"},
    {"attention.key.bias", "blk.{i}.attn_k.bias"},
    {"attention.value.weight", "blk.{i}.attn_v.weight"},
    {"attention.value.bias", "blk.{i}.attn_v.bias"},
    {"attention.output.weight", "blk.{i}.attn_output.weight"},
    {"attention.query_norm.scale", "blk.{i}.attn_q_norm.weight"},
    {"attention.key_norm.scale", "blk.{i}.attn_k_norm.weight"},
    {"feed_forward_norm.scale", "blk.{i}.ffn_norm.weight"},
    {"feed_forward.gate.weight", "blk.{i}.ffn_gate.weight"},
    {"feed_forward.up.weight", "blk.{i}.ffn_up.weight"},
    {"feed_forward.down.weight", "blk.{i}.ffn_down.weight"},
};
constexpr Row huggingface_llama[] = {
    {"token_embedding.weight", "model.embed_tokens.weight"},
    {"final_norm.scale", "model.norm.weight"},
    {"language_model_head.weight", "lm_head.weight"},
    {"attention_norm.scale", "model.layers.{i}.input_layernorm.weight"},
    {"attention.query.weight", "model.layers.{i}.self_attn.q_proj.weight"},
    {"attention.query.bias", "model.layers.{i}.self_attn.q_proj.bias"},
    {"attention.key.weight", "model.layers.{i}.self_attn.k_proj.weight"},
    {"attention.key.bias", "model.layers.{i}.self_attn.k_proj.bias"},
    {"attention.value.weight", "model.layers.{i}.self_attn.v_proj.weight"},
    {"attention.value.bias", "model.layers.{i}.self_attn.v_proj.bias"},
    {"attention.output.weight", "model.layers.{i}.self_attn.o_proj.weight"},
    {"attention.query_norm.scale", "model.layers.{i}.self_attn.q_norm.weight"},
    {"attention.key_norm.scale", "model.layers.{i}.self_attn.k_norm.weight"},
    {"feed_forward_norm.scale", "model.layers.{i}.post_attention_layernorm.weight"},
    {"feed_forward.gate.weight", "model.layers.{i}.mlp.gate_proj.weight"},
    {"feed_forward.up.weight", "model.layers.{i}.mlp.up_proj.weight"},
    {"feed_forward.down.weight", "model.layers.{i}.mlp.down_proj.weight"},
};
// Gemma 2/3: the post-block norms, and the feed-forward norm under its own name.
constexpr Row gguf_gemma[] = {
    {"post_attention_norm.scale", "blk.{i}.post_attention_norm.weight"},
    {"post_feed_forward_norm.scale", "blk.{i}.post_ffw_norm.weight"},
};
constexpr Row huggingface_gemma[] = {
    {"post_attention_norm.scale", "model.layers.{i}.post_attention_layernorm.weight"},
    {"feed_forward_norm.scale", "model.layers.{i}.pre_feedforward_layernorm.weight"},
    {"post_feed_forward_norm.scale", "model.layers.{i}.post_feedforward_layernorm.weight"},
};
// Phi-3's fused tensors: always in Hugging Face checkpoints, the second layout in GGUF files.
constexpr Row huggingface_phi3[] = {
    {"attention.query.weight", "model.layers.{i}.self_attn.qkv_proj.weight", 0},
    {"attention.key.weight", "model.layers.{i}.self_attn.qkv_proj.weight", 1},
    {"attention.value.weight", "model.layers.{i}.self_attn.qkv_proj.weight", 2},
    {"feed_forward.gate.weight", "model.layers.{i}.mlp.gate_up_proj.weight", 0},
    {"feed_forward.up.weight", "model.layers.{i}.mlp.gate_up_proj.weight", 1},
};
constexpr Row gguf_phi3_fused[] = {
    {"attention.query.weight", "blk.{i}.attn_qkv.weight", 0},
    {"attention.key.weight", "blk.{i}.attn_qkv.weight", 1},
    {"attention.value.weight", "blk.{i}.attn_qkv.weight", 2},
    {"feed_forward.gate.weight", "blk.{i}.ffn_up.weight", 0},
    {"feed_forward.up.weight", "blk.{i}.ffn_up.weight", 1},
};
// GPT-2 (GPT2LMHeadModel, without the optional "transformer." prefix).
constexpr Row huggingface_gpt2[] = {
    {"token_embedding.weight", "wte.weight"},
    {"position_embedding.weight", "wpe.weight"},
    {"final_norm.scale", "ln_f.weight"},
    {"final_norm.bias", "ln_f.bias"},
    {"language_model_head.weight", "lm_head.weight"},
    {"attention_norm.scale", "h.{i}.ln_1.weight"},
    {"attention_norm.bias", "h.{i}.ln_1.bias"},
    {"attention.query.weight", "h.{i}.attn.c_attn.weight", 0},
    {"attention.query.bias", "h.{i}.attn.c_attn.bias", 0},
    {"attention.key.weight", "h.{i}.attn.c_attn.weight", 1},
    {"attention.key.bias", "h.{i}.attn.c_attn.bias", 1},
    {"attention.value.weight", "h.{i}.attn.c_attn.weight", 2},
    {"attention.value.bias", "h.{i}.attn.c_attn.bias", 2},
    {"attention.output.weight", "h.{i}.attn.c_proj.weight"},
    {"attention.output.bias", "h.{i}.attn.c_proj.bias"},
    {"feed_forward_norm.scale", "h.{i}.ln_2.weight"},
    {"feed_forward_norm.bias", "h.{i}.ln_2.bias"},
    {"feed_forward.expand.weight", "h.{i}.mlp.c_fc.weight"},
    {"feed_forward.expand.bias", "h.{i}.mlp.c_fc.bias"},
    {"feed_forward.project.weight", "h.{i}.mlp.c_proj.weight"},
    {"feed_forward.project.bias", "h.{i}.mlp.c_proj.bias"},
};

std::string format_name(CheckpointFormat format) {
    switch (format) {
        case CheckpointFormat::Gguf:
            return "gguf";
        case CheckpointFormat::HuggingFace:
            return "huggingface";
    }
    throw std::invalid_argument("checkpoint_tensor_name: unknown format value " +
                                std::to_string(static_cast<std::uint32_t>(format)));
}

// The rows of `architecture` in `format`, layout `alternative`, later rows overriding earlier
// ones: a base table and the family's differences.
std::vector<std::span<const Row>> tables(DecoderArchitecture architecture, CheckpointFormat format,
                                         std::size_t alternative) {
    const bool gguf = format == CheckpointFormat::Gguf;
    switch (architecture) {
        case DecoderArchitecture::Llama:
        case DecoderArchitecture::Mistral:
        case DecoderArchitecture::Qwen2:
        case DecoderArchitecture::Qwen3:
            return {gguf ? std::span<const Row>(gguf_llama)
                         : std::span<const Row>(huggingface_llama)};
        case DecoderArchitecture::Gemma2:
        case DecoderArchitecture::Gemma3:
            if (gguf)
                return {gguf_llama, gguf_gemma};
            return {huggingface_llama, huggingface_gemma};
        case DecoderArchitecture::Phi3:
            if (gguf && alternative == 1)
                return {gguf_llama, gguf_phi3_fused};
            if (gguf)
                return {gguf_llama};
            return {huggingface_llama, huggingface_phi3};
        case DecoderArchitecture::Gpt2:
            if (gguf) {
                throw std::invalid_argument(
                    "checkpoint_tensor_name: gpt2 models are not read from GGUF files");
            }
            return {huggingface_gpt2};
    }
    throw std::invalid_argument("checkpoint_tensor_name: unknown architecture value " +
                                std::to_string(static_cast<std::uint32_t>(architecture)));
}

// The row for `ours` (the last table that has it wins), and whether it comes from the table of
// the alternative layout only.
const Row* find_row(const std::vector<std::span<const Row>>& rows, std::string_view ours,
                    bool& from_alternative_table) {
    const Row* found = nullptr;
    for (std::size_t t = 0; t < rows.size(); ++t) {
        for (const Row& row : rows[t]) {
            if (row.ours == ours) {
                found = &row;
                from_alternative_table = t > 0;
            }
        }
    }
    return found;
}

}  // namespace

std::optional<CheckpointTensorName> checkpoint_tensor_name(DecoderArchitecture architecture,
                                                           CheckpointFormat format,
                                                           std::string_view parameter,
                                                           std::size_t alternative) {
    const std::string format_text = format_name(format);
    const std::string architecture_text(decoder_architecture_name(architecture));
    const auto unknown = [&] {
        return std::invalid_argument("checkpoint_tensor_name: '" + std::string(parameter) +
                                     "' is not a parameter of a " + architecture_text +
                                     " model read from " + format_text + " checkpoints");
    };
    // "blocks.<i>.<local>" or a global name.
    std::string_view ours = parameter;
    std::string index;
    constexpr std::string_view block_prefix = "blocks.";
    if (parameter.substr(0, block_prefix.size()) == block_prefix) {
        const std::string_view rest = parameter.substr(block_prefix.size());
        const std::size_t dot = rest.find('.');
        std::uint64_t value = 0;
        if (dot == 0 || dot == std::string_view::npos || (rest[0] == '0' && dot > 1))
            throw unknown();
        const auto [end, error] = std::from_chars(rest.data(), rest.data() + dot, value);
        if (error != std::errc{} || end != rest.data() + dot)
            throw unknown();
        index = std::string(rest.substr(0, dot));
        ours = rest.substr(dot + 1);
    }
    const std::vector<std::span<const Row>> rows = tables(architecture, format, alternative);
    bool from_alternative_table = false;
    const Row* row = find_row(rows, ours, from_alternative_table);
    const bool in_block = !index.empty();
    if (row == nullptr || (row->tensor.find("{i}") != std::string_view::npos) != in_block) {
        // Not a name of this family: unknown whatever the layout.
        throw unknown();
    }
    // The alternative layout differs from the usual one only where its own table says so.
    const bool alternative_layout =
        format == CheckpointFormat::Gguf && architecture == DecoderArchitecture::Phi3;
    if (alternative > 1 || (alternative == 1 && !(alternative_layout && from_alternative_table)))
        return std::nullopt;
    CheckpointTensorName result;
    result.name = std::string(row->tensor);
    if (in_block)
        result.name.replace(result.name.find("{i}"), 3, index);
    if (row->part >= 0)
        result.part = static_cast<std::size_t>(row->part);
    return result;
}

}  // namespace riftco_transformer
