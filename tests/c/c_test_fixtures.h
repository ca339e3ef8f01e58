/*
 * Fixtures the pure C11 clients share: the tiny decoder every model test uses and readers of
 * its parameters. Functions are static inline so a program may use any subset of them.
 */
#ifndef RIFTCO_TRANSFORMER_TESTS_C_TEST_FIXTURES_H
#define RIFTCO_TRANSFORMER_TESTS_C_TEST_FIXTURES_H

#include <stdint.h>
#include <stdlib.h>

#include "c_test_support.h"

/* The tiny decoder: V=16, C=8, D=16, H=2, N=1, F=32. */
#define TINY_VOCABULARY 16u
#define TINY_CONTEXT 8u
#define TINY_WIDTH 16u
#define TINY_HEADS 2u
#define TINY_BLOCKS 1u
#define TINY_FEED_FORWARD 32u

static inline rt_transformer_config tiny_config(void) {
    rt_transformer_config config;
    EXPECT_OK(rt_transformer_config_init(&config, sizeof config));
    config.vocabulary_size = TINY_VOCABULARY;
    config.maximum_context = TINY_CONTEXT;
    config.model_width = TINY_WIDTH;
    config.head_count = TINY_HEADS;
    config.block_count = TINY_BLOCKS;
    config.feed_forward_width = TINY_FEED_FORWARD;
    return config;
}

static inline rt_model* create_tiny_model(void) {
    const rt_transformer_config config = tiny_config();
    rt_model* model = NULL;
    EXPECT_OK(rt_model_create(&config, &model));
    return model;
}

static inline rt_parameter_list* parameters_of(rt_model* model) {
    rt_parameter_list* list = NULL;
    EXPECT_OK(rt_model_parameters(model, &list));
    return list;
}

static inline uint64_t total_numel(const rt_parameter_list* list) {
    uint64_t total = 0;
    EXPECT_OK(rt_parameter_list_total_numel(list, &total));
    return total;
}

/* The logits [1, TINY_CONTEXT, TINY_VOCABULARY] of one row of TINY_CONTEXT tokens, in host
 * memory; the caller frees them. */
static inline float* tiny_logits(rt_model* model, const uint32_t* row) {
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, row, TINY_CONTEXT, 1, TINY_CONTEXT, &logits));
    const uint64_t count = (uint64_t)TINY_CONTEXT * TINY_VOCABULARY;
    float* values = malloc(count * sizeof *values);
    EXPECT(values != NULL);
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, values, count, &required));
    rt_variable_release(logits);
    return values;
}

/* Every parameter value in flat order (list order, then row-major); the caller frees it. */
static inline float* copy_parameter_values(const rt_parameter_list* list) {
    const uint64_t total = total_numel(list);
    float* values = malloc(total * sizeof *values);
    EXPECT(values != NULL);
    uint64_t required = 0;
    EXPECT_OK(rt_parameter_list_copy_to_host_f32(list, values, total, &required));
    EXPECT_EQ_U64(required, total);
    return values;
}

#endif /* RIFTCO_TRANSFORMER_TESTS_C_TEST_FIXTURES_H */
