// Llama/Mistral model handles (ABI 2.8) and GGUF loading. The handle shares a ModelState with
// any rt_model view of it (rt_llama_mistral_model_as_model), so every rt_model function (LoRA,
// NF4, decode sessions, Adam) serves this architecture too.

#include <random>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/interchange/llama_gguf.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

struct rt_llama_mistral_model {
    std::shared_ptr<ModelState> state;
};

namespace {

constexpr rt_llama_mistral_config default_config() {
    rt_llama_mistral_config config{};
    config.struct_size = sizeof(rt_llama_mistral_config);
    config.architecture = RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA;
    config.random_seed = 5489;  // std::mt19937's default seed
    config.rms_norm_epsilon = 1e-5F;
    config.rope_theta = 10000.0;
    return config;
}

LlamaMistralConfig to_engine(const rt_llama_mistral_config& given) {
    if (given.architecture != RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA &&
        given.architecture != RT_LLAMA_MISTRAL_ARCHITECTURE_MISTRAL) {
        throw std::invalid_argument("config->architecture: unknown value " +
                                    std::to_string(given.architecture));
    }
    if (given.tie_embeddings > 1) {
        throw std::invalid_argument("config->tie_embeddings must be 0 or 1 (got " +
                                    std::to_string(given.tie_embeddings) + ")");
    }
    LlamaMistralConfig c;
    c.architecture = static_cast<LlamaMistralArchitecture>(given.architecture);
    c.vocabulary_size = to_size(given.vocabulary_size, "config->vocabulary_size");
    c.maximum_context = to_size(given.maximum_context, "config->maximum_context");
    c.model_width = to_size(given.model_width, "config->model_width");
    c.query_head_count = to_size(given.query_head_count, "config->query_head_count");
    c.key_value_head_count = to_size(given.key_value_head_count, "config->key_value_head_count");
    c.block_count = to_size(given.block_count, "config->block_count");
    c.feed_forward_width = to_size(given.feed_forward_width, "config->feed_forward_width");
    c.rms_norm_epsilon = given.rms_norm_epsilon;
    c.rope_theta = given.rope_theta;
    if (given.sliding_window != 0)
        c.sliding_window = to_size(given.sliding_window, "config->sliding_window");
    c.tie_embeddings = given.tie_embeddings != 0;
    return c;
}

rt_llama_mistral_config to_abi(const LlamaMistralConfig& c, std::uint32_t seed) {
    rt_llama_mistral_config out = default_config();
    out.architecture = static_cast<int32_t>(c.architecture);
    out.random_seed = seed;
    out.vocabulary_size = c.vocabulary_size;
    out.maximum_context = c.maximum_context;
    out.model_width = c.model_width;
    out.query_head_count = c.query_head_count;
    out.key_value_head_count = c.key_value_head_count;
    out.block_count = c.block_count;
    out.feed_forward_width = c.feed_forward_width;
    out.rms_norm_epsilon = c.rms_norm_epsilon;
    out.tie_embeddings = c.tie_embeddings ? 1U : 0U;
    out.rope_theta = c.rope_theta;
    out.sliding_window = c.sliding_window.value_or(0);
    return out;
}

ModelState& state_of(const rt_llama_mistral_model* model) {
    return *require_handle(model, "model").state;
}

}  // namespace

extern "C" {

rt_status rt_llama_mistral_config_init(rt_llama_mistral_config* config, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(config, struct_size, sizeof(rt_llama_mistral_config), default_config(),
                          "config");
    });
}

rt_status rt_llama_mistral_model_create(const rt_llama_mistral_config* config,
                                        rt_llama_mistral_model** out) {
    return guarded(__func__, [&] {
        const rt_llama_mistral_config given =
            read_struct(config, sizeof(rt_llama_mistral_config), default_config(), "config");
        require_pointer(out, "out");
        const LlamaMistralConfig engine = to_engine(given);
        std::mt19937 generator(given.random_seed);
        const ScopedExecutionBackend on_cpu(ExecutionBackend::Cpu);
        auto state = std::make_shared<ModelState>();
        state->model = std::make_unique<LlamaMistralTransformer>(engine, generator);
        state->llama_config = to_abi(engine, given.random_seed);
        *out = new rt_llama_mistral_model{std::move(state)};
    });
}

rt_status rt_llama_mistral_model_load_gguf(const char* path, uint64_t maximum_context,
                                           rt_llama_mistral_model** out) {
    return guarded(__func__, [&] {
        require_pointer(path, "path");
        require_pointer(out, "out");
        LlamaGgufOptions options;
        options.maximum_context = to_size(maximum_context, "maximum_context");
        const ScopedExecutionBackend on_cpu(ExecutionBackend::Cpu);
        const GgufFile file = GgufFile::open(path);
        auto model = load_llama_from_gguf(file, options);
        auto state = std::make_shared<ModelState>();
        state->llama_config = to_abi(model->config(), 0);
        state->model = std::move(model);
        *out = new rt_llama_mistral_model{std::move(state)};
    });
}

void rt_llama_mistral_model_release(rt_llama_mistral_model* model) {
    delete model;
}

rt_status rt_llama_mistral_model_config(const rt_llama_mistral_model* model,
                                        rt_llama_mistral_config* out) {
    return guarded(__func__, [&] {
        write_struct(out, state_of(model).llama_config, sizeof(rt_llama_mistral_config), "out");
    });
}

rt_status rt_llama_mistral_model_to(rt_llama_mistral_model* model, int32_t backend) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        const ExecutionBackend destination = backend_from_value(backend, "backend");
        state.require_unpinned();
        state.model->to(destination);
    });
}

rt_status rt_llama_mistral_model_backend(const rt_llama_mistral_model* model,
                                         int32_t* out_backend) {
    return guarded(__func__, [&] {
        set_output(out_backend, static_cast<int32_t>(state_of(model).model->backend()),
                   "out_backend");
    });
}

rt_status rt_llama_mistral_model_forward(rt_llama_mistral_model* model, const uint32_t* tokens,
                                         uint64_t count, uint64_t batch, uint64_t time,
                                         rt_variable** out) {
    return guarded(__func__, [&] {
        const rt_llama_mistral_model& native = require_handle(model, "model");
        const auto ids = input_array(tokens, count, "tokens");
        const Shape shape{to_size(batch, "batch"), to_size(time, "time")};
        require_pointer(out, "out");
        Variable logits = native.state->model->forward(ids, shape);
        *out = new rt_variable(native.state, std::move(logits));
    });
}

rt_status rt_llama_mistral_model_parameters(rt_llama_mistral_model* model,
                                            rt_parameter_list** out) {
    return guarded(__func__, [&] {
        const rt_llama_mistral_model& native = require_handle(model, "model");
        require_pointer(out, "out");
        *out = new rt_parameter_list(native.state, native.state->model->parameters(), false);
    });
}

rt_status rt_llama_mistral_model_as_model(rt_llama_mistral_model* model, rt_model** out) {
    return guarded(__func__, [&] {
        const rt_llama_mistral_model& native = require_handle(model, "model");
        require_pointer(out, "out");
        *out = new rt_model{native.state};
    });
}

rt_status rt_model_is_llama_mistral(const rt_model* model, int32_t* out) {
    return guarded(__func__, [&] {
        const ModelState& state = *require_handle(model, "model").state;
        set_output(out, state.llama_config.struct_size != 0 ? 1 : 0, "out");
    });
}

}  // extern "C"
