/*
 * KV-cached decoding as a pure C11 client sees it: session steps against the full forward at
 * every position, prefill against steps, paged against contiguous, a shared pool and the
 * batched step, the output protocol, every argument rule with the state left unchanged, the
 * pinning rules, and sessions outliving their model handle.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_fixtures.h"
#include "c_test_support.h"

#define V TINY_VOCABULARY
#define C TINY_CONTEXT

static const uint32_t sequence[C] = {3, 1, 4, 1, 5, 9, 2, 6};

static char untouched_marker;
#define untouched ((rt_decode_session*)(void*)&untouched_marker)

/* Logits [C, V] of one full forward over `sequence`. */
static void full_forward(rt_model* model, float* out) {
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, sequence, C, 1, C, &logits));
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, out, C * V, &required));
    rt_variable_release(logits);
}

static double max_difference(const float* a, const float* b, size_t count) {
    double worst = 0.0;
    for (size_t i = 0; i < count; ++i) {
        const double d = fabs((double)a[i] - (double)b[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static rt_decode_session* session_of(rt_model* model, int32_t kind, uint64_t block_size) {
    rt_decode_session_options options;
    EXPECT_OK(rt_decode_session_options_init(&options, sizeof options));
    options.kind = kind;
    options.block_size = block_size;
    rt_decode_session* session = NULL;
    EXPECT_OK(rt_model_decode_session_create(model, &options, &session));
    return session;
}

static void steps_equal_the_full_forward(void) {
    rt_model* model = create_tiny_model();
    float expected[C * V];
    full_forward(model, expected);
    rt_decode_session* paged = session_of(model, RT_KV_CACHE_PAGED, 3);
    rt_decode_session* contiguous = session_of(model, RT_KV_CACHE_CONTIGUOUS, 0);
    for (uint32_t t = 0; t < C; ++t) {
        float a[V];
        float b[V];
        uint64_t required = 0;
        EXPECT_OK(rt_decode_session_step(paged, sequence[t], a, V, &required));
        EXPECT_EQ_U64(required, V);
        EXPECT_OK(rt_decode_session_step(contiguous, sequence[t], b, V, &required));
        EXPECT(max_difference(a, expected + t * V, V) <= 1e-5);
        EXPECT(memcmp(a, b, sizeof a) == 0); /* paged and contiguous: identical */
    }
    uint64_t value = 0;
    EXPECT_OK(rt_decode_session_size(paged, &value));
    EXPECT_EQ_U64(value, C);
    EXPECT_OK(rt_decode_session_capacity(paged, &value));
    EXPECT_EQ_U64(value, C);
    EXPECT_OK(rt_decode_session_block_size(paged, &value));
    EXPECT_EQ_U64(value, 3);
    EXPECT_OK(rt_decode_session_block_size(contiguous, &value));
    EXPECT_EQ_U64(value, C);
    int32_t kind = -1;
    EXPECT_OK(rt_decode_session_cache_kind(contiguous, &kind));
    EXPECT(kind == RT_KV_CACHE_CONTIGUOUS);
    EXPECT_OK(rt_decode_session_cache_kind(paged, &kind));
    EXPECT(kind == RT_KV_CACHE_PAGED);
    /* Full: out of range, size unchanged; reset starts over. */
    float logits[V];
    uint64_t required = 0;
    EXPECT_STATUS(rt_decode_session_step(paged, 1, logits, V, &required), RT_STATUS_OUT_OF_RANGE);
    EXPECT_LAST_ERROR_MENTIONS("never rolls over");
    EXPECT_OK(rt_decode_session_size(paged, &value));
    EXPECT_EQ_U64(value, C);
    EXPECT_OK(rt_decode_session_reset(paged));
    EXPECT_OK(rt_decode_session_size(paged, &value));
    EXPECT_EQ_U64(value, 0);
    EXPECT_OK(rt_decode_session_prefill(paged, sequence, C, logits, V, &required));
    EXPECT(max_difference(logits, expected + (C - 1) * V, V) <= 1e-5);
    rt_decode_session_release(paged);
    rt_decode_session_release(contiguous);
    rt_model_release(model);
}

static void argument_rules_change_nothing(void) {
    rt_model* model = create_tiny_model();
    rt_decode_session* session = session_of(model, RT_KV_CACHE_PAGED, 4);
    float logits[V];
    uint64_t required = 0;
    EXPECT_OK(rt_decode_session_step(session, 2, logits, V, &required));
    float before[V];
    memcpy(before, logits, sizeof logits);
    EXPECT_STATUS(rt_decode_session_step(session, V, logits, V, &required), RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(rt_decode_session_step(session, 1, logits, V - 1, &required),
                  RT_STATUS_OUT_OF_RANGE);
    required = 0;
    EXPECT_STATUS(rt_decode_session_step(session, 1, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(required, V); /* no size query, but *required says what is needed */
    EXPECT_STATUS(rt_decode_session_step(session, 1, logits, V, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_session_step(NULL, 1, logits, V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_session_prefill(session, NULL, 0, logits, V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_session_prefill(session, NULL, 2, logits, V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_session_prefill(session, sequence, C, logits, V, &required),
                  RT_STATUS_OUT_OF_RANGE); /* 1 + 8 > 8 */
    EXPECT(memcmp(before, logits, sizeof logits) == 0);
    uint64_t size = 0;
    EXPECT_OK(rt_decode_session_size(session, &size));
    EXPECT_EQ_U64(size, 1);

    rt_decode_session_options options;
    EXPECT_OK(rt_decode_session_options_init(&options, sizeof options));
    EXPECT(options.kind == RT_KV_CACHE_PAGED && options.block_size == 16 && options.reserved == 0);
    rt_decode_session* out = untouched;
    options.kind = 7;
    EXPECT_STATUS(rt_model_decode_session_create(model, &options, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("options->kind 7");
    options.kind = RT_KV_CACHE_PAGED;
    options.reserved = 1;
    EXPECT_STATUS(rt_model_decode_session_create(model, &options, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    options.reserved = 0;
    options.block_size = 0;
    EXPECT_STATUS(rt_model_decode_session_create(model, &options, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    options.block_size = 4;
    options.struct_size = 8;
    EXPECT_STATUS(rt_model_decode_session_create(model, &options, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(out == untouched);
    EXPECT_STATUS(rt_model_decode_session_create(model, NULL, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_model_decode_session_create(model, NULL, &out)); /* defaults */
    uint64_t block = 0;
    EXPECT_OK(rt_decode_session_block_size(out, &block));
    EXPECT_EQ_U64(block, 16);
    rt_decode_session_release(out);
    rt_decode_session_release(NULL);
    rt_decode_session_release(session);
    rt_model_release(model);
}

static void shared_pool_and_batched_steps(void) {
    rt_model* model = create_tiny_model();
    float expected[C * V];
    full_forward(model, expected);
    rt_kv_cache_pool_options options;
    EXPECT_OK(rt_kv_cache_pool_options_init(&options, sizeof options));
    EXPECT_EQ_U64(options.block_size, 16);
    EXPECT_EQ_U64(options.block_count, 0);
    options.block_size = 2;
    options.block_count = 6; /* one context is 4 pages */
    rt_kv_cache_pool* pool = NULL;
    EXPECT_OK(rt_model_kv_cache_pool_create(model, &options, &pool));
    uint64_t value = 0;
    EXPECT_OK(rt_kv_cache_pool_blocks_per_full_cache(pool, &value));
    EXPECT_EQ_U64(value, 4);
    EXPECT_OK(rt_kv_cache_pool_block_count(pool, &value));
    EXPECT_EQ_U64(value, 6);
    EXPECT_OK(rt_kv_cache_pool_block_size(pool, &value));
    EXPECT_EQ_U64(value, 2);
    rt_decode_session* a = NULL;
    rt_decode_session* b = NULL;
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &a));
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &b));
    /* a: prefill 3 tokens; b: prefill 5 tokens, in one batched step. */
    rt_decode_session* both[2] = {a, b};
    uint32_t tokens[8];
    memcpy(tokens, sequence, 3 * sizeof *tokens);
    memcpy(tokens + 3, sequence, 5 * sizeof *tokens);
    const uint64_t counts[2] = {3, 5};
    float logits[2 * V];
    uint64_t required = 0;
    EXPECT_OK(rt_decode_sessions_step(both, 2, tokens, counts, 8, logits, 2 * V, &required));
    EXPECT_EQ_U64(required, 2 * V);
    EXPECT(max_difference(logits, expected + 2 * V, V) <= 1e-5);
    EXPECT(max_difference(logits + V, expected + 4 * V, V) <= 1e-5);
    EXPECT_OK(rt_kv_cache_pool_leased_block_count(pool, &value));
    EXPECT_EQ_U64(value, 5); /* 2 + 3 pages */
    /* Exhaustion: a needs 1 more page (position 4), b needs 1 more (positions 6..7), and only
     * 1 is free: nothing changes. */
    const uint32_t more[5] = {sequence[3], sequence[4], sequence[5], sequence[6], sequence[7]};
    const uint64_t more_counts[2] = {2, 3};
    EXPECT_STATUS(rt_decode_sessions_step(both, 2, more, more_counts, 5, logits, 2 * V, &required),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("pool exhausted");
    EXPECT_OK(rt_decode_session_size(a, &value));
    EXPECT_EQ_U64(value, 3);
    EXPECT_OK(rt_kv_cache_pool_free_block_count(pool, &value));
    EXPECT_EQ_U64(value, 1);
    /* Argument rules. */
    const uint64_t bad_counts[2] = {0, 5};
    EXPECT_STATUS(rt_decode_sessions_step(both, 2, more, bad_counts, 5, logits, 2 * V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_sessions_step(both, 2, more, more_counts, 4, logits, 2 * V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_sessions_step(both, 2, more, more_counts, 5, logits, V, &required),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(rt_decode_sessions_step(NULL, 0, NULL, NULL, 0, logits, 2 * V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    rt_decode_session* repeated[2] = {a, a};
    const uint64_t ones[2] = {1, 1};
    EXPECT_STATUS(rt_decode_sessions_step(repeated, 2, more, ones, 2, logits, 2 * V, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("repeats");
    EXPECT_OK(rt_decode_session_size(a, &value));
    EXPECT_EQ_U64(value, 3);
    /* A session with a private cache joins a batch of the pool's sessions. */
    rt_decode_session* private_session = session_of(model, RT_KV_CACHE_CONTIGUOUS, 0);
    rt_decode_session* mixed[2] = {private_session, b};
    const uint32_t firsts[2] = {sequence[0], sequence[5]};
    EXPECT_OK(rt_decode_sessions_step(mixed, 2, firsts, ones, 2, logits, 2 * V, &required));
    EXPECT(max_difference(logits, expected, V) <= 1e-5);
    EXPECT(max_difference(logits + V, expected + 5 * V, V) <= 1e-5);
    EXPECT_OK(rt_decode_session_size(b, &value));
    EXPECT_EQ_U64(value, 6);
    /* Releasing a session returns its pages; the pool outlives its handle while sessions live. */
    rt_decode_session_release(b);
    EXPECT_OK(rt_kv_cache_pool_free_block_count(pool, &value));
    EXPECT_EQ_U64(value, 4);
    rt_kv_cache_pool_release(pool);
    rt_model_release(model);
    float next[V];
    EXPECT_OK(rt_decode_session_step(a, sequence[3], next, V, &required));
    EXPECT(max_difference(next, expected + 3 * V, V) <= 1e-5);
    rt_decode_session_release(a);
    rt_decode_session_release(private_session);
    EXPECT_STATUS(rt_model_kv_cache_pool_create(NULL, NULL, &pool), RT_STATUS_INVALID_ARGUMENT);
}

static void sessions_pin_their_model(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* parameters = parameters_of(model);
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(parameters, NULL, &adam));
    rt_decode_session* session = session_of(model, RT_KV_CACHE_PAGED, 4);
    EXPECT_STATUS(rt_model_to(model, RT_BACKEND_CPU), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("decode session");
    EXPECT_STATUS(rt_model_quantize_linear_weights_nf4(model, 64), RT_STATUS_RUNTIME_ERROR);
    rt_lora_config lora;
    EXPECT_OK(rt_lora_config_init(&lora, sizeof lora));
    EXPECT_STATUS(rt_model_attach_lora(model, &lora), RT_STATUS_RUNTIME_ERROR);
    EXPECT_STATUS(rt_adam_step(adam, NULL), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("decode session");
    float* values = copy_parameter_values(parameters);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(parameters, values, total_numel(parameters)),
                  RT_STATUS_RUNTIME_ERROR);
    free(values);
    rt_decode_session_release(session);
    EXPECT_OK(rt_adam_step(adam, NULL)); /* unpinned again */
    rt_adam_release(adam);
    rt_parameter_list_release(parameters);
    EXPECT_OK(rt_model_attach_lora(model, &lora));
    rt_model_release(model);
}

static void rows_argmax(void) {
    const float values[4 * 3] = {1.0f,      3.0f,      3.0f,  /* a tie: the lowest index */
                                 NAN,       -1.0f,     -2.0f, /* NaN never wins */
                                 -INFINITY, -INFINITY, -INFINITY, 0.0f, INFINITY, 5.0f};
    uint32_t argmax[4] = {9, 9, 9, 9};
    uint8_t finite[4] = {9, 9, 9, 9};
    EXPECT_OK(rt_f32_rows_argmax(values, 4, 3, argmax, finite));
    EXPECT(argmax[0] == 1 && argmax[1] == 1 && argmax[2] == 0 && argmax[3] == 1);
    EXPECT(finite[0] == 1 && finite[1] == 0 && finite[2] == 0 && finite[3] == 0);
    EXPECT_OK(rt_f32_rows_argmax(values, 1, 3, NULL, finite)); /* either output optional */
    EXPECT_OK(rt_f32_rows_argmax(values, 1, 3, argmax, NULL));
    EXPECT_OK(rt_f32_rows_argmax(NULL, 0, 3, NULL, NULL));
    uint32_t kept = 7;
    EXPECT_STATUS(rt_f32_rows_argmax(values, 1, 0, &kept, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_f32_rows_argmax(NULL, 1, 3, &kept, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_f32_rows_argmax(values, UINT64_MAX, 2, &kept, NULL), RT_STATUS_OVERFLOW);
    EXPECT_STATUS(rt_f32_rows_argmax(values, 1, (uint64_t)1 << 33, &kept, NULL),
                  RT_STATUS_OVERFLOW);
    EXPECT(kept == 7);
}

static void prefix_caching_shares_pages_within_one_parameter_epoch(void) {
    rt_model* model = create_tiny_model();
    float expected[C * V];
    full_forward(model, expected);
    rt_kv_cache_pool_options options;
    EXPECT_OK(rt_kv_cache_pool_options_init(&options, sizeof options));
    EXPECT_EQ_U64(options.prefix_caching, 0);
    options.block_size = 2;
    options.block_count = 8;
    options.prefix_caching = 2;
    rt_kv_cache_pool* pool = (rt_kv_cache_pool*)&untouched_marker;
    EXPECT_STATUS(rt_model_kv_cache_pool_create(model, &options, &pool),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("options->prefix_caching 2");
    EXPECT(pool == (rt_kv_cache_pool*)&untouched_marker);
    /* A 2.14-sized struct (init and create) reads prefix_caching 0; a smaller one is refused. */
    options.prefix_caching = 1;
    options.struct_size = 16;
    EXPECT_STATUS(rt_model_kv_cache_pool_create(model, &options, &pool),
                  RT_STATUS_INVALID_ARGUMENT);
    rt_kv_cache_pool_options old_client;
    EXPECT_OK(rt_kv_cache_pool_options_init(&old_client, 24));
    EXPECT_EQ_U64(old_client.struct_size, 24);
    options.struct_size = 24;
    EXPECT_OK(rt_model_kv_cache_pool_create(model, &options, &pool));
    rt_decode_session* a = NULL;
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &a));
    float logits[C * V];
    uint64_t required = 0;
    EXPECT_OK(rt_decode_session_prefill(a, sequence, 6, logits, V, &required));
    rt_decode_session_release(a);
    uint64_t value = 9;
    EXPECT_OK(rt_kv_cache_pool_cached_block_count(pool, &value));
    EXPECT_EQ_U64(value, 0);
    rt_kv_cache_pool_release(pool);

    options.struct_size = sizeof options;
    EXPECT_OK(rt_model_kv_cache_pool_create(model, &options, &pool));
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &a));
    EXPECT_OK(rt_decode_session_prefill(a, sequence, 6, logits, V, &required));
    rt_decode_session_release(a); /* its 3 full pages stay cached */
    EXPECT_OK(rt_kv_cache_pool_cached_block_count(pool, &value));
    EXPECT_EQ_U64(value, 3);
    EXPECT_OK(rt_kv_cache_pool_free_block_count(pool, &value));
    EXPECT_EQ_U64(value, 8);
    rt_decode_session* b = NULL;
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &b));
    uint64_t reused = 0;
    EXPECT_OK(rt_decode_session_reuse_prefix(b, sequence, C, &reused));
    EXPECT_EQ_U64(reused, 6);
    EXPECT_OK(rt_decode_session_size(b, &value));
    EXPECT_EQ_U64(value, 6);
    EXPECT_OK(rt_decode_session_prefill(b, sequence + 6, 2, logits, V, &required));
    EXPECT(max_difference(logits, expected + 7 * V, V) <= 1e-5);
    /* Only an empty session adopts; bad arguments change nothing. */
    reused = 77;
    EXPECT_STATUS(rt_decode_session_reuse_prefix(b, sequence, C, &reused), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("empty session");
    EXPECT_EQ_U64(reused, 77);
    rt_decode_session* c = NULL;
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &c));
    const uint32_t bad[3] = {1, (uint32_t)V, 2};
    EXPECT_STATUS(rt_decode_session_reuse_prefix(c, bad, 3, &reused), RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(rt_decode_session_reuse_prefix(c, NULL, 3, &reused), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_decode_session_reuse_prefix(c, sequence, 3, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(reused, 77);
    EXPECT_OK(rt_decode_session_size(c, &value));
    EXPECT_EQ_U64(value, 0);
    rt_decode_session_release(c);
    rt_decode_session_release(b);
    /* New parameter values (an optimizer step, allowed once no session lives): the pages
     * computed with the old ones are never adopted. */
    rt_parameter_list* parameters = parameters_of(model);
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(parameters, NULL, &adam));
    EXPECT_OK(rt_adam_step(adam, NULL));
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &c));
    EXPECT_OK(rt_decode_session_reuse_prefix(c, sequence, C, &reused));
    EXPECT_EQ_U64(reused, 0);
    rt_decode_session_release(c);
    /* Clearing turns the cached pages into free ones. */
    EXPECT_OK(rt_kv_cache_pool_cached_block_count(pool, &value));
    EXPECT(value > 0);
    EXPECT_OK(rt_kv_cache_pool_clear_prefix_cache(pool));
    EXPECT_OK(rt_kv_cache_pool_cached_block_count(pool, &value));
    EXPECT_EQ_U64(value, 0);
    EXPECT_OK(rt_kv_cache_pool_free_block_count(pool, &value));
    EXPECT_EQ_U64(value, 8);
    EXPECT_STATUS(rt_kv_cache_pool_clear_prefix_cache(NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_kv_cache_pool_cached_block_count(pool, NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_adam_release(adam);
    rt_parameter_list_release(parameters);
    rt_kv_cache_pool_release(pool);
    rt_model_release(model);
}

static void sampling_rows(void) {
    /* Weights by id [1/3, 2/3, 1] at T = 1: draw_unit(0, 0) = 0.8833 -> threshold 1.767 -> id 2;
     * draw_unit(3, 0) = 0.1135 -> threshold 0.227 -> id 0. */
    const float thirds[3] = {0.0f, 0.69314718f, 1.09861229f};
    rt_sampling_options options;
    EXPECT_OK(rt_sampling_options_init(&options, sizeof options));
    EXPECT(options.temperature == 0.0 && options.top_p == 1.0 && options.min_p == 0.0);
    EXPECT(options.repetition_penalty == 1.0 && options.top_k == 0 && options.seed == 0);
    uint32_t token = 99;
    EXPECT_OK(rt_sample_f32_row(thirds, 3, NULL, NULL, 0, 0, NULL, 0, &token)); /* greedy */
    EXPECT_EQ_U64(token, 2);
    options.temperature = 1.0;
    options.seed = 3;
    EXPECT_OK(rt_sample_f32_row(thirds, 3, &options, NULL, 0, 0, NULL, 0, &token));
    EXPECT_EQ_U64(token, 0);
    const uint8_t mask[3] = {0, 1, 0};
    EXPECT_OK(rt_sample_f32_row(thirds, 3, &options, NULL, 0, 0, mask, 0, &token));
    EXPECT_EQ_U64(token, 1);
    const uint32_t context[2] = {2, 2};
    options.temperature = 0.0;
    options.seed = 0;
    options.frequency_penalty = 2.0; /* id 2: 1.0986 - 4 after two generated occurrences */
    EXPECT_OK(rt_sample_f32_row(thirds, 3, &options, context, 2, 0, NULL, 0, &token));
    EXPECT_EQ_U64(token, 1);
    /* Refusals leave *token alone. */
    token = 77;
    options.top_k = 5;
    EXPECT_STATUS(rt_sample_f32_row(thirds, 3, &options, NULL, 0, 0, NULL, 0, &token),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("greedy");
    options.top_k = 0;
    EXPECT_STATUS(rt_sample_f32_row(thirds, 0, &options, NULL, 0, 0, NULL, 0, &token),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_sample_f32_row(NULL, 3, &options, NULL, 0, 0, NULL, 0, &token),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_sample_f32_row(thirds, 3, &options, NULL, 2, 0, NULL, 0, &token),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_sample_f32_row(thirds, 3, &options, NULL, 0, 0, NULL, 0, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(token, 77);
    /* Log-probabilities: log(1/6), and the top two (ids 2, 1). */
    double logprob = 0.0;
    uint32_t top_ids[2] = {9, 9};
    double top[2] = {0.0, 0.0};
    EXPECT_OK(rt_f32_row_log_probabilities(thirds, 3, 0, 2, &logprob, top_ids, top));
    EXPECT(fabs(logprob - log(1.0 / 6.0)) < 1e-6);
    EXPECT(top_ids[0] == 2 && top_ids[1] == 1);
    EXPECT(fabs(top[0] - log(0.5)) < 1e-6 && fabs(top[1] - log(1.0 / 3.0)) < 1e-6);
    EXPECT_OK(rt_f32_row_log_probabilities(thirds, 3, 0, 0, &logprob, NULL, NULL));
    EXPECT_STATUS(rt_f32_row_log_probabilities(thirds, 3, 3, 0, &logprob, NULL, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_f32_row_log_probabilities(thirds, 3, 0, 2, &logprob, NULL, top),
                  RT_STATUS_INVALID_ARGUMENT);
}

static void reservations_are_the_pools_ledger(void) {
    rt_model* model = create_tiny_model(); /* C = 8 */
    rt_kv_cache_pool_options options;
    EXPECT_OK(rt_kv_cache_pool_options_init(&options, sizeof options));
    options.block_size = 2;
    options.block_count = 6; /* one context is 4 pages */
    rt_kv_cache_pool* pool = NULL;
    EXPECT_OK(rt_model_kv_cache_pool_create(model, &options, &pool));
    int32_t verdict = -1;
    EXPECT_OK(rt_kv_cache_pool_admission(pool, 100, &verdict)); /* capped at C: 4 pages */
    EXPECT(verdict == RT_KV_ADMIT);
    rt_decode_session* a = NULL;
    EXPECT_OK(rt_kv_cache_pool_session_create_reserved(pool, 8, &a));
    uint64_t value = 0;
    EXPECT_OK(rt_decode_session_reserved_block_count(a, &value));
    EXPECT_EQ_U64(value, 4);
    EXPECT_OK(rt_kv_cache_pool_reserved_block_count(pool, &value));
    EXPECT_EQ_U64(value, 4);
    EXPECT_OK(rt_kv_cache_pool_available_block_count(pool, &value));
    EXPECT_EQ_U64(value, 2);
    EXPECT_OK(rt_kv_cache_pool_admission(pool, 5, &verdict)); /* 3 pages: later */
    EXPECT(verdict == RT_KV_WAIT);
    rt_decode_session* b = (rt_decode_session*)&untouched_marker;
    EXPECT_STATUS(rt_kv_cache_pool_session_create_reserved(pool, 5, &b), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("pool full");
    EXPECT(b == (rt_decode_session*)&untouched_marker);
    EXPECT_STATUS(rt_kv_cache_pool_session_create_reserved(pool, 0, &b),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_kv_cache_pool_admission(pool, 5, NULL), RT_STATUS_INVALID_ARGUMENT);
    /* A session without a reservation takes only the 2 pages nobody was promised. */
    rt_decode_session* plain = NULL;
    EXPECT_OK(rt_kv_cache_pool_session_create(pool, &plain));
    float logits[V];
    uint64_t required = 0;
    EXPECT_OK(rt_decode_session_prefill(plain, sequence, 4, logits, V, &required));
    EXPECT_STATUS(rt_decode_session_step(plain, sequence[4], logits, V, &required),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("promised to sessions with reservations");
    /* The reserved session fills its whole context and then cannot pass it. */
    EXPECT_OK(rt_decode_session_prefill(a, sequence, C, logits, V, &required));
    rt_decode_session_release(plain);
    rt_decode_session_release(a);
    EXPECT_OK(rt_kv_cache_pool_reserved_block_count(pool, &value));
    EXPECT_EQ_U64(value, 0);
    EXPECT_OK(rt_kv_cache_pool_available_block_count(pool, &value));
    EXPECT_EQ_U64(value, 6);
    rt_kv_cache_pool_release(pool);
    rt_model_release(model);
}

static void steps_that_sample_on_the_library_side(void) {
    rt_model* model = create_tiny_model();
    /* The plain step's logits, from a twin pair of sessions, are the oracle. */
    rt_decode_session* twins[2] = {session_of(model, RT_KV_CACHE_PAGED, 4),
                                   session_of(model, RT_KV_CACHE_PAGED, 4)};
    rt_decode_session* pair[2] = {session_of(model, RT_KV_CACHE_PAGED, 4),
                                  session_of(model, RT_KV_CACHE_PAGED, 4)};
    const uint32_t tokens[5] = {3, 1, 4, 1, 5};
    const uint64_t counts[2] = {3, 2};
    float logits[2 * V];
    uint64_t required = 0;
    EXPECT_OK(rt_decode_sessions_step(twins, 2, tokens, counts, 5, logits, 2 * V, &required));
    rt_sampling_options sampled_options;
    EXPECT_OK(rt_sampling_options_init(&sampled_options, sizeof sampled_options));
    sampled_options.temperature = 0.9;
    sampled_options.top_p = 0.8;
    sampled_options.seed = 42;
    rt_sampling_row rows[2];
    memset(rows, 0, sizeof rows);
    rows[0].struct_size = sizeof rows[0];
    rows[0].sample = 1; /* greedy */
    rows[0].log_probability = 1;
    rows[0].top_count = 3;
    rows[1].struct_size = sizeof rows[1];
    rows[1].options = &sampled_options;
    rows[1].draw_index = 7;
    rows[1].sample = 1;
    uint32_t ids[2] = {99, 99};
    uint8_t sampled[2] = {9, 9};
    double logprobs[2] = {0.0, 0.0};
    uint32_t top_ids[2 * RT_MAX_TOP_LOGPROBS];
    double top[2 * RT_MAX_TOP_LOGPROBS];
    /* A refused row changes no session. */
    rows[1].top_count = 21;
    EXPECT_STATUS(rt_decode_sessions_step_sample(pair, 2, tokens, counts, 5, rows, ids, sampled,
                                                 logprobs, top_ids, top),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("rows[1]: top_count 21");
    rows[1].top_count = 0;
    rows[1].reserved = 1;
    EXPECT_STATUS(rt_decode_sessions_step_sample(pair, 2, tokens, counts, 5, rows, ids, sampled,
                                                 logprobs, top_ids, top),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("rows[1]: sample and log_probability are 0 or 1 and reserved");
    rows[1].reserved = 0;
    rows[1].sample = 2;
    EXPECT_STATUS(rt_decode_sessions_step_sample(pair, 2, tokens, counts, 5, rows, ids, sampled,
                                                 logprobs, top_ids, top),
                  RT_STATUS_INVALID_ARGUMENT);
    rows[1].sample = 1;
    const uint8_t none[V] = {0};
    rows[1].mask = none;
    EXPECT_STATUS(rt_decode_sessions_step_sample(pair, 2, tokens, counts, 5, rows, ids, sampled,
                                                 logprobs, top_ids, top),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("rows[1]: sample_token: the token mask allows no token");
    rows[1].mask = NULL;
    EXPECT_STATUS(rt_decode_sessions_step_sample(pair, 2, tokens, counts, 5, rows, ids, sampled,
                                                 NULL, top_ids, top),
                  RT_STATUS_INVALID_ARGUMENT); /* row 0 asks for a log-probability */
    uint64_t size = 9;
    EXPECT_OK(rt_decode_session_size(pair[0], &size));
    EXPECT_EQ_U64(size, 0);
    EXPECT(ids[0] == 99 && sampled[0] == 9);
    EXPECT_OK(rt_decode_sessions_step_sample(pair, 2, tokens, counts, 5, rows, ids, sampled,
                                             logprobs, top_ids, top));
    EXPECT(sampled[0] == 1 && sampled[1] == 1);
    uint32_t expected = 0;
    EXPECT_OK(rt_sample_f32_row(logits, V, NULL, NULL, 0, 0, NULL, 0, &expected));
    EXPECT_EQ_U64(ids[0], expected);
    EXPECT_OK(rt_sample_f32_row(logits + V, V, &sampled_options, NULL, 0, 0, NULL, 7, &expected));
    EXPECT_EQ_U64(ids[1], expected);
    double logprob = 0.0;
    uint32_t oracle_ids[3];
    double oracle_top[3];
    EXPECT_OK(rt_f32_row_log_probabilities(logits, V, ids[0], 3, &logprob, oracle_ids, oracle_top));
    EXPECT(logprobs[0] == logprob);
    EXPECT(top_ids[0] == oracle_ids[0] && top_ids[1] == oracle_ids[1] &&
           top_ids[2] == oracle_ids[2] && top[2] == oracle_top[2]);
    /* A feed-only row, and a vocabulary limit (a padded vocabulary). */
    const uint32_t next[2] = {9, 2};
    const uint64_t ones[2] = {1, 1};
    rows[0].sample = 0;
    rows[0].log_probability = 0;
    rows[0].top_count = 0;
    rows[1].vocabulary_limit = 4;
    EXPECT_OK(rt_decode_sessions_step_sample(pair, 2, next, ones, 2, rows, ids, sampled, NULL, NULL,
                                             NULL));
    EXPECT(sampled[0] == 0 && sampled[1] == 1 && ids[1] < 4);
    rows[1].vocabulary_limit = V + 1;
    EXPECT_STATUS(rt_decode_sessions_step_sample(pair, 2, next, ones, 2, rows, ids, sampled, NULL,
                                                 NULL, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    for (int i = 0; i < 2; ++i) {
        rt_decode_session_release(twins[i]);
        rt_decode_session_release(pair[i]);
    }
    rt_model_release(model);
}

int main(void) {
    RUN_TEST(steps_equal_the_full_forward);
    RUN_TEST(argument_rules_change_nothing);
    RUN_TEST(shared_pool_and_batched_steps);
    RUN_TEST(sessions_pin_their_model);
    RUN_TEST(prefix_caching_shares_pages_within_one_parameter_epoch);
    RUN_TEST(rows_argmax);
    RUN_TEST(sampling_rows);
    RUN_TEST(reservations_are_the_pools_ledger);
    RUN_TEST(steps_that_sample_on_the_library_side);
    return finish_tests();
}
