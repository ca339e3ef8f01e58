// Adam handles: options (with the 2.3 prefix still accepted), steps that advance the model's
// parameter epoch, and logical state capture/restore.

#include <cmath>
#include <limits>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

// ABI 2.3 published rt_adam_options up to and including `reserved`; 2.4 appended the state
// layout fields, so an older client's 32-byte struct still creates an optimizer.
constexpr std::size_t adam_options_minimum_size = offsetof(rt_adam_options, state_storage);
static_assert(adam_options_minimum_size == 32);
// 2.13 appended the step's learning rate to the step statistics: a 32-byte struct still works
// (layouts: c_api/abi_layout.cpp).
constexpr std::size_t adam_step_stats_minimum_size = offsetof(rt_adam_step_stats, learning_rate);

constexpr rt_adam_options default_adam_options() {
    rt_adam_options options{};
    options.struct_size = sizeof(rt_adam_options);
    options.learning_rate = 1e-3F;
    options.beta1 = 0.9F;
    options.beta2 = 0.999F;
    options.epsilon = 1e-8F;
    options.maximum_gradient_norm = 1.0F;
    options.state_storage = RT_ADAM_STATE_CONTIGUOUS;
    options.page_size = 4096;
    options.schedule = RT_LEARNING_RATE_SCHEDULE_CONSTANT;
    return options;
}

AdamOptions native_options(const rt_adam_options& given) {
    if (given.reserved != 0 || given.reserved2 != 0 || given.reserved3 != 0) {
        throw std::invalid_argument(
            "options->reserved, options->reserved2 and options->reserved3 must be 0");
    }
    if (given.schedule != RT_LEARNING_RATE_SCHEDULE_CONSTANT &&
        given.schedule != RT_LEARNING_RATE_SCHEDULE_WARMUP_COSINE &&
        given.schedule != RT_LEARNING_RATE_SCHEDULE_WARMUP_LINEAR) {
        throw std::invalid_argument("options->schedule: unknown value " +
                                    std::to_string(given.schedule));
    }
    if (given.state_storage != RT_ADAM_STATE_CONTIGUOUS &&
        given.state_storage != RT_ADAM_STATE_PAGED) {
        throw std::invalid_argument("options->state_storage: unknown value " +
                                    std::to_string(given.state_storage));
    }
    AdamOptions options;
    options.learning_rate = given.learning_rate;
    options.beta1 = given.beta1;
    options.beta2 = given.beta2;
    options.epsilon = given.epsilon;
    options.maximum_gradient_norm = given.maximum_gradient_norm;
    options.state_storage = static_cast<AdamStateStorage>(given.state_storage);
    options.page_size = to_size(given.page_size, "options->page_size");
    options.weight_decay = given.weight_decay;
    options.schedule.kind = static_cast<LearningRateScheduleKind>(given.schedule);
    options.schedule.warmup_steps = given.warmup_steps;
    options.schedule.total_steps = given.total_steps;
    options.schedule.minimum_fraction = given.minimum_fraction;
    validate_adam_options(options);
    return options;
}

// The options a caller passed (NULL: the defaults), read and validated.
AdamOptions options_from(const rt_adam_options* options) {
    const rt_adam_options given =
        options == nullptr
            ? default_adam_options()
            : read_struct(options, adam_options_minimum_size, default_adam_options(), "options");
    return native_options(given);
}

const rt_adam& adam_of(const rt_adam* handle) {
    return require_handle(handle, "adam");
}

}  // namespace

extern "C" {

rt_status rt_adam_options_init(rt_adam_options* options, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, adam_options_minimum_size, default_adam_options(),
                          "options");
    });
}

rt_status rt_adam_create(const rt_parameter_list* parameters, const rt_adam_options* options,
                         rt_adam** out) {
    return guarded(__func__, [&] {
        const rt_parameter_list& list = require_handle(parameters, "parameters");
        const AdamOptions native = options_from(options);
        require_pointer(out, "out");
        *out = new rt_adam(list.state, Adam(list.parameters, native));
    });
}

rt_status rt_adam_create_sharded(rt_process_group* group, const rt_parameter_list* parameters,
                                 const rt_adam_options* options, rt_adam** out) {
    return guarded(__func__, [&] {
        const rt_process_group& native_group = require_handle(group, "group");
        const rt_parameter_list& list = require_handle(parameters, "parameters");
        const AdamOptions native = options_from(options);
        require_pointer(out, "out");
        *out = new rt_adam(list.state, native_group.state, list.parameters, native);
    });
}

rt_status rt_adam_sharded_state_bytes(const rt_adam* adam, uint64_t* out_held_bytes,
                                      uint64_t* out_unsharded_bytes) {
    return guarded(__func__, [&] {
        const rt_adam& native = adam_of(adam);
        require_pointer(out_held_bytes, "out_held_bytes");
        require_pointer(out_unsharded_bytes, "out_unsharded_bytes");
        *out_held_bytes = native.state_payload_bytes();
        *out_unsharded_bytes = 2 * native.state_value_count() * sizeof(float);
    });
}

void rt_adam_release(rt_adam* adam) {
    delete adam;
}

rt_status rt_adam_backend(const rt_adam* adam, int32_t* out_backend) {
    return guarded(__func__, [&] {
        const rt_adam& native = adam_of(adam);
        set_output(
            out_backend,
            static_cast<int32_t>(native.adam ? native.adam->backend() : native.sharded->backend()),
            "out_backend");
    });
}

rt_status rt_adam_step_count(const rt_adam* adam, uint64_t* out_count) {
    return guarded(__func__,
                   [&] { set_output(out_count, adam_of(adam).step_count(), "out_count"); });
}

rt_status rt_adam_parameter_count(const rt_adam* adam, uint64_t* out_count) {
    return guarded(__func__,
                   [&] { set_output(out_count, adam_of(adam).parameters().size(), "out_count"); });
}

rt_status rt_adam_state_storage(const rt_adam* adam, int32_t* out_storage) {
    return guarded(__func__, [&] {
        const rt_adam& native = adam_of(adam);
        const AdamOptions& options =
            native.adam ? native.adam->options() : native.sharded->options();
        set_output(out_storage, static_cast<int32_t>(options.state_storage), "out_storage");
    });
}

rt_status rt_adam_state_page_size(const rt_adam* adam, uint64_t* out_page_size) {
    return guarded(__func__, [&] {
        const rt_adam& native = adam_of(adam);
        set_output(
            out_page_size,
            native.adam ? native.adam->state_page_size() : native.sharded->options().page_size,
            "out_page_size");
    });
}

rt_status rt_adam_state_page_count(const rt_adam* adam, uint64_t* out_page_count) {
    return guarded(__func__, [&] {
        const Adam* local = adam_of(adam).local();
        set_output(out_page_count, local == nullptr ? 0 : local->state_page_count(),
                   "out_page_count");
    });
}

rt_status rt_adam_state_payload_bytes(const rt_adam* adam, uint64_t* out_bytes) {
    return guarded(
        __func__, [&] { set_output(out_bytes, adam_of(adam).state_payload_bytes(), "out_bytes"); });
}

rt_status rt_adam_step(rt_adam* adam, rt_adam_step_stats* stats) {
    return guarded(__func__, [&] {
        rt_adam& native = require_handle(adam, "adam");
        if (stats != nullptr) {
            require_struct_size(stats->struct_size, adam_step_stats_minimum_size, "stats");
        }
        native.pin.state().require_no_session();
        const AdamStepStats result = native.step();
        ++native.pin.state().parameter_epoch;
        if (stats != nullptr) {
            rt_adam_step_stats written{};
            written.struct_size = sizeof(rt_adam_step_stats);
            written.step = result.step;
            written.gradient_norm = result.gradient_norm;
            written.clip_scale = result.clip_scale;
            written.learning_rate = result.learning_rate;
            write_struct(stats, written, adam_step_stats_minimum_size, "stats");
        }
    });
}

rt_status rt_adam_zero_gradients(rt_adam* adam) {
    return guarded(__func__, [&] {
        rt_adam& native = require_handle(adam, "adam");
        if (native.adam)
            native.adam->zero_gradients();
        else
            native.sharded->zero_gradients();
    });
}

rt_status rt_adam_state_get(const rt_adam* adam, rt_adam_state* out_state) {
    return guarded(__func__, [&] {
        const rt_adam& native = adam_of(adam);
        require_pointer(out_state, "out_state");
        require_struct_size(out_state->struct_size, sizeof(rt_adam_state), "out_state");
        const AdamState state = native.state();
        rt_adam_state written{};
        written.struct_size = sizeof(rt_adam_state);
        written.step_count = state.step_count;
        written.beta1_power = state.beta1_power;
        written.beta2_power = state.beta2_power;
        written.value_count = state.parameter_values.size();
        write_struct(out_state, written, sizeof(rt_adam_state), "out_state");
    });
}

rt_status rt_adam_state_copy_to_host_f32(const rt_adam* adam, float* values, float* first_moments,
                                         float* second_moments, uint64_t capacity) {
    return guarded(__func__, [&] {
        const rt_adam& native = adam_of(adam);
        require_pointer(values, "values");
        require_pointer(first_moments, "first_moments");
        require_pointer(second_moments, "second_moments");
        const std::size_t count = native.state_value_count();
        if (capacity < count) {
            throw std::out_of_range("capacity " + std::to_string(capacity) + " is below the " +
                                    std::to_string(count) + " values of each array");
        }
        const AdamState state = native.state();
        std::copy(state.parameter_values.begin(), state.parameter_values.end(), values);
        std::copy(state.first_moments.begin(), state.first_moments.end(), first_moments);
        std::copy(state.second_moments.begin(), state.second_moments.end(), second_moments);
    });
}

rt_status rt_adam_state_load_from_host_f32(rt_adam* adam, const rt_adam_state* state,
                                           const float* values, const float* first_moments,
                                           const float* second_moments, uint64_t count) {
    return guarded(__func__, [&] {
        rt_adam& native = require_handle(adam, "adam");
        require_pointer(state, "state");
        require_struct_size(state->struct_size, sizeof(rt_adam_state), "state");
        const auto given_values = input_array(values, count, "values");
        const auto given_first = input_array(first_moments, count, "first_moments");
        const auto given_second = input_array(second_moments, count, "second_moments");
        if (state->value_count != count) {
            throw std::invalid_argument("state->value_count " + std::to_string(state->value_count) +
                                        " differs from count " + std::to_string(count));
        }
        native.pin.state().require_no_live_graph();
        AdamState restored;
        restored.step_count = state->step_count;
        restored.beta1_power = state->beta1_power;
        restored.beta2_power = state->beta2_power;
        restored.parameter_values.assign(given_values.begin(), given_values.end());
        restored.first_moments.assign(given_first.begin(), given_first.end());
        restored.second_moments.assign(given_second.begin(), given_second.end());
        native.load_state(restored);
        ++native.pin.state().parameter_epoch;
    });
}

}  // extern "C"
