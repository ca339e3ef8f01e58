/*
 * The programmed-model family of the C ABI as a pure C11 client sees it: multilinear map
 * import and queries, config inits, model creation (learned-only or with a program), forward
 * options and their rules, representation traces that outlive the model, and the shared
 * parameter-list / Adam / backward lifecycle. Every rejection leaves outputs untouched.
 */
#include "c_test_fixtures.h"

#define MODULUS 3u

/* (a + b) mod 3 on one-hot vectors: T[o, i, j] = 1 iff (i + j) % 3 == o. */
static rt_multilinear_map* modular_addition(void) {
    double values[MODULUS * MODULUS * MODULUS] = {0};
    for (unsigned i = 0; i < MODULUS; ++i)
        for (unsigned j = 0; j < MODULUS; ++j)
            values[((i + j) % MODULUS) * MODULUS * MODULUS + i * MODULUS + j] = 1.0;
    const uint64_t dims[2] = {MODULUS, MODULUS};
    rt_multilinear_map* map = NULL;
    EXPECT_OK(rt_multilinear_map_create_dense(MODULUS, dims, 2, values, 27, &map));
    return map;
}

static rt_program_augmented_model_config small_config(void) {
    rt_program_augmented_model_config config;
    EXPECT_OK(rt_program_augmented_model_config_init(&config, sizeof config));
    config.vocabulary_size = 6;
    config.context_length = 3;
    config.model_width = 8;
    config.head_count = 2;
    config.feed_forward_width = 16;
    return config;
}

static const rt_program_input_layout layouts[2] = {
    {RT_PROGRAM_INPUT_SOURCE_POSITION, 0, 0, 0},
    {RT_PROGRAM_INPUT_SOURCE_POSITION, 0, 1, 1},
};

static rt_program_augmented_model* program_model(rt_multilinear_map* map) {
    const rt_program_augmented_model_config config = small_config();
    rt_program_branch_config branch;
    EXPECT_OK(rt_program_branch_config_init(&branch, sizeof branch));
    branch.source_length = 2;
    branch.target_offset = 2;
    branch.inputs = layouts;
    branch.input_count = 2;
    rt_neural_lowering_options lowering;
    EXPECT_OK(rt_neural_lowering_options_init(&lowering, sizeof lowering));
    lowering.trainable = 1;
    rt_program_augmented_model* model = NULL;
    EXPECT_OK(rt_program_augmented_model_create(&config, map, &branch, &lowering, &model));
    return model;
}

static const uint32_t tokens[6] = {1, 2, 0, 3, 4, 5}; /* [2, 3] */
static const uint32_t targets[6] = {2, 0, 1, 4, 5, 3};

static void multilinear_maps_import_dense_and_sparse_and_report_themselves(void) {
    rt_multilinear_map* dense = modular_addition();
    uint64_t value = 0;
    EXPECT_OK(rt_multilinear_map_output_dimension(dense, &value));
    EXPECT_EQ_U64(value, MODULUS);
    EXPECT_OK(rt_multilinear_map_arity(dense, &value));
    EXPECT_EQ_U64(value, 2);
    uint64_t dims[2] = {0, 0};
    uint64_t required = 0;
    EXPECT_OK(rt_multilinear_map_input_dimensions(dense, NULL, 0, &required));
    EXPECT_EQ_U64(required, 2);
    EXPECT_OK(rt_multilinear_map_input_dimensions(dense, dims, 2, &required));
    EXPECT_EQ_U64(dims[1], MODULUS);
    double values[27];
    EXPECT_STATUS(rt_multilinear_map_values(dense, values, 26, &required), RT_STATUS_OUT_OF_RANGE);
    EXPECT_OK(rt_multilinear_map_values(dense, values, 27, &required));
    EXPECT(values[0 * 9 + 0 * 3 + 0] == 1.0 && values[1 * 9 + 0 * 3 + 1] == 1.0 &&
           values[1 * 9 + 0 * 3 + 0] == 0.0);

    const uint64_t two[2] = {MODULUS, MODULUS};
    const uint64_t indices[2] = {5, 20};
    const double nonzero[2] = {2.0, -1.0};
    rt_multilinear_map* sparse = NULL;
    EXPECT_OK(rt_multilinear_map_create_sparse(MODULUS, two, 2, indices, nonzero, 2, &sparse));
    EXPECT_OK(rt_multilinear_map_values(sparse, values, 27, &required));
    EXPECT(values[5] == 2.0 && values[20] == -1.0 && values[0] == 0.0);
    rt_multilinear_map* empty = NULL;
    EXPECT_OK(rt_multilinear_map_create_sparse(MODULUS, two, 2, NULL, NULL, 0, &empty));

    /* Rejections leave out untouched. */
    rt_multilinear_map* untouched = NULL;
    const uint64_t repeated[2] = {5, 5};
    EXPECT_STATUS(
        rt_multilinear_map_create_sparse(MODULUS, two, 2, repeated, nonzero, 2, &untouched),
        RT_STATUS_INVALID_ARGUMENT);
    const uint64_t past[1] = {27};
    EXPECT_STATUS(rt_multilinear_map_create_sparse(MODULUS, two, 2, past, nonzero, 1, &untouched),
                  RT_STATUS_OUT_OF_RANGE);
    const double zero[1] = {0.0};
    EXPECT_STATUS(rt_multilinear_map_create_sparse(MODULUS, two, 2, indices, zero, 1, &untouched),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("explicit zero");
    EXPECT_STATUS(rt_multilinear_map_create_dense(MODULUS, two, 2, values, 26, &untouched),
                  RT_STATUS_INVALID_ARGUMENT);
    const uint64_t huge[2] = {(uint64_t)1 << 20, (uint64_t)1 << 20};
    EXPECT_STATUS(rt_multilinear_map_create_dense(1, huge, 2, NULL, 0, &untouched),
                  RT_STATUS_OVERFLOW);
    const uint64_t zero_dim[1] = {0};
    EXPECT_STATUS(rt_multilinear_map_create_dense(2, zero_dim, 1, NULL, 0, &untouched),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(untouched == NULL);
    rt_multilinear_map_release(empty);
    rt_multilinear_map_release(sparse);
    rt_multilinear_map_release(dense);
}

static void config_inits_set_the_spec_defaults(void) {
    rt_program_augmented_model_config config;
    EXPECT_OK(rt_program_augmented_model_config_init(&config, sizeof config));
    EXPECT_EQ_U64(config.vocabulary_size, 512);
    EXPECT_EQ_U64(config.context_length, 128);
    EXPECT_EQ_U64(config.model_width, 64);
    EXPECT_EQ_U64(config.head_count, 4);
    EXPECT_EQ_U64(config.feed_forward_width, 256);
    EXPECT_EQ_U64(config.attention_branch_count, 2);
    EXPECT_EQ_U64(config.random_seed, 42);
    rt_neural_lowering_options lowering;
    EXPECT_OK(rt_neural_lowering_options_init(&lowering, sizeof lowering));
    EXPECT(lowering.strategy == RT_LOWERING_AUTO &&
           lowering.precision == RT_COEFFICIENT_PRECISION_EXACT);
    EXPECT(lowering.random_scale == 0.02f && lowering.random_seed == 42 && lowering.trainable == 0);
    EXPECT(lowering.attention_query_axis == -1);
    EXPECT_EQ_U64(lowering.max_coefficient_elements, (uint64_t)1 << 24);
    rt_program_branch_config branch;
    EXPECT_OK(rt_program_branch_config_init(&branch, sizeof branch));
    EXPECT_EQ_U64(branch.output_length, 1);
    rt_program_augmented_forward_options options;
    EXPECT_OK(rt_program_augmented_forward_options_init(&options, sizeof options));
    EXPECT_EQ_U64(options.batch_roll_shift, 1);
    EXPECT_STATUS(rt_program_augmented_forward_options_init(&options, 8),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(sizeof(rt_program_augmented_model_config), 64);
    EXPECT_EQ_U64(sizeof(rt_program_branch_config), 64);
    EXPECT_EQ_U64(sizeof(rt_neural_lowering_options), 48);
    EXPECT_EQ_U64(sizeof(rt_program_augmented_forward_options), 64);
}

static void creation_takes_all_three_program_parts_or_none(void) {
    const rt_program_augmented_model_config config = small_config();
    rt_multilinear_map* map = modular_addition();
    rt_program_branch_config branch;
    EXPECT_OK(rt_program_branch_config_init(&branch, sizeof branch));
    rt_program_augmented_model* model = NULL;
    EXPECT_STATUS(rt_program_augmented_model_create(&config, map, &branch, NULL, &model),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
    /* A branch that does not fit the map (no input layouts): invalid, nothing created. */
    rt_neural_lowering_options lowering;
    EXPECT_OK(rt_neural_lowering_options_init(&lowering, sizeof lowering));
    branch.source_length = 2;
    EXPECT_STATUS(rt_program_augmented_model_create(&config, map, &branch, &lowering, &model),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("arity 2");
    lowering.strategy = 9;
    branch.inputs = layouts;
    branch.input_count = 2;
    EXPECT_STATUS(rt_program_augmented_model_create(&config, map, &branch, &lowering, &model),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
    /* Reserved words must be zero; struct sizes below the first published one are invalid. */
    const rt_program_input_layout reserved_set[2] = {{RT_PROGRAM_INPUT_SOURCE_POSITION, 1, 0, 0},
                                                     {RT_PROGRAM_INPUT_SOURCE_POSITION, 0, 1, 1}};
    lowering.strategy = RT_LOWERING_AUTO;
    branch.inputs = reserved_set;
    EXPECT_STATUS(rt_program_augmented_model_create(&config, map, &branch, &lowering, &model),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("reserved");
    branch.inputs = layouts;
    branch.merge_bias = 2;
    EXPECT_STATUS(rt_program_augmented_model_create(&config, map, &branch, &lowering, &model),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("merge_bias");
    branch.merge_bias = 0;
    rt_program_augmented_model_config small = config;
    small.struct_size = 16;
    EXPECT_STATUS(rt_program_augmented_model_create(&small, NULL, NULL, NULL, &model),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
    EXPECT_OK(rt_program_augmented_model_create(&config, NULL, NULL, NULL, &model));
    rt_program_augmented_forward_options options;
    EXPECT_OK(rt_program_augmented_forward_options_init(&options, sizeof options));
    options.reserved = 1;
    rt_variable* logits = NULL;
    const uint32_t row[3] = {1, 2, 0};
    EXPECT_STATUS(rt_program_augmented_model_forward(model, row, 3, 1, &options, &logits, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    options.reserved = 0;
    options.ablate_program_output = 1; /* a learned-only model has no program to ablate */
    EXPECT_STATUS(rt_program_augmented_model_forward(model, row, 3, 1, &options, &logits, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(logits == NULL);
    int32_t has = 1;
    EXPECT_OK(rt_program_augmented_model_has_program(model, &has));
    EXPECT(has == 0);
    rt_program_augmented_model_config read;
    read.struct_size = sizeof read;
    EXPECT_OK(rt_program_augmented_model_get_config(model, &read));
    EXPECT_EQ_U64(read.context_length, 3);
    rt_program_augmented_model_release(model);
    rt_multilinear_map_release(map);
}

static void forward_traces_outlive_the_model_and_name_every_representation(void) {
    rt_multilinear_map* map = modular_addition();
    rt_program_augmented_model* model = program_model(map);
    rt_multilinear_map_release(map); /* the model holds its own copy */
    rt_program_augmented_forward_options options;
    EXPECT_OK(rt_program_augmented_forward_options_init(&options, sizeof options));
    rt_variable* logits = NULL;
    rt_representation_trace* trace = NULL;
    /* The trace pointer is required exactly when capture is on. */
    EXPECT_STATUS(
        rt_program_augmented_model_forward(model, tokens, 6, 2, &options, &logits, &trace),
        RT_STATUS_INVALID_ARGUMENT);
    options.capture_representations = 1;
    EXPECT_STATUS(rt_program_augmented_model_forward(model, tokens, 6, 2, &options, &logits, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    options.batch_roll_shift = 0;
    EXPECT_STATUS(
        rt_program_augmented_model_forward(model, tokens, 6, 2, &options, &logits, &trace),
        RT_STATUS_INVALID_ARGUMENT);
    options.batch_roll_shift = 1;
    EXPECT_STATUS(
        rt_program_augmented_model_forward(model, tokens, 5, 2, &options, &logits, &trace),
        RT_STATUS_INVALID_ARGUMENT);
    const uint32_t bad[6] = {1, 2, 0, 3, 4, 6};
    EXPECT_STATUS(rt_program_augmented_model_forward(model, bad, 6, 2, &options, &logits, &trace),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT(logits == NULL && trace == NULL);
    EXPECT_OK(rt_program_augmented_model_forward(model, tokens, 6, 2, &options, &logits, &trace));
    rt_program_augmented_model_release(model);

    uint64_t count = 0;
    EXPECT_OK(rt_representation_trace_count(trace, &count));
    EXPECT_EQ_U64(count, 12);
    char name[64];
    uint64_t required = 0;
    EXPECT_OK(rt_representation_trace_name(trace, 0, name, sizeof name, &required));
    EXPECT_STREQ(name, "embedding.sum");
    uint64_t index = 0;
    EXPECT_OK(rt_representation_trace_find(trace, "program.output.raw", &index));
    uint64_t shape[4];
    EXPECT_OK(rt_representation_trace_shape(trace, index, shape, 4, &required));
    EXPECT_EQ_U64(required, 2);
    EXPECT_EQ_U64(shape[0], 2);
    EXPECT_EQ_U64(shape[1], MODULUS);
    EXPECT_STATUS(rt_representation_trace_find(trace, "nope", &index), RT_STATUS_OUT_OF_RANGE);
    EXPECT_OK(rt_representation_trace_find(trace, "logits", &index));
    uint64_t numel = 0;
    EXPECT_OK(rt_representation_trace_numel(trace, index, &numel));
    EXPECT_EQ_U64(numel, 2 * 3 * 6);
    float traced[36];
    float direct[36];
    EXPECT_OK(rt_representation_trace_copy_f32(trace, index, traced, 36, &required));
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, direct, 36, &required));
    EXPECT(memcmp(traced, direct, sizeof traced) == 0);
    EXPECT_STATUS(rt_representation_trace_rank(trace, 12, &numel), RT_STATUS_OUT_OF_RANGE);
    rt_variable_release(logits);
    rt_representation_trace_release(trace);
}

static void interventions_change_the_logits_and_training_takes_adam_steps(void) {
    rt_multilinear_map* map = modular_addition();
    rt_program_augmented_model* model = program_model(map);
    rt_multilinear_map_release(map);
    rt_variable* plain = NULL;
    EXPECT_OK(rt_program_augmented_model_forward(model, tokens, 6, 2, NULL, &plain, NULL));
    float before[36];
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(plain, before, 36, &required));
    rt_variable_release(plain);

    rt_program_augmented_forward_options options;
    EXPECT_OK(rt_program_augmented_forward_options_init(&options, sizeof options));
    const float scales[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    const rt_program_steering steering[1] = {{0, 0, scales, 8, NULL, 0}};
    const uint64_t ablated[1] = {1};
    options.steering = steering;
    options.steering_count = 1;
    options.ablated_program_inputs = ablated;
    options.ablated_program_input_count = 1;
    options.ablate_program_output = 1;
    rt_variable* steered = NULL;
    EXPECT_OK(rt_program_augmented_model_forward(model, tokens, 6, 2, &options, &steered, NULL));
    float after[36];
    EXPECT_OK(rt_variable_copy_to_host_f32(steered, after, 36, &required));
    EXPECT(memcmp(before, after, sizeof before) != 0);
    rt_variable_release(steered);
    const uint64_t twice[2] = {1, 1};
    options.ablated_program_inputs = twice;
    options.ablated_program_input_count = 2;
    EXPECT_STATUS(rt_program_augmented_model_forward(model, tokens, 6, 2, &options, &steered, NULL),
                  RT_STATUS_INVALID_ARGUMENT);

    /* Parameters, Adam, backward: the rt_model lifecycle. */
    rt_parameter_list* parameters = NULL;
    EXPECT_OK(rt_program_augmented_model_parameters(model, &parameters));
    char name[64];
    EXPECT_OK(rt_parameter_list_name(parameters, 0, name, sizeof name, &required));
    EXPECT_STREQ(name, "token_embedding.weight");
    rt_adam_options adam_options;
    EXPECT_OK(rt_adam_options_init(&adam_options, sizeof adam_options));
    adam_options.learning_rate = 1e-2f;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(parameters, &adam_options, &adam));
    EXPECT_STATUS(rt_program_augmented_model_to(model, RT_BACKEND_CPU), RT_STATUS_RUNTIME_ERROR);
    float first = 0.0f, last = 0.0f;
    for (int step = 0; step < 20; ++step) {
        rt_variable* logits = NULL;
        EXPECT_OK(rt_program_augmented_model_forward(model, tokens, 6, 2, NULL, &logits, NULL));
        rt_variable* loss = NULL;
        EXPECT_OK(rt_cross_entropy(logits, targets, 6, &loss));
        float value = 0.0f;
        EXPECT_OK(rt_variable_copy_to_host_f32(loss, &value, 1, &required));
        if (step == 0)
            first = value;
        last = value;
        EXPECT_OK(rt_variable_backward(loss));
        EXPECT_OK(rt_adam_step(adam, NULL));
        rt_variable_release(loss);
        rt_variable_release(logits);
    }
    EXPECT(last < first);
    rt_adam_release(adam);
    rt_parameter_list_release(parameters);
    int32_t backend = -1;
    EXPECT_OK(rt_program_augmented_model_backend(model, &backend));
    EXPECT(backend == RT_BACKEND_CPU);
    rt_program_augmented_model_release(model);
}

int main(void) {
    RUN_TEST(multilinear_maps_import_dense_and_sparse_and_report_themselves);
    RUN_TEST(config_inits_set_the_spec_defaults);
    RUN_TEST(creation_takes_all_three_program_parts_or_none);
    RUN_TEST(forward_traces_outlive_the_model_and_name_every_representation);
    RUN_TEST(interventions_change_the_logits_and_training_takes_adam_steps);
    return finish_tests();
}
