/*
 * An older client of the C ABI: one built when rt_adam_options ended at `reserved` (ABI 2.3,
 * 32 bytes). ABI 2.4 appended the state layout fields; minors only add, so such a client keeps
 * working against this library: its short struct initialises, creates an optimizer with the
 * newer fields at their defaults (contiguous state, 4096-element pages) and trains.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_fixtures.h"
#include "c_test_support.h"

/* rt_adam_options as ABI 2.3 published it, under this client's own name. */
typedef struct older_adam_options {
    uint64_t struct_size;
    float learning_rate;
    float beta1;
    float beta2;
    float epsilon;
    float maximum_gradient_norm;
    uint32_t reserved;
} older_adam_options;

_Static_assert(sizeof(older_adam_options) == 32, "the ABI 2.3 rt_adam_options is 32 bytes");

#define SENTINEL_BYTE 0xA5u

/* The library reads and writes only the declared prefix, so the older struct is passed where
 * the current one is expected. */
static rt_adam_options* as_current(older_adam_options* options) {
    return (rt_adam_options*)options;
}

static older_adam_options older_default_options(void) {
    older_adam_options options;
    EXPECT_OK(rt_adam_options_init(as_current(&options), sizeof options));
    return options;
}

/* forward over 0, 1, ..., 7 -> cross-entropy against 1, 2, ..., 8 -> backward -> step. */
static void train_step(rt_model* model, rt_adam* adam) {
    static const uint32_t tokens[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const uint32_t targets[] = {1, 2, 3, 4, 5, 6, 7, 8};
    rt_variable* logits = NULL;
    rt_variable* loss = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
    EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_OK(rt_adam_step(adam, NULL));
    rt_variable_release(loss);
    rt_variable_release(logits);
}

/* A client built against minor `client_minor` of major `client_major` accepts a library of
 * the same major and at least its minor (minors only add). */
static int client_accepts_library(uint32_t client_major, uint32_t client_minor,
                                  uint32_t library_version) {
    return (library_version >> 16) == client_major && (library_version & 0xFFFFu) >= client_minor;
}

static void older_options_init_fills_the_2_3_prefix_and_nothing_past_it(void) {
    struct {
        older_adam_options options;
        unsigned char after[32];
    } buffer;
    memset(&buffer, SENTINEL_BYTE, sizeof buffer);
    EXPECT_OK(rt_adam_options_init(as_current(&buffer.options), sizeof buffer.options));
    EXPECT_EQ_U64(buffer.options.struct_size, 32u);
    EXPECT(buffer.options.learning_rate == 1e-3f);
    EXPECT(buffer.options.beta1 == 0.9f);
    EXPECT(buffer.options.beta2 == 0.999f);
    EXPECT(buffer.options.epsilon == 1e-8f);
    EXPECT(buffer.options.maximum_gradient_norm == 1.0f);
    EXPECT_EQ_U64(buffer.options.reserved, 0u);
    EXPECT(all_bytes_are(buffer.after, sizeof buffer.after, SENTINEL_BYTE));
}

static void options_shorter_than_the_2_3_prefix_are_rejected(void) {
    older_adam_options options;
    memset(&options, SENTINEL_BYTE, sizeof options);
    EXPECT_STATUS(rt_adam_options_init(as_current(&options), 24), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(all_bytes_are(&options, sizeof options, SENTINEL_BYTE));

    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    options = older_default_options();
    options.struct_size = 24;
    rt_adam* adam = NULL;
    EXPECT_STATUS(rt_adam_create(list, as_current(&options), &adam), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(adam == NULL);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void older_options_with_nonzero_reserved_are_rejected(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    older_adam_options options = older_default_options();
    options.reserved = 1;
    rt_adam* adam = NULL;
    EXPECT_STATUS(rt_adam_create(list, as_current(&options), &adam), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(adam == NULL);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void optimizer_from_older_options_uses_contiguous_4096_element_pages(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    older_adam_options options = older_default_options();
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, as_current(&options), &adam));
    int32_t storage = -1;
    uint64_t page_size = 0;
    EXPECT_OK(rt_adam_state_storage(adam, &storage));
    EXPECT_OK(rt_adam_state_page_size(adam, &page_size));
    EXPECT(storage == RT_ADAM_STATE_CONTIGUOUS);
    EXPECT_EQ_U64(page_size, 4096u);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void optimizer_from_older_options_steps(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* before = copy_parameter_values(list);
    older_adam_options options = older_default_options();
    options.learning_rate = 1e-2f;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, as_current(&options), &adam));
    train_step(model, adam);

    uint64_t steps = 0;
    EXPECT_OK(rt_adam_step_count(adam, &steps));
    EXPECT_EQ_U64(steps, 1u);
    float* after = copy_parameter_values(list);
    EXPECT(memcmp(after, before, (size_t)total * sizeof *after) != 0);
    free(after);
    free(before);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void older_options_train_exactly_like_the_same_current_options(void) {
    rt_model* older_model = create_tiny_model();
    rt_model* current_model = create_tiny_model();
    rt_parameter_list* older_list = parameters_of(older_model);
    rt_parameter_list* current_list = parameters_of(current_model);

    older_adam_options older = older_default_options();
    older.learning_rate = 2e-2f;
    older.beta1 = 0.8f;
    older.maximum_gradient_norm = 0.5f;
    rt_adam_options current;
    EXPECT_OK(rt_adam_options_init(&current, sizeof current));
    current.learning_rate = 2e-2f;
    current.beta1 = 0.8f;
    current.maximum_gradient_norm = 0.5f;

    rt_adam* older_adam = NULL;
    rt_adam* current_adam = NULL;
    EXPECT_OK(rt_adam_create(older_list, as_current(&older), &older_adam));
    EXPECT_OK(rt_adam_create(current_list, &current, &current_adam));
    for (int step = 0; step < 3; ++step) {
        train_step(older_model, older_adam);
        train_step(current_model, current_adam);
    }
    const uint64_t total = total_numel(older_list);
    float* older_values = copy_parameter_values(older_list);
    float* current_values = copy_parameter_values(current_list);
    EXPECT(memcmp(older_values, current_values, (size_t)total * sizeof *older_values) == 0);
    free(current_values);
    free(older_values);
    rt_adam_release(current_adam);
    rt_adam_release(older_adam);
    rt_parameter_list_release(current_list);
    rt_parameter_list_release(older_list);
    rt_model_release(current_model);
    rt_model_release(older_model);
}

static void a_client_built_against_2_8_accepts_this_library(void) {
    EXPECT(client_accepts_library(2, 8, rt_abi_version()));
    EXPECT(client_accepts_library(RT_ABI_VERSION_MAJOR, RT_ABI_VERSION_MINOR, rt_abi_version()));
    /* ... and the 2.3 client this file imitates accepts it too. */
    EXPECT(client_accepts_library(2, 3, rt_abi_version()));
}

static void the_acceptance_rule_needs_the_same_major_and_no_older_minor(void) {
    EXPECT(client_accepts_library(2, 8, 0x00020009u));
    EXPECT(!client_accepts_library(2, 8, 0x00020007u));
    EXPECT(!client_accepts_library(2, 8, 0x00030008u));
    EXPECT(!client_accepts_library(2, 8, 0x00010008u));
    /* A 2.9 client (one that uses RT_BACKEND_PJRT) refuses a 2.8 library. */
    EXPECT(client_accepts_library(2, 9, 0x00020009u));
    EXPECT(client_accepts_library(2, 9, 0x0002000Au));
    EXPECT(!client_accepts_library(2, 9, 0x00020008u));
}

int main(void) {
    RUN_TEST(older_options_init_fills_the_2_3_prefix_and_nothing_past_it);
    RUN_TEST(options_shorter_than_the_2_3_prefix_are_rejected);
    RUN_TEST(older_options_with_nonzero_reserved_are_rejected);
    RUN_TEST(optimizer_from_older_options_uses_contiguous_4096_element_pages);
    RUN_TEST(optimizer_from_older_options_steps);
    RUN_TEST(older_options_train_exactly_like_the_same_current_options);
    RUN_TEST(a_client_built_against_2_8_accepts_this_library);
    RUN_TEST(the_acceptance_rule_needs_the_same_major_and_no_older_minor);
    return finish_tests();
}
