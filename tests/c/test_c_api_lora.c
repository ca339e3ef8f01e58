/*
 * The LoRA / NF4 family of the C ABI as a pure C11 client sees it: config init and layout,
 * attach (once, atomic, pinned), adapter-only parameter lists and Adam, merge, conversion,
 * memory statistics and the packed state round trip. Every rejection leaves the model as it
 * was.
 */
#include "c_test_fixtures.h"

static const uint32_t tokens[8] = {1, 5, 2, 9, 3, 7, 4, 0};
static const uint32_t targets[8] = {5, 2, 9, 3, 7, 4, 0, 1};

/* The logits of the fixed [1, 8] token row; the caller frees them. */
static float* logits_of(rt_model* model) {
    return tiny_logits(model, tokens);
}

static float max_difference(const float* a, const float* b, uint64_t count) {
    float worst = 0.0f;
    for (uint64_t i = 0; i < count; ++i) {
        const float d = fabsf(a[i] - b[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static uint64_t count_of(const rt_parameter_list* list) {
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(list, &count));
    return count;
}

/* One adapter-only Adam step over the model's LoRA factors. */
static void train_adapters_one_step(rt_model* model, float learning_rate) {
    rt_parameter_list* adapters = NULL;
    EXPECT_OK(rt_model_lora_parameters(model, &adapters));
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    options.learning_rate = learning_rate;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(adapters, &options, &adam));
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_OK(rt_adam_step(adam, NULL));
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_release(adam);
    rt_parameter_list_release(adapters);
}

static void lora_config_init_sets_the_spec_defaults(void) {
    rt_lora_config config;
    memset(&config, 0xAB, sizeof config);
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    EXPECT_EQ_U64(config.struct_size, sizeof config);
    EXPECT_EQ_U64(config.rank, 4);
    EXPECT(config.alpha == 8.0f);
    EXPECT_EQ_U64(config.random_seed, 5489);
    EXPECT_EQ_U64(config.targets, RT_LORA_TARGETS_DEFAULT);
    EXPECT_EQ_U64(RT_LORA_TARGETS_DEFAULT, 0x5);
    EXPECT_EQ_U64(config.reserved, 0);
    /* 2.13 appended rank_stabilized (rsLoRA) and reserved2 to the 40-byte 2.8 layout. */
    EXPECT_EQ_U64(config.rank_stabilized, 0);
    EXPECT_EQ_U64(config.reserved2, 0);
    /* 2.15 appended dropout and reserved3 to the 48-byte 2.13 layout. */
    EXPECT(config.dropout == 0.0f);
    EXPECT_EQ_U64(config.reserved3, 0);
    EXPECT_EQ_U64(sizeof(rt_lora_config), 56);
    EXPECT_EQ_U64(sizeof(rt_quantized_memory_stats), 96);
    EXPECT_STATUS(rt_lora_config_init(&config, 8), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_lora_config_init(NULL, sizeof config), RT_STATUS_INVALID_ARGUMENT);
}

static void attach_is_output_preserving_and_keeps_the_base_list(void) {
    rt_model* model = create_tiny_model();
    float* before = logits_of(model);
    rt_parameter_list* base_before = parameters_of(model);
    const uint64_t base_count = count_of(base_before);
    rt_parameter_list_release(base_before);

    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    config.targets = RT_LORA_TARGETS_ALL_LINEAR;
    config.rank = 2;
    EXPECT_OK(rt_model_attach_lora(model, &config));
    int32_t has = 0;
    EXPECT_OK(rt_model_has_lora(model, &has));
    EXPECT(has == 1);
    rt_lora_config read;
    read.struct_size = sizeof read;
    EXPECT_OK(rt_model_lora_config(model, &read));
    EXPECT_EQ_U64(read.rank, 2);
    EXPECT_EQ_U64(read.targets, RT_LORA_TARGETS_ALL_LINEAR);

    float* after = logits_of(model);
    EXPECT(memcmp(before, after, 8u * TINY_VOCABULARY * sizeof(float)) == 0);
    rt_parameter_list* base_after = parameters_of(model);
    EXPECT_EQ_U64(count_of(base_after), base_count);
    rt_parameter_list_release(base_after);

    rt_parameter_list* adapters = NULL;
    EXPECT_OK(rt_model_lora_parameters(model, &adapters));
    EXPECT_EQ_U64(count_of(adapters), 2u * (6u * TINY_BLOCKS + 1u));
    char name[96];
    uint64_t required = 0;
    EXPECT_OK(rt_parameter_list_name(adapters, 0, name, sizeof name, &required));
    EXPECT_STREQ(name, "blocks.0.attention.query.lora_a.weight");
    EXPECT_OK(rt_parameter_list_name(adapters, 13, name, sizeof name, &required));
    EXPECT_STREQ(name, "language_model_head.lora_b.weight");
    rt_parameter_list_release(adapters);

    /* Once per lifetime. */
    EXPECT_STATUS(rt_model_attach_lora(model, &config), RT_STATUS_RUNTIME_ERROR);
    free(before);
    free(after);
    rt_model_release(model);
}

static void attach_rejections_change_nothing(void) {
    rt_model* model = create_tiny_model();
    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    rt_lora_config bad = config;
    bad.rank = 0;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    bad = config;
    bad.alpha = -1.0f;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("alpha");
    bad = config;
    bad.targets = 0;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    bad = config;
    bad.targets = (uint64_t)1 << 10; /* no such target in the C ABI */
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("targets");
    bad = config;
    bad.targets = RT_LORA_TARGET_FEED_FORWARD_GATE; /* no such projection in a GPT decoder */
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    bad = config;
    bad.reserved = 1;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    bad = config;
    bad.rank = TINY_WIDTH + 1; /* > min(in, out) of every projection */
    bad.alpha = 1.0f;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("rank");
    bad = config;
    bad.struct_size = 16;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_attach_lora(model, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_attach_lora(NULL, &config), RT_STATUS_INVALID_ARGUMENT);
    /* A live variable pins the model. */
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
    EXPECT_STATUS(rt_model_attach_lora(model, &config), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("pinned");
    rt_variable_release(logits);

    int32_t has = 1;
    EXPECT_OK(rt_model_has_lora(model, &has));
    EXPECT(has == 0);
    rt_lora_config read;
    read.struct_size = sizeof read;
    EXPECT_STATUS(rt_model_lora_config(model, &read), RT_STATUS_RUNTIME_ERROR);
    rt_parameter_list* adapters = NULL;
    EXPECT_STATUS(rt_model_lora_parameters(model, &adapters), RT_STATUS_RUNTIME_ERROR);
    EXPECT(adapters == NULL);
    EXPECT_STATUS(rt_model_merge_lora(model), RT_STATUS_RUNTIME_ERROR);
    /* The model still takes its attach. */
    EXPECT_OK(rt_model_attach_lora(model, &config));
    rt_model_release(model);
}

/* One adapter-only Adam step that leaves the model open (its B factors become non-zero). */
static void step_adapters(rt_model* model) {
    rt_parameter_list* adapters = NULL;
    EXPECT_OK(rt_model_lora_parameters(model, &adapters));
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    options.learning_rate = 0.05f;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(adapters, &options, &adam));
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_OK(rt_adam_step(adam, NULL));
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_adam_release(adam);
    rt_parameter_list_release(adapters);
}

/* 2.15: dropout on the adapter input, its key and the evaluation mode. */
static void lora_dropout_follows_the_key_and_the_evaluation_mode(void) {
    const uint64_t count = 8u * TINY_VOCABULARY;
    rt_model* model = create_tiny_model();
    uint64_t key = 1;
    EXPECT_OK(rt_model_lora_dropout_key(model, &key));
    EXPECT_EQ_U64(key, 0);
    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    config.targets = RT_LORA_TARGETS_ALL_LINEAR;
    config.rank = 2;
    /* Out of [0, 1), or reserved3 set: rejected naming the field, nothing attached. */
    const float bad_values[3] = {-0.5f, 1.0f, NAN};
    for (int i = 0; i < 3; ++i) {
        rt_lora_config bad = config;
        bad.dropout = bad_values[i];
        EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
        EXPECT_LAST_ERROR_MENTIONS("dropout");
    }
    rt_lora_config bad = config;
    bad.dropout = 0.25f;
    bad.reserved3 = 1;
    EXPECT_STATUS(rt_model_attach_lora(model, &bad), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("reserved3");
    int32_t has = 1;
    EXPECT_OK(rt_model_has_lora(model, &has));
    EXPECT(has == 0);

    config.dropout = 0.25f;
    EXPECT_OK(rt_model_attach_lora(model, &config));
    rt_lora_config read;
    read.struct_size = sizeof read;
    EXPECT_OK(rt_model_lora_config(model, &read));
    EXPECT(read.dropout == 0.25f);
    /* A 48-byte (2.13) reader gets the rest; its bytes beyond stay untouched. */
    rt_lora_config short_read;
    memset(&short_read, 0xAB, sizeof short_read);
    short_read.struct_size = 48;
    EXPECT_OK(rt_model_lora_config(model, &short_read));
    EXPECT_EQ_U64(short_read.rank, 2);
    EXPECT_EQ_U64(short_read.reserved3, 0xABABABABu);

    step_adapters(model); /* one training forward: key 0 used, now 1 */
    EXPECT_OK(rt_model_lora_dropout_key(model, &key));
    EXPECT_EQ_U64(key, 1);
    /* Evaluation mode: no dropout, no key. */
    int32_t enabled = 0;
    EXPECT_OK(rt_model_lora_dropout_enabled(model, &enabled));
    EXPECT(enabled == 1);
    EXPECT_OK(rt_model_set_lora_dropout_enabled(model, 0));
    float* evaluated = logits_of(model);
    float* evaluated_again = logits_of(model);
    EXPECT(memcmp(evaluated, evaluated_again, count * sizeof(float)) == 0);
    EXPECT_OK(rt_model_lora_dropout_key(model, &key));
    EXPECT_EQ_U64(key, 1);
    EXPECT_STATUS(rt_model_set_lora_dropout_enabled(model, 2), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("enabled");
    EXPECT_OK(rt_model_set_lora_dropout_enabled(model, 1));
    /* Training forwards: one mask per key, replayed by setting the key back. */
    EXPECT_OK(rt_model_set_lora_dropout_key(model, 7));
    float* first = logits_of(model);
    float* second = logits_of(model);
    EXPECT_OK(rt_model_lora_dropout_key(model, &key));
    EXPECT_EQ_U64(key, 9);
    EXPECT(memcmp(first, evaluated, count * sizeof(float)) != 0);
    EXPECT(memcmp(first, second, count * sizeof(float)) != 0);
    EXPECT_OK(rt_model_set_lora_dropout_key(model, 7));
    float* replayed = logits_of(model);
    EXPECT(memcmp(first, replayed, count * sizeof(float)) == 0);
    EXPECT_STATUS(rt_model_lora_dropout_key(model, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_set_lora_dropout_key(NULL, 1), RT_STATUS_INVALID_ARGUMENT);
    free(evaluated);
    free(evaluated_again);
    free(first);
    free(second);
    free(replayed);
    rt_model_release(model);
}

/* Once backward consumed its graph, a variable holds only its value and pins nothing: attach
 * and merge succeed while the logits and the loss are still open. */
static void a_graph_that_backward_consumed_no_longer_pins_the_model(void) {
    rt_model* model = create_tiny_model();
    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
    EXPECT_STATUS(rt_model_attach_lora(model, &config), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("2 live variable(s) whose graph no backward has consumed");
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_OK(rt_model_attach_lora(model, &config));
    EXPECT_OK(rt_model_merge_lora(model));
    EXPECT_STATUS(rt_variable_backward(loss), RT_STATUS_RUNTIME_ERROR); /* still consumed */
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void adapter_only_training_then_merge_reproduces_the_adapted_outputs(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* base = parameters_of(model);
    float* base_values = copy_parameter_values(base);
    rt_parameter_list_release(base);

    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    config.targets = RT_LORA_TARGETS_ALL_LINEAR;
    EXPECT_OK(rt_model_attach_lora(model, &config));
    /* The base is frozen: Adam refuses it. */
    rt_parameter_list* frozen = parameters_of(model);
    rt_adam* refused = NULL;
    EXPECT_STATUS(rt_adam_create(frozen, NULL, &refused), RT_STATUS_INVALID_ARGUMENT);
    rt_parameter_list_release(frozen);
    for (int step = 0; step < 3; ++step) {
        train_adapters_one_step(model, 5e-2f);
    }
    base = parameters_of(model);
    float* base_after = copy_parameter_values(base);
    EXPECT(memcmp(base_values, base_after, total_numel(base) * sizeof(float)) == 0);
    rt_parameter_list_release(base);
    float* adapted = logits_of(model);

    /* Pinned by a live adapter list. */
    rt_parameter_list* adapters = NULL;
    EXPECT_OK(rt_model_lora_parameters(model, &adapters));
    EXPECT_STATUS(rt_model_merge_lora(model), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("adapter parameter list");
    rt_parameter_list_release(adapters);

    EXPECT_OK(rt_model_merge_lora(model));
    int32_t has = 1;
    EXPECT_OK(rt_model_has_lora(model, &has));
    EXPECT(has == 0);
    float* merged = logits_of(model);
    EXPECT(max_difference(adapted, merged, 8u * TINY_VOCABULARY) <= 1e-5f);
    EXPECT_STATUS(rt_model_merge_lora(model), RT_STATUS_RUNTIME_ERROR);
    EXPECT_STATUS(rt_model_attach_lora(model, &config), RT_STATUS_RUNTIME_ERROR);
    /* The merged base trains again. */
    base = parameters_of(model);
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(base, NULL, &adam));
    rt_adam_release(adam);
    rt_parameter_list_release(base);
    free(base_values);
    free(base_after);
    free(adapted);
    free(merged);
    rt_model_release(model);
}

static void quantize_packs_every_projection_and_reports_exact_bytes(void) {
    rt_model* model = create_tiny_model();
    rt_quantized_memory_stats stats;
    stats.struct_size = sizeof stats;
    EXPECT_OK(rt_model_quantized_memory_stats(model, &stats));
    EXPECT_EQ_U64(stats.weight_count, 0);
    int32_t packed = 1;
    EXPECT_OK(rt_model_has_quantized_linear_weights(model, &packed));
    EXPECT(packed == 0);
    /* A live parameter list holds the dense weights. */
    rt_parameter_list* list = parameters_of(model);
    EXPECT_STATUS(rt_model_quantize_linear_weights_nf4_double_quantized(model, 64, 256),
                  RT_STATUS_RUNTIME_ERROR);
    rt_parameter_list_release(list);
    EXPECT_STATUS(rt_model_quantize_linear_weights_nf4(model, 48), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("block_size");
    EXPECT_STATUS(rt_model_quantize_linear_weights_nf4_double_quantized(model, 64, 8192),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("scale_block_size");
    EXPECT_OK(rt_model_has_quantized_linear_weights(model, &packed));
    EXPECT(packed == 0);

    float* dense = logits_of(model);
    EXPECT_OK(rt_model_quantize_linear_weights_nf4_double_quantized(model, 64, 256));
    EXPECT_OK(rt_model_has_quantized_linear_weights(model, &packed));
    EXPECT(packed == 1);
    EXPECT_STATUS(rt_model_quantize_linear_weights_nf4(model, 64), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_model_quantized_memory_stats(model, &stats));
    /* Per block: q, k, v, o (D x D), expand (F x D), project (D x F); then the head (V x D).
     * Every N here is a multiple of 64, so M = N / 64 and one scale group per weight. */
    const uint64_t sizes[7] = {TINY_WIDTH * TINY_WIDTH,        TINY_WIDTH * TINY_WIDTH,
                               TINY_WIDTH * TINY_WIDTH,        TINY_WIDTH * TINY_WIDTH,
                               TINY_FEED_FORWARD * TINY_WIDTH, TINY_FEED_FORWARD * TINY_WIDTH,
                               TINY_VOCABULARY * TINY_WIDTH};
    uint64_t codes = 0, scale_codes = 0, ranges = 0, fp32 = 0;
    for (int i = 0; i < 7; ++i) {
        const uint64_t n = sizes[i];
        const uint64_t m = (n + 63) / 64;
        codes += (n + 1) / 2;
        scale_codes += m;
        ranges += 4 * ((m + 255) / 256);
        fp32 += 4 * n;
    }
    EXPECT_EQ_U64(stats.weight_count, 7);
    EXPECT_EQ_U64(stats.double_quantized_weight_count, 7);
    EXPECT_EQ_U64(stats.packed_code_bytes, codes);
    EXPECT_EQ_U64(stats.scale_code_bytes, scale_codes);
    EXPECT_EQ_U64(stats.second_level_scale_bytes, ranges);
    EXPECT_EQ_U64(stats.scale_offset_bytes, 4 * 7);
    EXPECT_EQ_U64(stats.fp32_scale_bytes, 0);
    EXPECT_EQ_U64(stats.scale_bytes, scale_codes + ranges + 4 * 7);
    EXPECT_EQ_U64(stats.logical_payload_bytes, codes + scale_codes + ranges + 4 * 7);
    EXPECT_EQ_U64(stats.resident_payload_bytes, stats.logical_payload_bytes);
    EXPECT_EQ_U64(stats.fp32_equivalent_bytes, fp32);

    /* The packed model still runs: 4-bit weights move the logits, by much less than their
     * size (the exact kernels are checked against a dequantized oracle in the C++ tests). */
    float* packed_logits = logits_of(model);
    float largest = 0.0f;
    for (uint64_t i = 0; i < 8u * TINY_VOCABULARY; ++i) {
        EXPECT(isfinite(packed_logits[i]));
        largest = fabsf(dense[i]) > largest ? fabsf(dense[i]) : largest;
    }
    const float moved = max_difference(dense, packed_logits, 8u * TINY_VOCABULARY);
    EXPECT(moved > 0.0f && moved < 0.35f * largest);
    /* The base list no longer holds the packed weights. */
    list = parameters_of(model);
    EXPECT(count_of(list) < 2u + 12u * TINY_BLOCKS + 4u);
    rt_parameter_list_release(list);
    free(dense);
    free(packed_logits);
    rt_model_release(model);
}

static void qlora_trains_adapters_on_packed_weights_and_merges_to_fp32(void) {
    rt_model* model = create_tiny_model();
    EXPECT_OK(rt_model_quantize_linear_weights_nf4(model, 32));
    rt_lora_config config;
    EXPECT_OK(rt_lora_config_init(&config, sizeof config));
    EXPECT_OK(rt_model_attach_lora(model, &config));
    for (int step = 0; step < 3; ++step) {
        train_adapters_one_step(model, 5e-2f);
    }
    float* adapted = logits_of(model);
    EXPECT_OK(rt_model_merge_lora(model));
    int32_t packed = 1;
    EXPECT_OK(rt_model_has_quantized_linear_weights(model, &packed));
    EXPECT(packed == 0);
    rt_parameter_list* list = parameters_of(model);
    EXPECT_EQ_U64(count_of(list), 2u + 16u * TINY_BLOCKS + 4u);
    rt_parameter_list_release(list);
    float* merged = logits_of(model);
    EXPECT(max_difference(adapted, merged, 8u * TINY_VOCABULARY) <= 1e-5f);
    free(adapted);
    free(merged);
    rt_model_release(model);
}

static void packed_state_round_trips_and_rejects_a_corrupt_or_mismatched_state(void) {
    rt_model* model = create_tiny_model();
    uint64_t size = 0;
    EXPECT_STATUS(rt_model_packed_state_size(model, &size), RT_STATUS_RUNTIME_ERROR);
    EXPECT_OK(rt_model_quantize_linear_weights_nf4(model, 64));
    EXPECT_OK(rt_model_packed_state_size(model, &size));
    uint64_t required = 0;
    EXPECT_OK(rt_model_packed_state_copy(model, NULL, 0, &required));
    EXPECT_EQ_U64(required, size);
    uint8_t* bytes = malloc(size);
    EXPECT(bytes != NULL);
    EXPECT_STATUS(rt_model_packed_state_copy(model, bytes, size - 1, &required),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_OK(rt_model_packed_state_copy(model, bytes, size, &required));
    EXPECT(memcmp(bytes, "RTNF4ST1", 8) == 0);
    float* before = logits_of(model);

    /* Another model, same shapes, different weights: loading makes it compute the same. */
    rt_transformer_config other_config = tiny_config();
    other_config.random_seed = 99;
    rt_model* other = NULL;
    EXPECT_OK(rt_model_create(&other_config, &other));
    EXPECT_STATUS(rt_model_packed_state_load(other, bytes, size), RT_STATUS_RUNTIME_ERROR);
    EXPECT_OK(rt_model_quantize_linear_weights_nf4(other, 64));
    /* Copy the dense (unpacked) parameters too, so the whole model matches. */
    rt_parameter_list* source = parameters_of(model);
    rt_parameter_list* target = parameters_of(other);
    float* values = copy_parameter_values(source);
    EXPECT_OK(rt_parameter_list_load_from_host_f32(target, values, total_numel(source)));
    rt_parameter_list_release(source);
    rt_parameter_list_release(target);
    EXPECT_OK(rt_model_packed_state_load(other, bytes, size));
    float* loaded = logits_of(other);
    EXPECT(memcmp(before, loaded, 8u * TINY_VOCABULARY * sizeof(float)) == 0);

    /* Truncated, trailing bytes, a bad magic, a flipped reserved word: rejected. */
    EXPECT_STATUS(rt_model_packed_state_load(other, bytes, size - 1), RT_STATUS_INVALID_ARGUMENT);
    uint8_t* longer = malloc(size + 1);
    memcpy(longer, bytes, size);
    longer[size] = 0;
    EXPECT_STATUS(rt_model_packed_state_load(other, longer, size + 1), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("trailing");
    free(longer);
    bytes[0] = 'X';
    EXPECT_STATUS(rt_model_packed_state_load(other, bytes, size), RT_STATUS_INVALID_ARGUMENT);
    bytes[0] = 'R';
    /* A double-quantized state does not fit a legacy-scale model. */
    rt_model* dq = create_tiny_model();
    EXPECT_OK(rt_model_quantize_linear_weights_nf4_double_quantized(dq, 64, 256));
    EXPECT_STATUS(rt_model_packed_state_load(dq, bytes, size), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("scales");
    float* unchanged = logits_of(other);
    EXPECT(memcmp(before, unchanged, 8u * TINY_VOCABULARY * sizeof(float)) == 0);
    free(unchanged);
    free(before);
    free(loaded);
    free(values);
    free(bytes);
    rt_model_release(dq);
    rt_model_release(other);
    rt_model_release(model);
}

int main(void) {
    RUN_TEST(lora_config_init_sets_the_spec_defaults);
    RUN_TEST(attach_is_output_preserving_and_keeps_the_base_list);
    RUN_TEST(attach_rejections_change_nothing);
    RUN_TEST(lora_dropout_follows_the_key_and_the_evaluation_mode);
    RUN_TEST(a_graph_that_backward_consumed_no_longer_pins_the_model);
    RUN_TEST(adapter_only_training_then_merge_reproduces_the_adapted_outputs);
    RUN_TEST(quantize_packs_every_projection_and_reports_exact_bytes);
    RUN_TEST(qlora_trains_adapters_on_packed_weights_and_merges_to_fp32);
    RUN_TEST(packed_state_round_trips_and_rejects_a_corrupt_or_mismatched_state);
    return finish_tests();
}
