// C ABI: process groups and data parallelism (distributed/process_group.hpp).

#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/c_api.h"
#include "riftco_transformer/distributed/process_group.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

DistributedState& group_of(const rt_process_group* group) {
    return *require_handle(group, "group").state;
}

}  // namespace

extern "C" {

rt_status rt_distributed_compiled_in(int32_t* out) {
    return guarded(__func__, [&] { set_output(out, distributed_compiled_in() ? 1 : 0, "out"); });
}

rt_status rt_process_group_create(uint64_t timeout_ms, rt_process_group** out) {
    return guarded(__func__, [&] {
        require_pointer(out, "out");
        if (timeout_ms == 0 || timeout_ms > std::uint64_t{1} << 40) {
            throw std::invalid_argument("timeout_ms must be in [1, 2^40], got " +
                                        std::to_string(timeout_ms));
        }
        ProcessGroupOptions options;
        options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_ms));
        *out =
            new rt_process_group{std::make_shared<DistributedState>(create_process_group(options))};
    });
}

rt_status rt_process_group_create_single(rt_process_group** out) {
    return guarded(__func__, [&] {
        require_pointer(out, "out");
        *out =
            new rt_process_group{std::make_shared<DistributedState>(create_single_process_group())};
    });
}

void rt_process_group_release(rt_process_group* group) {
    delete group;
}

rt_status rt_process_group_rank(const rt_process_group* group, int32_t* out) {
    return guarded(__func__, [&] { set_output(out, group_of(group).group->rank(), "out"); });
}

rt_status rt_process_group_world_size(const rt_process_group* group, int32_t* out) {
    return guarded(__func__, [&] { set_output(out, group_of(group).group->world_size(), "out"); });
}

rt_status rt_process_group_barrier(rt_process_group* group) {
    return guarded(__func__, [&] { group_of(group).group->barrier(); });
}

rt_status rt_process_group_allreduce_sum_f64(rt_process_group* group, double* values,
                                             uint64_t count) {
    return guarded(__func__, [&] {
        DistributedState& native = group_of(group);
        if (count > 0)
            require_pointer(values, "values");
        native.group->allreduce_sum(std::span<double>(values, to_size(count, "count")));
    });
}

rt_status rt_process_group_broadcast_bytes(rt_process_group* group, uint8_t* bytes, uint64_t count,
                                           int32_t root) {
    return guarded(__func__, [&] {
        DistributedState& native = group_of(group);
        if (count > 0)
            require_pointer(bytes, "bytes");
        // The group checks root (std::invalid_argument naming it).
        native.group->broadcast(std::span<std::uint8_t>(bytes, to_size(count, "count")), root);
    });
}

rt_status rt_process_group_allgather_u64(rt_process_group* group, uint64_t value, uint64_t* out,
                                         uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        DistributedState& native = group_of(group);
        require_pointer(required, "required");
        const std::vector<std::uint64_t> values = native.group->allgather(value);
        write_output(std::span<const std::uint64_t>(values), out, capacity, required);
    });
}

rt_status rt_process_group_set_bucket_bytes(rt_process_group* group, uint64_t bucket_bytes) {
    return guarded(__func__, [&] {
        group_of(group).parallel.set_bucket_bytes(to_size(bucket_bytes, "bucket_bytes"));
    });
}

rt_status rt_process_group_communication(const rt_process_group* group, uint64_t* out_bytes,
                                         double* out_seconds) {
    return guarded(__func__, [&] {
        const DistributedState& native = group_of(group);
        require_pointer(out_bytes, "out_bytes");
        require_pointer(out_seconds, "out_seconds");
        *out_bytes = native.parallel.communicated_bytes();
        *out_seconds = native.parallel.communication_seconds();
    });
}

rt_status rt_data_parallel_synchronize_parameters(rt_process_group* group,
                                                  rt_parameter_list* list) {
    return guarded(__func__, [&] {
        DistributedState& native = group_of(group);
        rt_parameter_list& parameters = require_handle(list, "list");
        native.parallel.synchronize_parameters(parameters.parameters);
        if (native.group->rank() != 0)
            ++parameters.state->parameter_epoch;
    });
}

rt_status rt_data_parallel_reduce_gradients(rt_process_group* group, rt_parameter_list* list,
                                            double local_weight, double* out_total_weight) {
    return guarded(__func__, [&] {
        DistributedState& native = group_of(group);
        rt_parameter_list& parameters = require_handle(list, "list");
        const double total = native.parallel.reduce_gradients(parameters.parameters, local_weight);
        if (out_total_weight != nullptr)
            *out_total_weight = total;
    });
}

rt_status rt_data_parallel_backward_and_reduce(rt_process_group* group, rt_parameter_list* list,
                                               rt_variable* loss, double local_weight,
                                               float seed_scale, uint32_t accumulate,
                                               double* out_total_weight) {
    return guarded(__func__, [&] {
        DistributedState& native = group_of(group);
        rt_parameter_list& parameters = require_handle(list, "list");
        rt_variable& variable = require_handle(loss, "loss");
        const bool add = flag_from_value(accumulate, "accumulate");
        if (!std::isfinite(seed_scale)) {
            throw std::invalid_argument("seed_scale must be finite, got " +
                                        std::to_string(seed_scale));
        }
        if (variable.pin.shared_state() != parameters.state) {
            throw std::invalid_argument("loss and list belong to different models");
        }
        require_differentiable(variable);
        const double total =
            native.parallel.backward_and_reduce(variable.variable, parameters.parameters,
                                                local_weight, {.accumulate = add}, seed_scale);
        variable.backward_consumed = true;
        if (out_total_weight != nullptr)
            *out_total_weight = total;
    });
}

rt_status rt_data_parallel_parameter_hash(const rt_parameter_list* list, uint64_t* out) {
    return guarded(__func__, [&] {
        const rt_parameter_list& parameters = require_handle(list, "list");
        require_pointer(out, "out");
        *out = DataParallel::parameter_hash(parameters.parameters);
    });
}

}  // extern "C"
