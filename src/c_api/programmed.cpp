// The programmed-model family (ABI 2.5): multilinear maps, program-augmented models and their
// forward options, and representation traces. The model shares ModelState with rt_model, so
// parameter lists, variables and Adam work unchanged.

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

std::vector<std::size_t> dimensions_from(const uint64_t* dimensions, uint64_t arity) {
    const auto given = input_array(dimensions, arity, "input_dimensions");
    std::vector<std::size_t> result;
    result.reserve(given.size());
    for (uint64_t value : given)
        result.push_back(to_size(value, "input_dimensions[i]"));
    return result;
}

bool flag(uint32_t value, const char* field) {
    if (value > 1) {
        throw std::invalid_argument(std::string(field) + " must be 0 or 1 (got " +
                                    std::to_string(value) + ")");
    }
    return value == 1;
}

// The ABI form of a model config (struct_size = sizeof).
rt_program_augmented_model_config to_abi(const ProgramAugmentedModelConfig& c) {
    rt_program_augmented_model_config config{};
    config.struct_size = sizeof(config);
    config.vocabulary_size = c.vocabulary_size;
    config.context_length = c.context_length;
    config.model_width = c.model_width;
    config.head_count = c.head_count;
    config.feed_forward_width = c.feed_forward_width;
    config.attention_branch_count = c.attention_branch_count;
    config.attention = static_cast<int32_t>(c.attention);
    config.random_seed = c.random_seed;
    return config;
}

rt_program_augmented_model_config default_model_config() {
    return to_abi(ProgramAugmentedModelConfig{});
}

constexpr rt_program_branch_config default_branch_config() {
    rt_program_branch_config config{};
    config.struct_size = sizeof(config);
    config.output_length = 1;
    return config;
}

rt_neural_lowering_options default_lowering_options() {
    rt_neural_lowering_options options{};
    const NeuralLoweringConfig defaults;
    options.struct_size = sizeof(options);
    options.strategy = static_cast<int32_t>(defaults.strategy);
    options.unsupported_policy = static_cast<int32_t>(defaults.unsupported);
    options.precision = static_cast<int32_t>(defaults.precision);
    options.initialization = static_cast<int32_t>(defaults.initialization);
    options.random_scale = defaults.random_scale;
    options.random_seed = defaults.random_seed;
    options.trainable = 0;
    options.attention_query_axis = -1;
    options.max_coefficient_elements = defaults.max_coefficient_elements;
    return options;
}

constexpr rt_program_augmented_forward_options default_forward_options() {
    rt_program_augmented_forward_options options{};
    options.struct_size = sizeof(options);
    options.batch_roll_shift = 1;
    return options;
}

template <typename Enum>
Enum enum_from(int32_t value, int32_t count, const char* field) {
    if (value < 0 || value >= count) {
        throw std::invalid_argument(std::string(field) + ": unknown value " +
                                    std::to_string(value));
    }
    return static_cast<Enum>(value);
}

NeuralLoweringConfig lowering_from(const rt_neural_lowering_options& given) {
    NeuralLoweringConfig config;
    config.strategy = enum_from<LoweringStrategy>(given.strategy, 4, "lowering->strategy");
    config.unsupported = enum_from<UnsupportedLoweringPolicy>(given.unsupported_policy, 2,
                                                              "lowering->unsupported_policy");
    config.precision = enum_from<CoefficientPrecision>(given.precision, 2, "lowering->precision");
    config.initialization =
        enum_from<CoefficientInitialization>(given.initialization, 2, "lowering->initialization");
    config.random_scale = given.random_scale;
    config.random_seed = given.random_seed;
    config.trainable = flag(given.trainable, "lowering->trainable");
    if (given.attention_query_axis != -1) {
        if (given.attention_query_axis < 0) {
            throw std::invalid_argument("lowering->attention_query_axis must be -1, 1 or 2 (got " +
                                        std::to_string(given.attention_query_axis) + ")");
        }
        config.attention_query_axis = static_cast<std::size_t>(given.attention_query_axis);
    }
    config.max_coefficient_elements =
        to_size(given.max_coefficient_elements, "lowering->max_coefficient_elements");
    return config;
}

ModelState& program_state(const rt_program_augmented_model* model) {
    return *require_handle(model, "model").state;
}

const RepresentationTrace& trace_of(const rt_representation_trace* trace) {
    return require_handle(trace, "trace").trace;
}

const Representation& representation_at(const rt_representation_trace* trace, uint64_t index) {
    const RepresentationTrace& native = trace_of(trace);
    if (index >= native.size()) {
        throw std::out_of_range("index " + std::to_string(index) + " is past the " +
                                std::to_string(native.size()) + " representations");
    }
    return native.entries()[static_cast<std::size_t>(index)];
}

ProgramAugmentedForwardOptions forward_options_from(
    const rt_program_augmented_forward_options* options) {
    const rt_program_augmented_forward_options given =
        options == nullptr ? default_forward_options()
                           : read_struct(options, sizeof(rt_program_augmented_forward_options),
                                         default_forward_options(), "options");
    if (given.reserved != 0) {
        throw std::invalid_argument("options->reserved must be 0");
    }
    ProgramAugmentedForwardOptions result;
    result.capture_representations =
        flag(given.capture_representations, "options->capture_representations");
    result.batch_roll_learned_attention =
        flag(given.batch_roll_learned_attention, "options->batch_roll_learned_attention");
    result.batch_roll_shift = to_size(given.batch_roll_shift, "options->batch_roll_shift");
    result.ablate_program_output =
        flag(given.ablate_program_output, "options->ablate_program_output");
    for (const rt_program_steering& edit :
         input_array(given.steering, given.steering_count, "options->steering")) {
        ProgramSteering steering;
        steering.input_index = to_size(edit.input_index, "steering input_index");
        steering.position = to_size(edit.position, "steering position");
        const auto scales = input_array(edit.scales, edit.scale_count, "steering scales");
        const auto offsets = input_array(edit.offsets, edit.offset_count, "steering offsets");
        steering.scales.assign(scales.begin(), scales.end());
        steering.offsets.assign(offsets.begin(), offsets.end());
        result.steering.push_back(std::move(steering));
    }
    for (uint64_t index :
         input_array(given.ablated_program_inputs, given.ablated_program_input_count,
                     "options->ablated_program_inputs")) {
        result.ablated_program_inputs.push_back(to_size(index, "ablated program input"));
    }
    return result;
}

}  // namespace

extern "C" {

rt_status rt_multilinear_map_create_dense(uint64_t output_dimension,
                                          const uint64_t* input_dimensions, uint64_t arity,
                                          const double* values, uint64_t count,
                                          rt_multilinear_map** out) {
    return guarded(__func__, [&] {
        std::vector<std::size_t> dimensions = dimensions_from(input_dimensions, arity);
        const auto given = input_array(values, count, "values");
        require_pointer(out, "out");
        *out = new rt_multilinear_map{MultilinearMap::from_dense(
            to_size(output_dimension, "output_dimension"), std::move(dimensions), given)};
    });
}

rt_status rt_multilinear_map_create_sparse(uint64_t output_dimension,
                                           const uint64_t* input_dimensions, uint64_t arity,
                                           const uint64_t* indices, const double* values,
                                           uint64_t count, rt_multilinear_map** out) {
    return guarded(__func__, [&] {
        std::vector<std::size_t> dimensions = dimensions_from(input_dimensions, arity);
        const auto given_indices = input_array(indices, count, "indices");
        const auto given_values = input_array(values, count, "values");
        require_pointer(out, "out");
        *out = new rt_multilinear_map{
            MultilinearMap::from_sparse(to_size(output_dimension, "output_dimension"),
                                        std::move(dimensions), given_indices, given_values)};
    });
}

void rt_multilinear_map_release(rt_multilinear_map* map) {
    delete map;
}

rt_status rt_multilinear_map_output_dimension(const rt_multilinear_map* map, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(map, "map").map.output_dimension(), "out");
    });
}

rt_status rt_multilinear_map_arity(const rt_multilinear_map* map, uint64_t* out) {
    return guarded(__func__,
                   [&] { set_output(out, require_handle(map, "map").map.arity(), "out"); });
}

rt_status rt_multilinear_map_input_dimensions(const rt_multilinear_map* map, uint64_t* out,
                                              uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const std::vector<std::size_t>& dims = require_handle(map, "map").map.input_dimensions();
        const std::vector<uint64_t> values(dims.begin(), dims.end());
        write_output(std::span<const uint64_t>(values), out, capacity, required);
    });
}

rt_status rt_multilinear_map_values(const rt_multilinear_map* map, double* out, uint64_t capacity,
                                    uint64_t* required) {
    return guarded(__func__, [&] {
        write_output(require_handle(map, "map").map.values(), out, capacity, required);
    });
}

rt_status rt_program_augmented_model_config_init(rt_program_augmented_model_config* config,
                                                 uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(config, struct_size, sizeof(rt_program_augmented_model_config),
                          default_model_config(), "config");
    });
}

rt_status rt_program_branch_config_init(rt_program_branch_config* config, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(config, struct_size, sizeof(rt_program_branch_config),
                          default_branch_config(), "config");
    });
}

rt_status rt_neural_lowering_options_init(rt_neural_lowering_options* options,
                                          uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, sizeof(rt_neural_lowering_options),
                          default_lowering_options(), "options");
    });
}

rt_status rt_program_augmented_forward_options_init(rt_program_augmented_forward_options* options,
                                                    uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, sizeof(rt_program_augmented_forward_options),
                          default_forward_options(), "options");
    });
}

rt_status rt_program_augmented_model_create(const rt_program_augmented_model_config* config,
                                            const rt_multilinear_map* map,
                                            const rt_program_branch_config* branch,
                                            const rt_neural_lowering_options* lowering,
                                            rt_program_augmented_model** out) {
    return guarded(__func__, [&] {
        const rt_program_augmented_model_config given = read_struct(
            config, sizeof(rt_program_augmented_model_config), default_model_config(), "config");
        const int present = (map != nullptr) + (branch != nullptr) + (lowering != nullptr);
        if (present != 0 && present != 3) {
            throw std::invalid_argument(
                "map, branch and lowering must all be NULL (a learned-only model) or all set");
        }
        require_pointer(out, "out");
        ProgramAugmentedModelConfig native;
        native.vocabulary_size = to_size(given.vocabulary_size, "config->vocabulary_size");
        native.context_length = to_size(given.context_length, "config->context_length");
        native.model_width = to_size(given.model_width, "config->model_width");
        native.head_count = to_size(given.head_count, "config->head_count");
        native.feed_forward_width = to_size(given.feed_forward_width, "config->feed_forward_width");
        native.attention_branch_count =
            to_size(given.attention_branch_count, "config->attention_branch_count");
        native.attention = enum_from<AttentionKind>(given.attention, 2, "config->attention");
        native.random_seed = given.random_seed;
        std::optional<ProgramBranch> program;
        if (present == 3) {
            const rt_program_branch_config b = read_struct(branch, sizeof(rt_program_branch_config),
                                                           default_branch_config(), "branch");
            const rt_neural_lowering_options l =
                read_struct(lowering, sizeof(rt_neural_lowering_options),
                            default_lowering_options(), "lowering");
            ProgramBranch native_branch{
                .map = map->map,
                .source_offset = to_size(b.source_offset, "branch->source_offset"),
                .source_length = to_size(b.source_length, "branch->source_length"),
                .target_offset = to_size(b.target_offset, "branch->target_offset"),
                .output_length = to_size(b.output_length, "branch->output_length"),
                .inputs = {},
                .lowering = lowering_from(l),
                .input_projection_bias =
                    flag(b.input_projection_bias, "branch->input_projection_bias"),
                .merge_bias = flag(b.merge_bias, "branch->merge_bias")};
            for (const rt_program_input_layout& layout :
                 input_array(b.inputs, b.input_count, "branch->inputs")) {
                if (layout.reserved != 0) {
                    throw std::invalid_argument("branch->inputs[i].reserved must be 0");
                }
                native_branch.inputs.push_back(
                    {enum_from<ProgramInputSource>(layout.source, 2, "branch->inputs[i].source"),
                     to_size(layout.position, "branch->inputs[i].position"),
                     to_size(layout.projection_group, "branch->inputs[i].projection_group")});
            }
            program = std::move(native_branch);
        }
        // Models are created on CPU whatever the thread's construction default is.
        const ScopedExecutionBackend on_cpu(ExecutionBackend::Cpu);
        auto state = std::make_shared<ModelState>();
        state->program_model = std::make_unique<ProgramAugmentedModel>(native, std::move(program));
        *out = new rt_program_augmented_model{std::move(state)};
    });
}

void rt_program_augmented_model_release(rt_program_augmented_model* model) {
    delete model;
}

rt_status rt_program_augmented_model_get_config(const rt_program_augmented_model* model,
                                                rt_program_augmented_model_config* out) {
    return guarded(__func__, [&] {
        const rt_program_augmented_model_config value =
            to_abi(program_state(model).program_model->config());
        write_struct(out, value, sizeof(rt_program_augmented_model_config), "out");
    });
}

rt_status rt_program_augmented_model_to(rt_program_augmented_model* model, int32_t backend) {
    return guarded(__func__, [&] {
        ModelState& state = program_state(model);
        const ExecutionBackend destination = backend_from_value(backend, "backend");
        state.require_unpinned();
        state.program_model->to(destination);
    });
}

rt_status rt_program_augmented_model_backend(const rt_program_augmented_model* model,
                                             int32_t* out_backend) {
    return guarded(__func__, [&] {
        set_output(out_backend, static_cast<int32_t>(program_state(model).program_model->backend()),
                   "out_backend");
    });
}

rt_status rt_program_augmented_model_has_program(const rt_program_augmented_model* model,
                                                 int32_t* out) {
    return guarded(__func__, [&] {
        set_output(out, program_state(model).program_model->has_program() ? 1 : 0, "out");
    });
}

rt_status rt_program_augmented_model_parameters(rt_program_augmented_model* model,
                                                rt_parameter_list** out) {
    return guarded(__func__, [&] {
        const rt_program_augmented_model& native = require_handle(model, "model");
        require_pointer(out, "out");
        *out =
            new rt_parameter_list(native.state, native.state->program_model->parameters(), false);
    });
}

rt_status rt_program_augmented_model_forward(rt_program_augmented_model* model,
                                             const uint32_t* tokens, uint64_t count, uint64_t batch,
                                             const rt_program_augmented_forward_options* options,
                                             rt_variable** out_logits,
                                             rt_representation_trace** out_trace) {
    return guarded(__func__, [&] {
        const rt_program_augmented_model& native = require_handle(model, "model");
        const auto ids = input_array(tokens, count, "tokens");
        const ProgramAugmentedForwardOptions forward_options = forward_options_from(options);
        require_pointer(out_logits, "out_logits");
        if (forward_options.capture_representations != (out_trace != nullptr)) {
            throw std::invalid_argument(
                forward_options.capture_representations
                    ? "out_trace is NULL but options->capture_representations is 1"
                    : "out_trace is set but options->capture_representations is 0");
        }
        const ProgramAugmentedModel& program_model = *native.state->program_model;
        const Shape shape{to_size(batch, "batch"), program_model.config().context_length};
        ProgramAugmentedForwardResult result = program_model.forward(ids, shape, forward_options);
        auto logits = std::make_unique<rt_variable>(native.state, std::move(result.logits));
        if (out_trace != nullptr) {
            auto trace = std::make_unique<rt_representation_trace>();
            trace->trace = std::move(*result.trace);
            *out_trace = trace.release();
        }
        *out_logits = logits.release();
    });
}

void rt_representation_trace_release(rt_representation_trace* trace) {
    delete trace;
}

rt_status rt_representation_trace_count(const rt_representation_trace* trace, uint64_t* out) {
    return guarded(__func__, [&] { set_output(out, trace_of(trace).size(), "out"); });
}

rt_status rt_representation_trace_name(const rt_representation_trace* trace, uint64_t index,
                                       char* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        write_text(representation_at(trace, index).name, out, capacity, required);
    });
}

rt_status rt_representation_trace_find(const rt_representation_trace* trace, const char* name,
                                       uint64_t* out_index) {
    return guarded(__func__, [&] {
        const RepresentationTrace& native = trace_of(trace);
        require_pointer(name, "name");
        require_pointer(out_index, "out_index");
        const std::optional<std::size_t> index = native.find(name);
        if (!index) {
            throw std::out_of_range(std::string("no representation named '") + name + "'");
        }
        *out_index = *index;
    });
}

rt_status rt_representation_trace_rank(const rt_representation_trace* trace, uint64_t index,
                                       uint64_t* out_rank) {
    return guarded(__func__, [&] {
        set_output(out_rank, representation_at(trace, index).shape.size(), "out_rank");
    });
}

rt_status rt_representation_trace_shape(const rt_representation_trace* trace, uint64_t index,
                                        uint64_t* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        write_shape(representation_at(trace, index).shape, out, capacity, required);
    });
}

rt_status rt_representation_trace_numel(const rt_representation_trace* trace, uint64_t index,
                                        uint64_t* out_numel) {
    return guarded(__func__, [&] {
        set_output(out_numel, representation_at(trace, index).values.size(), "out_numel");
    });
}

rt_status rt_representation_trace_copy_f32(const rt_representation_trace* trace, uint64_t index,
                                           float* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const std::vector<float>& values = representation_at(trace, index).values;
        write_output(std::span<const float>(values), out, capacity, required);
    });
}

}  // extern "C"
