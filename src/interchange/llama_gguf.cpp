#include "riftco_transformer/interchange/llama_gguf.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/interchange/checkpoint_names.hpp"

namespace riftco_transformer {
namespace {

[[noreturn]] void fail(const GgufFile& file, const std::string& what) {
    throw GgufFormatError("gguf: " + file.source() + ": " + what);
}

// An integer metadata value as size_t (any integer width the file used).
std::size_t get_size(const GgufFile& file, const std::string& key) {
    return static_cast<std::size_t>(file.get_uint64(key));
}

// A float metadata value stored as float32 or float64.
double get_real(const GgufFile& file, const std::string& key) {
    const GgufValue& value = file.at(key);
    if (value.type() == GgufValueType::Float64)
        return file.get_float64(key);
    return static_cast<double>(file.get_float32(key));
}

// The families this loader reads, by their general.architecture value.
constexpr DecoderArchitecture supported_architectures[] = {
    DecoderArchitecture::Llama, DecoderArchitecture::Mistral, DecoderArchitecture::Qwen2,
    DecoderArchitecture::Qwen3, DecoderArchitecture::Gemma2,  DecoderArchitecture::Gemma3,
    DecoderArchitecture::Phi3,
};

DecoderArchitecture architecture_of(const GgufFile& file) {
    const std::string& architecture = file.get_string("general.architecture");
    for (const DecoderArchitecture candidate : supported_architectures) {
        if (architecture == decoder_architecture_name(candidate))
            return candidate;
    }
    std::string known;
    for (const DecoderArchitecture candidate : supported_architectures)
        known += (known.empty() ? "" : ", ") + std::string(decoder_architecture_name(candidate));
    fail(file, "general.architecture '" + gguf_printable(architecture) + "' is not supported (" +
                   known + ")");
}

// llama.cpp's converter permutes the q/k rows of these families for the interleaved RoPE;
// the others (Qwen, Gemma, Phi-3) are stored for the split-half ("NeoX") form as they are.
bool rotary_rows_permuted(DecoderArchitecture architecture) {
    return architecture == DecoderArchitecture::Llama ||
           architecture == DecoderArchitecture::Mistral;
}

// The tensor `name`, required to have GGUF dims {columns, rows} and a type dequantize handles.
const GgufTensorInfo& checked_tensor(const GgufFile& file, const std::string& name,
                                     std::size_t rows, std::size_t columns) {
    const GgufTensorInfo& info = file.tensor(name);
    const bool fits = (info.dims.size() == 2 && info.dims[0] == columns && info.dims[1] == rows) ||
                      (rows == 1 && info.dims.size() == 1 && info.dims[0] == columns);
    if (!fits) {
        std::ostringstream message;
        message << "tensor '" << name << "' has dims {";
        for (std::size_t i = 0; i < info.dims.size(); ++i)
            message << (i ? ", " : "") << info.dims[i];
        message << "}, expected {" << columns;
        if (rows != 1)
            message << ", " << rows;
        message << "}";
        fail(file, message.str());
    }
    if (!gguf_can_dequantize(info.type)) {
        fail(file, "tensor '" + name + "' has type " + std::string(ggml_type_name(info.type)) +
                       " (id " + std::to_string(static_cast<std::uint32_t>(info.type)) +
                       "), which is not supported");
    }
    return info;
}

// One parameter's source: rows [row_begin, row_begin + rows) of the GGUF tensor (a fused
// tensor such as Phi-3's attn_qkv feeds several parameters) and, for query/key weights of the
// permuted families, the head count whose RoPE row permutation is undone.
struct TensorSource {
    std::string parameter;
    const GgufTensorInfo* tensor;
    std::size_t rotary_heads = 0;  // 0: stored as it is
    std::size_t row_begin = 0;
    std::size_t rows = 0;
    std::size_t columns = 0;
};

// Undoes llama.cpp's RoPE row permutation on rows of `columns` elements of any type (floats,
// or the bytes of a row of blocks).
template <typename Element>
std::vector<Element> unpermute_rows(std::span<const Element> weight, std::size_t heads,
                                    std::size_t columns) {
    if (heads == 0 || columns == 0 || weight.size() % (heads * columns) != 0 ||
        (weight.size() / (heads * columns)) % 2 != 0) {
        std::ostringstream message;
        message << "unpermute_rotary_rows: " << weight.size() << " values are not " << heads
                << " heads of an even number of rows of " << columns << " columns";
        throw std::invalid_argument(message.str());
    }
    const std::size_t d = weight.size() / (heads * columns);
    std::vector<Element> original(weight.size());
    for (std::size_t h = 0; h < heads; ++h) {
        for (std::size_t i = 0; i < d / 2; ++i) {
            for (std::size_t s = 0; s < 2; ++s) {
                const std::size_t stored = h * d + 2 * i + s;
                const std::size_t row = h * d + s * (d / 2) + i;
                std::copy_n(weight.begin() + static_cast<std::ptrdiff_t>(stored * columns), columns,
                            original.begin() + static_cast<std::ptrdiff_t>(row * columns));
            }
        }
    }
    return original;
}

// The GGUF type of a block format QuantizedWeight stores; nullopt for any other type.
std::optional<WeightFormat> block_format_of(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0:
            return WeightFormat::q8_0;
        case GgmlType::Q4_0:
            return WeightFormat::q4_0;
        case GgmlType::Q4_1:
            return WeightFormat::q4_1;
        case GgmlType::Q5_0:
            return WeightFormat::q5_0;
        case GgmlType::Q4_K:
            return WeightFormat::q4_k;
        case GgmlType::Q5_K:
            return WeightFormat::q5_k;
        case GgmlType::Q6_K:
            return WeightFormat::q6_k;
        case GgmlType::F16:
            return WeightFormat::f16;
        case GgmlType::BF16:
            return WeightFormat::bf16;
        default:
            return std::nullopt;
    }
}

}  // namespace

std::vector<float> unpermute_rotary_rows(std::span<const float> weight, std::size_t heads,
                                         std::size_t columns) {
    return unpermute_rows(weight, heads, columns);
}

DecoderConfig llama_config_from_gguf(const GgufFile& file, const LlamaGgufOptions& options) {
    const DecoderArchitecture architecture = architecture_of(file);
    const std::string arch(decoder_architecture_name(architecture));
    DecoderConfig c;
    c.model_width = get_size(file, arch + ".embedding_length");
    c.block_count = get_size(file, arch + ".block_count");
    c.feed_forward_width = get_size(file, arch + ".feed_forward_length");
    c.query_head_count = get_size(file, arch + ".attention.head_count");
    c.key_value_head_count = file.contains(arch + ".attention.head_count_kv")
                                 ? get_size(file, arch + ".attention.head_count_kv")
                                 : c.query_head_count;
    c.maximum_context = options.maximum_context != 0 ? options.maximum_context
                                                     : get_size(file, arch + ".context_length");
    // Each dimension by the key it came from, so a zero names the key (the model's own
    // validation below would name only the field).
    const std::pair<std::size_t, std::string> dimensions[] = {
        {c.model_width, arch + ".embedding_length"},
        {c.block_count, arch + ".block_count"},
        {c.feed_forward_width, arch + ".feed_forward_length"},
        {c.query_head_count, arch + ".attention.head_count"},
        {c.key_value_head_count, arch + ".attention.head_count_kv"},
        {c.maximum_context, options.maximum_context != 0 ? std::string("the maximum_context option")
                                                         : arch + ".context_length"}};
    for (const auto& [value, key] : dimensions) {
        if (value == 0)
            fail(file, key + " is 0 (every dimension must be positive)");
    }
    c.rms_norm_epsilon =
        static_cast<float>(get_real(file, arch + ".attention.layer_norm_rms_epsilon"));
    if (file.contains(arch + ".rope.freq_base"))
        c.rope_theta = get_real(file, arch + ".rope.freq_base");
    if (file.contains(arch + ".attention.sliding_window")) {
        const std::size_t window = get_size(file, arch + ".attention.sliding_window");
        if (window != 0)
            c.sliding_window = window;
    }
    // Head width: key_length when given (Qwen 3, Gemma: independent of D/Hq).
    if (file.contains(arch + ".attention.key_length")) {
        c.head_width = get_size(file, arch + ".attention.key_length");
        if (c.head_width == 0)
            fail(file, arch + ".attention.key_length is 0 (every dimension must be positive)");
        if (file.contains(arch + ".attention.value_length") &&
            get_size(file, arch + ".attention.value_length") != c.head_width) {
            fail(file, arch + ".attention.value_length " +
                           std::to_string(get_size(file, arch + ".attention.value_length")) +
                           " differs from " + arch + ".attention.key_length " +
                           std::to_string(c.head_width) +
                           " (different key and value widths are not supported)");
        }
        if (c.query_head_count != 0 && c.model_width % c.query_head_count == 0 &&
            c.head_width == c.model_width / c.query_head_count) {
            c.head_width = 0;  // the default width: the config reads as the family's own
        }
    }
    const std::string scaling_key = arch + ".rope.scaling.type";
    if (file.contains(scaling_key)) {
        const std::string& scaling = file.get_string(scaling_key);
        if (scaling == "linear") {
            c.rope_scaling.kind = RopeScalingKind::Linear;
            c.rope_scaling.factor = get_real(file, arch + ".rope.scaling.factor");
        } else if (scaling == "yarn") {
            // llama.cpp's YaRN keys. yarn_attn_factor is the Hugging Face attention_factor m
            // itself (convert_hf_to_gguf writes it unchanged), otherwise 0.1·ln(factor) + 1;
            // rope.scaling.attn_factor multiplies either (llama.cpp's extra factor).
            const std::string prefix = arch + ".rope.scaling.";
            RopeScaling& yarn = c.rope_scaling;
            yarn.kind = RopeScalingKind::Yarn;
            yarn.factor = get_real(file, prefix + "factor");
            yarn.original_context = get_size(file, prefix + "original_context_length");
            if (file.contains(prefix + "yarn_beta_fast"))
                yarn.beta_fast = get_real(file, prefix + "yarn_beta_fast");
            if (file.contains(prefix + "yarn_beta_slow"))
                yarn.beta_slow = get_real(file, prefix + "yarn_beta_slow");
            if (file.contains(prefix + "yarn_ext_factor") &&
                get_real(file, prefix + "yarn_ext_factor") != 1.0) {
                fail(file, prefix + "yarn_ext_factor " +
                               std::to_string(get_real(file, prefix + "yarn_ext_factor")) +
                               " is not supported (YaRN's ramp at full strength, 1, only)");
            }
            if (file.contains(prefix + "yarn_log_multiplier"))
                fail(file, prefix + "yarn_log_multiplier (DeepSeek's mscale) is not supported");
            if (file.contains(prefix + "yarn_attn_factor"))
                yarn.attention_factor = get_real(file, prefix + "yarn_attn_factor");
            if (file.contains(prefix + "attn_factor")) {
                const double extra = get_real(file, prefix + "attn_factor");
                if (!std::isfinite(extra) || !(extra > 0.0)) {
                    fail(file, prefix + "attn_factor must be finite and > 0 (got " +
                                   std::to_string(extra) + ")");
                }
                yarn.attention_factor = (yarn.attention_factor != 0.0 ? yarn.attention_factor
                                                                      : rotary_magnitude(yarn)) *
                                        extra;
            }
        } else if (scaling != "none") {
            fail(file, scaling_key + " '" + gguf_printable(scaling) +
                           "' is not supported (none, linear, yarn, or Llama 3's "
                           "rope_freqs.weight)");
        }
    }
    const GgufTensorInfo& embedding = file.tensor("token_embd.weight");
    if (embedding.dims.size() != 2 || embedding.dims[0] != c.model_width) {
        fail(file, "tensor 'token_embd.weight' must have dims {" + std::to_string(c.model_width) +
                       ", vocabulary}");
    }
    c.vocabulary_size = static_cast<std::size_t>(embedding.dims[1]);
    c.tie_embeddings = file.find_tensor("output.weight") == nullptr;
    const std::size_t head_width = c.resolved_head_width();
    if (c.query_head_count != 0 && file.contains(arch + ".rope.dimension_count")) {
        const std::size_t rotary = get_size(file, arch + ".rope.dimension_count");
        if (rotary != head_width) {
            fail(file, arch + ".rope.dimension_count " + std::to_string(rotary) +
                           " differs from the head width " + std::to_string(head_width) +
                           " (partial RoPE is not implemented)");
        }
    }
    // Llama 3.1's frequency scaling, as the per-frequency divisors the converter wrote.
    if (const GgufTensorInfo* factors = file.find_tensor("rope_freqs.weight")) {
        if (c.rope_scaling.kind != RopeScalingKind::None)
            fail(file, "tensor 'rope_freqs.weight' together with " + scaling_key);
        if (factors->dims.size() != 1 || factors->dims[0] != head_width / 2) {
            fail(file, "tensor 'rope_freqs.weight' must have dims {" +
                           std::to_string(head_width / 2) + "} (half the head width)");
        }
        if (!gguf_can_dequantize(factors->type))
            fail(file, "tensor 'rope_freqs.weight' has a type that is not supported");
        c.rope_scaling.kind = RopeScalingKind::FrequencyFactors;
        c.rope_scaling.frequency_factors = file.dequantize(*factors);
    }
    if (file.find_tensor("rope_factors_long.weight") != nullptr ||
        file.find_tensor("rope_factors_short.weight") != nullptr) {
        fail(file, "LongRoPE (rope_factors_long/short.weight) is not supported");
    }
    // The family's choices. GGUF stores Gemma's norm weights with the 1 already added (the
    // converter's +1), so they are read as ordinary RMSNorm weights.
    // Gemma 2's soft caps as the file gives them (0 turns one off); absent, the preset's 50
    // and 30, the values llama.cpp assumes too.
    std::optional<float> file_caps[2];
    if (architecture == DecoderArchitecture::Gemma2) {
        const std::string cap_keys[2] = {arch + ".attn_logit_softcapping",
                                         arch + ".final_logit_softcapping"};
        for (std::size_t i = 0; i < 2; ++i) {
            if (!file.contains(cap_keys[i]))
                continue;
            const double cap = get_real(file, cap_keys[i]);
            if (!std::isfinite(cap) || cap < 0.0 || cap > std::numeric_limits<float>::max()) {
                fail(file,
                     cap_keys[i] + " must be finite and >= 0 (got " + std::to_string(cap) + ")");
            }
            file_caps[i] = static_cast<float>(cap);
        }
    }
    c = architecture_preset(architecture, c);
    if (architecture == DecoderArchitecture::Gemma2) {
        c.norm_weight_offset = false;
        c.attention_logit_softcap = file_caps[0].value_or(c.attention_logit_softcap);
        c.final_logit_softcap = file_caps[1].value_or(c.final_logit_softcap);
        // GGUF has no query_pre_attn_scalar: it is the head width for every Gemma 2 but the
        // 27B (46 blocks), whose scalar is D/Hq, the rule llama.cpp applies too.
        if (c.block_count == 46 && c.query_head_count != 0) {
            const std::size_t scalar = c.model_width / c.query_head_count;  // D/Hq, whole
            c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(scalar)));
        }
    }
    if (architecture == DecoderArchitecture::Gemma3) {
        c.norm_weight_offset = false;
        // GGUF has no query_pre_attn_scalar: it is the head width for every Gemma 3 but the
        // 27B (62 blocks), whose scalar is D/Hq, the rule llama.cpp applies too.
        if (c.block_count == 62 && c.query_head_count != 0) {
            const std::size_t scalar = c.model_width / c.query_head_count;  // D/Hq, whole
            c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(scalar)));
        }
    }
    try {
        validate_decoder_config(c);
    } catch (const std::invalid_argument& error) {
        fail(file, std::string("the metadata describe no valid model: ") + error.what());
    }
    return c;
}

std::unique_ptr<Decoder> load_llama_from_gguf(const GgufFile& file,
                                              const LlamaGgufOptions& options) {
    const DecoderConfig c = llama_config_from_gguf(file, options);
    const std::size_t D = c.model_width;
    const std::size_t d = c.resolved_head_width();
    const std::size_t query_width = c.query_head_count * d;
    const std::size_t kv_width = c.key_value_head_count * d;
    const std::size_t F = c.feed_forward_width;
    const bool permuted = rotary_rows_permuted(c.architecture);
    // Every source tensor is checked (presence, dims, type) before the model is built, in
    // the model's parameter order; values are then dequantized one tensor at a time, so
    // the peak memory is the model plus one tensor.
    std::vector<TensorSource> sources;
    std::vector<const GgufTensorInfo*> used;
    const auto add_rows = [&](std::string parameter, const std::string& tensor,
                              std::size_t tensor_rows, std::size_t columns, std::size_t row_begin,
                              std::size_t rows, std::size_t rotary_heads) {
        const GgufTensorInfo& info = checked_tensor(file, tensor, tensor_rows, columns);
        if (used.empty() || used.back() != &info)
            used.push_back(&info);
        sources.push_back({std::move(parameter), &info, rotary_heads, row_begin, rows, columns});
    };
    const auto add = [&](std::string parameter, const std::string& tensor, std::size_t rows,
                         std::size_t columns, std::size_t rotary_heads = 0) {
        add_rows(std::move(parameter), tensor, rows, columns, 0, rows, rotary_heads);
    };
    // The names are the architecture table's (interchange/checkpoint_names.hpp).
    const auto tensor_of = [&](const std::string& parameter, std::size_t alternative) {
        return checkpoint_tensor_name(c.architecture, CheckpointFormat::Gguf, parameter,
                                      alternative);
    };
    const auto add_named = [&](const std::string& parameter, std::size_t rows, std::size_t columns,
                               std::size_t rotary_heads = 0) {
        add(parameter, tensor_of(parameter, 0)->name, rows, columns, rotary_heads);
    };
    // The parameters `names` as the parts of one fused tensor of `widths` rows each (in the
    // table's part order) when the file has the table's fused layout; false when it has not.
    const auto add_fused = [&](const std::vector<std::string>& names,
                               const std::vector<std::size_t>& widths) {
        const std::optional<CheckpointTensorName> first = tensor_of(names.front(), 1);
        if (!first || file.find_tensor(first->name) == nullptr)
            return false;
        std::size_t total = 0;
        for (const std::size_t width : widths)
            total += width;
        for (const std::string& name : names) {
            const CheckpointTensorName part = *tensor_of(name, 1);
            std::size_t begin = 0;
            for (std::size_t p = 0; p < *part.part; ++p)
                begin += widths[p];
            add_rows(name, part.name, total, D, begin, widths[*part.part], 0);
        }
        return true;
    };
    add_named("token_embedding.weight", c.vocabulary_size, D);
    for (std::size_t i = 0; i < c.block_count; ++i) {
        const std::string target = "blocks." + std::to_string(i) + ".";
        add_named(target + "attention_norm.scale", 1, D);
        const std::string attention = target + "attention.";
        // Phi-3 files may fuse q, k and v (rows q: Hq·d, then k and v: Hkv·d each).
        if (!add_fused(
                {attention + "query.weight", attention + "key.weight", attention + "value.weight"},
                {query_width, kv_width, kv_width})) {
            add_named(attention + "query.weight", query_width, D,
                      permuted ? c.query_head_count : 0);
            if (c.query_key_value_bias)
                add_named(attention + "query.bias", 1, query_width);
            add_named(attention + "key.weight", kv_width, D, permuted ? c.key_value_head_count : 0);
            if (c.query_key_value_bias)
                add_named(attention + "key.bias", 1, kv_width);
            add_named(attention + "value.weight", kv_width, D);
            if (c.query_key_value_bias)
                add_named(attention + "value.bias", 1, kv_width);
        }
        add_named(attention + "output.weight", D, query_width);
        if (c.query_key_norm) {
            add_named(attention + "query_norm.scale", 1, d);
            add_named(attention + "key_norm.scale", 1, d);
        }
        if (c.post_block_norms)
            add_named(target + "post_attention_norm.scale", 1, D);
        add_named(target + "feed_forward_norm.scale", 1, D);
        // Phi-3 files may fuse gate and up (rows gate: F, then up: F) when there is no
        // separate gate tensor.
        const bool separate_gate =
            file.find_tensor(tensor_of(target + "feed_forward.gate.weight", 0)->name) != nullptr;
        if (separate_gate ||
            !add_fused({target + "feed_forward.gate.weight", target + "feed_forward.up.weight"},
                       {F, F})) {
            add_named(target + "feed_forward.gate.weight", F, D);
            add_named(target + "feed_forward.up.weight", F, D);
        }
        add_named(target + "feed_forward.down.weight", D, F);
        if (c.post_block_norms)
            add_named(target + "post_feed_forward_norm.scale", 1, D);
    }
    add_named("final_norm.scale", 1, D);
    if (!c.tie_embeddings)
        add_named("language_model_head.weight", c.vocabulary_size, D);
    // Every tensor of the file must be one the architecture reads, as llama.cpp requires: a
    // stray or misnamed tensor means the file is not what its metadata says.
    std::vector<const GgufTensorInfo*> known = used;
    if (const GgufTensorInfo* factors = file.find_tensor("rope_freqs.weight"))
        known.push_back(factors);
    for (const GgufTensorInfo& tensor : file.tensors()) {
        if (std::find(known.begin(), known.end(), &tensor) == known.end()) {
            fail(file, "tensor '" + gguf_printable(tensor.name) + "' is not part of a " +
                           std::string(decoder_architecture_name(c.architecture)) + " model of " +
                           std::to_string(c.block_count) + " blocks");
        }
    }

    // With packed weights the model is built without dense projections (and without a dense
    // embedding table when the file stores it in a block format: a tied head then multiplies
    // by the packed table); their blocks are read after the dense rest.
    const TensorSource* packed_embedding = nullptr;  // sources.front(): token_embedding.weight
    if (options.keep_packed_weights && block_format_of(sources.front().tensor->type))
        packed_embedding = &sources.front();
    std::mt19937 generator(5489);  // the draws are overwritten below
    std::unique_ptr<Decoder> model;
    {
        const DeferredWeightsScope deferred(options.keep_packed_weights,
                                            packed_embedding != nullptr);
        model = std::make_unique<Decoder>(c, generator, options.attention);
    }
    std::vector<const TensorSource*> packed_sources;
    if (options.keep_packed_weights) {
        for (const AdaptableProjection& projection : model->projections()) {
            const std::string parameter = projection.path + ".weight";
            const auto found = std::find_if(
                sources.begin(), sources.end(),
                [&](const TensorSource& source) { return source.parameter == parameter; });
            if (found == sources.end())
                throw std::logic_error("load_llama_from_gguf: no source for " + parameter);
            if (!block_format_of(found->tensor->type)) {
                throw std::invalid_argument(
                    "load_llama_from_gguf: keeping the file's weights needs every projection in "
                    "a block format (q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k, f16 or bf16), but "
                    "tensor '" +
                    gguf_printable(found->tensor->name) + "' (" + parameter + ") is " +
                    std::string(ggml_type_name(found->tensor->type)) +
                    "; load it as float32 or convert the file");
            }
            packed_sources.push_back(&*found);
        }
    }
    // The dense parameters, in order: every source but the packed ones.
    std::vector<const TensorSource*> dense_sources;
    for (const TensorSource& source : sources) {
        if (&source != packed_embedding && std::find(packed_sources.begin(), packed_sources.end(),
                                                     &source) == packed_sources.end())
            dense_sources.push_back(&source);
    }
    {
        const ParameterList parameters = model->parameters();
        if (parameters.size() != dense_sources.size())
            throw std::logic_error(
                "load_llama_from_gguf: parameter count differs from the mapping");
        const GgufTensorInfo* cached_tensor = nullptr;
        std::vector<float> cached;
        for (std::size_t i = 0; i < dense_sources.size(); ++i) {
            const TensorSource& source = *dense_sources[i];
            if (parameters[i].name != source.parameter) {
                throw std::logic_error("load_llama_from_gguf: parameter " + parameters[i].name +
                                       " mapped as " + source.parameter);
            }
            if (cached_tensor != source.tensor) {
                cached = file.dequantize(*source.tensor);
                cached_tensor = source.tensor;
            }
            const auto first =
                cached.begin() + static_cast<std::ptrdiff_t>(source.row_begin * source.columns);
            std::vector<float> values(
                first, first + static_cast<std::ptrdiff_t>(source.rows * source.columns));
            if (source.rotary_heads != 0)
                values = unpermute_rotary_rows(values, source.rotary_heads, source.columns);
            Variable leaf = parameters[i].parameter;  // handles share the registered leaf
            leaf.set_value(Tensor(leaf.shape(), values));
        }
    }
    if (!packed_sources.empty()) {
        const GgufTensorInfo* cached_tensor = nullptr;
        std::vector<std::uint8_t> cached;
        const auto read_blocks = [&](const TensorSource& source) {
            const WeightFormat format = *block_format_of(source.tensor->type);
            const std::size_t row_bytes =
                source.columns / gguf_format_block_elements(format) * gguf_block_bytes(format);
            std::vector<std::uint8_t> blocks;
            if (source.row_begin == 0 && source.rows * row_bytes == source.tensor->byte_size) {
                // A whole tensor (every one but the parts of Phi-3's fused ones): its bytes
                // as read, with no second copy of them.
                blocks = file.read_tensor_bytes(*source.tensor);
            } else {
                if (cached_tensor != source.tensor) {
                    cached = file.read_tensor_bytes(*source.tensor);
                    cached_tensor = source.tensor;
                }
                const auto first =
                    cached.begin() + static_cast<std::ptrdiff_t>(source.row_begin * row_bytes);
                blocks.assign(first, first + static_cast<std::ptrdiff_t>(source.rows * row_bytes));
            }
            if (source.rotary_heads != 0)
                blocks = unpermute_rows<std::uint8_t>(blocks, source.rotary_heads, row_bytes);
            return QuantizedWeight::from_packed_blocks(
                {format, source.rows, source.columns, std::move(blocks)}, ExecutionBackend::Cpu);
        };
        std::vector<QuantizedWeight> packed;
        packed.reserve(packed_sources.size());
        for (const TensorSource* source : packed_sources)
            packed.push_back(read_blocks(*source));
        std::optional<QuantizedWeight> embedding;
        if (packed_embedding != nullptr)
            embedding = read_blocks(*packed_embedding);
        model->adopt_packed_weights(packed, embedding ? &*embedding : nullptr);
    }
    return model;
}

}  // namespace riftco_transformer
