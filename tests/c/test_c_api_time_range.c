/*
 * rt_cross_entropy_time_range as a pure C11 client sees it: the loss over one time slice of
 * the tiny model's logits against a double oracle and against rt_cross_entropy, a backward
 * pass that ignores the targets outside the slice, the graph's epoch, and one status per
 * error rule with the output left untouched; and rt_cross_entropy_masked, the response-only
 * loss, against the time-range loss of the same positions and its error rules.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_fixtures.h"
#include "c_test_support.h"

/* Two rows of eight positions (T = TINY_CONTEXT) over a fixed token pattern. */
#define BATCH 2u
#define TIME 8u
#define TOKENS (BATCH * TIME)

static const uint32_t tokens[TOKENS] = {1, 5, 2, 9, 3, 7, 4, 0, 6, 6, 11, 15, 8, 2, 13, 10};
static const uint32_t targets[TOKENS] = {5, 2, 9, 3, 7, 4, 0, 1, 6, 11, 15, 8, 2, 13, 10, 12};

/* Where a failing call must leave *out: a pointer no call ever returns. */
static char untouched_marker;
#define untouched ((rt_variable*)(void*)&untouched_marker)

static rt_variable* forward_tokens(rt_model* model) {
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, TOKENS, BATCH, TIME, &logits));
    return logits;
}

static float scalar_value(const rt_variable* variable) {
    float value = NAN;
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(variable, &value, 1, &required));
    EXPECT_EQ_U64(required, 1u);
    return value;
}

/* −(1/(B·count))·Σ_{b, t in [offset, offset+count)} log softmax(z_bt)[y_bt], in double. */
static double oracle_loss(const float* logits, const uint32_t* ids, uint64_t offset,
                          uint64_t count) {
    double total = 0.0;
    for (uint64_t b = 0; b < BATCH; ++b) {
        for (uint64_t t = offset; t < offset + count; ++t) {
            const float* z = logits + (b * TIME + t) * TINY_VOCABULARY;
            double peak = -INFINITY;
            for (uint64_t j = 0; j < TINY_VOCABULARY; ++j) {
                peak = z[j] > peak ? z[j] : peak;
            }
            double sum = 0.0;
            for (uint64_t j = 0; j < TINY_VOCABULARY; ++j) {
                sum += exp(z[j] - peak);
            }
            total += peak + log(sum) - z[ids[b * TIME + t]];
        }
    }
    return total / (double)(BATCH * count);
}

static rt_adam* create_adam(const rt_parameter_list* list) {
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    options.learning_rate = 1e-2f;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, &options, &adam));
    return adam;
}

/* The flat parameters after one Adam step on the time-range loss of `ids`; caller frees. */
static float* parameters_after_a_step(const uint32_t* ids, uint64_t offset, uint64_t count) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list);
    rt_variable* logits = forward_tokens(model);
    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy_time_range(logits, ids, TOKENS, offset, count, &loss));
    EXPECT_OK(rt_variable_backward(loss));
    rt_variable_release(loss);
    rt_variable_release(logits);
    EXPECT_OK(rt_adam_step(adam, NULL));
    float* values = copy_parameter_values(list);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
    return values;
}

/* ---- Values ---------------------------------------------------------------------------- */

static void loss_matches_a_double_oracle_of_the_logits_on_every_slice(void) {
    static const uint64_t slices[][2] = {{0, 1}, {2, 3}, {7, 1}, {0, TIME}, {3, 5}};
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    float values[TOKENS * TINY_VOCABULARY];
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, values, TOKENS * TINY_VOCABULARY, &required));
    for (size_t i = 0; i < sizeof slices / sizeof slices[0]; ++i) {
        rt_variable* loss = NULL;
        EXPECT_OK(rt_cross_entropy_time_range(logits, targets, TOKENS, slices[i][0], slices[i][1],
                                              &loss));
        uint64_t rank = 99;
        EXPECT_OK(rt_variable_rank(loss, &rank));
        EXPECT_EQ_U64(rank, 0u);
        const double expected = oracle_loss(values, targets, slices[i][0], slices[i][1]);
        EXPECT_NEAR(scalar_value(loss), expected, 1e-5 * expected);
        rt_variable_release(loss);
    }
    rt_variable_release(logits);
    rt_model_release(model);
}

static void the_whole_time_range_equals_rt_cross_entropy(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    rt_variable* ranged = NULL;
    rt_variable* whole = NULL;
    EXPECT_OK(rt_cross_entropy_time_range(logits, targets, TOKENS, 0, TIME, &ranged));
    EXPECT_OK(rt_cross_entropy(logits, targets, TOKENS, &whole));
    EXPECT_NEAR(scalar_value(ranged), scalar_value(whole), 1e-6);
    rt_variable_release(whole);
    rt_variable_release(ranged);
    rt_variable_release(logits);
    rt_model_release(model);
}

/* ---- Backward -------------------------------------------------------------------------- */

static void backward_ignores_the_targets_outside_the_slice(void) {
    /* The gradient rows outside the slice are exactly zero, so other targets there give
     * bit-identical parameters after a step; a target inside the slice changes them. */
    uint32_t outside[TOKENS];
    uint32_t inside[TOKENS];
    memcpy(outside, targets, sizeof targets);
    memcpy(inside, targets, sizeof targets);
    for (uint64_t b = 0; b < BATCH; ++b) {
        outside[b * TIME + 0] = (outside[b * TIME + 0] + 3u) % TINY_VOCABULARY;
        outside[b * TIME + 6] = (outside[b * TIME + 6] + 5u) % TINY_VOCABULARY;
    }
    inside[TIME + 3] = (inside[TIME + 3] + 1u) % TINY_VOCABULARY;
    float* reference = parameters_after_a_step(targets, 2, 3);
    float* with_outside = parameters_after_a_step(outside, 2, 3);
    float* with_inside = parameters_after_a_step(inside, 2, 3);
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const size_t bytes = (size_t)total_numel(list) * sizeof(float);
    rt_parameter_list_release(list);
    rt_model_release(model);
    const int outside_equal = memcmp(reference, with_outside, bytes) == 0;
    const int inside_equal = memcmp(reference, with_inside, bytes) == 0;
    free(with_inside);
    free(with_outside);
    free(reference);
    EXPECT(outside_equal);
    EXPECT(!inside_equal);
}

static void a_time_range_loss_is_single_use_and_follows_the_logits_epoch(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list);
    rt_variable* logits = forward_tokens(model);
    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy_time_range(logits, targets, TOKENS, 1, 4, &loss));
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_STATUS(rt_variable_backward(loss), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(loss);
    /* After a step the logits are stale: a new loss from them is built but cannot backward. */
    EXPECT_OK(rt_adam_step(adam, NULL));
    loss = NULL;
    EXPECT_OK(rt_cross_entropy_time_range(logits, targets, TOKENS, 1, 4, &loss));
    EXPECT_STATUS(rt_variable_backward(loss), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* ---- Errors: one status per rule, *out untouched -------------------------------------- */

static void logits_of_another_rank_are_invalid_argument(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    rt_variable* scalar = NULL;
    EXPECT_OK(rt_cross_entropy(logits, targets, TOKENS, &scalar));
    rt_variable* out = untouched;
    EXPECT_STATUS(rt_cross_entropy_time_range(scalar, targets, 1, 0, 1, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("rank 3");
    EXPECT(out == untouched);
    rt_variable_release(scalar);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void an_empty_time_count_is_invalid_argument(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    rt_variable* out = untouched;
    EXPECT_STATUS(rt_cross_entropy_time_range(logits, targets, TOKENS, 3, 0, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("count must be > 0");
    EXPECT(out == untouched);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void a_range_past_the_end_is_out_of_range_without_wraparound(void) {
    static const uint64_t windows[][2] = {
        {0, TIME + 1}, {6, 3}, {TIME, 1}, {UINT64_MAX, 2}, {1, UINT64_MAX}};
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; ++i) {
        rt_variable* out = untouched;
        EXPECT_STATUS(rt_cross_entropy_time_range(logits, targets, TOKENS, windows[i][0],
                                                  windows[i][1], &out),
                      RT_STATUS_OUT_OF_RANGE);
        EXPECT_LAST_ERROR_MENTIONS("exceeds T = 8");
        EXPECT(out == untouched);
    }
    rt_variable_release(logits);
    rt_model_release(model);
}

static void a_target_count_other_than_batch_times_time_is_invalid_argument(void) {
    static const uint64_t counts[] = {1, BATCH * 3u, TOKENS - 1u};
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i) {
        rt_variable* out = untouched;
        EXPECT_STATUS(rt_cross_entropy_time_range(logits, targets, counts[i], 2, 3, &out),
                      RT_STATUS_INVALID_ARGUMENT);
        EXPECT_LAST_ERROR_MENTIONS("targets given");
        EXPECT(out == untouched);
    }
    rt_variable_release(logits);
    rt_model_release(model);
}

static void a_target_outside_the_vocabulary_is_out_of_range_even_outside_the_slice(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    uint32_t ids[TOKENS];
    memcpy(ids, targets, sizeof targets);
    ids[TIME + 7] = TINY_VOCABULARY; /* b = 1, t = 7: outside [2, 5) */
    rt_variable* out = untouched;
    EXPECT_STATUS(rt_cross_entropy_time_range(logits, ids, TOKENS, 2, 3, &out),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_LAST_ERROR_MENTIONS("targets[15] = 16");
    EXPECT(out == untouched);
    EXPECT(ids[TIME + 7] == TINY_VOCABULARY);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void null_handles_and_pointers_are_invalid_argument(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    rt_variable* out = untouched;
    EXPECT_STATUS(rt_cross_entropy_time_range(NULL, targets, TOKENS, 0, 1, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy_time_range(logits, NULL, TOKENS, 0, 1, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy_time_range(logits, targets, TOKENS, 0, 1, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(out == untouched);
    rt_variable_release(logits);
    rt_model_release(model);
}

/* ---- rt_cross_entropy_masked (the response-only loss) ------------------------------------ */

static void a_masked_loss_equals_the_time_range_loss_of_the_same_positions(void) {
    uint8_t mask[TOKENS] = {0};
    for (uint64_t b = 0; b < BATCH; ++b) {
        for (uint64_t t = 2; t < 5; ++t) {
            mask[b * TIME + t] = 1;
        }
    }
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    rt_variable* masked = NULL;
    rt_variable* ranged = NULL;
    EXPECT_OK(rt_cross_entropy_masked(logits, targets, TOKENS, mask, TOKENS, &masked));
    EXPECT_OK(rt_cross_entropy_time_range(logits, targets, TOKENS, 2, 3, &ranged));
    EXPECT_NEAR(scalar_value(masked), scalar_value(ranged), 1e-6);
    EXPECT_OK(rt_variable_backward(masked));
    rt_variable_release(ranged);
    rt_variable_release(masked);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void masked_loss_error_rules_leave_the_output_untouched(void) {
    uint8_t ones[TOKENS];
    uint8_t zeros[TOKENS] = {0};
    memset(ones, 1, sizeof ones);
    uint8_t two[TOKENS];
    memset(two, 1, sizeof two);
    two[3] = 2;
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_tokens(model);
    rt_variable* out = untouched;
    EXPECT_STATUS(rt_cross_entropy_masked(logits, targets, TOKENS, zeros, TOKENS, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy_masked(logits, targets, TOKENS, two, TOKENS, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy_masked(logits, targets, TOKENS, ones, TOKENS - 1, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy_masked(logits, targets, TOKENS, NULL, TOKENS, &out),
                  RT_STATUS_INVALID_ARGUMENT);
    uint32_t outside[TOKENS];
    memcpy(outside, targets, sizeof targets);
    outside[0] = TINY_VOCABULARY;
    EXPECT_STATUS(rt_cross_entropy_masked(logits, outside, TOKENS, ones, TOKENS, &out),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT(out == untouched);
    rt_variable_release(logits);
    rt_model_release(model);
}

int main(void) {
    RUN_TEST(loss_matches_a_double_oracle_of_the_logits_on_every_slice);
    RUN_TEST(the_whole_time_range_equals_rt_cross_entropy);
    RUN_TEST(backward_ignores_the_targets_outside_the_slice);
    RUN_TEST(a_time_range_loss_is_single_use_and_follows_the_logits_epoch);
    RUN_TEST(logits_of_another_rank_are_invalid_argument);
    RUN_TEST(an_empty_time_count_is_invalid_argument);
    RUN_TEST(a_range_past_the_end_is_out_of_range_without_wraparound);
    RUN_TEST(a_target_count_other_than_batch_times_time_is_invalid_argument);
    RUN_TEST(a_target_outside_the_vocabulary_is_out_of_range_even_outside_the_slice);
    RUN_TEST(null_handles_and_pointers_are_invalid_argument);
    RUN_TEST(a_masked_loss_equals_the_time_range_loss_of_the_same_positions);
    RUN_TEST(masked_loss_error_rules_leave_the_output_untouched);
    return finish_tests();
}
