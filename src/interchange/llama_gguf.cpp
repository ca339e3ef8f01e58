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

// The tensor `name` dequantized, required to have GGUF dims {columns, rows}.
std::vector<float> matrix(const GgufFile& file, const std::string& name, std::size_t rows,
                          std::size_t columns) {
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
    return file.dequantize(info);
}

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
    // Every source tensor is checked and dequantized before the model is built, in the
    // model's parameter order.
    std::vector<std::pair<std::string, std::vector<float>>> values;
    values.emplace_back("token_embedding.weight",
                        matrix(file, "token_embd.weight", c.vocabulary_size, D));
    for (std::size_t i = 0; i < c.block_count; ++i) {
        const std::string source = "blk." + std::to_string(i) + ".";
        const std::string target = "blocks." + std::to_string(i) + ".";
        values.emplace_back(target + "attention_norm.scale",
                            matrix(file, source + "attn_norm.weight", 1, D));
        values.emplace_back(target + "attention.query.weight",
                            unpermute_rotary_rows(matrix(file, source + "attn_q.weight", D, D),
                                                  c.query_head_count, D));
        values.emplace_back(
            target + "attention.key.weight",
            unpermute_rotary_rows(matrix(file, source + "attn_k.weight", kv_width, D),
                                  c.key_value_head_count, D));
        values.emplace_back(target + "attention.value.weight",
                            matrix(file, source + "attn_v.weight", kv_width, D));
        values.emplace_back(target + "attention.output.weight",
                            matrix(file, source + "attn_output.weight", D, D));
        values.emplace_back(target + "feed_forward_norm.scale",
                            matrix(file, source + "ffn_norm.weight", 1, D));
        values.emplace_back(target + "feed_forward.gate.weight",
                            matrix(file, source + "ffn_gate.weight", F, D));
        values.emplace_back(target + "feed_forward.up.weight",
                            matrix(file, source + "ffn_up.weight", F, D));
        values.emplace_back(target + "feed_forward.down.weight",
                            matrix(file, source + "ffn_down.weight", D, F));
    }
    values.emplace_back("final_norm.scale", matrix(file, "output_norm.weight", 1, D));
    if (!c.tie_embeddings) {
        values.emplace_back("language_model_head.weight",
                            matrix(file, "output.weight", c.vocabulary_size, D));
    }

    std::mt19937 generator(5489);  // the draws are overwritten below
    const bool windowed = c.sliding_window && *c.sliding_window < c.maximum_context;
    auto model = std::make_unique<LlamaMistralTransformer>(
        c, generator, windowed ? AttentionKind::Materialized : options.attention);
    const ParameterList parameters = model->parameters();
    if (parameters.size() != values.size())
        throw std::logic_error("load_llama_from_gguf: parameter count differs from the mapping");
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (parameters[i].name != values[i].first) {
            throw std::logic_error("load_llama_from_gguf: parameter " + parameters[i].name +
                                   " mapped as " + values[i].first);
        }
        Variable leaf = parameters[i].parameter;  // handles share the registered leaf
        leaf.set_value(Tensor(leaf.shape(), values[i].second));
        std::vector<float>().swap(values[i].second);  // keep one copy of each weight alive
    }
    return model;
}

}  // namespace riftco_transformer
