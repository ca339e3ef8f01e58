#pragma once
// Rotary-family checkpoints from GGUF files (llama.cpp's format) into Decoder:
// general.architecture llama, mistral, qwen2, qwen3, gemma3 or phi3, each read with its
// family's preset (architecture_preset) and the file's values:
//   ARCH.attention.key_length (head width, = value_length), qwen2's blk.i.attn_{q,k,v}.bias,
//   blk.i.attn_{q,k}_norm.weight (QK-norm), gemma3's blk.i.post_attention_norm and
//   post_ffw_norm (its norms are stored as 1 + w, read as plain RMSNorm weights), phi3's fused
//   blk.i.attn_qkv.weight (rows q, k, v) and ffn_up.weight (rows gate, up), split at load;
//   ARCH.rope.scaling.type linear with .factor; Llama 3's rope_freqs.weight (per-frequency
//   divisors). Any tensor the architecture does not read is an error naming it.
//
// Metadata read (ARCH = general.architecture):
//   ARCH.embedding_length (D), ARCH.block_count (N), ARCH.feed_forward_length (F),
//   ARCH.attention.head_count (Hq), ARCH.attention.head_count_kv (Hkv, default Hq),
//   ARCH.context_length (C), ARCH.attention.layer_norm_rms_epsilon, ARCH.rope.freq_base
//   (θ, default 10000), ARCH.attention.sliding_window (optional), ARCH.rope.dimension_count
//   (must equal the head width when present). V is the row count of token_embd.weight. RoPE
//   scaling other than none/linear, and LongRoPE factors, are rejected naming the key.
// Tensors (GGUF dims {in, out} are our row-major [out, in]):
//   token_embd.weight -> token_embedding.weight; blk.i.attn_norm.weight -> attention_norm;
//   blk.i.attn_{q,k,v,output}.weight -> attention.{query,key,value,output};
//   blk.i.ffn_norm.weight -> feed_forward_norm; blk.i.ffn_{gate,up,down}.weight ->
//   feed_forward.{gate,up,down}; output_norm.weight -> final_norm; output.weight ->
//   language_model_head (absent: tied embeddings).
// llama.cpp's converter stores the query and key rows of each head permuted for the
// interleaved (adjacent-pair) RoPE: stored row h·d + 2i + s holds original row
// h·d + s·d/2 + i (i < d/2, s ∈ {0,1}). The importer undoes it, so the split-half RoPE of our
// model applies (unpermute_rotary_rows; the equivalence is tested).

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "riftco_transformer/interchange/gguf.hpp"
#include "riftco_transformer/model/decoder.hpp"

namespace riftco_transformer {

struct LlamaGgufOptions {
    // 0: the file's context_length. Otherwise the model's maximum context (RoPE has no
    // table, so any value works; a smaller one bounds cache memory).
    std::size_t maximum_context = 0;
    // Flash by default (it applies a sliding window itself).
    AttentionKind attention = AttentionKind::Flash;
    // Keep every projection (attention, feed-forward, an untied head) in the file's block
    // format (q8_0, q4_0 or q4_1: QuantizedWeight::from_packed_blocks of the file's bytes, no
    // float32 round trip); the embedding table and the norms are float32 as always. A
    // projection stored in any other type: std::invalid_argument naming the tensor and type.
    bool keep_packed_weights = false;
};

// The config the file describes. Missing or ill-typed metadata, an unsupported architecture or
// RoPE scaling, or a rotary dimension that disagrees with the head width: GgufFormatError
// naming the key; the config's own rules: std::invalid_argument.
[[nodiscard]] DecoderConfig llama_config_from_gguf(const GgufFile& file,
                                                   const LlamaGgufOptions& options = {});

// The model with every weight dequantized to float32 from the file. A tensor missing, of the
// wrong shape, or of a type dequantize does not support: GgufFormatError naming the tensor.
[[nodiscard]] std::unique_ptr<Decoder> load_llama_from_gguf(const GgufFile& file,
                                                            const LlamaGgufOptions& options = {});

// Undoes the converter's RoPE row permutation of a [heads·d, in] weight (row-major), in
// place semantics returned as a new vector. rows % heads or (rows/heads) odd:
// std::invalid_argument.
[[nodiscard]] std::vector<float> unpermute_rotary_rows(std::span<const float> weight,
                                                       std::size_t heads, std::size_t columns);

}  // namespace riftco_transformer
