// LoRA attach/merge, NF4 conversion, packed-memory statistics and the packed state of a
// model handle (docs/ARCHITECTURE.md, 'LoRA', 'NF4' and 'The C ABI'). Pinning: attach needs an
// unpinned model; merge additionally no live adapter parameter list; conversion no live
// parameter list at all (they hold the dense weights it releases); a packed-state load no live
// graph.

#include <algorithm>
#include <string>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/nn/packed_state.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

// ABI 2.8 published rt_lora_config up to and including `reserved` (40 bytes); 2.13 appended
// rank_stabilized, 2.15 dropout (a shorter struct reads their init values).
constexpr std::size_t lora_config_minimum_size = offsetof(rt_lora_config, rank_stabilized);

constexpr rt_lora_config default_lora_config() {
    rt_lora_config config{};
    config.struct_size = sizeof(rt_lora_config);
    const LoraConfig defaults;
    config.rank = defaults.rank;
    config.alpha = defaults.alpha;
    config.random_seed = defaults.random_seed;
    config.targets = defaults.targets;
    return config;
}

ModelState& state_of(const rt_model* model) {
    return *require_handle(model, "model").state;
}

void require_no_parameter_lists(const ModelState& state) {
    if (state.live_parameter_lists != 0) {
        throw std::logic_error("the model is pinned by " +
                               std::to_string(state.live_parameter_lists) +
                               " live parameter list(s); release them first");
    }
}

void quantize(rt_model* model, const Nf4Options& options) {
    ModelState& state = state_of(model);
    state.require_unpinned();
    require_no_parameter_lists(state);
    state.model->quantize_nf4(options);
}

}  // namespace

extern "C" {

rt_status rt_lora_config_init(rt_lora_config* config, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(config, struct_size, lora_config_minimum_size, default_lora_config(),
                          "config");
    });
}

rt_status rt_model_attach_lora(rt_model* model, const rt_lora_config* config) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        const rt_lora_config given =
            read_struct(config, lora_config_minimum_size, default_lora_config(), "config");
        if (given.reserved != 0 || given.reserved2 != 0 || given.reserved3 != 0) {
            throw std::invalid_argument(
                "config->reserved, config->reserved2 and config->reserved3 must be 0");
        }
        if ((given.targets & ~static_cast<uint64_t>(RT_LORA_TARGETS_KNOWN)) != 0) {
            throw std::invalid_argument("config->targets has bits outside 0x3FF (got " +
                                        std::to_string(given.targets) + ")");
        }
        state.require_unpinned();
        LoraConfig lora;
        lora.rank = to_size(given.rank, "config->rank");
        lora.alpha = given.alpha;
        lora.random_seed = given.random_seed;
        lora.targets = given.targets;
        lora.rank_stabilized = flag_from_value(given.rank_stabilized, "config->rank_stabilized");
        lora.dropout = given.dropout;  // the config's rules name it
        state.model->attach_lora(lora);
    });
}

rt_status rt_model_has_lora(const rt_model* model, int32_t* out) {
    return guarded(__func__,
                   [&] { set_output(out, state_of(model).model->lora_attached() ? 1 : 0, "out"); });
}

rt_status rt_model_lora_config(const rt_model* model, rt_lora_config* out) {
    return guarded(__func__, [&] {
        const LoraConfig& lora = state_of(model).model->lora_config();
        rt_lora_config value = default_lora_config();
        value.rank = lora.rank;
        value.alpha = lora.alpha;
        value.random_seed = lora.random_seed;
        value.targets = lora.targets;
        value.rank_stabilized = lora.rank_stabilized ? 1U : 0U;
        value.dropout = lora.dropout;
        write_struct(out, value, lora_config_minimum_size, "out");
    });
}

rt_status rt_model_lora_dropout_key(const rt_model* model, uint64_t* out) {
    return guarded(__func__,
                   [&] { set_output(out, state_of(model).model->lora_dropout_key(), "out"); });
}

rt_status rt_model_set_lora_dropout_key(rt_model* model, uint64_t key) {
    return guarded(__func__, [&] { state_of(model).model->set_lora_dropout_key(key); });
}

rt_status rt_model_lora_dropout_enabled(const rt_model* model, int32_t* out) {
    return guarded(__func__, [&] {
        set_output(out, state_of(model).model->lora_dropout_enabled() ? 1 : 0, "out");
    });
}

rt_status rt_model_set_lora_dropout_enabled(rt_model* model, int32_t enabled) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        if (enabled != 0 && enabled != 1) {
            throw std::invalid_argument("enabled must be 0 or 1 (got " + std::to_string(enabled) +
                                        ")");
        }
        state.model->set_lora_dropout_enabled(enabled == 1);
    });
}

rt_status rt_model_lora_parameters(rt_model* model, rt_parameter_list** out) {
    return guarded(__func__, [&] {
        const rt_model& native = require_handle(model, "model");
        require_pointer(out, "out");
        if (!native.state->model->lora_attached()) {
            throw std::logic_error("the model has no attached LoRA adapter");
        }
        *out = new rt_parameter_list(native.state, native.state->model->lora_parameters(), true);
    });
}

rt_status rt_model_merge_lora(rt_model* model) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        if (state.model->lora_attached()) {  // the model's own rules name the other cases
            state.require_unpinned();
            if (state.live_adapter_lists != 0) {
                throw std::logic_error("the model is pinned by " +
                                       std::to_string(state.live_adapter_lists) +
                                       " live adapter parameter list(s); release them first");
            }
        }
        state.model->merge_lora();
        ++state.parameter_epoch;
    });
}

rt_status rt_model_untie_embeddings(rt_model* model) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        state.require_unpinned();
        require_no_parameter_lists(state);  // they list the base parameters, which gain the head
        state.model->untie_embeddings();
        state.config.tie_embeddings = 0;
        state.llama_config.tie_embeddings = 0;
        ++state.parameter_epoch;
    });
}

rt_status rt_model_quantize_linear_weights_nf4(rt_model* model, uint64_t block_size) {
    return guarded(__func__, [&] {
        quantize(model, {.block_size = to_size(block_size, "block_size"),
                         .double_quantization = false,
                         .scale_block_size = 0});
    });
}

rt_status rt_model_quantize_linear_weights_nf4_double_quantized(rt_model* model,
                                                                uint64_t block_size,
                                                                uint64_t scale_block_size) {
    return guarded(__func__, [&] {
        quantize(model, {.block_size = to_size(block_size, "block_size"),
                         .double_quantization = true,
                         .scale_block_size = to_size(scale_block_size, "scale_block_size")});
    });
}

rt_status rt_model_quantize_linear_weights(rt_model* model, int32_t format) {
    return guarded(__func__, [&] {
        const auto chosen = static_cast<WeightFormat>(format);
        if (format < 0 || format > 255 || !is_block_weight_format(chosen)) {
            throw std::invalid_argument("format " + std::to_string(format) +
                                        " is not a block format (RT_WEIGHT_FORMAT_Q8_0, _Q4_0, "
                                        "_Q4_1, _Q5_0, _F16 or _BF16; "
                                        "NF4 has its own functions, which take its block sizes)");
        }
        ModelState& state = state_of(model);
        state.require_unpinned();
        require_no_parameter_lists(state);
        state.model->quantize_blocks(chosen);
    });
}

rt_status rt_model_linear_weight_format(const rt_model* model, int32_t* out) {
    return guarded(__func__, [&] {
        const CausalLanguageModel& language_model = *state_of(model).model;
        int32_t format = -1;
        if (language_model.has_quantized_weights()) {
            const std::vector<QuantizedWeight> state = language_model.packed_quantized_state();
            format = static_cast<int32_t>(state.front().format());
            for (const QuantizedWeight& weight : state) {
                if (static_cast<int32_t>(weight.format()) != format)
                    format = -2;  // a file that stores its tensors in several formats
            }
        }
        set_output(out, format, "out");
    });
}

rt_status rt_model_has_quantized_linear_weights(const rt_model* model, int32_t* out) {
    return guarded(__func__, [&] {
        set_output(out, state_of(model).model->has_quantized_weights() ? 1 : 0, "out");
    });
}

rt_status rt_model_quantized_memory_stats(const rt_model* model, rt_quantized_memory_stats* out) {
    return guarded(__func__, [&] {
        const QuantizedMemoryUsage usage = state_of(model).model->quantized_memory_usage();
        rt_quantized_memory_stats value{};
        value.struct_size = sizeof(rt_quantized_memory_stats);
        value.weight_count = usage.weight_count;
        value.packed_code_bytes = usage.packed_code_bytes;
        value.scale_bytes = usage.scale_bytes;
        value.logical_payload_bytes = usage.logical_payload_bytes;
        value.resident_payload_bytes = usage.resident_payload_bytes;
        value.fp32_equivalent_bytes = usage.fp32_equivalent_bytes;
        value.fp32_scale_bytes = usage.fp32_scale_bytes;
        value.scale_code_bytes = usage.scale_code_bytes;
        value.second_level_scale_bytes = usage.second_level_scale_bytes;
        value.scale_offset_bytes = usage.scale_offset_bytes;
        value.double_quantized_weight_count = usage.double_quantized_weight_count;
        write_struct(out, value, sizeof(rt_quantized_memory_stats), "out");
    });
}

rt_status rt_model_packed_state_size(const rt_model* model, uint64_t* out_size) {
    return guarded(__func__, [&] {
        const std::vector<QuantizedWeight> weights =
            state_of(model).model->packed_quantized_state();
        set_output(out_size, packed_state_size(weights), "out_size");
    });
}

rt_status rt_model_packed_state_copy(const rt_model* model, uint8_t* out, uint64_t capacity,
                                     uint64_t* required) {
    return guarded(__func__, [&] {
        const std::vector<QuantizedWeight> weights =
            state_of(model).model->packed_quantized_state();
        if (!begin_output(out, capacity, required, packed_state_size(weights))) {
            return;  // size query
        }
        const std::vector<std::uint8_t> bytes = encode_packed_state(weights);
        std::copy(bytes.begin(), bytes.end(), out);
    });
}

rt_status rt_model_packed_state_load(rt_model* model, const uint8_t* bytes, uint64_t count) {
    return guarded(__func__, [&] {
        ModelState& state = state_of(model);
        const auto given = input_array(bytes, count, "bytes");
        if (!state.model->has_quantized_weights()) {
            throw std::logic_error("the model's weights are not packed (quantize first)");
        }
        state.require_no_live_graph();
        const ExecutionBackend backend = state.model->backend();
        std::vector<PackedWeightPayload> payloads = decode_packed_state(given);
        std::vector<QuantizedWeight> weights;
        weights.reserve(payloads.size());
        const std::vector<AdaptableProjection>& projections = state.model->projections();
        for (std::size_t i = 0; i < payloads.size(); ++i) {
            const std::string where =
                "packed state weight " + std::to_string(i) +
                (i < projections.size() ? " (" + projections[i].path + ")" : std::string()) + ": ";
            try {
                weights.push_back(upload_packed_payload(std::move(payloads[i]), backend));
            } catch (const std::overflow_error& error) {
                throw std::overflow_error(where + error.what());
            } catch (const std::invalid_argument& error) {
                throw std::invalid_argument(where + error.what());
            }
        }
        state.model->load_packed_quantized_state(weights);
        ++state.parameter_epoch;
    });
}

}  // extern "C"
