// Model handles (GPT decoder), the pins that guard its backend and parameters, and
// parameter lists.

#include <cmath>
#include <random>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace riftco_transformer::c_api {

void ModelState::require_no_session() const {
    if (live_sessions != 0) {
        throw std::logic_error("the model is pinned by " + std::to_string(live_sessions) +
                               " live decode session(s); release them first");
    }
}

std::size_t ModelState::live_graphs() const noexcept {
    std::size_t count = 0;
    for (const Variable* variable : variables)
        count += variable->holds_graph() ? 1 : 0;
    return count;
}

namespace {

std::string graphs_text(std::size_t graphs) {
    return std::to_string(graphs) +
           " live variable(s) whose graph no backward has consumed (release them, or call "
           "backward on the loss that reads them)";
}

}  // namespace

void ModelState::require_unpinned() const {
    require_no_session();
    const std::size_t graphs = live_graphs();
    if (graphs != 0 || live_optimizers != 0) {
        throw std::logic_error("the model is pinned by " + graphs_text(graphs) + " and " +
                               std::to_string(live_optimizers) +
                               " live Adam optimizer(s); release them first");
    }
}

void ModelState::require_no_live_graph() const {
    require_no_session();
    const std::size_t graphs = live_graphs();
    if (graphs != 0)
        throw std::logic_error("the model is pinned by " + graphs_text(graphs));
}

ModelPin::ModelPin(std::shared_ptr<ModelState> state, Kind kind)
    : state_(std::move(state)), kind_(kind) {
    ++(kind_ == Kind::Variable ? state_->live_variables : state_->live_optimizers);
}

ModelPin::~ModelPin() {
    --(kind_ == Kind::Variable ? state_->live_variables : state_->live_optimizers);
}

}  // namespace riftco_transformer::c_api

namespace {

// The first published rt_transformer_config (through layer_norm_epsilon); clients built
// against it pass this size and get the appended fields' defaults.
constexpr std::size_t transformer_config_minimum_size = 64;

constexpr rt_transformer_config default_config() {
    rt_transformer_config config{};
    config.struct_size = sizeof(rt_transformer_config);
    config.random_seed = 5489;  // std::mt19937's default seed
    config.layer_norm_epsilon = 1e-5F;
    config.feed_forward_activation = RT_FEED_FORWARD_ACTIVATION_GELU;
    config.tie_embeddings = 0;
    return config;
}

Activation activation_from_value(std::uint32_t value) {
    if (value != RT_FEED_FORWARD_ACTIVATION_GELU && value != RT_FEED_FORWARD_ACTIVATION_RELU &&
        value != RT_FEED_FORWARD_ACTIVATION_GELU_TANH) {
        throw std::invalid_argument("config->feed_forward_activation: unknown value " +
                                    std::to_string(value));
    }
    return static_cast<Activation>(value);
}

ModelState& state_of(const rt_model* model) {
    return *require_handle(model, "model").state;
}

AttentionKind attention_from_value(int32_t value) {
    if (value != RT_ATTENTION_MATERIALIZED && value != RT_ATTENTION_FLASH) {
        throw std::invalid_argument("attention: unknown full-sequence attention value " +
                                    std::to_string(value));
    }
    return static_cast<AttentionKind>(value);
}

ActivationCheckpointing checkpointing_from_value(int32_t value) {
    if (value != RT_ACTIVATION_CHECKPOINTING_DISABLED &&
        value != RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK) {
        throw std::invalid_argument("checkpointing: unknown activation checkpointing value " +
                                    std::to_string(value));
    }
    return static_cast<ActivationCheckpointing>(value);
}

const rt_parameter_list& list_of(const rt_parameter_list* list) {
    return require_handle(list, "list");
}

const NamedParameter& parameter_at(const rt_parameter_list* list, uint64_t index) {
    const rt_parameter_list& native = list_of(list);
    if (index >= native.parameters.size()) {
        throw std::out_of_range("index " + std::to_string(index) + " is past the " +
                                std::to_string(native.parameters.size()) + " parameters");
    }
    return native.parameters[static_cast<std::size_t>(index)];
}

std::size_t total_numel(const ParameterList& parameters) {
    std::size_t total = 0;
    for (const NamedParameter& entry : parameters) {
        total += entry.parameter.value().numel();
    }
    return total;
}

}  // namespace

extern "C" {

rt_status rt_transformer_config_init(rt_transformer_config* config, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(config, struct_size, transformer_config_minimum_size, default_config(),
                          "config");
    });
}

rt_status rt_model_create(const rt_transformer_config* config, rt_model** out) {
    return guarded(__func__, [&] {
        rt_transformer_config given =
            read_struct(config, transformer_config_minimum_size, default_config(), "config");
        require_pointer(out, "out");
        TransformerDimensions dimensions;
        dimensions.vocabulary_size = to_size(given.vocabulary_size, "config->vocabulary_size");
        dimensions.maximum_context = to_size(given.maximum_context, "config->maximum_context");
        dimensions.model_width = to_size(given.model_width, "config->model_width");
        dimensions.head_count = to_size(given.head_count, "config->head_count");
        dimensions.block_count = to_size(given.block_count, "config->block_count");
        dimensions.feed_forward_width =
            to_size(given.feed_forward_width, "config->feed_forward_width");
        DecoderOptions options;
        options.feed_forward_activation = activation_from_value(given.feed_forward_activation);
        options.tie_embeddings = flag_from_value(given.tie_embeddings, "config->tie_embeddings");
        std::mt19937 generator(given.random_seed);
        // Models are created on CPU whatever the thread's construction default is.
        const ScopedExecutionBackend on_cpu(ExecutionBackend::Cpu);
        auto state = std::make_shared<ModelState>();
        state->model = std::make_unique<DecoderOnlyTransformer>(
            dimensions, generator, given.layer_norm_epsilon, AttentionKind::Materialized,
            ActivationCheckpointing::Disabled, options);
        given.struct_size = sizeof(rt_transformer_config);
        state->config = given;
        *out = new rt_model{std::move(state)};
    });
}

void rt_model_release(rt_model* model) {
    delete model;
}

rt_status rt_model_config(const rt_model* model, rt_transformer_config* out) {
    return guarded(__func__, [&] {
        const ModelState& state = state_of(model);
        if (state.config.struct_size == 0) {
            throw std::invalid_argument(
                "model: a Llama/Mistral decoder has no GPT configuration; use "
                "rt_llama_mistral_model_config");
        }
        write_struct(out, state.config, transformer_config_minimum_size, "out");
    });
}

rt_status rt_model_to(rt_model* model, int32_t backend) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        const ExecutionBackend destination = backend_from_value(backend, "backend");
        state.require_unpinned();
        state.model->to(destination);
    });
}

rt_status rt_model_backend(const rt_model* model, int32_t* out_backend) {
    return guarded(__func__, [&] {
        set_output(out_backend, static_cast<int32_t>(state_of(model).model->backend()),
                   "out_backend");
    });
}

rt_status rt_model_set_full_sequence_attention(rt_model* model, int32_t attention) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        state.model->set_attention(attention_from_value(attention));
    });
}

rt_status rt_model_get_full_sequence_attention(const rt_model* model, int32_t* out_attention) {
    return guarded(__func__, [&] {
        set_output(out_attention, static_cast<int32_t>(state_of(model).model->attention()),
                   "out_attention");
    });
}

rt_status rt_model_set_activation_checkpointing(rt_model* model, int32_t checkpointing) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        state.model->set_activation_checkpointing(checkpointing_from_value(checkpointing));
    });
}

rt_status rt_model_get_activation_checkpointing(const rt_model* model, int32_t* out_checkpointing) {
    return guarded(__func__, [&] {
        set_output(out_checkpointing,
                   static_cast<int32_t>(state_of(model).model->activation_checkpointing()),
                   "out_checkpointing");
    });
}

rt_status rt_model_forward(rt_model* model, const uint32_t* tokens, uint64_t count, uint64_t batch,
                           uint64_t time, rt_variable** out) {
    return guarded(__func__, [&] {
        const rt_model& native = require_handle(model, "model");
        const auto ids = input_array(tokens, count, "tokens");
        const Shape shape{to_size(batch, "batch"), to_size(time, "time")};
        require_pointer(out, "out");
        // The model checks B, T > 0, count == B·T, T <= C and every id < V.
        Variable logits = native.state->model->forward(ids, shape);
        *out = new rt_variable(native.state, std::move(logits));
    });
}

rt_status rt_model_forward_packed(rt_model* model, const uint32_t* tokens,
                                  const uint32_t* positions, uint64_t count, uint64_t batch,
                                  uint64_t time, rt_variable** out) {
    return guarded(__func__, [&] {
        const rt_model& native = require_handle(model, "model");
        const auto ids = input_array(tokens, count, "tokens");
        const auto packed = input_array(positions, count, "positions");
        const Shape shape{to_size(batch, "batch"), to_size(time, "time")};
        require_pointer(out, "out");
        // The model checks the shape, the ids and the packing rules.
        Variable logits = native.state->model->forward(ids, shape, packed);
        *out = new rt_variable(native.state, std::move(logits));
    });
}

rt_status rt_model_parameters(rt_model* model, rt_parameter_list** out) {
    return guarded(__func__, [&] {
        const rt_model& native = require_handle(model, "model");
        require_pointer(out, "out");  // before anything is allocated
        *out = new rt_parameter_list(native.state, native.state->model->parameters(), false);
    });
}

void rt_parameter_list_release(rt_parameter_list* list) {
    delete list;
}

rt_status rt_parameter_list_count(const rt_parameter_list* list, uint64_t* out) {
    return guarded(__func__, [&] { set_output(out, list_of(list).parameters.size(), "out"); });
}

rt_status rt_parameter_list_backend(const rt_parameter_list* list, int32_t* out_backend) {
    return guarded(__func__, [&] {
        const rt_parameter_list& native = list_of(list);
        require_pointer(out_backend, "out_backend");
        if (native.parameters.empty()) {
            throw std::logic_error("the list holds no parameters");
        }
        *out_backend = static_cast<int32_t>(native.parameters.front().parameter.backend());
    });
}

rt_status rt_parameter_list_name(const rt_parameter_list* list, uint64_t index, char* out,
                                 uint64_t capacity, uint64_t* required) {
    return guarded(__func__,
                   [&] { write_text(parameter_at(list, index).name, out, capacity, required); });
}

rt_status rt_parameter_list_rank(const rt_parameter_list* list, uint64_t index,
                                 uint64_t* out_rank) {
    return guarded(__func__, [&] {
        set_output(out_rank, parameter_at(list, index).parameter.shape().size(), "out_rank");
    });
}

rt_status rt_parameter_list_shape(const rt_parameter_list* list, uint64_t index, uint64_t* out,
                                  uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        write_shape(parameter_at(list, index).parameter.shape(), out, capacity, required);
    });
}

rt_status rt_parameter_list_numel(const rt_parameter_list* list, uint64_t index,
                                  uint64_t* out_numel) {
    return guarded(__func__, [&] {
        set_output(out_numel, parameter_at(list, index).parameter.value().numel(), "out_numel");
    });
}

rt_status rt_parameter_list_total_numel(const rt_parameter_list* list, uint64_t* out_numel) {
    return guarded(__func__, [&] {
        set_output(out_numel, total_numel(list_of(list).parameters), "out_numel");
    });
}

rt_status rt_parameter_list_copy_to_host_f32(const rt_parameter_list* list, float* out,
                                             uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const rt_parameter_list& native = list_of(list);
        if (!begin_output(out, capacity, required, total_numel(native.parameters))) {
            return;  // size query
        }
        std::size_t offset = 0;
        for (const NamedParameter& entry : native.parameters) {
            const Tensor& value = entry.parameter.value();
            value.copy_to_host(std::span<float>(out + offset, value.numel()));
            offset += value.numel();
        }
    });
}

rt_status rt_parameter_list_load_from_host_f32(rt_parameter_list* list, const float* values,
                                               uint64_t count) {
    return guarded(__func__, [&] {
        rt_parameter_list& native = require_handle(list, "list");
        const auto given = input_array(values, count, "values");
        const std::size_t total = total_numel(native.parameters);
        if (given.size() != total) {
            throw std::invalid_argument("count " + std::to_string(count) +
                                        " differs from the list's " + std::to_string(total) +
                                        " values");
        }
        for (std::size_t index = 0; index < given.size(); ++index) {
            if (!std::isfinite(given[index])) {
                throw std::invalid_argument("values[" + std::to_string(index) + "] is not finite");
            }
        }
        native.state->require_unpinned();
        // Every new value is built before the first is installed, so a failed allocation
        // changes nothing.
        std::vector<Tensor> replacements;
        replacements.reserve(native.parameters.size());
        std::size_t offset = 0;
        for (const NamedParameter& entry : native.parameters) {
            const Tensor& current = entry.parameter.value();
            replacements.emplace_back(current.shape(), given.subspan(offset, current.numel()),
                                      current.backend());
            offset += current.numel();
        }
        for (std::size_t index = 0; index < replacements.size(); ++index) {
            Variable parameter = native.parameters[index].parameter;
            parameter.set_value(std::move(replacements[index]));
        }
        ++native.state->parameter_epoch;
    });
}

}  // extern "C"
