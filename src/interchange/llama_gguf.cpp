#include "riftco_transformer/interchange/llama_gguf.hpp"

#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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

std::string architecture_of(const GgufFile& file) {
    const std::string& architecture = file.get_string("general.architecture");
    if (architecture != "llama" && architecture != "mistral") {
        fail(file, "general.architecture '" + architecture +
                       "' is not supported (llama or mistral)");
    }
    return architecture;
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

// One parameter's source: the GGUF tensor and, for query/key weights, the head count whose
// RoPE row permutation is undone.
struct TensorSource {
    std::string parameter;
    const GgufTensorInfo* tensor;
    std::size_t rotary_heads = 0;  // 0: stored as it is
};

}  // namespace

std::vector<float> unpermute_rotary_rows(std::span<const float> weight, std::size_t heads,
                                         std::size_t columns) {
    if (heads == 0 || columns == 0 || weight.size() % (heads * columns) != 0 ||
        (weight.size() / (heads * columns)) % 2 != 0) {
        std::ostringstream message;
        message << "unpermute_rotary_rows: " << weight.size() << " values are not " << heads
                << " heads of an even number of rows of " << columns << " columns";
        throw std::invalid_argument(message.str());
    }
    const std::size_t d = weight.size() / (heads * columns);
    std::vector<float> original(weight.size());
    for (std::size_t h = 0; h < heads; ++h) {
        for (std::size_t i = 0; i < d / 2; ++i) {
            for (std::size_t s = 0; s < 2; ++s) {
                const std::size_t stored = h * d + 2 * i + s;
                const std::size_t row = h * d + s * (d / 2) + i;
                std::copy_n(weight.begin() + static_cast<std::ptrdiff_t>(stored * columns),
                            columns,
                            original.begin() + static_cast<std::ptrdiff_t>(row * columns));
            }
        }
    }
    return original;
}

LlamaMistralConfig llama_config_from_gguf(const GgufFile& file, const LlamaGgufOptions& options) {
    const std::string arch = architecture_of(file);
    LlamaMistralConfig c;
    c.architecture =
        arch == "mistral" ? LlamaMistralArchitecture::Mistral : LlamaMistralArchitecture::Llama;
    c.model_width = get_size(file, arch + ".embedding_length");
    c.block_count = get_size(file, arch + ".block_count");
    c.feed_forward_width = get_size(file, arch + ".feed_forward_length");
    c.query_head_count = get_size(file, arch + ".attention.head_count");
    c.key_value_head_count = file.contains(arch + ".attention.head_count_kv")
                                 ? get_size(file, arch + ".attention.head_count_kv")
                                 : c.query_head_count;
    c.maximum_context = options.maximum_context != 0
                            ? options.maximum_context
                            : get_size(file, arch + ".context_length");
    c.rms_norm_epsilon =
        static_cast<float>(get_real(file, arch + ".attention.layer_norm_rms_epsilon"));
    if (file.contains(arch + ".rope.freq_base"))
        c.rope_theta = get_real(file, arch + ".rope.freq_base");
    if (file.contains(arch + ".attention.sliding_window"))
        c.sliding_window = get_size(file, arch + ".attention.sliding_window");
    const std::string scaling_key = arch + ".rope.scaling.type";
    if (file.contains(scaling_key) && file.get_string(scaling_key) != "none") {
        fail(file, scaling_key + " '" + file.get_string(scaling_key) +
                       "' is not supported (RoPE scaling is not implemented)");
    }
    const GgufTensorInfo& embedding = file.tensor("token_embd.weight");
    if (embedding.dims.size() != 2 || embedding.dims[0] != c.model_width) {
        fail(file, "tensor 'token_embd.weight' must have dims {" + std::to_string(c.model_width) +
                       ", vocabulary}");
    }
    c.vocabulary_size = static_cast<std::size_t>(embedding.dims[1]);
    c.tie_embeddings = file.find_tensor("output.weight") == nullptr;
    if (c.query_head_count != 0 && file.contains(arch + ".rope.dimension_count")) {
        const std::size_t rotary = get_size(file, arch + ".rope.dimension_count");
        if (rotary != c.model_width / c.query_head_count) {
            fail(file, arch + ".rope.dimension_count " + std::to_string(rotary) +
                           " differs from the head width " +
                           std::to_string(c.model_width / c.query_head_count) +
                           " (partial RoPE is not implemented)");
        }
    }
    validate_llama_mistral_config(c);
    return c;
}

std::unique_ptr<LlamaMistralTransformer> load_llama_from_gguf(const GgufFile& file,
                                                              const LlamaGgufOptions& options) {
    const LlamaMistralConfig c = llama_config_from_gguf(file, options);
    const std::size_t D = c.model_width;
    const std::size_t d = D / c.query_head_count;
    const std::size_t kv_width = c.key_value_head_count * d;
    const std::size_t F = c.feed_forward_width;
    // Every source tensor is checked (presence, dims, type) before the model is built, in
    // the model's parameter order; values are then dequantized one parameter at a time, so
    // the peak memory is the model plus one tensor.
    std::vector<TensorSource> sources;
    const auto add = [&](std::string parameter, const std::string& tensor, std::size_t rows,
                         std::size_t columns, std::size_t rotary_heads = 0) {
        sources.push_back(
            {std::move(parameter), &checked_tensor(file, tensor, rows, columns), rotary_heads});
    };
    add("token_embedding.weight", "token_embd.weight", c.vocabulary_size, D);
    for (std::size_t i = 0; i < c.block_count; ++i) {
        const std::string source = "blk." + std::to_string(i) + ".";
        const std::string target = "blocks." + std::to_string(i) + ".";
        add(target + "attention_norm.scale", source + "attn_norm.weight", 1, D);
        add(target + "attention.query.weight", source + "attn_q.weight", D, D, c.query_head_count);
        add(target + "attention.key.weight", source + "attn_k.weight", kv_width, D,
            c.key_value_head_count);
        add(target + "attention.value.weight", source + "attn_v.weight", kv_width, D);
        add(target + "attention.output.weight", source + "attn_output.weight", D, D);
        add(target + "feed_forward_norm.scale", source + "ffn_norm.weight", 1, D);
        add(target + "feed_forward.gate.weight", source + "ffn_gate.weight", F, D);
        add(target + "feed_forward.up.weight", source + "ffn_up.weight", F, D);
        add(target + "feed_forward.down.weight", source + "ffn_down.weight", D, F);
    }
    add("final_norm.scale", "output_norm.weight", 1, D);
    if (!c.tie_embeddings)
        add("language_model_head.weight", "output.weight", c.vocabulary_size, D);

    std::mt19937 generator(5489);  // the draws are overwritten below
    auto model = std::make_unique<LlamaMistralTransformer>(c, generator, options.attention);
    const ParameterList parameters = model->parameters();
    if (parameters.size() != sources.size())
        throw std::logic_error("load_llama_from_gguf: parameter count differs from the mapping");
    for (std::size_t i = 0; i < sources.size(); ++i) {
        const TensorSource& source = sources[i];
        if (parameters[i].name != source.parameter) {
            throw std::logic_error("load_llama_from_gguf: parameter " + parameters[i].name +
                                   " mapped as " + source.parameter);
        }
        std::vector<float> values = file.dequantize(*source.tensor);
        if (source.rotary_heads != 0)
            values = unpermute_rotary_rows(values, source.rotary_heads, D);
        Variable leaf = parameters[i].parameter;  // handles share the registered leaf
        leaf.set_value(Tensor(leaf.shape(), values));
    }
    return model;
}

}  // namespace riftco_transformer
