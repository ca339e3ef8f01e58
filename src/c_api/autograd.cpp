// Variables (graph outputs) and the cross-entropy loss. Graphs are single-use: the C++ graph
// consumes itself on backward; the model's parameter epoch turns a graph built before an
// optimizer step or a parameter load into an explicit error.

#include <cmath>
#include <string>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

const rt_variable& variable_of(const rt_variable* handle, const char* argument) {
    return require_handle(handle, argument);
}

// A loss computed from `logits`: the same model pin, and the logits' epoch (the loss's graph
// is the logits' graph).
rt_variable* loss_handle(const rt_variable& logits, Variable loss) {
    auto* result = new rt_variable(logits.pin.shared_state(), std::move(loss));
    result->epoch = logits.epoch;
    return result;
}

// rt_variable_backward's graph checks, then the pass (seed `scale`, replacing or adding).
void run_backward(rt_variable* variable, float scale, bool accumulate) {
    rt_variable& native = require_handle(variable, "variable");
    require_differentiable(native);
    const BackwardOptions options{.accumulate = accumulate};
    if (scale == 1.0F) {
        native.variable.backward(options);
    } else {
        const Tensor& value = native.variable.value();
        if (value.numel() != 1) {
            throw std::invalid_argument(
                "rt_variable_backward_scaled: the variable must be a "
                "scalar, not " +
                std::to_string(value.numel()) + " elements");
        }
        Tensor seed = Tensor::full(value.shape(), scale, value.backend());
        native.variable.backward(seed, options);
    }
    native.backward_consumed = true;
}

}  // namespace

namespace riftco_transformer::c_api {

void require_differentiable(const rt_variable& native) {
    const ModelState& state = native.pin.state();
    if (native.backward_consumed) {
        throw std::logic_error(
            "an earlier rt_variable_backward consumed this graph (graphs are single-use); "
            "build a new graph with rt_model_forward");
    }
    if (native.epoch != state.parameter_epoch) {
        throw std::logic_error(
            "the graph was built at parameter epoch " + std::to_string(native.epoch) +
            " but the model is at epoch " + std::to_string(state.parameter_epoch) +
            " (an Adam step or a parameter load replaced the parameters it read); build "
            "a new graph");
    }
}

}  // namespace riftco_transformer::c_api

extern "C" {

void rt_variable_release(rt_variable* variable) {
    delete variable;
}

rt_status rt_variable_backend(const rt_variable* variable, int32_t* out_backend) {
    return guarded(__func__, [&] {
        set_output(out_backend,
                   static_cast<int32_t>(variable_of(variable, "variable").variable.backend()),
                   "out_backend");
    });
}

rt_status rt_variable_rank(const rt_variable* variable, uint64_t* out_rank) {
    return guarded(__func__, [&] {
        set_output(out_rank, variable_of(variable, "variable").variable.shape().size(), "out_rank");
    });
}

rt_status rt_variable_shape(const rt_variable* variable, uint64_t* out, uint64_t capacity,
                            uint64_t* required) {
    return guarded(__func__, [&] {
        write_shape(variable_of(variable, "variable").variable.shape(), out, capacity, required);
    });
}

rt_status rt_variable_numel(const rt_variable* variable, uint64_t* out_numel) {
    return guarded(__func__, [&] {
        set_output(out_numel, variable_of(variable, "variable").variable.value().numel(),
                   "out_numel");
    });
}

rt_status rt_variable_copy_to_host_f32(const rt_variable* variable, float* out, uint64_t capacity,
                                       uint64_t* required) {
    return guarded(__func__, [&] {
        write_tensor_values(variable_of(variable, "variable").variable.value(), out, capacity,
                            required);
    });
}

rt_status rt_variable_backward(rt_variable* variable) {
    return guarded(__func__, [&] { run_backward(variable, 1.0F, false); });
}

rt_status rt_variable_backward_scaled(rt_variable* variable, float scale, uint32_t accumulate) {
    return guarded(__func__, [&] {
        if (!std::isfinite(scale)) {
            throw std::invalid_argument("scale must be finite, got " + std::to_string(scale));
        }
        const bool add = flag_from_value(accumulate, "accumulate");
        run_backward(variable, scale, add);
    });
}

rt_status rt_cross_entropy(const rt_variable* logits, const uint32_t* targets, uint64_t count,
                           rt_variable** out) {
    return guarded(__func__, [&] {
        const rt_variable& native = variable_of(logits, "logits");
        const auto given = input_array(targets, count, "targets");
        require_pointer(out, "out");
        Variable loss = cross_entropy(native.variable, given);
        *out = loss_handle(native, std::move(loss));
    });
}

rt_status rt_cross_entropy_time_range(const rt_variable* logits, const uint32_t* targets,
                                      uint64_t count, uint64_t time_offset, uint64_t time_count,
                                      rt_variable** out) {
    return guarded(__func__, [&] {
        const rt_variable& native = variable_of(logits, "logits");
        const auto given = input_array(targets, count, "targets");
        require_pointer(out, "out");
        Variable loss =
            cross_entropy_time_range(native.variable, given, to_size(time_offset, "time_offset"),
                                     to_size(time_count, "time_count"));
        *out = loss_handle(native, std::move(loss));
    });
}

rt_status rt_cross_entropy_masked(const rt_variable* logits, const uint32_t* targets,
                                  uint64_t count, const uint8_t* mask, uint64_t mask_count,
                                  rt_variable** out) {
    return guarded(__func__, [&] {
        const rt_variable& native = variable_of(logits, "logits");
        const auto given = input_array(targets, count, "targets");
        const auto flags = input_array(mask, mask_count, "mask");
        require_pointer(out, "out");
        Variable loss = cross_entropy_masked(native.variable, given, flags);
        *out = loss_handle(native, std::move(loss));
    });
}

}  // extern "C"
