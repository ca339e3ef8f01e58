// KV-cached decoding through the C ABI (docs/ARCHITECTURE.md, 'Decoding and KV caches' and
// 'The C ABI'): decode sessions with a private or a shared cache, batched prefill, the batched step
// of several sessions, and the shared pool. Sessions pin their model (ModelState::live_sessions)
// and record its parameter epoch; every output is checked before a session changes.

#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/serving/sampling.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

constexpr rt_decode_session_options default_session_options() {
    rt_decode_session_options options{};
    options.struct_size = sizeof(rt_decode_session_options);
    options.kind = RT_KV_CACHE_PAGED;
    options.block_size = default_key_value_block_size;
    return options;
}

// Before 2.15 the pool options ended at block_count (prefix_caching then reads 0).
constexpr std::size_t pool_options_size_2_14 = offsetof(rt_kv_cache_pool_options, prefix_caching);

constexpr rt_kv_cache_pool_options default_pool_options() {
    rt_kv_cache_pool_options options{};
    options.struct_size = sizeof(rt_kv_cache_pool_options);
    options.block_size = default_key_value_block_size;
    return options;
}

KeyValueCacheKind cache_kind_from(std::int32_t value) {
    if (value != RT_KV_CACHE_CONTIGUOUS && value != RT_KV_CACHE_PAGED) {
        throw std::invalid_argument("options->kind " + std::to_string(value) +
                                    " is not a KV cache kind (RT_KV_CACHE_CONTIGUOUS 0, "
                                    "RT_KV_CACHE_PAGED 1)");
    }
    return static_cast<KeyValueCacheKind>(value);
}

CausalLanguageModel& model_of(ModelState& state) {
    if (!state.model) {
        throw std::invalid_argument("model is not a decoder-only transformer handle");
    }
    return *state.model;
}

// A session that may step: its model's parameters are those its cache was built from.
rt_decode_session& current_session(rt_decode_session* handle, const char* argument) {
    rt_decode_session& native = require_handle(handle, argument);
    if (native.state->parameter_epoch != native.epoch) {
        throw std::logic_error(std::string(argument) +
                               " is stale: the model's parameters changed after it was created");
    }
    return native;
}

std::size_t vocabulary_of(const rt_decode_session& native) {
    return native.session->model().vocabulary_size();
}

// The logits output of step and prefill: non-NULL, capacity >= V (after *required = V).
// (No size query: *required is set, then a NULL logits is RT_STATUS_INVALID_ARGUMENT.)
void require_logits_output(float* logits, std::uint64_t capacity, std::uint64_t* required,
                           std::size_t count) {
    if (logits == nullptr) {
        require_pointer(required, "required");
        *required = count;
        throw std::invalid_argument("logits is NULL: a step writes " + std::to_string(count) +
                                    " logits and has no size query");
    }
    static_cast<void>(begin_output(logits, capacity, required, count));
}

}  // namespace

namespace {

constexpr rt_sampling_options default_sampling_options() {
    rt_sampling_options options{};
    options.struct_size = sizeof(rt_sampling_options);
    options.top_p = 1.0;
    options.repetition_penalty = 1.0;
    return options;
}

SamplingOptions sampling_options_of(const rt_sampling_options& given) {
    return {.temperature = given.temperature,
            .top_k = to_size(given.top_k, "options->top_k"),
            .top_p = given.top_p,
            .min_p = given.min_p,
            .repetition_penalty = given.repetition_penalty,
            .presence_penalty = given.presence_penalty,
            .frequency_penalty = given.frequency_penalty,
            .seed = given.seed};
}

std::size_t vocabulary_size_of(std::uint64_t vocabulary) {
    if (vocabulary == 0) {
        throw std::invalid_argument("vocabulary must be positive");
    }
    if (vocabulary - 1 > std::numeric_limits<std::uint32_t>::max()) {
        throw std::overflow_error("vocabulary " + std::to_string(vocabulary) +
                                  " does not fit uint32 ids");
    }
    return to_size(vocabulary, "vocabulary");
}

}  // namespace

namespace {

// The work of one batched step, every argument checked (rt_decode_sessions_step's rules).
std::vector<DecodeWork> step_work(rt_decode_session* const* sessions, uint64_t session_count,
                                  const uint32_t* tokens, const uint64_t* token_counts,
                                  uint64_t token_total) {
    const auto handles = input_array(sessions, session_count, "sessions");
    const auto counts = input_array(token_counts, session_count, "token_counts");
    const auto given = input_array(tokens, token_total, "tokens");
    if (handles.empty()) {
        throw std::invalid_argument("session_count must be positive");
    }
    std::vector<DecodeWork> work;
    work.reserve(handles.size());
    std::uint64_t used = 0;
    for (std::size_t i = 0; i < handles.size(); ++i) {
        const std::string argument = "sessions[" + std::to_string(i) + "]";
        rt_decode_session& native = current_session(handles[i], argument.c_str());
        if (native.state != require_handle(handles[0], "sessions[0]").state) {
            throw std::invalid_argument(argument +
                                        " is a session of another model than "
                                        "sessions[0]");
        }
        if (counts[i] == 0 || counts[i] > token_total - used) {
            throw std::invalid_argument(
                "token_counts[" + std::to_string(i) + "] = " + std::to_string(counts[i]) +
                " must be positive and within token_total " + std::to_string(token_total) + " (" +
                std::to_string(used) + " used before it)");
        }
        work.push_back({native.session.get(), given.subspan(static_cast<std::size_t>(used),
                                                            static_cast<std::size_t>(counts[i]))});
        used += counts[i];
    }
    if (used != token_total) {
        throw std::invalid_argument("token_counts sum to " + std::to_string(used) +
                                    " but token_total is " + std::to_string(token_total));
    }
    return work;
}

}  // namespace

extern "C" {

rt_status rt_decode_session_options_init(rt_decode_session_options* options, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, sizeof(rt_decode_session_options),
                          default_session_options(), "options");
    });
}

rt_status rt_model_decode_session_create(rt_model* model, const rt_decode_session_options* options,
                                         rt_decode_session** out) {
    return guarded(__func__, [&] {
        const std::shared_ptr<ModelState>& state = require_handle(model, "model").state;
        require_pointer(out, "out");
        const rt_decode_session_options given =
            options == nullptr ? default_session_options()
                               : read_struct(options, sizeof(rt_decode_session_options),
                                             default_session_options(), "options");
        if (given.reserved != 0) {
            throw std::invalid_argument("options->reserved must be 0");
        }
        const KeyValueCacheKind kind = cache_kind_from(given.kind);
        auto session = std::make_unique<DecodeSession>(
            model_of(*state), kind, to_size(given.block_size, "options->block_size"));
        *out = new rt_decode_session(state, nullptr, std::move(session));
    });
}

void rt_decode_session_release(rt_decode_session* session) {
    delete session;
}

rt_status rt_decode_session_step(rt_decode_session* session, uint32_t token, float* logits,
                                 uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        rt_decode_session& native = current_session(session, "session");
        require_logits_output(logits, capacity, required, vocabulary_of(native));
        const Tensor values = native.session->decode_token(token);
        values.copy_to_host({logits, vocabulary_of(native)});
    });
}

rt_status rt_decode_session_prefill(rt_decode_session* session, const uint32_t* tokens,
                                    uint64_t count, float* logits, uint64_t capacity,
                                    uint64_t* required) {
    return guarded(__func__, [&] {
        rt_decode_session& native = current_session(session, "session");
        const auto given = input_array(tokens, count, "tokens");
        if (given.empty()) {
            throw std::invalid_argument("count must be positive");
        }
        require_logits_output(logits, capacity, required, vocabulary_of(native));
        const Tensor values = native.session->prefill(given);
        values.copy_to_host({logits, vocabulary_of(native)});
    });
}

rt_status rt_decode_session_reset(rt_decode_session* session) {
    return guarded(__func__, [&] { require_handle(session, "session").session->reset(); });
}

rt_status rt_decode_session_size(const rt_decode_session* session, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(session, "session").session->size(), "out");
    });
}

rt_status rt_decode_session_capacity(const rt_decode_session* session, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(session, "session").session->capacity(), "out");
    });
}

rt_status rt_decode_session_cache_kind(const rt_decode_session* session, int32_t* out) {
    return guarded(__func__, [&] {
        set_output(
            out,
            static_cast<std::int32_t>(require_handle(session, "session").session->cache_kind()),
            "out");
    });
}

rt_status rt_decode_session_block_size(const rt_decode_session* session, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(session, "session").session->block_size(), "out");
    });
}

rt_status rt_kv_cache_pool_options_init(rt_kv_cache_pool_options* options, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, pool_options_size_2_14, default_pool_options(),
                          "options");
    });
}

rt_status rt_model_kv_cache_pool_create(rt_model* model, const rt_kv_cache_pool_options* options,
                                        rt_kv_cache_pool** out) {
    return guarded(__func__, [&] {
        const std::shared_ptr<ModelState>& state = require_handle(model, "model").state;
        require_pointer(out, "out");
        const rt_kv_cache_pool_options given =
            options == nullptr
                ? default_pool_options()
                : read_struct(options, pool_options_size_2_14, default_pool_options(), "options");
        if (given.prefix_caching > 1) {
            throw std::invalid_argument("options->prefix_caching " +
                                        std::to_string(given.prefix_caching) +
                                        " is not 0 (off) or 1 (on)");
        }
        auto pool = make_key_value_cache_pool(
            model_of(*state), to_size(given.block_size, "options->block_size"),
            to_size(given.block_count, "options->block_count"), given.prefix_caching == 1);
        *out = new rt_kv_cache_pool{state, std::move(pool)};
    });
}

void rt_kv_cache_pool_release(rt_kv_cache_pool* pool) {
    delete pool;
}

rt_status rt_kv_cache_pool_session_create(rt_kv_cache_pool* pool, rt_decode_session** out) {
    return guarded(__func__, [&] {
        rt_kv_cache_pool& native = require_handle(pool, "pool");
        require_pointer(out, "out");
        auto session = std::make_unique<DecodeSession>(model_of(*native.state), native.pool);
        // Prefixes are shared only among sessions that saw the same parameter values.
        session->set_prefix_namespace(native.state->parameter_epoch);
        *out = new rt_decode_session(native.state, native.pool, std::move(session));
    });
}

rt_status rt_kv_cache_pool_block_size(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(
        __func__, [&] { set_output(out, require_handle(pool, "pool").pool->block_size(), "out"); });
}

rt_status rt_kv_cache_pool_block_count(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->block_count(), "out");
    });
}

rt_status rt_kv_cache_pool_blocks_per_full_cache(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->blocks_per_full_cache(), "out");
    });
}

rt_status rt_kv_cache_pool_free_block_count(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->free_block_count(), "out");
    });
}

rt_status rt_kv_cache_pool_leased_block_count(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->leased_block_count(), "out");
    });
}

rt_status rt_kv_cache_pool_cached_block_count(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->cached_block_count(), "out");
    });
}

rt_status rt_kv_cache_pool_clear_prefix_cache(rt_kv_cache_pool* pool) {
    return guarded(__func__, [&] { require_handle(pool, "pool").pool->clear_prefix_cache(); });
}

rt_status rt_kv_cache_pool_admission(const rt_kv_cache_pool* pool, uint64_t token_budget,
                                     int32_t* out) {
    return guarded(__func__, [&] {
        const KeyValueCachePool& native = *require_handle(pool, "pool").pool;
        require_pointer(out, "out");
        const std::size_t blocks = native.blocks_for(to_size(token_budget, "token_budget"));
        *out = static_cast<int32_t>(native.admission(blocks));
    });
}

rt_status rt_kv_cache_pool_session_create_reserved(rt_kv_cache_pool* pool, uint64_t token_budget,
                                                   rt_decode_session** out) {
    return guarded(__func__, [&] {
        rt_kv_cache_pool& native = require_handle(pool, "pool");
        require_pointer(out, "out");
        auto session = std::make_unique<DecodeSession>(model_of(*native.state), native.pool,
                                                       to_size(token_budget, "token_budget"));
        session->set_prefix_namespace(native.state->parameter_epoch);
        *out = new rt_decode_session(native.state, native.pool, std::move(session));
    });
}

rt_status rt_kv_cache_pool_reserved_block_count(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->reserved_block_count(), "out");
    });
}

rt_status rt_kv_cache_pool_available_block_count(const rt_kv_cache_pool* pool, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(pool, "pool").pool->available_block_count(), "out");
    });
}

rt_status rt_decode_session_reserved_block_count(const rt_decode_session* session, uint64_t* out) {
    return guarded(__func__, [&] {
        set_output(out, require_handle(session, "session").session->cache().reserved_pages(),
                   "out");
    });
}

rt_status rt_decode_session_reuse_prefix(rt_decode_session* session, const uint32_t* prompt,
                                         uint64_t count, uint64_t* reused) {
    return guarded(__func__, [&] {
        rt_decode_session& native = current_session(session, "session");
        const auto given = input_array(prompt, count, "prompt");
        require_pointer(reused, "reused");
        *reused = native.session->reuse_prefix(given);
    });
}

rt_status rt_decode_sessions_step(rt_decode_session* const* sessions, uint64_t session_count,
                                  const uint32_t* tokens, const uint64_t* token_counts,
                                  uint64_t token_total, float* logits, uint64_t capacity,
                                  uint64_t* required) {
    return guarded(__func__, [&] {
        const std::vector<DecodeWork> work =
            step_work(sessions, session_count, tokens, token_counts, token_total);
        const std::size_t vocabulary = work[0].session->model().vocabulary_size();
        require_logits_output(logits, capacity, required, work.size() * vocabulary);
        const Tensor values = decode_batch(work);
        values.copy_to_host({logits, work.size() * vocabulary});
    });
}

rt_status rt_decode_sessions_step_sample(rt_decode_session* const* sessions, uint64_t session_count,
                                         const uint32_t* tokens, const uint64_t* token_counts,
                                         uint64_t token_total, const rt_sampling_row* rows,
                                         uint32_t* ids, uint8_t* sampled, double* log_probabilities,
                                         uint32_t* top_ids, double* top_log_probabilities) {
    return guarded(__func__, [&] {
        const std::vector<DecodeWork> work =
            step_work(sessions, session_count, tokens, token_counts, token_total);
        const std::size_t vocabulary = work[0].session->model().vocabulary_size();
        const auto given = input_array(rows, session_count, "rows");
        require_pointer(ids, "ids");
        require_pointer(sampled, "sampled");
        std::vector<RowSampling> plan(given.size());
        bool wants_log_probability = false;
        bool wants_top = false;
        for (std::size_t i = 0; i < given.size(); ++i) {
            const std::string name = "rows[" + std::to_string(i) + "]";
            const rt_sampling_row row =
                read_struct(&given[i], sizeof(rt_sampling_row), rt_sampling_row{}, name.c_str());
            if (row.reserved != 0 || row.sample > 1 || row.log_probability > 1) {
                throw std::invalid_argument(name +
                                            ": sample and log_probability are 0 or 1 and "
                                            "reserved must be 0");
            }
            if (row.top_count > RT_MAX_TOP_LOGPROBS) {
                throw std::invalid_argument(name + ": top_count " + std::to_string(row.top_count) +
                                            " exceeds RT_MAX_TOP_LOGPROBS (20)");
            }
            RowSampling& entry = plan[i];
            const rt_sampling_options options =
                row.options == nullptr
                    ? default_sampling_options()
                    : read_struct(row.options, sizeof(rt_sampling_options),
                                  default_sampling_options(), (name + ".options").c_str());
            entry.options = sampling_options_of(options);
            entry.input.context = input_array(row.context, row.context_count, "context");
            entry.input.prompt_length = to_size(row.prompt_length, "prompt_length");
            entry.vocabulary_limit = to_size(row.vocabulary_limit, "vocabulary_limit");
            if (row.mask != nullptr) {
                entry.input.mask = {
                    row.mask, entry.vocabulary_limit == 0 ? vocabulary : entry.vocabulary_limit};
            }
            entry.input.draw_index = row.draw_index;
            entry.sample = row.sample == 1;
            entry.log_probability = row.log_probability == 1;
            entry.top_count = row.top_count;
            wants_log_probability = wants_log_probability || entry.log_probability;
            wants_top = wants_top || entry.top_count != 0;
        }
        if (wants_log_probability) {
            require_pointer(log_probabilities, "log_probabilities");
        }
        if (wants_top) {
            require_pointer(top_ids, "top_ids");
            require_pointer(top_log_probabilities, "top_log_probabilities");
        }
        require_row_samplings(plan, vocabulary);
        const Tensor values = decode_batch(work);
        std::vector<float> host(work.size() * vocabulary);
        values.copy_to_host(host);
        const std::vector<RowSample> results = sample_rows(host, vocabulary, plan);
        for (std::size_t i = 0; i < results.size(); ++i) {
            const RowSample& result = results[i];
            if (result.failed) {
                throw std::bad_alloc();  // the step happened; the caller sees out of memory
            }
            sampled[i] = !result.finite ? 2 : (plan[i].sample ? 1 : 0);
            ids[i] = sampled[i] == 1 ? result.token : 0;
            if (sampled[i] != 1) {
                continue;
            }
            if (plan[i].log_probability) {
                log_probabilities[i] = result.log_probabilities.log_probability;
            }
            for (std::size_t j = 0; j < plan[i].top_count; ++j) {
                top_ids[i * RT_MAX_TOP_LOGPROBS + j] = result.log_probabilities.top_ids[j];
                top_log_probabilities[i * RT_MAX_TOP_LOGPROBS + j] =
                    result.log_probabilities.top_log_probabilities[j];
            }
        }
    });
}

rt_status rt_f32_rows_argmax(const float* values, uint64_t rows, uint64_t width, uint32_t* argmax,
                             uint8_t* finite) {
    return guarded(__func__, [&] {
        if (width == 0) {
            throw std::invalid_argument("width must be positive");
        }
        if (width - 1 > std::numeric_limits<std::uint32_t>::max()) {
            throw std::overflow_error("width " + std::to_string(width) +
                                      " does not fit uint32 indices");
        }
        if (rows > std::numeric_limits<std::uint64_t>::max() / width) {
            throw std::overflow_error("rows * width overflows (" + std::to_string(rows) + " x " +
                                      std::to_string(width) + ")");
        }
        const auto given = input_array(values, rows * width, "values");
        for (std::uint64_t r = 0; r < rows; ++r) {
            const float* row = given.data() + r * width;
            std::uint32_t best = 0;
            bool all_finite = std::isfinite(row[0]);
            bool have = !std::isnan(row[0]);
            for (std::uint64_t i = 1; i < width; ++i) {
                const float value = row[i];
                all_finite = all_finite && std::isfinite(value);
                if (!std::isnan(value) && (!have || value > row[best])) {
                    best = static_cast<std::uint32_t>(i);
                    have = true;
                }
            }
            if (argmax != nullptr) {
                argmax[r] = best;
            }
            if (finite != nullptr) {
                finite[r] = all_finite ? 1 : 0;
            }
        }
    });
}

}  // extern "C"

rt_status rt_sampling_options_init(rt_sampling_options* options, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, sizeof(rt_sampling_options),
                          default_sampling_options(), "options");
    });
}

rt_status rt_sample_f32_row(const float* logits, uint64_t vocabulary,
                            const rt_sampling_options* options, const uint32_t* context,
                            uint64_t context_count, uint64_t prompt_length, const uint8_t* mask,
                            uint64_t draw_index, uint32_t* token) {
    return guarded(__func__, [&] {
        const std::size_t width = vocabulary_size_of(vocabulary);
        const rt_sampling_options given = options == nullptr
                                              ? default_sampling_options()
                                              : read_struct(options, sizeof(rt_sampling_options),
                                                            default_sampling_options(), "options");
        require_pointer(token, "token");
        SamplingInput input;
        input.logits = input_array(logits, width, "logits");
        input.context = input_array(context, context_count, "context");
        input.prompt_length = to_size(prompt_length, "prompt_length");
        if (mask != nullptr) {
            input.mask = {mask, width};
        }
        input.draw_index = draw_index;
        *token = sample_token(input, sampling_options_of(given));
    });
}

rt_status rt_f32_row_log_probabilities(const float* logits, uint64_t vocabulary, uint32_t token,
                                       uint64_t top_count, double* log_probability,
                                       uint32_t* top_ids, double* top_log_probabilities) {
    return guarded(__func__, [&] {
        const std::size_t width = vocabulary_size_of(vocabulary);
        const auto given = input_array(logits, width, "logits");
        require_pointer(log_probability, "log_probability");
        if (top_count != 0) {
            require_pointer(top_ids, "top_ids");
            require_pointer(top_log_probabilities, "top_log_probabilities");
        }
        const TokenLogProbabilities result =
            token_log_probabilities(given, token, to_size(top_count, "top_count"));
        *log_probability = result.log_probability;
        std::copy(result.top_ids.begin(), result.top_ids.end(), top_ids);
        std::copy(result.top_log_probabilities.begin(), result.top_log_probabilities.end(),
                  top_log_probabilities);
    });
}
