/*
 * ABI 2.13 (the fine-tuning issue): rt_adam_options' weight decay and learning-rate schedule,
 * rt_adam_step_stats' learning rate, rt_variable_backward_scaled and rt_model_forward_packed.
 * A 2.4-sized (48-byte)
 * options struct and a 32-byte step-statistics struct keep working.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_fixtures.h"
#include "c_test_support.h"

static const uint32_t tokens[] = {0, 1, 2, 3, 4, 5, 6, 7};
static const uint32_t targets[] = {1, 2, 3, 4, 5, 6, 7, 8};

static rt_variable* loss_of(rt_model* model, rt_variable** logits) {
    rt_variable* loss = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, logits));
    EXPECT_OK(rt_cross_entropy(*logits, targets, 8, &loss));
    return loss;
}

static void step_with(rt_model* model, rt_adam* adam, rt_adam_step_stats* stats) {
    rt_variable* logits = NULL;
    rt_variable* loss = loss_of(model, &logits);
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_OK(rt_adam_step(adam, stats));
    rt_variable_release(loss);
    rt_variable_release(logits);
}

static void options_init_gives_plain_adam_at_a_constant_rate(void) {
    rt_adam_options options;
    memset(&options, 0xA5, sizeof options);
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    EXPECT_EQ_U64(options.struct_size, sizeof(rt_adam_options));
    EXPECT_EQ_U64(sizeof(rt_adam_options), 88u);
    EXPECT(options.weight_decay == 0.0);
    EXPECT(options.schedule == RT_LEARNING_RATE_SCHEDULE_CONSTANT);
    EXPECT_EQ_U64(options.reserved3, 0u);
    EXPECT_EQ_U64(options.warmup_steps, 0u);
    EXPECT_EQ_U64(options.total_steps, 0u);
    EXPECT(options.minimum_fraction == 0.0);
}

/* base 0.01, W = 2, T = 6, f = 0.1, linear: 0.005, 0.01, 0.00775, 0.0055, 0.00325, 0.001, 0.001
 * (hand-computed: f + (1 - f)(1 - (t - W)/(T - W)) past the warmup). */
static void the_step_reports_the_scheduled_rate(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    options.learning_rate = 0.01f;
    options.schedule = RT_LEARNING_RATE_SCHEDULE_WARMUP_LINEAR;
    options.warmup_steps = 2;
    options.total_steps = 6;
    options.minimum_fraction = 0.1;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, &options, &adam));
    static const double expected[] = {0.005, 0.01, 0.00775, 0.0055, 0.00325, 0.001, 0.001};
    for (size_t i = 0; i < sizeof expected / sizeof *expected; ++i) {
        rt_adam_step_stats stats;
        memset(&stats, 0, sizeof stats);
        stats.struct_size = sizeof stats;
        step_with(model, adam, &stats);
        EXPECT_EQ_U64(stats.step, i + 1);
        /* options.learning_rate is a float: the base rate is 0.01f. */
        EXPECT(fabs(stats.learning_rate - expected[i] * ((double)0.01f / 0.01)) < 1e-12);
    }
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* AdamW through the ABI: theta <- theta (1 - lr lambda) - lr m/(sqrt(v) + eps). From the same
 * start and gradient, the decayed step differs from the plain one by exactly lr lambda theta_0
 * (up to float rounding), per parameter. */
static void weight_decay_shrinks_each_parameter_by_lr_lambda_theta(void) {
    rt_model* plain_model = create_tiny_model();
    rt_model* decayed_model = create_tiny_model();
    rt_parameter_list* plain_list = parameters_of(plain_model);
    rt_parameter_list* decayed_list = parameters_of(decayed_model);
    float* start = copy_parameter_values(plain_list);
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    options.learning_rate = 0.01f;
    rt_adam* plain = NULL;
    EXPECT_OK(rt_adam_create(plain_list, &options, &plain));
    options.weight_decay = 0.5;
    rt_adam* decayed = NULL;
    EXPECT_OK(rt_adam_create(decayed_list, &options, &decayed));
    step_with(plain_model, plain, NULL);
    step_with(decayed_model, decayed, NULL);
    const uint64_t total = total_numel(plain_list);
    float* a = copy_parameter_values(plain_list);
    float* b = copy_parameter_values(decayed_list);
    for (uint64_t i = 0; i < total; ++i) {
        const double expected = (double)0.01f * 0.5 * start[i];
        EXPECT(fabs(((double)a[i] - b[i]) - expected) <= 1e-7 + 1e-5 * fabs(expected));
    }
    free(b);
    free(a);
    free(start);
    rt_adam_release(decayed);
    rt_adam_release(plain);
    rt_parameter_list_release(decayed_list);
    rt_parameter_list_release(plain_list);
    rt_model_release(decayed_model);
    rt_model_release(plain_model);
}

static void a_32_byte_step_statistics_struct_still_works(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, NULL, &adam));
    struct {
        rt_adam_step_stats stats;
        unsigned char after[8];
    } buffer;
    memset(&buffer, 0xA5, sizeof buffer);
    buffer.stats.struct_size = 32;
    step_with(model, adam, &buffer.stats);
    EXPECT_EQ_U64(buffer.stats.struct_size, 32u);
    EXPECT_EQ_U64(buffer.stats.step, 1u);
    /* learning_rate (bytes 32..40) lies past the declared size: untouched. */
    EXPECT(all_bytes_are((const unsigned char*)&buffer.stats + 32, 8, 0xA5));
    buffer.stats.struct_size = 24;
    rt_variable* logits = NULL;
    rt_variable* loss = loss_of(model, &logits);
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_STATUS(rt_adam_step(adam, &buffer.stats), RT_STATUS_INVALID_ARGUMENT);
    uint64_t steps = 0;
    EXPECT_OK(rt_adam_step_count(adam, &steps));
    EXPECT_EQ_U64(steps, 1u);
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void bad_schedules_create_nothing(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    for (int which = 0; which < 6; ++which) {
        rt_adam_options options;
        EXPECT_OK(rt_adam_options_init(&options, sizeof options));
        switch (which) {
            case 0:
                options.schedule = 7;
                break;
            case 1:
                options.reserved3 = 1;
                break;
            case 2:
                options.warmup_steps = 3;
                break; /* constant with a warmup */
            case 3:
                options.schedule = RT_LEARNING_RATE_SCHEDULE_WARMUP_COSINE;
                options.warmup_steps = 5;
                options.total_steps = 5;
                break;
            case 4:
                options.schedule = RT_LEARNING_RATE_SCHEDULE_WARMUP_LINEAR;
                options.total_steps = 5;
                options.minimum_fraction = 1.5;
                break;
            default:
                options.weight_decay = -1.0;
                break;
        }
        rt_adam* adam = NULL;
        EXPECT_STATUS(rt_adam_create(list, &options, &adam), RT_STATUS_INVALID_ARGUMENT);
        EXPECT(adam == NULL);
    }
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* A 2.12 client's 48-byte struct: the 2.13 fields take their init values (plain Adam). */
static void a_2_12_sized_options_struct_trains_like_the_defaults(void) {
    rt_model* short_model = create_tiny_model();
    rt_model* full_model = create_tiny_model();
    rt_parameter_list* short_list = parameters_of(short_model);
    rt_parameter_list* full_list = parameters_of(full_model);
    rt_adam_options shorter;
    memset(&shorter, 0xA5, sizeof shorter);
    EXPECT_OK(rt_adam_options_init(&shorter, 48));
    /* bytes past 48 were not written by init, and are not read by create. */
    EXPECT(all_bytes_are((const unsigned char*)&shorter + 48, sizeof shorter - 48, 0xA5));
    rt_adam_options full;
    EXPECT_OK(rt_adam_options_init(&full, sizeof full));
    rt_adam* short_adam = NULL;
    rt_adam* full_adam = NULL;
    EXPECT_OK(rt_adam_create(short_list, &shorter, &short_adam));
    EXPECT_OK(rt_adam_create(full_list, &full, &full_adam));
    for (int step = 0; step < 2; ++step) {
        step_with(short_model, short_adam, NULL);
        step_with(full_model, full_adam, NULL);
    }
    const uint64_t total = total_numel(short_list);
    float* a = copy_parameter_values(short_list);
    float* b = copy_parameter_values(full_list);
    EXPECT(memcmp(a, b, (size_t)total * sizeof *a) == 0);
    free(b);
    free(a);
    rt_adam_release(full_adam);
    rt_adam_release(short_adam);
    rt_parameter_list_release(full_list);
    rt_parameter_list_release(short_list);
    rt_model_release(full_model);
    rt_model_release(short_model);
}

/* Two halves accumulated (scale 0.5 each, the second added) update exactly like one backward:
 * the seed 0.5 halves every gradient exactly, and x/2 + x/2 == x in binary floating point. */
static void scaled_backward_accumulates_micro_batches(void) {
    rt_model* whole_model = create_tiny_model();
    rt_model* halves_model = create_tiny_model();
    rt_parameter_list* whole_list = parameters_of(whole_model);
    rt_parameter_list* halves_list = parameters_of(halves_model);
    rt_adam* whole = NULL;
    rt_adam* halves = NULL;
    EXPECT_OK(rt_adam_create(whole_list, NULL, &whole));
    EXPECT_OK(rt_adam_create(halves_list, NULL, &halves));

    rt_adam_step_stats whole_stats = {sizeof(rt_adam_step_stats), 0, 0.0, 0.0, 0.0};
    step_with(whole_model, whole, &whole_stats);

    rt_variable* logits = NULL;
    rt_variable* loss = loss_of(halves_model, &logits);
    EXPECT_STATUS(rt_variable_backward_scaled(loss, NAN, 0), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_backward_scaled(loss, 0.5f, 2), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_variable_backward_scaled(loss, 0.5f, 0));
    /* the graph is consumed, as by rt_variable_backward */
    EXPECT_STATUS(rt_variable_backward_scaled(loss, 0.5f, 1), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(loss);
    rt_variable_release(logits);
    loss = loss_of(halves_model, &logits);
    EXPECT_OK(rt_variable_backward_scaled(loss, 0.5f, 1));
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_step_stats halves_stats = {sizeof(rt_adam_step_stats), 0, 0.0, 0.0, 0.0};
    EXPECT_OK(rt_adam_step(halves, &halves_stats));
    EXPECT(halves_stats.gradient_norm == whole_stats.gradient_norm);

    const uint64_t total = total_numel(whole_list);
    float* a = copy_parameter_values(whole_list);
    float* b = copy_parameter_values(halves_list);
    EXPECT(memcmp(a, b, (size_t)total * sizeof *a) == 0);
    free(b);
    free(a);

    /* Without accumulate, the second half REPLACES the first: half the gradient. */
    loss = loss_of(halves_model, &logits);
    EXPECT_OK(rt_variable_backward_scaled(loss, 2.0f, 0));
    rt_variable_release(loss);
    rt_variable_release(logits);
    loss = loss_of(halves_model, &logits);
    EXPECT_OK(rt_variable_backward_scaled(loss, 0.5f, 0));
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_step_stats replaced = {sizeof(rt_adam_step_stats), 0, 0.0, 0.0, 0.0};
    loss = loss_of(whole_model, &logits);
    EXPECT_OK(rt_variable_backward(loss));
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_step_stats reference = {sizeof(rt_adam_step_stats), 0, 0.0, 0.0, 0.0};
    EXPECT_OK(rt_adam_step(whole, &reference));
    EXPECT_OK(rt_adam_step(halves, &replaced));
    EXPECT(fabs(replaced.gradient_norm - 0.5 * reference.gradient_norm) <=
           1e-6 * reference.gradient_norm);

    rt_adam_release(halves);
    rt_adam_release(whole);
    rt_parameter_list_release(halves_list);
    rt_parameter_list_release(whole_list);
    rt_model_release(halves_model);
    rt_model_release(whole_model);
}

/* Packed rows: one row holding documents of 3 and 5 tokens gives each the logits it gets alone
 * (up to rounding), and bad positions are refused, writing nothing. */
static void packed_rows_give_each_document_its_own_logits(void) {
    rt_model* model = create_tiny_model();
    static const uint32_t row[] = {4, 9, 2, 7, 7, 1, 3, 8};
    static const uint32_t positions[] = {0, 1, 2, 0, 1, 2, 3, 4};
    rt_variable* packed = NULL;
    EXPECT_OK(rt_model_forward_packed(model, row, positions, 8, 1, 8, &packed));
    uint64_t numel = 0;
    EXPECT_OK(rt_variable_numel(packed, &numel));
    const uint64_t vocabulary = numel / 8;
    float* packed_values = malloc((size_t)numel * sizeof *packed_values);
    EXPECT_OK(rt_variable_copy_to_host_f32(packed, packed_values, numel, &numel));
    const uint64_t starts[] = {0, 3};
    const uint64_t lengths[] = {3, 5};
    for (int document = 0; document < 2; ++document) {
        rt_variable* alone = NULL;
        EXPECT_OK(rt_model_forward(model, row + starts[document], lengths[document], 1,
                                   lengths[document], &alone));
        const uint64_t count = lengths[document] * vocabulary;
        float* alone_values = malloc((size_t)count * sizeof *alone_values);
        uint64_t required = 0;
        EXPECT_OK(rt_variable_copy_to_host_f32(alone, alone_values, count, &required));
        EXPECT_EQ_U64(required, count);
        for (uint64_t i = 0; i < count; ++i) {
            const float want = alone_values[i];
            const float got = packed_values[starts[document] * vocabulary + i];
            EXPECT(fabsf(got - want) <= 1e-5f + 1e-5f * fabsf(want));
        }
        free(alone_values);
        rt_variable_release(alone);
    }
    free(packed_values);
    rt_variable_release(packed);

    static const uint32_t bad[] = {0, 1, 2, 0, 1, 3, 4, 5}; /* 3 after 1 */
    rt_variable* refused = NULL;
    EXPECT_STATUS(rt_model_forward_packed(model, row, bad, 8, 1, 8, &refused),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(refused == NULL);
    EXPECT(strstr(rt_last_error(), "row 0 at token 5 is 3") != NULL);
    EXPECT_STATUS(rt_model_forward_packed(model, row, NULL, 8, 1, 8, &refused),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(refused == NULL);
    rt_model_release(model);
}

/* rsLoRA (2.13): rank_stabilized reads back; a 40-byte (2.8) config still attaches plain LoRA;
 * a flag other than 0/1 or a nonzero reserved2 attaches nothing. */
static void lora_config_carries_rank_stabilized(void) {
    rt_model* model = create_tiny_model();
    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    EXPECT_EQ_U64(sizeof config, 56u); /* 48 in 2.13; 2.15 appended dropout */
    EXPECT_EQ_U64(config.rank_stabilized, 0u);
    config.rank_stabilized = 2;
    EXPECT_STATUS(rt_model_attach_lora(model, &config), RT_STATUS_INVALID_ARGUMENT);
    config.rank_stabilized = 1;
    config.reserved2 = 1;
    EXPECT_STATUS(rt_model_attach_lora(model, &config), RT_STATUS_INVALID_ARGUMENT);
    int32_t attached = 1;
    EXPECT_OK(rt_model_has_lora(model, &attached));
    EXPECT(attached == 0);
    config.reserved2 = 0;
    EXPECT_OK(rt_model_attach_lora(model, &config));
    rt_lora_config read;
    memset(&read, 0, sizeof read);
    read.struct_size = sizeof read;
    EXPECT_OK(rt_model_lora_config(model, &read));
    EXPECT_EQ_U64(read.rank_stabilized, 1u);
    rt_model_release(model);

    rt_model* older = create_tiny_model();
    struct {
        rt_lora_config config;
    } buffer;
    memset(&buffer, 0xA5, sizeof buffer);
    EXPECT_OK(rt_lora_config_init(&buffer.config, 40));
    EXPECT(all_bytes_are((const unsigned char*)&buffer.config + 40, 8, 0xA5));
    EXPECT_OK(rt_model_attach_lora(older, &buffer.config));
    memset(&read, 0, sizeof read);
    read.struct_size = sizeof read;
    EXPECT_OK(rt_model_lora_config(older, &read));
    EXPECT_EQ_U64(read.rank_stabilized, 0u);
    rt_model_release(older);

    /* A 48-byte (2.13) config reads dropout 0: the bytes beyond it are never touched. */
    rt_model* before_dropout = create_tiny_model();
    memset(&buffer, 0xA5, sizeof buffer);
    EXPECT_OK(rt_lora_config_init(&buffer.config, 48));
    EXPECT(all_bytes_are((const unsigned char*)&buffer.config + 48, 8, 0xA5));
    EXPECT_OK(rt_model_attach_lora(before_dropout, &buffer.config));
    memset(&read, 0xA5, sizeof read);
    read.struct_size = sizeof read;
    EXPECT_OK(rt_model_lora_config(before_dropout, &read));
    EXPECT(read.dropout == 0.0f);
    EXPECT_EQ_U64(read.reserved3, 0u);
    rt_model_release(before_dropout);
}

int main(void) {
    RUN_TEST(options_init_gives_plain_adam_at_a_constant_rate);
    RUN_TEST(the_step_reports_the_scheduled_rate);
    RUN_TEST(weight_decay_shrinks_each_parameter_by_lr_lambda_theta);
    RUN_TEST(a_32_byte_step_statistics_struct_still_works);
    RUN_TEST(bad_schedules_create_nothing);
    RUN_TEST(a_2_12_sized_options_struct_trains_like_the_defaults);
    RUN_TEST(scaled_backward_accumulates_micro_batches);
    RUN_TEST(packed_rows_give_each_document_its_own_logits);
    RUN_TEST(lora_config_carries_rank_stabilized);
    return finish_tests();
}
