// Llama/Mistral model handles (ABI 2.8) and GGUF loading. The handle shares a ModelState with
// any rt_model view of it (rt_llama_mistral_model_as_model), so every rt_model function (LoRA,
// NF4, decode sessions, Adam) serves this architecture too.

#include <random>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/interchange/checkpoint_names.hpp"
#include "riftco_transformer/interchange/llama_gguf.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

struct rt_llama_mistral_model {
    std::shared_ptr<ModelState> state;
};

namespace {

// The first published size (2.8): clients built before 2.10 declare it.
constexpr std::size_t first_config_size = 96;
// The size of 2.10, the first with the family choices (2.11 appends the soft caps).
constexpr std::size_t family_config_size = 184;
// The size of 2.12, the first with the GPT-2 choices.
constexpr std::size_t gpt2_config_size = 264;
static_assert(sizeof(rt_llama_mistral_config) == gpt2_config_size);

constexpr rt_llama_mistral_config default_config() {
    rt_llama_mistral_config config{};
    config.struct_size = sizeof(rt_llama_mistral_config);
    config.architecture = RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA;
    config.random_seed = 5489;  // std::mt19937's default seed
    config.rms_norm_epsilon = 1e-5F;
    config.rope_theta = 10000.0;
    config.feed_forward_activation = RT_GATED_ACTIVATION_SILU;
    config.rope_scaling = RT_ROPE_SCALING_NONE;
    config.rope_scaling_factor = 1.0;
    config.rope_low_frequency_factor = 1.0;
    config.rope_high_frequency_factor = 4.0;
    config.rope_original_context = 8192;
    config.rope_yarn_beta_fast = 32.0;
    config.rope_yarn_beta_slow = 1.0;
    config.positions = RT_POSITIONS_ROTARY;
    config.norm = RT_NORM_RMS;
    config.feed_forward = RT_FEED_FORWARD_GATED;
    config.plain_activation = RT_FEED_FORWARD_ACTIVATION_GELU;
    return config;
}

DecoderConfig to_engine(const rt_llama_mistral_config& given) {
    DecoderConfig c;
    // Enum values are checked where the config is validated (validate_decoder_config).
    c.architecture = static_cast<DecoderArchitecture>(given.architecture);
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
    c.tie_embeddings = flag_from_value(given.tie_embeddings, "config->tie_embeddings");
    c.head_width = to_size(given.head_width, "config->head_width");
    c.query_key_value_bias =
        flag_from_value(given.query_key_value_bias, "config->query_key_value_bias");
    c.query_key_norm = flag_from_value(given.query_key_norm, "config->query_key_norm");
    c.norm_weight_offset = flag_from_value(given.norm_weight_offset, "config->norm_weight_offset");
    c.post_block_norms = flag_from_value(given.post_block_norms, "config->post_block_norms");
    c.feed_forward_activation = static_cast<GatedActivation>(given.feed_forward_activation);
    c.embedding_scale = given.embedding_scale;
    c.attention_scale = given.attention_scale;
    c.sliding_window_period = to_size(given.sliding_window_period, "config->sliding_window_period");
    c.rope_local_theta = given.rope_local_theta;
    c.attention_logit_softcap = given.attention_logit_softcap;
    c.final_logit_softcap = given.final_logit_softcap;
    // The factors (2.11): read when that kind is given; a count without factors, or factors
    // of another kind, is a caller's mistake named here (their values and count are the
    // engine's rules).
    if (given.rope_scaling == RT_ROPE_SCALING_FREQUENCY_FACTORS) {
        if (given.rope_frequency_factors == nullptr) {
            throw std::invalid_argument(
                "config->rope_frequency_factors: RT_ROPE_SCALING_FREQUENCY_FACTORS needs the "
                "head_width/2 factors (got NULL; a client before 2.11 cannot give this kind)");
        }
        const std::size_t count =
            to_size(given.rope_frequency_factor_count, "config->rope_frequency_factor_count");
        c.rope_scaling.frequency_factors.assign(given.rope_frequency_factors,
                                                given.rope_frequency_factors + count);
    } else if (given.rope_frequency_factors != nullptr || given.rope_frequency_factor_count != 0) {
        throw std::invalid_argument(
            "config->rope_frequency_factors: given with rope_scaling " +
            std::to_string(given.rope_scaling) +
            " (only RT_ROPE_SCALING_FREQUENCY_FACTORS reads them; NULL and 0 otherwise)");
    }
    c.rope_scaling.kind = static_cast<RopeScalingKind>(given.rope_scaling);
    c.rope_scaling.factor = given.rope_scaling_factor;
    c.rope_scaling.low_frequency_factor = given.rope_low_frequency_factor;
    c.rope_scaling.high_frequency_factor = given.rope_high_frequency_factor;
    c.rope_scaling.original_context =
        to_size(given.rope_original_context, "config->rope_original_context");
    c.rope_scaling.beta_fast = given.rope_yarn_beta_fast;
    c.rope_scaling.beta_slow = given.rope_yarn_beta_slow;
    c.rope_scaling.attention_factor = given.rope_yarn_attention_factor;
    // 2.12 (values checked by validate_decoder_config, as above).
    c.positions = static_cast<PositionEncoding>(given.positions);
    c.norm = static_cast<NormKind>(given.norm);
    c.feed_forward = static_cast<FeedForwardKind>(given.feed_forward);
    c.plain_activation = static_cast<Activation>(given.plain_activation);
    c.output_bias = flag_from_value(given.output_bias, "config->output_bias");
    c.feed_forward_bias = flag_from_value(given.feed_forward_bias, "config->feed_forward_bias");
    c.head_bias = flag_from_value(given.head_bias, "config->head_bias");
    if (given.reserved != 0) {
        throw std::invalid_argument("config->reserved must be 0 (got " +
                                    std::to_string(given.reserved) + ")");
    }
    return c;
}

// The choices architecture_preset sets, written into `out` (rt_llama_mistral_config_preset writes
// exactly these; to_abi these and the rest).
void put_family_choices(const DecoderConfig& c, rt_llama_mistral_config& out) {
    out.query_key_value_bias = c.query_key_value_bias ? 1U : 0U;
    out.query_key_norm = c.query_key_norm ? 1U : 0U;
    out.norm_weight_offset = c.norm_weight_offset ? 1U : 0U;
    out.post_block_norms = c.post_block_norms ? 1U : 0U;
    out.feed_forward_activation = static_cast<int32_t>(c.feed_forward_activation);
    out.embedding_scale = c.embedding_scale;
    out.sliding_window_period = c.sliding_window_period;
    out.rope_local_theta = c.rope_local_theta;
    out.attention_logit_softcap = c.attention_logit_softcap;
    out.final_logit_softcap = c.final_logit_softcap;
    out.positions = static_cast<int32_t>(c.positions);
    out.norm = static_cast<int32_t>(c.norm);
    out.feed_forward = static_cast<int32_t>(c.feed_forward);
    out.plain_activation = static_cast<int32_t>(c.plain_activation);
    out.output_bias = c.output_bias ? 1U : 0U;
    out.feed_forward_bias = c.feed_forward_bias ? 1U : 0U;
    out.head_bias = c.head_bias ? 1U : 0U;
}

rt_llama_mistral_config to_abi(const DecoderConfig& c, std::uint32_t seed) {
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
    out.head_width = c.head_width;
    put_family_choices(c, out);
    out.attention_scale = c.attention_scale;
    out.rope_scaling = static_cast<int32_t>(c.rope_scaling.kind);
    out.rope_scaling_factor = c.rope_scaling.factor;
    out.rope_low_frequency_factor = c.rope_scaling.low_frequency_factor;
    out.rope_high_frequency_factor = c.rope_scaling.high_frequency_factor;
    out.rope_original_context = c.rope_scaling.original_context;
    out.rope_yarn_beta_fast = c.rope_scaling.beta_fast;
    out.rope_yarn_beta_slow = c.rope_scaling.beta_slow;
    out.rope_yarn_attention_factor = c.rope_scaling.attention_factor;
    // Into the model's own config: valid while the model lives.
    if (!c.rope_scaling.frequency_factors.empty()) {
        out.rope_frequency_factors = c.rope_scaling.frequency_factors.data();
        out.rope_frequency_factor_count = c.rope_scaling.frequency_factors.size();
    }
    return out;
}

ModelState& state_of(const rt_llama_mistral_model* model) {
    return *require_handle(model, "model").state;
}

}  // namespace

namespace {

void load_gguf(const char* path, uint64_t maximum_context, bool keep_packed_weights,
               rt_llama_mistral_model** out) {
    require_pointer(path, "path");
    require_pointer(out, "out");
    LlamaGgufOptions options;
    options.maximum_context = to_size(maximum_context, "maximum_context");
    options.keep_packed_weights = keep_packed_weights;
    const ScopedExecutionBackend on_cpu(ExecutionBackend::Cpu);
    const GgufFile file = GgufFile::open(path);
    auto model = load_llama_from_gguf(file, options);
    auto state = std::make_shared<ModelState>();
    state->llama_config = to_abi(model->config(), 0);
    state->model = std::move(model);
    *out = new rt_llama_mistral_model{std::move(state)};
}

}  // namespace

extern "C" {

rt_status rt_llama_mistral_config_init(rt_llama_mistral_config* config, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(config, struct_size, first_config_size, default_config(), "config");
    });
}

rt_status rt_llama_mistral_config_preset(rt_llama_mistral_config* config, int32_t architecture) {
    return guarded(__func__, [&] {
        require_pointer(config, "config");
        if (config->struct_size < family_config_size) {
            throw std::invalid_argument(
                "config->struct_size " + std::to_string(config->struct_size) +
                " is below the 2.10 size " + std::to_string(family_config_size) +
                " that holds the family choices");
        }
        if (architecture == RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2 &&
            config->struct_size < gpt2_config_size) {
            throw std::invalid_argument(
                "architecture " + std::to_string(architecture) + " (gpt2): config->struct_size " +
                std::to_string(config->struct_size) + " is below the 2.12 size " +
                std::to_string(gpt2_config_size) + " that holds its choices");
        }
        // A 2.10 client's struct ends before the soft caps: read and write only its prefix.
        rt_llama_mistral_config full =
            read_struct(config, family_config_size, default_config(), "config");
        // Dimensions as given (not validated here: rt_llama_mistral_model_create does that);
        // an unknown architecture is architecture_preset's std::invalid_argument.
        DecoderConfig dimensions;
        dimensions.model_width = static_cast<std::size_t>(config->model_width);
        if (config->sliding_window != 0)
            dimensions.sliding_window = static_cast<std::size_t>(config->sliding_window);
        dimensions.sliding_window_period = static_cast<std::size_t>(config->sliding_window_period);
        dimensions.rope_local_theta = config->rope_local_theta;
        dimensions.attention_logit_softcap = full.attention_logit_softcap;
        dimensions.final_logit_softcap = full.final_logit_softcap;
        const DecoderConfig preset =
            architecture_preset(static_cast<DecoderArchitecture>(architecture), dimensions);
        full.architecture = architecture;
        put_family_choices(preset, full);
        write_struct(config, full, family_config_size, "config");
    });
}

rt_status rt_llama_mistral_model_create(const rt_llama_mistral_config* config,
                                        rt_llama_mistral_model** out) {
    return guarded(__func__, [&] {
        const rt_llama_mistral_config given =
            read_struct(config, first_config_size, default_config(), "config");
        require_pointer(out, "out");
        const DecoderConfig engine = to_engine(given);
        std::mt19937 generator(given.random_seed);
        const ScopedExecutionBackend on_cpu(ExecutionBackend::Cpu);
        auto state = std::make_shared<ModelState>();
        auto model = std::make_unique<Decoder>(engine, generator);
        // The model's config, not `engine`: the frequency factors must outlive this call.
        state->llama_config = to_abi(model->config(), given.random_seed);
        state->model = std::move(model);
        *out = new rt_llama_mistral_model{std::move(state)};
    });
}

rt_status rt_llama_mistral_model_load_gguf(const char* path, uint64_t maximum_context,
                                           rt_llama_mistral_model** out) {
    return guarded(__func__, [&] { load_gguf(path, maximum_context, false, out); });
}

rt_status rt_llama_mistral_model_load_gguf_packed(const char* path, uint64_t maximum_context,
                                                  rt_llama_mistral_model** out) {
    return guarded(__func__, [&] { load_gguf(path, maximum_context, true, out); });
}

void rt_llama_mistral_model_release(rt_llama_mistral_model* model) {
    delete model;
}

rt_status rt_llama_mistral_model_config(const rt_llama_mistral_model* model,
                                        rt_llama_mistral_config* out) {
    return guarded(__func__, [&] {
        write_struct(out, state_of(model).llama_config, first_config_size, "out");
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

rt_status rt_checkpoint_tensor_name(int32_t architecture, int32_t format, const char* parameter,
                                    uint32_t alternative, char* out, uint64_t capacity,
                                    uint64_t* required, int32_t* out_part) {
    return guarded(__func__, [&] {
        require_pointer(parameter, "parameter");
        require_pointer(out_part, "out_part");
        if (architecture < 0)
            throw std::invalid_argument("architecture: unknown value " +
                                        std::to_string(architecture));
        if (format != RT_CHECKPOINT_FORMAT_GGUF && format != RT_CHECKPOINT_FORMAT_HUGGING_FACE)
            throw std::invalid_argument("format: unknown value " + std::to_string(format));
        const std::optional<CheckpointTensorName> name =
            checkpoint_tensor_name(static_cast<DecoderArchitecture>(architecture),
                                   static_cast<CheckpointFormat>(format), parameter, alternative);
        if (!name) {
            throw std::out_of_range("alternative " + std::to_string(alternative) + ": " +
                                    std::string(parameter) + " has no such layout in " +
                                    (format == RT_CHECKPOINT_FORMAT_GGUF ? "gguf" : "huggingface") +
                                    " checkpoints");
        }
        write_text(name->name, out, capacity, required);
        *out_part = name->part ? static_cast<int32_t>(*name->part) : -1;
    });
}

rt_status rt_model_decoder_config(const rt_model* model, rt_llama_mistral_config* out) {
    return guarded(__func__, [&] {
        const ModelState& state = *require_handle(model, "model").state;
        const auto* decoder = dynamic_cast<const Decoder*>(state.model.get());
        if (decoder == nullptr)
            throw std::invalid_argument("model: not a decoder (a program-augmented model)");
        const std::uint32_t seed = state.llama_config.struct_size != 0
                                       ? state.llama_config.random_seed
                                       : state.config.random_seed;
        write_struct(out, to_abi(decoder->config(), seed), first_config_size, "out");
    });
}

}  // extern "C"
