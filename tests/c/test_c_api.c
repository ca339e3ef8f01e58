/*
 * The stable C ABI (include/riftco_transformer/c_api.h) as a pure C11 client sees it. Each
 * test states one documented behaviour and is named after it; the families follow the
 * header's order: versioning and status, backends, tokenizers, contexts and tensors, the
 * size-query protocol of every variable-size output, models, parameter lists, autograd,
 * Adam, training, and thread-local errors.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_fixtures.h"
#include "c_test_support.h"

#if !defined(__STDC_NO_THREADS__)
#include <threads.h>
#elif defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

/* ==== Fixtures ============================================================================ */

/* The training batch: two rows of eight positions over the repeating pattern 0, 1, ..., 15,
 * each target the token that follows. */
#define PATTERN_BATCH 2u
#define PATTERN_TIME 8u
#define PATTERN_TOKENS (PATTERN_BATCH * PATTERN_TIME)

#define SENTINEL_BYTE 0xA5u

/* The unavailable stubs of the default build. A cuda build on a machine with a visible device
 * is the one exception: there cuda is available, so unavailable_here() leaves it out of these
 * checks, saying so. (Without the adapter, cuda is never available.) */
static const int32_t unavailable_backends[] = {RT_BACKEND_METAL, RT_BACKEND_CUDA, RT_BACKEND_TPU,
                                               RT_BACKEND_PJRT};
static const char* const unavailable_backend_names[] = {"metal", "cuda", "tpu", "pjrt"};
#define UNAVAILABLE_BACKEND_COUNT 4u

/* 1 only in a cuda build where a device is visible. */
static int cuda_device_visible(void) {
    int32_t available = 0;
    if (rt_backend_is_available(RT_BACKEND_CUDA, &available) != RT_STATUS_OK) {
        return 0;
    }
    return available != 0;
}

/* Whether unavailable_backends[index] is unavailable here (every entry, except cuda where a
 * device is visible: its available behaviour is tested by test_c_api_cuda). */
static int unavailable_here(size_t index) {
    if (unavailable_backends[index] == RT_BACKEND_CUDA && cuda_device_visible()) {
        printf("  note: a CUDA device is visible: cuda's unavailable-stub checks are skipped\n");
        return 0;
    }
    return 1;
}
/* The first value past the last backend identity (RT_BACKEND_PJRT = 4). */
#define FIRST_UNASSIGNED_BACKEND 5

static void pattern_tokens(uint32_t tokens[PATTERN_TOKENS]) {
    for (uint32_t position = 0; position < PATTERN_TOKENS; ++position) {
        tokens[position] = position % TINY_VOCABULARY;
    }
}

static void pattern_targets(uint32_t targets[PATTERN_TOKENS]) {
    for (uint32_t position = 0; position < PATTERN_TOKENS; ++position) {
        targets[position] = (position + 1u) % TINY_VOCABULARY;
    }
}

static rt_variable* forward_pattern(rt_model* model) {
    uint32_t tokens[PATTERN_TOKENS];
    pattern_tokens(tokens);
    rt_variable* logits = NULL;
    EXPECT_OK(
        rt_model_forward(model, tokens, PATTERN_TOKENS, PATTERN_BATCH, PATTERN_TIME, &logits));
    return logits;
}

/* A fresh graph: forward over the pattern, then its mean cross-entropy. */
static rt_variable* pattern_loss(rt_model* model) {
    uint32_t targets[PATTERN_TOKENS];
    pattern_targets(targets);
    rt_variable* logits = forward_pattern(model);
    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy(logits, targets, PATTERN_TOKENS, &loss));
    rt_variable_release(logits);
    return loss;
}

static float scalar_value(const rt_variable* variable) {
    float value = NAN;
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(variable, &value, 1, &required));
    EXPECT_EQ_U64(required, 1u);
    return value;
}

static int parameters_equal(const rt_parameter_list* list, const float* expected) {
    float* actual = copy_parameter_values(list);
    const int equal = memcmp(actual, expected, total_numel(list) * sizeof *actual) == 0;
    free(actual);
    return equal;
}

static rt_adam_options default_adam_options(void) {
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    return options;
}

static rt_adam* create_adam(const rt_parameter_list* list, float learning_rate) {
    rt_adam_options options = default_adam_options();
    options.learning_rate = learning_rate;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, &options, &adam));
    return adam;
}

static uint64_t step_count_of(const rt_adam* adam) {
    uint64_t count = UINT64_MAX;
    EXPECT_OK(rt_adam_step_count(adam, &count));
    return count;
}

/* One training step on the pattern; returns the loss before the update. */
static float train_step(rt_model* model, rt_adam* adam, rt_adam_step_stats* stats) {
    rt_variable* loss = pattern_loss(model);
    const float value = scalar_value(loss);
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_OK(rt_adam_step(adam, stats));
    rt_variable_release(loss);
    return value;
}

static rt_context* create_cpu_context(void) {
    rt_context* context = NULL;
    EXPECT_OK(rt_context_create(RT_BACKEND_CPU, &context));
    return context;
}

static rt_tensor* create_tensor(const rt_context* context, const uint64_t* shape, uint64_t rank,
                                const float* values, uint64_t count) {
    rt_tensor* tensor = NULL;
    EXPECT_OK(rt_tensor_create_f32(context, shape, rank, values, count, &tensor));
    return tensor;
}

static rt_tokenizer* create_byte_tokenizer(const char* corpus, uint64_t size) {
    rt_tokenizer* tokenizer = NULL;
    EXPECT_OK(rt_tokenizer_create((const uint8_t*)corpus, size, &tokenizer));
    return tokenizer;
}

/* A BPE tokenizer with at most four merges, learned from a corpus where "ab" dominates. */
static rt_tokenizer* create_small_bpe_tokenizer(void) {
    static const char corpus[] = "abababab abab ab abababab";
    rt_tokenizer_options options;
    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    options.method = RT_TOKENIZER_METHOD_BPE;
    options.vocabulary_size = 260;
    rt_tokenizer* tokenizer = NULL;
    EXPECT_OK(rt_tokenizer_create_with_options((const uint8_t*)corpus, sizeof corpus - 1, &options,
                                               &tokenizer));
    return tokenizer;
}

/* The ids of `bytes` and their count; the caller frees them. */
static uint32_t* encode_all(const rt_tokenizer* tokenizer, const uint8_t* bytes, uint64_t size,
                            uint64_t* id_count) {
    uint32_t* ids = malloc((size + 1u) * sizeof *ids);
    EXPECT(ids != NULL);
    EXPECT_OK(rt_tokenizer_encode(tokenizer, bytes, size, ids, size, id_count));
    return ids;
}

/* ==== Versioning, status names and the error text ======================================== */

static void abi_version_is_the_header_version(void) {
    EXPECT_EQ_U64(rt_abi_version(), RT_ABI_VERSION);
}

static void abi_version_is_major_shifted_over_minor(void) {
    EXPECT_EQ_U64(RT_ABI_VERSION_MAJOR, 2u);
    EXPECT_EQ_U64(RT_ABI_VERSION_MINOR, 15u);
    EXPECT_EQ_U64(RT_ABI_VERSION, 0x0002000Fu);
    EXPECT_EQ_U64(RT_ABI_VERSION,
                  ((uint32_t)RT_ABI_VERSION_MAJOR << 16) | (uint32_t)RT_ABI_VERSION_MINOR);
    EXPECT_EQ_U64(rt_abi_version() >> 16, RT_ABI_VERSION_MAJOR);
    EXPECT_EQ_U64(rt_abi_version() & 0xFFFFu, RT_ABI_VERSION_MINOR);
}

static void status_string_names_every_status(void) {
    EXPECT_STREQ(rt_status_string(RT_STATUS_OK), "ok");
    EXPECT_STREQ(rt_status_string(RT_STATUS_INVALID_ARGUMENT), "invalid_argument");
    EXPECT_STREQ(rt_status_string(RT_STATUS_OUT_OF_RANGE), "out_of_range");
    EXPECT_STREQ(rt_status_string(RT_STATUS_OVERFLOW), "overflow");
    EXPECT_STREQ(rt_status_string(RT_STATUS_BACKEND_UNAVAILABLE), "backend_unavailable");
    EXPECT_STREQ(rt_status_string(RT_STATUS_OUT_OF_MEMORY), "out_of_memory");
    EXPECT_STREQ(rt_status_string(RT_STATUS_RUNTIME_ERROR), "runtime_error");
    EXPECT_STREQ(rt_status_string(RT_STATUS_UNKNOWN_ERROR), "unknown_error");
}

static void status_string_of_an_unknown_value_is_unrecognized(void) {
    static const rt_status unknown[] = {7, 42, 254, 256, -1, INT32_MIN, INT32_MAX};
    for (size_t index = 0; index < sizeof unknown / sizeof unknown[0]; ++index) {
        EXPECT_STREQ(rt_status_string(unknown[index]), "unrecognized status");
    }
}

static void a_successful_call_clears_the_last_error(void) {
    int32_t available = -1;
    EXPECT_STATUS(rt_backend_is_available(99, &available), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(rt_last_error()[0] != '\0');
    EXPECT_OK(rt_backend_is_available(RT_BACKEND_CPU, &available));
    EXPECT_STREQ(rt_last_error(), "");
}

static void last_error_survives_calls_that_return_no_status(void) {
    int32_t available = -1;
    EXPECT_STATUS(rt_backend_is_available(99, &available), RT_STATUS_INVALID_ARGUMENT);
    char error[1024];
    snprintf(error, sizeof error, "%s", rt_last_error());
    (void)rt_abi_version();
    (void)rt_status_string(RT_STATUS_OK);
    rt_tensor_release(NULL);
    rt_model_release(NULL);
    EXPECT_STREQ(rt_last_error(), error);
}

static void last_error_is_truncated_to_1023_bytes(void) {
    /* The overflow message spells out the whole shape: 100 thirteen-digit dimensions make it
     * far longer than the buffer. */
    uint64_t shape[100];
    for (size_t axis = 0; axis < 100; ++axis) {
        shape[axis] = UINT64_C(1) << 40;
    }
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = NULL;
    EXPECT_STATUS(rt_tensor_zeros_f32(context, shape, 100, &tensor), RT_STATUS_OVERFLOW);
    EXPECT_EQ_U64(strlen(rt_last_error()), 1023u);
    EXPECT(tensor == NULL);
    rt_context_release(context);
}

static void releasing_null_handles_is_a_no_op(void) {
    rt_tokenizer_release(NULL);
    rt_context_release(NULL);
    rt_tensor_release(NULL);
    rt_model_release(NULL);
    rt_parameter_list_release(NULL);
    rt_variable_release(NULL);
    rt_adam_release(NULL);
}

/* ==== Backends ============================================================================ */

static void cpu_backend_is_available(void) {
    int32_t available = -1;
    EXPECT_OK(rt_backend_is_available(RT_BACKEND_CPU, &available));
    EXPECT(available == 1);

    char reason[8];
    memset(reason, 'x', sizeof reason);
    uint64_t required = 0;
    EXPECT_OK(rt_backend_unavailability_reason(RT_BACKEND_CPU, reason, sizeof reason, &required));
    EXPECT_EQ_U64(required, 1u);
    EXPECT_STREQ(reason, "");
}

static void cpu_info_names_the_gemm_kernel_and_the_thread_count(void) {
    uint64_t required = 0;
    EXPECT_OK(rt_cpu_info(NULL, 0, &required));
    EXPECT(required > 1u);
    char info[512];
    EXPECT(required <= sizeof info);
    EXPECT_OK(rt_cpu_info(info, sizeof info, &required));
    EXPECT(strncmp(info, "gemm=", 5) == 0);
    EXPECT(strstr(info, "; packed=nf4 ") != NULL);
    EXPECT(strstr(info, ", q8_0/q4_0/q4_1/q5_0/q4_k/q5_k/q6_k/f16/bf16 ") != NULL);
    EXPECT(strstr(info, "; threads=") != NULL);
    EXPECT_EQ_U64((uint64_t)strlen(info) + 1u, required);
    char small[4];
    EXPECT_STATUS(rt_cpu_info(small, sizeof small, &required), RT_STATUS_OUT_OF_RANGE);
}

static void stub_backends_are_unavailable_with_a_reason(void) {
    for (size_t index = 0; index < UNAVAILABLE_BACKEND_COUNT; ++index) {
        if (!unavailable_here(index)) {
            continue;
        }
        int32_t available = -1;
        EXPECT_OK(rt_backend_is_available(unavailable_backends[index], &available));
        EXPECT(available == 0);

        uint64_t required = 0;
        EXPECT_OK(
            rt_backend_unavailability_reason(unavailable_backends[index], NULL, 0, &required));
        EXPECT(required > 1u); /* a non-empty reason and its NUL */
    }
}

static void backend_values_are_stable(void) {
    EXPECT(RT_BACKEND_CPU == 0);
    EXPECT(RT_BACKEND_METAL == 1);
    EXPECT(RT_BACKEND_CUDA == 2);
    EXPECT(RT_BACKEND_TPU == 3);
    EXPECT(RT_BACKEND_PJRT == 4); /* appended in 2.9 */
}

/* Without the PJRT adapter the reason names its build option; a build with it (the build's
 * option, compiled in by tests/CMakeLists.txt) and no plugin named names the plugin variable. */
#if RIFTCO_TRANSFORMER_TEST_HAVE_PJRT
#define PJRT_REASON_FRAGMENT "RIFTCO_TRANSFORMER_PJRT_PLUGIN"
#else
#define PJRT_REASON_FRAGMENT "RIFTCO_TRANSFORMER_ENABLE_TPU"
#endif

static void pjrt_is_unavailable_in_a_default_build_naming_its_build_option(void) {
    int32_t available = -1;
    EXPECT_OK(rt_backend_is_available(RT_BACKEND_PJRT, &available));
    if (available == 1) {
        printf("skipped: a PJRT plugin is loaded here\n");
        return;
    }
    EXPECT(available == 0);
    char reason[256];
    uint64_t required = 0;
    EXPECT_OK(rt_backend_unavailability_reason(RT_BACKEND_PJRT, reason, sizeof reason, &required));
    EXPECT(strstr(reason, "PJRT") != NULL);
    EXPECT(strstr(reason, PJRT_REASON_FRAGMENT) != NULL);

    rt_context* context = NULL;
    EXPECT_STATUS(rt_context_create(RT_BACKEND_PJRT, &context), RT_STATUS_BACKEND_UNAVAILABLE);
    EXPECT_LAST_ERROR_MENTIONS(PJRT_REASON_FRAGMENT);
    EXPECT(context == NULL);
}

static void backends_have_their_stable_names(void) {
    static const int32_t backends[] = {RT_BACKEND_CPU, RT_BACKEND_METAL, RT_BACKEND_CUDA,
                                       RT_BACKEND_TPU, RT_BACKEND_PJRT};
    static const char* const names[] = {"cpu", "metal", "cuda", "tpu", "pjrt"};
    for (size_t index = 0; index < sizeof backends / sizeof backends[0]; ++index) {
        char name[16];
        uint64_t required = 0;
        EXPECT_OK(rt_backend_name(backends[index], name, sizeof name, &required));
        EXPECT_STREQ(name, names[index]);
        EXPECT_EQ_U64(required, strlen(names[index]) + 1u);
    }
}

static void backend_queries_reject_an_unknown_backend(void) {
    static const int32_t unknown[] = {-1, FIRST_UNASSIGNED_BACKEND, 1000};
    for (size_t index = 0; index < sizeof unknown / sizeof unknown[0]; ++index) {
        int32_t available = -1;
        EXPECT_STATUS(rt_backend_is_available(unknown[index], &available),
                      RT_STATUS_INVALID_ARGUMENT);
        EXPECT(available == -1);
        uint64_t required = 0;
        EXPECT_STATUS(rt_backend_name(unknown[index], NULL, 0, &required),
                      RT_STATUS_INVALID_ARGUMENT);
        EXPECT_STATUS(rt_backend_unavailability_reason(unknown[index], NULL, 0, &required),
                      RT_STATUS_INVALID_ARGUMENT);
        rt_context* context = NULL;
        EXPECT_STATUS(rt_context_create(unknown[index], &context), RT_STATUS_INVALID_ARGUMENT);
        EXPECT(context == NULL);
    }
}

static void backend_is_available_rejects_a_null_out(void) {
    EXPECT_STATUS(rt_backend_is_available(RT_BACKEND_CPU, NULL), RT_STATUS_INVALID_ARGUMENT);
}

/* ==== Tokenizers ========================================================================== */

static void tokenizer_options_init_sets_the_defaults(void) {
    rt_tokenizer_options options;
    memset(&options, SENTINEL_BYTE, sizeof options);
    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    EXPECT_EQ_U64(options.struct_size, sizeof options);
    EXPECT(options.method == RT_TOKENIZER_METHOD_BYTE);
    EXPECT_EQ_U64(options.reserved, 0u);
    EXPECT_EQ_U64(options.vocabulary_size, 512u);
    EXPECT_EQ_U64(options.minimum_pair_frequency, 2u);
}

static void tokenizer_options_init_rejects_a_struct_size_below_the_minimum(void) {
    rt_tokenizer_options options;
    memset(&options, SENTINEL_BYTE, sizeof options);
    EXPECT_STATUS(rt_tokenizer_options_init(&options, sizeof options - 1u),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_options_init(&options, 0), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(all_bytes_are(&options, sizeof options, SENTINEL_BYTE));
    EXPECT_STATUS(rt_tokenizer_options_init(NULL, sizeof options), RT_STATUS_INVALID_ARGUMENT);
}

static void tokenizer_options_in_a_larger_struct_keep_their_tail(void) {
    struct {
        rt_tokenizer_options options;
        unsigned char tail[24];
    } larger;
    memset(&larger, SENTINEL_BYTE, sizeof larger);
    EXPECT_OK(rt_tokenizer_options_init(&larger.options, sizeof larger));
    EXPECT_EQ_U64(larger.options.struct_size, sizeof larger);
    EXPECT_EQ_U64(larger.options.vocabulary_size, 512u);
    EXPECT(all_bytes_are(larger.tail, sizeof larger.tail, SENTINEL_BYTE));

    /* Creation reads only the prefix it knows, whatever the tail holds. */
    static const char corpus[] = "abc";
    rt_tokenizer* tokenizer = NULL;
    EXPECT_OK(
        rt_tokenizer_create_with_options((const uint8_t*)corpus, 3, &larger.options, &tokenizer));
    rt_tokenizer_release(tokenizer);
}

/* Creating a tokenizer from `options` fails with invalid_argument and yields no handle. */
static void expect_tokenizer_options_rejected(const rt_tokenizer_options* options) {
    static const char corpus[] = "abc";
    rt_tokenizer* tokenizer = NULL;
    EXPECT_STATUS(rt_tokenizer_create_with_options((const uint8_t*)corpus, 3, options, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tokenizer == NULL);
}

static void tokenizer_creation_rejects_nonzero_reserved_options(void) {
    rt_tokenizer_options options;
    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    options.reserved = 1;
    expect_tokenizer_options_rejected(&options);
}

static void tokenizer_creation_rejects_an_unknown_method(void) {
    rt_tokenizer_options options;
    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    options.method = 2;
    expect_tokenizer_options_rejected(&options);
}

static void tokenizer_options_struct_size_is_checked_at_creation(void) {
    rt_tokenizer_options options;
    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    options.struct_size = 8;
    expect_tokenizer_options_rejected(&options);
}

static void tokenizer_creation_rejects_an_empty_or_missing_corpus(void) {
    static const uint8_t corpus[] = {'a'};
    rt_tokenizer* tokenizer = NULL;
    EXPECT_STATUS(rt_tokenizer_create(NULL, 0, &tokenizer), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_create(NULL, 3, &tokenizer), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_create(corpus, 1, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tokenizer == NULL);
}

static void byte_tokenizer_vocabulary_is_the_sorted_distinct_corpus_bytes(void) {
    static const char corpus[] = "banana\0bandana";
    rt_tokenizer* tokenizer = create_byte_tokenizer(corpus, sizeof corpus - 1);
    int32_t method = -1;
    EXPECT_OK(rt_tokenizer_get_method(tokenizer, &method));
    EXPECT(method == RT_TOKENIZER_METHOD_BYTE);
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(tokenizer, &size));
    EXPECT_EQ_U64(size, 5u);

    static const uint8_t expected[] = {0x00, 'a', 'b', 'd', 'n'};
    uint8_t vocabulary[5];
    uint64_t required = 0;
    EXPECT_OK(rt_tokenizer_vocabulary(tokenizer, vocabulary, sizeof vocabulary, &required));
    EXPECT_EQ_U64(required, 5u);
    EXPECT(memcmp(vocabulary, expected, sizeof expected) == 0);
    rt_tokenizer_release(tokenizer);
}

static void byte_tokenizer_round_trips_bytes_with_embedded_nul(void) {
    static const char corpus[] = "banana\0bandana";
    static const uint8_t text[] = {'b', 0x00, 'a', 'n', 0x00, 0x00, 'd'};
    rt_tokenizer* tokenizer = create_byte_tokenizer(corpus, sizeof corpus - 1);

    uint64_t id_count = 0;
    uint32_t* ids = encode_all(tokenizer, text, sizeof text, &id_count);
    EXPECT_EQ_U64(id_count, sizeof text);
    EXPECT(ids[1] == 0u && ids[4] == 0u); /* NUL is the smallest byte, so id 0 */

    uint8_t decoded[sizeof text];
    uint64_t required = 0;
    EXPECT_OK(rt_tokenizer_decode(tokenizer, ids, id_count, decoded, sizeof decoded, &required));
    EXPECT_EQ_U64(required, sizeof text);
    EXPECT(memcmp(decoded, text, sizeof text) == 0);
    free(ids);
    rt_tokenizer_release(tokenizer);
}

static void byte_tokenizer_rejects_an_unseen_byte(void) {
    static const uint8_t text[] = {'a', 'z'};
    rt_tokenizer* tokenizer = create_byte_tokenizer("abc", 3);
    uint32_t ids[2] = {UINT32_MAX, UINT32_MAX};
    uint64_t required = UINT64_MAX;
    EXPECT_STATUS(rt_tokenizer_encode(tokenizer, text, 2, ids, 2, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(ids[0] == UINT32_MAX && ids[1] == UINT32_MAX);
    EXPECT_EQ_U64(required, UINT64_MAX);
    rt_tokenizer_release(tokenizer);
}

static void decoding_an_unknown_id_is_out_of_range(void) {
    static const uint32_t ids[] = {0, 3};
    rt_tokenizer* tokenizer = create_byte_tokenizer("abc", 3);
    uint8_t bytes[2] = {SENTINEL_BYTE, SENTINEL_BYTE};
    uint64_t required = UINT64_MAX;
    EXPECT_STATUS(rt_tokenizer_decode(tokenizer, ids, 2, bytes, 2, &required),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT(all_bytes_are(bytes, sizeof bytes, SENTINEL_BYTE));
    EXPECT_EQ_U64(required, UINT64_MAX); /* an invalid input fails before *required is set */
    rt_tokenizer_release(tokenizer);
}

static void token_bytes_of_an_unknown_id_is_out_of_range(void) {
    rt_tokenizer* tokenizer = create_byte_tokenizer("abc", 3);
    uint64_t required = UINT64_MAX;
    EXPECT_STATUS(rt_tokenizer_token_bytes(tokenizer, 3, NULL, 0, &required),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_EQ_U64(required, UINT64_MAX);
    rt_tokenizer* bpe = create_small_bpe_tokenizer();
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(bpe, &size));
    EXPECT_STATUS(rt_tokenizer_token_bytes(bpe, (uint32_t)size, NULL, 0, &required),
                  RT_STATUS_OUT_OF_RANGE);
    rt_tokenizer_release(bpe);
    rt_tokenizer_release(tokenizer);
}

static void encoding_no_bytes_gives_no_ids(void) {
    rt_tokenizer* tokenizer = create_byte_tokenizer("abc", 3);
    uint64_t required = UINT64_MAX;
    EXPECT_OK(rt_tokenizer_encode(tokenizer, NULL, 0, NULL, 0, &required));
    EXPECT_EQ_U64(required, 0u);
    rt_tokenizer_release(tokenizer);
}

static void byte_tokenizer_has_no_merge_table(void) {
    rt_tokenizer* tokenizer = create_byte_tokenizer("abc", 3);
    uint64_t count = UINT64_MAX;
    EXPECT_STATUS(rt_tokenizer_bpe_merge_count(tokenizer, &count), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(count, UINT64_MAX);
    rt_bpe_merge_rule rule = {1, 2, 3};
    EXPECT_STATUS(rt_tokenizer_bpe_merge_rule(tokenizer, 0, &rule), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(rule.left == 1 && rule.right == 2 && rule.result == 3);
    rt_tokenizer_release(tokenizer);
}

static void null_options_create_a_byte_tokenizer(void) {
    static const char corpus[] = "hello";
    rt_tokenizer* tokenizer = NULL;
    EXPECT_OK(rt_tokenizer_create_with_options((const uint8_t*)corpus, 5, NULL, &tokenizer));
    int32_t method = -1;
    EXPECT_OK(rt_tokenizer_get_method(tokenizer, &method));
    EXPECT(method == RT_TOKENIZER_METHOD_BYTE);
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(tokenizer, &size));
    EXPECT_EQ_U64(size, 4u); /* e, h, l, o */
    rt_tokenizer_release(tokenizer);
}

static void byte_method_ignores_the_bpe_options(void) {
    static const char corpus[] = "hello";
    rt_tokenizer_options options;
    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    options.vocabulary_size = 0;
    options.minimum_pair_frequency = 0;
    rt_tokenizer* tokenizer = NULL;
    EXPECT_OK(rt_tokenizer_create_with_options((const uint8_t*)corpus, 5, &options, &tokenizer));
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(tokenizer, &size));
    EXPECT_EQ_U64(size, 4u);
    rt_tokenizer_release(tokenizer);
}

static void bpe_tokenizer_learns_merges_from_a_corpus(void) {
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    int32_t method = -1;
    EXPECT_OK(rt_tokenizer_get_method(tokenizer, &method));
    EXPECT(method == RT_TOKENIZER_METHOD_BPE);
    uint64_t merges = 0;
    EXPECT_OK(rt_tokenizer_bpe_merge_count(tokenizer, &merges));
    EXPECT(merges >= 1u && merges <= 4u);
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(tokenizer, &size));
    EXPECT_EQ_U64(size, 256u + merges);

    /* "ab" is the most frequent pair, so it is the first merge. */
    rt_bpe_merge_rule first;
    EXPECT_OK(rt_tokenizer_bpe_merge_rule(tokenizer, 0, &first));
    EXPECT(first.left == 'a' && first.right == 'b' && first.result == 256u);

    for (uint64_t index = 0; index < merges; ++index) {
        rt_bpe_merge_rule rule;
        EXPECT_OK(rt_tokenizer_bpe_merge_rule(tokenizer, index, &rule));
        EXPECT_EQ_U64(rule.result, 256u + index);
        EXPECT(rule.left < rule.result && rule.right < rule.result);

        /* A merged token's bytes are its operands' bytes, concatenated. */
        uint8_t left[16];
        uint8_t right[16];
        uint8_t merged[32];
        uint64_t left_size = 0;
        uint64_t right_size = 0;
        uint64_t merged_size = 0;
        EXPECT_OK(rt_tokenizer_token_bytes(tokenizer, rule.left, left, sizeof left, &left_size));
        EXPECT_OK(
            rt_tokenizer_token_bytes(tokenizer, rule.right, right, sizeof right, &right_size));
        EXPECT_OK(
            rt_tokenizer_token_bytes(tokenizer, rule.result, merged, sizeof merged, &merged_size));
        EXPECT_EQ_U64(merged_size, left_size + right_size);
        EXPECT(memcmp(merged, left, left_size) == 0);
        EXPECT(memcmp(merged + left_size, right, right_size) == 0);
    }
    rt_tokenizer_release(tokenizer);
}

static void bpe_merge_rule_rejects_an_index_past_the_table(void) {
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    uint64_t merges = 0;
    EXPECT_OK(rt_tokenizer_bpe_merge_count(tokenizer, &merges));
    rt_bpe_merge_rule rule = {1, 2, 3};
    EXPECT_STATUS(rt_tokenizer_bpe_merge_rule(tokenizer, merges, &rule), RT_STATUS_OUT_OF_RANGE);
    EXPECT(rule.left == 1 && rule.right == 2 && rule.result == 3);
    EXPECT_STATUS(rt_tokenizer_bpe_merge_rule(tokenizer, 0, NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_tokenizer_release(tokenizer);
}

static void bpe_tokenizer_has_no_byte_vocabulary(void) {
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    uint64_t required = UINT64_MAX;
    EXPECT_STATUS(rt_tokenizer_vocabulary(tokenizer, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(required, UINT64_MAX);
    rt_tokenizer_release(tokenizer);
}

static void bpe_tokenizer_round_trips_any_bytes_including_nul(void) {
    /* Byte-level BPE knows all 256 bytes, including ones its corpus never contained. */
    static const uint8_t text[] = {'a', 'b', 'a', 'b', 0x00, 0xFF, 'a', 'b', 0x00, 'z'};
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    uint64_t id_count = 0;
    uint32_t* ids = encode_all(tokenizer, text, sizeof text, &id_count);
    EXPECT(id_count < sizeof text); /* the "ab" pairs merged */

    uint8_t decoded[sizeof text];
    uint64_t required = 0;
    EXPECT_OK(rt_tokenizer_decode(tokenizer, ids, id_count, decoded, sizeof decoded, &required));
    EXPECT_EQ_U64(required, sizeof text);
    EXPECT(memcmp(decoded, text, sizeof text) == 0);
    free(ids);
    rt_tokenizer_release(tokenizer);
}

static void bpe_options_out_of_range_are_rejected(void) {
    static const char corpus[] = "abab";
    rt_tokenizer_options options;
    rt_tokenizer* tokenizer = NULL;

    EXPECT_OK(rt_tokenizer_options_init(&options, sizeof options));
    options.method = RT_TOKENIZER_METHOD_BPE;
    options.vocabulary_size = 255;
    EXPECT_STATUS(rt_tokenizer_create_with_options((const uint8_t*)corpus, 4, &options, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);

    options.vocabulary_size = UINT64_C(1) << 32;
    EXPECT_STATUS(rt_tokenizer_create_with_options((const uint8_t*)corpus, 4, &options, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);

    options.vocabulary_size = 300;
    options.minimum_pair_frequency = 0;
    EXPECT_STATUS(rt_tokenizer_create_with_options((const uint8_t*)corpus, 4, &options, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tokenizer == NULL);
}

static void byte_tokenizer_restored_from_its_vocabulary_encodes_identically(void) {
    static const char corpus[] = "restoration\0test";
    static const uint8_t text[] = {'t', 'e', 0x00, 's', 't', 'r', 'o', 'n'};
    rt_tokenizer* original = create_byte_tokenizer(corpus, sizeof corpus - 1);
    uint8_t vocabulary[256];
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary(original, vocabulary, sizeof vocabulary, &size));

    rt_tokenizer* restored = NULL;
    EXPECT_OK(rt_tokenizer_create_from_byte_vocabulary(vocabulary, size, &restored));
    int32_t method = -1;
    EXPECT_OK(rt_tokenizer_get_method(restored, &method));
    EXPECT(method == RT_TOKENIZER_METHOD_BYTE);
    uint64_t restored_size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(restored, &restored_size));
    EXPECT_EQ_U64(restored_size, size);

    uint64_t original_count = 0;
    uint64_t restored_count = 0;
    uint32_t* original_ids = encode_all(original, text, sizeof text, &original_count);
    uint32_t* restored_ids = encode_all(restored, text, sizeof text, &restored_count);
    EXPECT_EQ_U64(restored_count, original_count);
    EXPECT(memcmp(restored_ids, original_ids, original_count * sizeof *original_ids) == 0);
    free(original_ids);
    free(restored_ids);
    rt_tokenizer_release(restored);
    rt_tokenizer_release(original);
}

static void bpe_tokenizer_restored_from_its_merges_encodes_identically(void) {
    static const uint8_t text[] = {'a', 'b', 'a', 'b', ' ', 'a', 'b', 'a', 'b', 'a', 'b', 0x00};
    rt_tokenizer* original = create_small_bpe_tokenizer();
    uint64_t merges = 0;
    EXPECT_OK(rt_tokenizer_bpe_merge_count(original, &merges));
    rt_bpe_merge_rule rules[4];
    for (uint64_t index = 0; index < merges; ++index) {
        EXPECT_OK(rt_tokenizer_bpe_merge_rule(original, index, &rules[index]));
    }

    rt_tokenizer* restored = NULL;
    EXPECT_OK(rt_tokenizer_create_from_bpe_merges(rules, merges, &restored));
    int32_t method = -1;
    EXPECT_OK(rt_tokenizer_get_method(restored, &method));
    EXPECT(method == RT_TOKENIZER_METHOD_BPE);
    uint64_t restored_merges = 0;
    EXPECT_OK(rt_tokenizer_bpe_merge_count(restored, &restored_merges));
    EXPECT_EQ_U64(restored_merges, merges);

    uint64_t original_count = 0;
    uint64_t restored_count = 0;
    uint32_t* original_ids = encode_all(original, text, sizeof text, &original_count);
    uint32_t* restored_ids = encode_all(restored, text, sizeof text, &restored_count);
    EXPECT_EQ_U64(restored_count, original_count);
    EXPECT(memcmp(restored_ids, original_ids, original_count * sizeof *original_ids) == 0);
    free(original_ids);
    free(restored_ids);
    rt_tokenizer_release(restored);
    rt_tokenizer_release(original);
}

static void an_empty_merge_table_restores_a_pure_byte_level_bpe(void) {
    rt_tokenizer* tokenizer = NULL;
    EXPECT_OK(rt_tokenizer_create_from_bpe_merges(NULL, 0, &tokenizer));
    uint64_t size = 0;
    EXPECT_OK(rt_tokenizer_vocabulary_size(tokenizer, &size));
    EXPECT_EQ_U64(size, 256u);
    rt_tokenizer_release(tokenizer);
}

static void byte_vocabulary_restoration_rejects_invalid_vocabularies(void) {
    static const uint8_t repeated[] = {'a', 'a'};
    rt_tokenizer* tokenizer = NULL;
    EXPECT_STATUS(rt_tokenizer_create_from_byte_vocabulary(repeated, 2, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_create_from_byte_vocabulary(NULL, 0, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_create_from_byte_vocabulary(NULL, 1, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tokenizer == NULL);
}

static void bpe_restoration_rejects_an_inconsistent_merge_table(void) {
    static const rt_bpe_merge_rule wrong_result[] = {{'a', 'b', 300}};
    static const rt_bpe_merge_rule operand_not_yet_created[] = {{'a', 257, 256}};
    static const rt_bpe_merge_rule repeated_pair[] = {{'a', 'b', 256}, {'a', 'b', 257}};
    rt_tokenizer* tokenizer = NULL;
    EXPECT_STATUS(rt_tokenizer_create_from_bpe_merges(wrong_result, 1, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_create_from_bpe_merges(operand_not_yet_created, 1, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_create_from_bpe_merges(repeated_pair, 2, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tokenizer == NULL);
}

static void tokenizer_queries_reject_null_handles_and_outputs(void) {
    rt_tokenizer* tokenizer = create_byte_tokenizer("abc", 3);
    int32_t method = -1;
    uint64_t value = 0;
    uint64_t required = 0;
    EXPECT_STATUS(rt_tokenizer_get_method(NULL, &method), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_get_method(tokenizer, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_vocabulary_size(NULL, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_vocabulary_size(tokenizer, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_bpe_merge_count(NULL, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_vocabulary(NULL, NULL, 0, &required), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_token_bytes(NULL, 0, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_encode(NULL, NULL, 0, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_encode(tokenizer, NULL, 2, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_decode(NULL, NULL, 0, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tokenizer_decode(tokenizer, NULL, 2, NULL, 0, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(method == -1);
    rt_tokenizer_release(tokenizer);
}

/* ==== Contexts and tensors ================================================================ */

static void context_reports_its_backend(void) {
    rt_context* context = create_cpu_context();
    int32_t backend = -1;
    EXPECT_OK(rt_context_backend(context, &backend));
    EXPECT(backend == RT_BACKEND_CPU);
    EXPECT_STATUS(rt_context_backend(NULL, &backend), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_context_backend(context, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_context_create(RT_BACKEND_CPU, NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_context_release(context);
}

static void context_on_an_unavailable_backend_fails_naming_it(void) {
    for (size_t index = 0; index < UNAVAILABLE_BACKEND_COUNT; ++index) {
        if (!unavailable_here(index)) {
            continue;
        }
        rt_context* context = NULL;
        EXPECT_STATUS(rt_context_create(unavailable_backends[index], &context),
                      RT_STATUS_BACKEND_UNAVAILABLE);
        EXPECT_LAST_ERROR_MENTIONS(unavailable_backend_names[index]);
        EXPECT(context == NULL);
    }
}

static void tensor_reports_its_shape_rank_numel_and_backend(void) {
    static const uint64_t shape[] = {2, 3};
    static const float values[] = {1, 2, 3, 4, 5, 6};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = create_tensor(context, shape, 2, values, 6);

    uint64_t rank = 0;
    uint64_t numel = 0;
    int32_t backend = -1;
    EXPECT_OK(rt_tensor_rank(tensor, &rank));
    EXPECT_OK(rt_tensor_numel(tensor, &numel));
    EXPECT_OK(rt_tensor_backend(tensor, &backend));
    EXPECT_EQ_U64(rank, 2u);
    EXPECT_EQ_U64(numel, 6u);
    EXPECT(backend == RT_BACKEND_CPU);

    uint64_t dimensions[2] = {0, 0};
    uint64_t required = 0;
    EXPECT_OK(rt_tensor_shape(tensor, dimensions, 2, &required));
    EXPECT(dimensions[0] == 2u && dimensions[1] == 3u);
    rt_tensor_release(tensor);
    rt_context_release(context);
}

static void tensor_holds_a_copy_of_the_callers_values(void) {
    static const uint64_t shape[] = {3};
    float values[] = {1, 2, 3};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = create_tensor(context, shape, 1, values, 3);
    values[0] = 100.0f;

    float copied[3];
    uint64_t required = 0;
    EXPECT_OK(rt_tensor_copy_to_host_f32(tensor, copied, 3, &required));
    EXPECT(copied[0] == 1.0f && copied[1] == 2.0f && copied[2] == 3.0f);
    rt_tensor_release(tensor);
    rt_context_release(context);
}

static void scalar_tensor_has_rank_zero(void) {
    static const float value = 2.5f;
    rt_context* context = create_cpu_context();
    rt_tensor* scalar = create_tensor(context, NULL, 0, &value, 1);
    uint64_t rank = UINT64_MAX;
    uint64_t numel = 0;
    uint64_t required = UINT64_MAX;
    EXPECT_OK(rt_tensor_rank(scalar, &rank));
    EXPECT_OK(rt_tensor_numel(scalar, &numel));
    EXPECT_OK(rt_tensor_shape(scalar, NULL, 0, &required));
    EXPECT_EQ_U64(rank, 0u);
    EXPECT_EQ_U64(numel, 1u);
    EXPECT_EQ_U64(required, 0u);

    float copied = 0.0f;
    EXPECT_OK(rt_tensor_copy_to_host_f32(scalar, &copied, 1, &required));
    EXPECT(copied == 2.5f);
    rt_tensor_release(scalar);
    rt_context_release(context);
}

static void zeros_tensor_holds_zeros(void) {
    static const uint64_t shape[] = {2, 2, 2};
    rt_context* context = create_cpu_context();
    rt_tensor* zeros = NULL;
    EXPECT_OK(rt_tensor_zeros_f32(context, shape, 3, &zeros));
    float values[8];
    memset(values, SENTINEL_BYTE, sizeof values);
    uint64_t required = 0;
    EXPECT_OK(rt_tensor_copy_to_host_f32(zeros, values, 8, &required));
    for (size_t index = 0; index < 8; ++index) {
        EXPECT(values[index] == 0.0f);
    }
    rt_tensor_release(zeros);
    rt_context_release(context);
}

static void matmul_multiplies_row_major_matrices(void) {
    static const uint64_t left_shape[] = {2, 3};
    static const uint64_t right_shape[] = {3, 2};
    static const float left_values[] = {1, 2, 3, 4, 5, 6};
    static const float right_values[] = {7, 8, 9, 10, 11, 12};
    rt_context* context = create_cpu_context();
    rt_tensor* left = create_tensor(context, left_shape, 2, left_values, 6);
    rt_tensor* right = create_tensor(context, right_shape, 2, right_values, 6);

    rt_tensor* product = NULL;
    EXPECT_OK(rt_tensor_matmul(left, right, &product));
    uint64_t shape[2] = {0, 0};
    uint64_t required = 0;
    EXPECT_OK(rt_tensor_shape(product, shape, 2, &required));
    EXPECT(shape[0] == 2u && shape[1] == 2u);
    float values[4];
    EXPECT_OK(rt_tensor_copy_to_host_f32(product, values, 4, &required));
    EXPECT(values[0] == 58.0f && values[1] == 64.0f && values[2] == 139.0f && values[3] == 154.0f);

    rt_tensor_release(product);
    rt_tensor_release(right);
    rt_tensor_release(left);
    rt_context_release(context);
}

static void matmul_multiplies_each_leading_batch(void) {
    /* [2, 1, 2] x [2, 2, 1] -> [2, 1, 1]: ([1 2]·[3 4]ᵀ, [5 6]·[7 8]ᵀ) = (11, 83). */
    static const uint64_t left_shape[] = {2, 1, 2};
    static const uint64_t right_shape[] = {2, 2, 1};
    static const float left_values[] = {1, 2, 5, 6};
    static const float right_values[] = {3, 4, 7, 8};
    rt_context* context = create_cpu_context();
    rt_tensor* left = create_tensor(context, left_shape, 3, left_values, 4);
    rt_tensor* right = create_tensor(context, right_shape, 3, right_values, 4);
    rt_tensor* product = NULL;
    EXPECT_OK(rt_tensor_matmul(left, right, &product));
    uint64_t shape[3] = {0, 0, 0};
    uint64_t required = 0;
    EXPECT_OK(rt_tensor_shape(product, shape, 3, &required));
    EXPECT(shape[0] == 2u && shape[1] == 1u && shape[2] == 1u);
    float values[2];
    EXPECT_OK(rt_tensor_copy_to_host_f32(product, values, 2, &required));
    EXPECT(values[0] == 11.0f && values[1] == 83.0f);
    rt_tensor_release(product);
    rt_tensor_release(right);
    rt_tensor_release(left);
    rt_context_release(context);
}

static void matmul_rejects_mismatched_inner_dimensions(void) {
    static const uint64_t left_shape[] = {2, 3};
    static const uint64_t right_shape[] = {2, 2};
    static const float values[] = {1, 2, 3, 4, 5, 6};
    rt_context* context = create_cpu_context();
    rt_tensor* left = create_tensor(context, left_shape, 2, values, 6);
    rt_tensor* right = create_tensor(context, right_shape, 2, values, 4);
    rt_tensor* product = NULL;
    EXPECT_STATUS(rt_tensor_matmul(left, right, &product), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(product == NULL);
    EXPECT_STATUS(rt_tensor_matmul(left, NULL, &product), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_matmul(left, left, NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_tensor_release(right);
    rt_tensor_release(left);
    rt_context_release(context);
}

static void tensor_creation_rejects_a_zero_dimension(void) {
    static const uint64_t shape[] = {2, 0};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = NULL;
    EXPECT_STATUS(rt_tensor_zeros_f32(context, shape, 2, &tensor), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_create_f32(context, shape, 2, NULL, 0, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tensor == NULL);
    rt_context_release(context);
}

static void tensor_creation_rejects_a_count_other_than_the_shape_product(void) {
    static const uint64_t shape[] = {2, 3};
    static const float values[] = {1, 2, 3, 4, 5, 6, 7};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = NULL;
    EXPECT_STATUS(rt_tensor_create_f32(context, shape, 2, values, 5, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_create_f32(context, shape, 2, values, 7, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_create_f32(context, NULL, 0, values, 2, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tensor == NULL);
    rt_context_release(context);
}

static void tensor_creation_rejects_null_inputs_with_nonzero_counts(void) {
    static const uint64_t shape[] = {2};
    static const float values[] = {1, 2};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = NULL;
    EXPECT_STATUS(rt_tensor_create_f32(context, NULL, 1, values, 2, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_create_f32(context, shape, 1, NULL, 2, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_create_f32(NULL, shape, 1, values, 2, &tensor),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_create_f32(context, shape, 1, values, 2, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_zeros_f32(context, NULL, 1, &tensor), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tensor == NULL);
    rt_context_release(context);
}

static void tensor_creation_rejects_a_shape_whose_element_count_overflows(void) {
    static const uint64_t shape[] = {UINT64_C(1) << 40, UINT64_C(1) << 40};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = NULL;
    EXPECT_STATUS(rt_tensor_zeros_f32(context, shape, 2, &tensor), RT_STATUS_OVERFLOW);
    EXPECT(tensor == NULL);
    rt_context_release(context);
}

static void tensor_creation_rejects_a_value_count_whose_byte_size_overflows(void) {
    /* 2^62 floats need 2^64 bytes; the count is rejected before any value is read. */
    static const uint64_t shape[] = {1};
    static const float value = 1.0f;
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = NULL;
    EXPECT_STATUS(rt_tensor_create_f32(context, shape, 1, &value, UINT64_C(1) << 62, &tensor),
                  RT_STATUS_OVERFLOW);
    EXPECT(tensor == NULL);
    rt_context_release(context);
}

static void tensor_outlives_its_context(void) {
    static const uint64_t shape[] = {2};
    static const float values[] = {3, 4};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = create_tensor(context, shape, 1, values, 2);
    rt_tensor* zeros = NULL;
    EXPECT_OK(rt_tensor_zeros_f32(context, shape, 1, &zeros));
    rt_context_release(context);

    float copied[2] = {0, 0};
    uint64_t required = 0;
    int32_t backend = -1;
    EXPECT_OK(rt_tensor_copy_to_host_f32(tensor, copied, 2, &required));
    EXPECT_OK(rt_tensor_backend(tensor, &backend));
    EXPECT(copied[0] == 3.0f && copied[1] == 4.0f);
    EXPECT(backend == RT_BACKEND_CPU);
    rt_tensor_release(zeros);
    rt_tensor_release(tensor);
}

static void tensor_queries_reject_null_handles_and_outputs(void) {
    static const uint64_t shape[] = {1};
    static const float value = 1.0f;
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = create_tensor(context, shape, 1, &value, 1);
    uint64_t number = 0;
    int32_t backend = -1;
    EXPECT_STATUS(rt_tensor_rank(NULL, &number), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_rank(tensor, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_numel(NULL, &number), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_numel(tensor, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_backend(NULL, &backend), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_backend(tensor, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_shape(NULL, NULL, 0, &number), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_tensor_copy_to_host_f32(NULL, NULL, 0, &number), RT_STATUS_INVALID_ARGUMENT);
    rt_tensor_release(tensor);
    rt_context_release(context);
}

/* ==== The size-query protocol ==============================================================
 * Every variable-size output is (out, capacity, *required). Each is checked through an
 * adapter with one signature, so a single routine states the whole protocol. */

typedef rt_status (*sized_output)(const void* subject, void* out, uint64_t capacity,
                                  uint64_t* required);

static void expect_protocol_status(rt_status actual, rt_status expected, const char* function,
                                   const char* situation, int line) {
    char call[160];
    snprintf(call, sizeof call, "%s (%s)", function, situation);
    test_expect_status(actual, expected, call, __FILE__, line);
}

/* Checks the protocol on an output of `expected_count` elements of `element_size` bytes:
 * size query, NULL out with a capacity, NULL required, one element short (out untouched),
 * exact and larger capacities. Returns the output (malloc'd; the caller frees it). */
static void* expect_size_query_protocol(const char* function, sized_output call,
                                        const void* subject, size_t element_size,
                                        uint64_t expected_count) {
    uint64_t required = UINT64_MAX;
    expect_protocol_status(call(subject, NULL, 0, &required), RT_STATUS_OK, function,
                           "size query: out NULL, capacity 0", __LINE__);
    EXPECT_EQ_U64(required, expected_count);

    expect_protocol_status(call(subject, NULL, 1, &required), RT_STATUS_INVALID_ARGUMENT, function,
                           "out NULL with capacity 1", __LINE__);
    expect_protocol_status(call(subject, NULL, 0, NULL), RT_STATUS_INVALID_ARGUMENT, function,
                           "required NULL", __LINE__);

    const size_t size = element_size * (size_t)(expected_count + 1u);
    unsigned char* exact = malloc(size);
    unsigned char* larger = malloc(size);
    EXPECT(exact != NULL && larger != NULL);
    memset(exact, SENTINEL_BYTE, size);
    if (expected_count > 0) {
        required = UINT64_MAX;
        expect_protocol_status(call(subject, exact, expected_count - 1u, &required),
                               RT_STATUS_OUT_OF_RANGE, function, "capacity one short", __LINE__);
        EXPECT_EQ_U64(required, expected_count); /* set before the capacity is checked */
        EXPECT(all_bytes_are(exact, size, SENTINEL_BYTE));
    }

    required = UINT64_MAX;
    expect_protocol_status(call(subject, exact, expected_count, &required), RT_STATUS_OK, function,
                           "exact capacity", __LINE__);
    EXPECT_EQ_U64(required, expected_count);

    required = UINT64_MAX;
    expect_protocol_status(call(subject, larger, expected_count + 1u, &required), RT_STATUS_OK,
                           function, "larger capacity", __LINE__);
    EXPECT_EQ_U64(required, expected_count);
    EXPECT(memcmp(larger, exact, element_size * (size_t)expected_count) == 0);
    free(larger);
    return exact;
}

/* A text output's required count includes its terminating NUL. */
static void expect_text_output(const char* function, sized_output call, const void* subject,
                               const char* expected) {
    char* text = expect_size_query_protocol(function, call, subject, 1, strlen(expected) + 1u);
    EXPECT(text[strlen(expected)] == '\0');
    EXPECT_STREQ(text, expected);
    free(text);
}

typedef struct tokenizer_input {
    const rt_tokenizer* tokenizer;
    const void* items;
    uint64_t count;
} tokenizer_input;

typedef struct tokenizer_token {
    const rt_tokenizer* tokenizer;
    uint32_t id;
} tokenizer_token;

typedef struct list_entry {
    const rt_parameter_list* list;
    uint64_t index;
} list_entry;

static rt_status backend_name_output(const void* subject, void* out, uint64_t capacity,
                                     uint64_t* required) {
    return rt_backend_name(*(const int32_t*)subject, out, capacity, required);
}

static rt_status unavailability_reason_output(const void* subject, void* out, uint64_t capacity,
                                              uint64_t* required) {
    return rt_backend_unavailability_reason(*(const int32_t*)subject, out, capacity, required);
}

static rt_status tokenizer_vocabulary_output(const void* subject, void* out, uint64_t capacity,
                                             uint64_t* required) {
    return rt_tokenizer_vocabulary(subject, out, capacity, required);
}

static rt_status token_bytes_output(const void* subject, void* out, uint64_t capacity,
                                    uint64_t* required) {
    const tokenizer_token* token = subject;
    return rt_tokenizer_token_bytes(token->tokenizer, token->id, out, capacity, required);
}

static rt_status encode_output(const void* subject, void* out, uint64_t capacity,
                               uint64_t* required) {
    const tokenizer_input* input = subject;
    return rt_tokenizer_encode(input->tokenizer, input->items, input->count, out, capacity,
                               required);
}

static rt_status decode_output(const void* subject, void* out, uint64_t capacity,
                               uint64_t* required) {
    const tokenizer_input* input = subject;
    return rt_tokenizer_decode(input->tokenizer, input->items, input->count, out, capacity,
                               required);
}

static rt_status tensor_shape_output(const void* subject, void* out, uint64_t capacity,
                                     uint64_t* required) {
    return rt_tensor_shape(subject, out, capacity, required);
}

static rt_status tensor_values_output(const void* subject, void* out, uint64_t capacity,
                                      uint64_t* required) {
    return rt_tensor_copy_to_host_f32(subject, out, capacity, required);
}

static rt_status parameter_name_output(const void* subject, void* out, uint64_t capacity,
                                       uint64_t* required) {
    const list_entry* entry = subject;
    return rt_parameter_list_name(entry->list, entry->index, out, capacity, required);
}

static rt_status parameter_shape_output(const void* subject, void* out, uint64_t capacity,
                                        uint64_t* required) {
    const list_entry* entry = subject;
    return rt_parameter_list_shape(entry->list, entry->index, out, capacity, required);
}

static rt_status parameter_values_output(const void* subject, void* out, uint64_t capacity,
                                         uint64_t* required) {
    return rt_parameter_list_copy_to_host_f32(subject, out, capacity, required);
}

static rt_status variable_shape_output(const void* subject, void* out, uint64_t capacity,
                                       uint64_t* required) {
    return rt_variable_shape(subject, out, capacity, required);
}

static rt_status variable_values_output(const void* subject, void* out, uint64_t capacity,
                                        uint64_t* required) {
    return rt_variable_copy_to_host_f32(subject, out, capacity, required);
}

static void backend_name_follows_the_size_query_protocol(void) {
    const int32_t backend = RT_BACKEND_CUDA;
    expect_text_output("rt_backend_name", backend_name_output, &backend, "cuda");
}

static void unavailability_reason_follows_the_size_query_protocol(void) {
    /* cuda, or the metal stub where a CUDA device is visible (cuda's reason is empty there). */
    const int32_t backend = cuda_device_visible() ? RT_BACKEND_METAL : RT_BACKEND_CUDA;
    uint64_t length = 0;
    EXPECT_OK(rt_backend_unavailability_reason(backend, NULL, 0, &length));
    char* reason = expect_size_query_protocol("rt_backend_unavailability_reason",
                                              unavailability_reason_output, &backend, 1, length);
    EXPECT(reason[length - 1u] == '\0');
    EXPECT_EQ_U64(strlen(reason), length - 1u);
    free(reason);

    const int32_t cpu = RT_BACKEND_CPU;
    expect_text_output("rt_backend_unavailability_reason", unavailability_reason_output, &cpu, "");
}

static void tokenizer_vocabulary_follows_the_size_query_protocol(void) {
    rt_tokenizer* tokenizer = create_byte_tokenizer("cab", 3);
    uint8_t* vocabulary = expect_size_query_protocol("rt_tokenizer_vocabulary",
                                                     tokenizer_vocabulary_output, tokenizer, 1, 3);
    EXPECT(vocabulary[0] == 'a' && vocabulary[1] == 'b' && vocabulary[2] == 'c');
    free(vocabulary);
    rt_tokenizer_release(tokenizer);
}

static void token_bytes_follows_the_size_query_protocol(void) {
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    const tokenizer_token merged_ab = {tokenizer, 256};
    uint8_t* bytes = expect_size_query_protocol("rt_tokenizer_token_bytes", token_bytes_output,
                                                &merged_ab, 1, 2);
    EXPECT(bytes[0] == 'a' && bytes[1] == 'b');
    free(bytes);
    rt_tokenizer_release(tokenizer);
}

static void encode_follows_the_size_query_protocol(void) {
    static const uint8_t text[] = {'a', 'b', 'a', 'b', 'x'};
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    uint64_t id_count = 0;
    EXPECT_OK(rt_tokenizer_encode(tokenizer, text, sizeof text, NULL, 0, &id_count));
    EXPECT(id_count >= 2u && id_count < sizeof text);
    const tokenizer_input input = {tokenizer, text, sizeof text};
    uint32_t* ids = expect_size_query_protocol("rt_tokenizer_encode", encode_output, &input,
                                               sizeof(uint32_t), id_count);
    EXPECT(ids[id_count - 1u] == 'x');
    free(ids);
    rt_tokenizer_release(tokenizer);
}

static void decode_follows_the_size_query_protocol(void) {
    static const uint32_t ids[] = {256, 0, 'b'};
    static const uint8_t expected[] = {'a', 'b', 0x00, 'b'};
    rt_tokenizer* tokenizer = create_small_bpe_tokenizer();
    const tokenizer_input input = {tokenizer, ids, 3};
    uint8_t* bytes = expect_size_query_protocol("rt_tokenizer_decode", decode_output, &input, 1,
                                                sizeof expected);
    EXPECT(memcmp(bytes, expected, sizeof expected) == 0);
    free(bytes);
    rt_tokenizer_release(tokenizer);
}

static void tensor_shape_and_values_follow_the_size_query_protocol(void) {
    static const uint64_t shape[] = {2, 1, 3};
    static const float values[] = {1, 2, 3, 4, 5, 6};
    rt_context* context = create_cpu_context();
    rt_tensor* tensor = create_tensor(context, shape, 3, values, 6);

    uint64_t* dimensions = expect_size_query_protocol("rt_tensor_shape", tensor_shape_output,
                                                      tensor, sizeof(uint64_t), 3);
    EXPECT(memcmp(dimensions, shape, sizeof shape) == 0);
    free(dimensions);

    float* copied = expect_size_query_protocol("rt_tensor_copy_to_host_f32", tensor_values_output,
                                               tensor, sizeof(float), 6);
    EXPECT(memcmp(copied, values, sizeof values) == 0);
    free(copied);

    /* A scalar's shape is empty: any buffer, even a zero capacity one, holds it. */
    rt_tensor* scalar = create_tensor(context, NULL, 0, values, 1);
    free(expect_size_query_protocol("rt_tensor_shape", tensor_shape_output, scalar,
                                    sizeof(uint64_t), 0));
    rt_tensor_release(scalar);
    rt_tensor_release(tensor);
    rt_context_release(context);
}

static void parameter_list_outputs_follow_the_size_query_protocol(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const list_entry token_embedding = {list, 0};
    expect_text_output("rt_parameter_list_name", parameter_name_output, &token_embedding,
                       "token_embedding.weight");

    uint64_t* shape = expect_size_query_protocol("rt_parameter_list_shape", parameter_shape_output,
                                                 &token_embedding, sizeof(uint64_t), 2);
    EXPECT(shape[0] == TINY_VOCABULARY && shape[1] == TINY_WIDTH);
    free(shape);

    float* values =
        expect_size_query_protocol("rt_parameter_list_copy_to_host_f32", parameter_values_output,
                                   list, sizeof(float), total_numel(list));
    free(values);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void variable_outputs_follow_the_size_query_protocol(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    uint64_t* shape = expect_size_query_protocol("rt_variable_shape", variable_shape_output, logits,
                                                 sizeof(uint64_t), 3);
    EXPECT(shape[0] == PATTERN_BATCH && shape[1] == PATTERN_TIME && shape[2] == TINY_VOCABULARY);
    free(shape);

    float* values =
        expect_size_query_protocol("rt_variable_copy_to_host_f32", variable_values_output, logits,
                                   sizeof(float), PATTERN_TOKENS * TINY_VOCABULARY);
    free(values);
    rt_variable_release(logits);
    rt_model_release(model);
}

/* ==== Models ============================================================================== */

static void transformer_config_init_sets_the_defaults(void) {
    rt_transformer_config config;
    memset(&config, SENTINEL_BYTE, sizeof config);
    EXPECT_OK(rt_transformer_config_init(&config, sizeof config));
    EXPECT_EQ_U64(config.struct_size, sizeof config);
    EXPECT_EQ_U64(config.vocabulary_size, 0u);
    EXPECT_EQ_U64(config.maximum_context, 0u);
    EXPECT_EQ_U64(config.model_width, 0u);
    EXPECT_EQ_U64(config.head_count, 0u);
    EXPECT_EQ_U64(config.block_count, 0u);
    EXPECT_EQ_U64(config.feed_forward_width, 0u);
    EXPECT_EQ_U64(config.random_seed, 5489u);
    EXPECT(config.layer_norm_epsilon == 1e-5f);
    EXPECT_EQ_U64(config.feed_forward_activation, RT_FEED_FORWARD_ACTIVATION_GELU);
    EXPECT_EQ_U64(config.tie_embeddings, 0u);
}

static void transformer_config_init_rejects_a_struct_size_below_the_minimum(void) {
    rt_transformer_config config;
    memset(&config, SENTINEL_BYTE, sizeof config);
    /* The first published layout (64 bytes, through layer_norm_epsilon) is the minimum. */
    EXPECT_STATUS(rt_transformer_config_init(&config, 64u - 1u), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_transformer_config_init(&config, 8), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(all_bytes_are(&config, sizeof config, SENTINEL_BYTE));
    EXPECT_STATUS(rt_transformer_config_init(NULL, sizeof config), RT_STATUS_INVALID_ARGUMENT);
}

static void transformer_config_in_a_larger_struct_keeps_its_tail(void) {
    struct {
        rt_transformer_config config;
        unsigned char tail[24];
    } larger;
    memset(&larger, SENTINEL_BYTE, sizeof larger);
    EXPECT_OK(rt_transformer_config_init(&larger.config, sizeof larger));
    EXPECT_EQ_U64(larger.config.struct_size, sizeof larger);
    EXPECT_EQ_U64(larger.config.random_seed, 5489u);
    EXPECT(all_bytes_are(larger.tail, sizeof larger.tail, SENTINEL_BYTE));

    larger.config.vocabulary_size = TINY_VOCABULARY;
    larger.config.maximum_context = TINY_CONTEXT;
    larger.config.model_width = TINY_WIDTH;
    larger.config.head_count = TINY_HEADS;
    larger.config.block_count = TINY_BLOCKS;
    larger.config.feed_forward_width = TINY_FEED_FORWARD;
    rt_model* model = NULL;
    EXPECT_OK(rt_model_create(&larger.config, &model));
    rt_model_release(model);
}

static void model_creation_rejects_a_zero_dimension(void) {
    rt_transformer_config config = tiny_config();
    uint64_t* const dimensions[] = {&config.vocabulary_size, &config.maximum_context,
                                    &config.model_width,     &config.head_count,
                                    &config.block_count,     &config.feed_forward_width};
    for (size_t index = 0; index < 6; ++index) {
        config = tiny_config();
        *dimensions[index] = 0;
        rt_model* model = NULL;
        EXPECT_STATUS(rt_model_create(&config, &model), RT_STATUS_INVALID_ARGUMENT);
        EXPECT(model == NULL);
    }
}

static void model_creation_rejects_a_width_not_divisible_by_the_heads(void) {
    rt_transformer_config config = tiny_config();
    config.head_count = 3;
    rt_model* model = NULL;
    EXPECT_STATUS(rt_model_create(&config, &model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
}

static void model_creation_rejects_a_block_count_whose_parameters_do_not_fit(void) {
    /* Rejected from the config alone, before any block is allocated (the limit is 2^47
     * bytes of parameters), so this returns at once. */
    const uint64_t block_counts[] = {UINT64_MAX, UINT64_C(1) << 40};
    for (size_t index = 0; index < 2; ++index) {
        rt_transformer_config config = tiny_config();
        config.block_count = block_counts[index];
        rt_model* model = NULL;
        EXPECT_STATUS(rt_model_create(&config, &model), RT_STATUS_OVERFLOW);
        EXPECT(model == NULL);
        EXPECT_LAST_ERROR_MENTIONS(index == 0 ? "block_count 18446744073709551615 too large"
                                              : "block_count 1099511627776 too large");
    }
}

/* GPT-2's variant (ABI fields appended after layer_norm_epsilon): tanh GELU and a tied head. */
static uint64_t parameter_count_of(rt_model* model) {
    rt_parameter_list* list = NULL;
    uint64_t count = 0;
    EXPECT_OK(rt_model_parameters(model, &list));
    EXPECT_OK(rt_parameter_list_count(list, &count));
    rt_parameter_list_release(list);
    return count;
}

static void model_creation_takes_the_gpt2_variant_fields(void) {
    rt_transformer_config config = tiny_config();
    config.feed_forward_activation = RT_FEED_FORWARD_ACTIVATION_GELU_TANH;
    config.tie_embeddings = 1;
    rt_model* tied = NULL;
    EXPECT_OK(rt_model_create(&config, &tied));
    rt_model* plain = NULL;
    const rt_transformer_config plain_config = tiny_config();
    EXPECT_OK(rt_model_create(&plain_config, &plain));
    /* No language_model_head.{weight,bias}. */
    EXPECT_EQ_U64(parameter_count_of(tied) + 2u, parameter_count_of(plain));
    rt_transformer_config read_back;
    EXPECT_OK(rt_transformer_config_init(&read_back, sizeof read_back));
    EXPECT_OK(rt_model_config(tied, &read_back));
    EXPECT_EQ_U64(read_back.feed_forward_activation, RT_FEED_FORWARD_ACTIVATION_GELU_TANH);
    EXPECT_EQ_U64(read_back.tie_embeddings, 1u);
    /* A client of the first layout reads 64 bytes and nothing past them is written. */
    struct {
        rt_transformer_config config;
    } older;
    memset(&older, SENTINEL_BYTE, sizeof older);
    older.config.struct_size = 64;
    EXPECT_OK(rt_model_config(tied, &older.config));
    EXPECT_EQ_U64(older.config.struct_size, 64u);
    EXPECT_EQ_U64(older.config.vocabulary_size, TINY_VOCABULARY);
    EXPECT(all_bytes_are((const unsigned char*)&older + 64, sizeof older - 64, SENTINEL_BYTE));
    rt_model_release(plain);
    rt_model_release(tied);
}

static void model_creation_of_an_older_client_ignores_the_bytes_past_its_struct(void) {
    /* struct_size 64: the appended fields are garbage here and must read as their defaults
     * (exact GELU, untied), so the model has the GPT decoder's default head. */
    rt_transformer_config config = tiny_config();
    memset((unsigned char*)&config + 64, SENTINEL_BYTE, sizeof config - 64);
    config.struct_size = 64;
    rt_model* model = NULL;
    EXPECT_OK(rt_model_create(&config, &model));
    rt_transformer_config read_back;
    EXPECT_OK(rt_transformer_config_init(&read_back, sizeof read_back));
    EXPECT_OK(rt_model_config(model, &read_back));
    EXPECT_EQ_U64(read_back.struct_size, sizeof read_back);
    EXPECT_EQ_U64(read_back.feed_forward_activation, RT_FEED_FORWARD_ACTIVATION_GELU);
    EXPECT_EQ_U64(read_back.tie_embeddings, 0u);
    rt_model_release(model);
}

static void model_creation_rejects_unknown_gpt2_variant_values(void) {
    rt_transformer_config config = tiny_config();
    config.feed_forward_activation = 3;
    rt_model* model = NULL;
    EXPECT_STATUS(rt_model_create(&config, &model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
    EXPECT_LAST_ERROR_MENTIONS("config->feed_forward_activation: unknown value 3");
    config = tiny_config();
    config.tie_embeddings = 2;
    EXPECT_STATUS(rt_model_create(&config, &model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
    EXPECT_LAST_ERROR_MENTIONS("config->tie_embeddings: must be 0 or 1, not 2");
}

static void model_creation_rejects_bad_config_pointers_and_sizes(void) {
    rt_transformer_config config = tiny_config();
    rt_model* model = NULL;
    EXPECT_STATUS(rt_model_create(NULL, &model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_create(&config, NULL), RT_STATUS_INVALID_ARGUMENT);
    config.struct_size = 16;
    EXPECT_STATUS(rt_model_create(&config, &model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(model == NULL);
}

static void model_config_returns_the_creation_config(void) {
    rt_transformer_config config = tiny_config();
    config.random_seed = 1234;
    config.layer_norm_epsilon = 1e-3f;
    rt_model* model = NULL;
    EXPECT_OK(rt_model_create(&config, &model));

    rt_transformer_config returned;
    memset(&returned, 0, sizeof returned);
    returned.struct_size = sizeof returned;
    EXPECT_OK(rt_model_config(model, &returned));
    EXPECT(memcmp(&returned, &config, sizeof config) == 0);
    rt_model_release(model);
}

static void model_config_rejects_a_small_output_struct(void) {
    rt_model* model = create_tiny_model();
    rt_transformer_config returned;
    memset(&returned, SENTINEL_BYTE, sizeof returned);
    returned.struct_size = 8;
    EXPECT_STATUS(rt_model_config(model, &returned), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(returned.struct_size, 8u);
    EXPECT(all_bytes_are((const unsigned char*)&returned + 8, sizeof returned - 8u, SENTINEL_BYTE));
    EXPECT_STATUS(rt_model_config(model, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_config(NULL, &returned), RT_STATUS_INVALID_ARGUMENT);
    rt_model_release(model);
}

static void model_config_writes_only_the_known_prefix_of_a_larger_struct(void) {
    rt_model* model = create_tiny_model();
    struct {
        rt_transformer_config config;
        unsigned char tail[16];
    } larger;
    memset(&larger, SENTINEL_BYTE, sizeof larger);
    larger.config.struct_size = sizeof larger;
    EXPECT_OK(rt_model_config(model, &larger.config));
    EXPECT_EQ_U64(larger.config.struct_size, sizeof larger);
    EXPECT_EQ_U64(larger.config.vocabulary_size, TINY_VOCABULARY);
    EXPECT(all_bytes_are(larger.tail, sizeof larger.tail, SENTINEL_BYTE));
    rt_model_release(model);
}

static void new_model_is_on_cpu_with_materialized_attention_and_no_checkpointing(void) {
    rt_model* model = create_tiny_model();
    int32_t backend = -1;
    int32_t attention = -1;
    int32_t checkpointing = -1;
    EXPECT_OK(rt_model_backend(model, &backend));
    EXPECT_OK(rt_model_get_full_sequence_attention(model, &attention));
    EXPECT_OK(rt_model_get_activation_checkpointing(model, &checkpointing));
    EXPECT(backend == RT_BACKEND_CPU);
    EXPECT(attention == RT_ATTENTION_MATERIALIZED);
    EXPECT(checkpointing == RT_ACTIVATION_CHECKPOINTING_DISABLED);
    rt_model_release(model);
}

static void attention_policy_is_set_and_unknown_values_are_rejected(void) {
    rt_model* model = create_tiny_model();
    int32_t attention = -1;
    EXPECT_OK(rt_model_set_full_sequence_attention(model, RT_ATTENTION_FLASH));
    EXPECT_OK(rt_model_get_full_sequence_attention(model, &attention));
    EXPECT(attention == RT_ATTENTION_FLASH);

    EXPECT_STATUS(rt_model_set_full_sequence_attention(model, 2), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_set_full_sequence_attention(model, -1), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_model_get_full_sequence_attention(model, &attention));
    EXPECT(attention == RT_ATTENTION_FLASH);
    EXPECT_STATUS(rt_model_get_full_sequence_attention(model, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_set_full_sequence_attention(NULL, RT_ATTENTION_FLASH),
                  RT_STATUS_INVALID_ARGUMENT);
    rt_model_release(model);
}

static void checkpointing_policy_is_set_and_unknown_values_are_rejected(void) {
    rt_model* model = create_tiny_model();
    int32_t checkpointing = -1;
    EXPECT_OK(rt_model_set_activation_checkpointing(model,
                                                    RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK));
    EXPECT_OK(rt_model_get_activation_checkpointing(model, &checkpointing));
    EXPECT(checkpointing == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);

    EXPECT_STATUS(rt_model_set_activation_checkpointing(model, 2), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_model_get_activation_checkpointing(model, &checkpointing));
    EXPECT(checkpointing == RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK);
    EXPECT_STATUS(rt_model_get_activation_checkpointing(model, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_set_activation_checkpointing(NULL, 0), RT_STATUS_INVALID_ARGUMENT);
    rt_model_release(model);
}

static void forward_gives_batch_by_time_by_vocabulary_logits(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    uint64_t rank = 0;
    uint64_t numel = 0;
    int32_t backend = -1;
    EXPECT_OK(rt_variable_rank(logits, &rank));
    EXPECT_OK(rt_variable_numel(logits, &numel));
    EXPECT_OK(rt_variable_backend(logits, &backend));
    EXPECT_EQ_U64(rank, 3u);
    EXPECT_EQ_U64(numel, PATTERN_TOKENS * TINY_VOCABULARY);
    EXPECT(backend == RT_BACKEND_CPU);

    uint64_t shape[3] = {0, 0, 0};
    uint64_t required = 0;
    EXPECT_OK(rt_variable_shape(logits, shape, 3, &required));
    EXPECT(shape[0] == PATTERN_BATCH && shape[1] == PATTERN_TIME && shape[2] == TINY_VOCABULARY);

    float values[PATTERN_TOKENS * TINY_VOCABULARY];
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, values, numel, &required));
    for (size_t index = 0; index < PATTERN_TOKENS * TINY_VOCABULARY; ++index) {
        EXPECT(isfinite(values[index]));
    }
    rt_variable_release(logits);
    rt_model_release(model);
}

static void models_with_the_same_seed_compute_the_same_logits(void) {
    rt_model* first = create_tiny_model();
    rt_model* second = create_tiny_model();
    rt_variable* first_logits = forward_pattern(first);
    rt_variable* second_logits = forward_pattern(second);
    float first_values[PATTERN_TOKENS * TINY_VOCABULARY];
    float second_values[PATTERN_TOKENS * TINY_VOCABULARY];
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(first_logits, first_values,
                                           PATTERN_TOKENS * TINY_VOCABULARY, &required));
    EXPECT_OK(rt_variable_copy_to_host_f32(second_logits, second_values,
                                           PATTERN_TOKENS * TINY_VOCABULARY, &required));
    EXPECT(memcmp(first_values, second_values, sizeof first_values) == 0);
    rt_variable_release(second_logits);
    rt_variable_release(first_logits);
    rt_model_release(second);
    rt_model_release(first);
}

static void attention_and_checkpointing_policies_do_not_change_the_logits(void) {
    rt_model* plain = create_tiny_model();
    rt_model* policies = create_tiny_model();
    EXPECT_OK(rt_model_set_full_sequence_attention(policies, RT_ATTENTION_FLASH));
    EXPECT_OK(rt_model_set_activation_checkpointing(policies,
                                                    RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK));
    rt_variable* plain_logits = forward_pattern(plain);
    rt_variable* policy_logits = forward_pattern(policies);
    float plain_values[PATTERN_TOKENS * TINY_VOCABULARY];
    float policy_values[PATTERN_TOKENS * TINY_VOCABULARY];
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(plain_logits, plain_values,
                                           PATTERN_TOKENS * TINY_VOCABULARY, &required));
    EXPECT_OK(rt_variable_copy_to_host_f32(policy_logits, policy_values,
                                           PATTERN_TOKENS * TINY_VOCABULARY, &required));
    for (size_t index = 0; index < PATTERN_TOKENS * TINY_VOCABULARY; ++index) {
        EXPECT_NEAR(policy_values[index], plain_values[index], 1e-4);
    }
    rt_variable_release(policy_logits);
    rt_variable_release(plain_logits);
    rt_model_release(policies);
    rt_model_release(plain);
}

static void forward_rejects_a_count_other_than_batch_times_time(void) {
    uint32_t tokens[PATTERN_TOKENS];
    pattern_tokens(tokens);
    rt_model* model = create_tiny_model();
    rt_variable* logits = NULL;
    EXPECT_STATUS(
        rt_model_forward(model, tokens, PATTERN_TOKENS - 1u, PATTERN_BATCH, PATTERN_TIME, &logits),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_forward(model, tokens, PATTERN_TOKENS, 3, PATTERN_TIME, &logits),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(logits == NULL);
    rt_model_release(model);
}

static void forward_rejects_a_zero_batch_or_time(void) {
    static const uint32_t tokens[] = {1, 2};
    rt_model* model = create_tiny_model();
    rt_variable* logits = NULL;
    EXPECT_STATUS(rt_model_forward(model, tokens, 0, 0, 2, &logits), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_forward(model, tokens, 0, 1, 0, &logits), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(logits == NULL);
    rt_model_release(model);
}

static void forward_rejects_an_id_outside_the_vocabulary(void) {
    static const uint32_t tokens[] = {1, TINY_VOCABULARY, 2};
    rt_model* model = create_tiny_model();
    rt_variable* logits = NULL;
    EXPECT_STATUS(rt_model_forward(model, tokens, 3, 1, 3, &logits), RT_STATUS_OUT_OF_RANGE);
    EXPECT(logits == NULL);
    rt_model_release(model);
}

static void forward_rejects_time_beyond_the_maximum_context(void) {
    uint32_t tokens[TINY_CONTEXT + 1u];
    for (uint32_t position = 0; position <= TINY_CONTEXT; ++position) {
        tokens[position] = position;
    }
    rt_model* model = create_tiny_model();
    rt_variable* logits = NULL;
    EXPECT_STATUS(rt_model_forward(model, tokens, TINY_CONTEXT + 1u, 1, TINY_CONTEXT + 1u, &logits),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(logits == NULL);
    EXPECT_OK(rt_model_forward(model, tokens, TINY_CONTEXT, 1, TINY_CONTEXT, &logits));
    rt_variable_release(logits);
    rt_model_release(model);
}

static void forward_rejects_null_handles_and_pointers(void) {
    static const uint32_t tokens[] = {1, 2};
    rt_model* model = create_tiny_model();
    rt_variable* logits = NULL;
    EXPECT_STATUS(rt_model_forward(NULL, tokens, 2, 1, 2, &logits), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_forward(model, NULL, 2, 1, 2, &logits), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_forward(model, tokens, 2, 1, 2, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(logits == NULL);
    rt_model_release(model);
}

static void model_to_cpu_keeps_the_model_on_cpu(void) {
    rt_model* model = create_tiny_model();
    EXPECT_OK(rt_model_to(model, RT_BACKEND_CPU));
    int32_t backend = -1;
    EXPECT_OK(rt_model_backend(model, &backend));
    EXPECT(backend == RT_BACKEND_CPU);
    rt_model_release(model);
}

static void model_to_an_unavailable_backend_fails_naming_it_and_changes_nothing(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    float* before = copy_parameter_values(list);
    for (size_t index = 0; index < UNAVAILABLE_BACKEND_COUNT; ++index) {
        if (!unavailable_here(index)) {
            continue;
        }
        EXPECT_STATUS(rt_model_to(model, unavailable_backends[index]),
                      RT_STATUS_BACKEND_UNAVAILABLE);
        EXPECT_LAST_ERROR_MENTIONS(unavailable_backend_names[index]);
        int32_t backend = -1;
        EXPECT_OK(rt_model_backend(model, &backend));
        EXPECT(backend == RT_BACKEND_CPU);
    }
    EXPECT(parameters_equal(list, before));
    rt_variable* logits = forward_pattern(model); /* still usable */
    rt_variable_release(logits);
    free(before);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void model_to_rejects_an_unknown_backend(void) {
    rt_model* model = create_tiny_model();
    EXPECT_STATUS(rt_model_to(model, FIRST_UNASSIGNED_BACKEND), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_to(NULL, RT_BACKEND_CPU), RT_STATUS_INVALID_ARGUMENT);
    rt_model_release(model);
}

static void model_to_is_rejected_while_a_variable_lives(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    EXPECT_STATUS(rt_model_to(model, RT_BACKEND_CPU), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(logits);
    EXPECT_OK(rt_model_to(model, RT_BACKEND_CPU));
    rt_model_release(model);
}

static void model_to_is_rejected_while_an_optimizer_lives_and_changes_nothing(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);

    EXPECT_STATUS(rt_model_to(model, RT_BACKEND_CPU), RT_STATUS_RUNTIME_ERROR);
    int32_t model_backend = -1;
    int32_t adam_backend = -1;
    EXPECT_OK(rt_model_backend(model, &model_backend));
    EXPECT_OK(rt_adam_backend(adam, &adam_backend));
    EXPECT(model_backend == RT_BACKEND_CPU && adam_backend == RT_BACKEND_CPU);
    EXPECT_EQ_U64(step_count_of(adam), 1u);

    rt_adam_release(adam);
    EXPECT_OK(rt_model_to(model, RT_BACKEND_CPU));
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* ==== Parameter lists ===================================================================== */

static void parameter_list_has_the_canonical_names_and_shapes(void) {
    /* The decoder's parameter names, order and [out, in] shapes, for one block
     * (docs/ARCHITECTURE.md, 'The decoder'). */
    static const struct {
        const char* name;
        uint64_t rank;
        uint64_t shape[2];
    } expected[] = {
        {"token_embedding.weight", 2, {TINY_VOCABULARY, TINY_WIDTH}},
        {"position_embedding.weight", 2, {TINY_CONTEXT, TINY_WIDTH}},
        {"blocks.0.attention_norm.scale", 1, {TINY_WIDTH, 0}},
        {"blocks.0.attention_norm.bias", 1, {TINY_WIDTH, 0}},
        {"blocks.0.attention.query.weight", 2, {TINY_WIDTH, TINY_WIDTH}},
        {"blocks.0.attention.query.bias", 1, {TINY_WIDTH, 0}},
        {"blocks.0.attention.key.weight", 2, {TINY_WIDTH, TINY_WIDTH}},
        {"blocks.0.attention.key.bias", 1, {TINY_WIDTH, 0}},
        {"blocks.0.attention.value.weight", 2, {TINY_WIDTH, TINY_WIDTH}},
        {"blocks.0.attention.value.bias", 1, {TINY_WIDTH, 0}},
        {"blocks.0.attention.output.weight", 2, {TINY_WIDTH, TINY_WIDTH}},
        {"blocks.0.attention.output.bias", 1, {TINY_WIDTH, 0}},
        {"blocks.0.feed_forward_norm.scale", 1, {TINY_WIDTH, 0}},
        {"blocks.0.feed_forward_norm.bias", 1, {TINY_WIDTH, 0}},
        {"blocks.0.feed_forward.expand.weight", 2, {TINY_FEED_FORWARD, TINY_WIDTH}},
        {"blocks.0.feed_forward.expand.bias", 1, {TINY_FEED_FORWARD, 0}},
        {"blocks.0.feed_forward.project.weight", 2, {TINY_WIDTH, TINY_FEED_FORWARD}},
        {"blocks.0.feed_forward.project.bias", 1, {TINY_WIDTH, 0}},
        {"final_norm.scale", 1, {TINY_WIDTH, 0}},
        {"final_norm.bias", 1, {TINY_WIDTH, 0}},
        {"language_model_head.weight", 2, {TINY_VOCABULARY, TINY_WIDTH}},
        {"language_model_head.bias", 1, {TINY_VOCABULARY, 0}},
    };
    const uint64_t expected_count = sizeof expected / sizeof expected[0];
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(list, &count));
    EXPECT_EQ_U64(count, expected_count);

    uint64_t total = 0;
    for (uint64_t index = 0; index < expected_count; ++index) {
        char name[64];
        uint64_t required = 0;
        EXPECT_OK(rt_parameter_list_name(list, index, name, sizeof name, &required));
        EXPECT_STREQ(name, expected[index].name);

        uint64_t rank = 0;
        uint64_t shape[2] = {0, 0};
        uint64_t numel = 0;
        EXPECT_OK(rt_parameter_list_rank(list, index, &rank));
        EXPECT_OK(rt_parameter_list_shape(list, index, shape, 2, &required));
        EXPECT_OK(rt_parameter_list_numel(list, index, &numel));
        EXPECT_EQ_U64(rank, expected[index].rank);
        EXPECT(memcmp(shape, expected[index].shape, sizeof shape) == 0);
        EXPECT_EQ_U64(numel, rank == 2u ? shape[0] * shape[1] : shape[0]);
        total += numel;
    }
    EXPECT_EQ_U64(total_numel(list), total);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_list_queries_reject_an_index_past_the_end(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(list, &count));
    uint64_t value = UINT64_MAX;
    uint64_t required = UINT64_MAX;
    EXPECT_STATUS(rt_parameter_list_name(list, count, NULL, 0, &required), RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(rt_parameter_list_rank(list, count, &value), RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(rt_parameter_list_shape(list, count, NULL, 0, &required), RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(rt_parameter_list_numel(list, count, &value), RT_STATUS_OUT_OF_RANGE);
    EXPECT_EQ_U64(value, UINT64_MAX);
    EXPECT_EQ_U64(required, UINT64_MAX);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_list_queries_reject_null_handles_and_outputs(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    uint64_t value = 0;
    int32_t backend = -1;
    EXPECT_STATUS(rt_model_parameters(NULL, &list), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_model_parameters(model, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_count(NULL, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_count(list, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_backend(NULL, &backend), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_backend(list, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_rank(list, 0, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_numel(list, 0, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_total_numel(NULL, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_total_numel(list, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(NULL, NULL, 0), RT_STATUS_INVALID_ARGUMENT);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_list_reports_the_cpu_backend(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    int32_t backend = -1;
    EXPECT_OK(rt_parameter_list_backend(list, &backend));
    EXPECT(backend == RT_BACKEND_CPU);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_values_round_trip_through_copy_and_load(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* values = copy_parameter_values(list);
    for (uint64_t index = 0; index < total; ++index) {
        values[index] = values[index] * 0.5f + 0.25f;
    }
    EXPECT_OK(rt_parameter_list_load_from_host_f32(list, values, total));
    EXPECT(parameters_equal(list, values));
    free(values);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void loaded_parameters_are_what_forward_uses(void) {
    /* With every parameter zero the head's weights and bias are zero: all logits are 0. */
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* zeros = calloc((size_t)total, sizeof *zeros);
    EXPECT(zeros != NULL);
    EXPECT_OK(rt_parameter_list_load_from_host_f32(list, zeros, total));

    rt_variable* logits = forward_pattern(model);
    float values[PATTERN_TOKENS * TINY_VOCABULARY];
    uint64_t required = 0;
    EXPECT_OK(
        rt_variable_copy_to_host_f32(logits, values, PATTERN_TOKENS * TINY_VOCABULARY, &required));
    for (size_t index = 0; index < PATTERN_TOKENS * TINY_VOCABULARY; ++index) {
        EXPECT(values[index] == 0.0f);
    }
    rt_variable_release(logits);
    free(zeros);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_load_rejects_a_wrong_count_without_changing_values(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* before = copy_parameter_values(list);
    float* candidate = calloc((size_t)total + 1u, sizeof *candidate);
    EXPECT(candidate != NULL);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, candidate, total - 1u),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, candidate, total + 1u),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, NULL, total),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(parameters_equal(list, before));
    free(candidate);
    free(before);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_load_rejects_nan_without_changing_values(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* before = copy_parameter_values(list);
    float* candidate = calloc((size_t)total, sizeof *candidate);
    EXPECT(candidate != NULL);
    candidate[total - 1u] = NAN; /* the last value: every earlier one would have been valid */
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, candidate, total),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(parameters_equal(list, before));
    free(candidate);
    free(before);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_load_rejects_infinity_without_changing_values(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* before = copy_parameter_values(list);
    float* candidate = calloc((size_t)total, sizeof *candidate);
    EXPECT(candidate != NULL);
    candidate[total / 2u] = -INFINITY;
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, candidate, total),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(parameters_equal(list, before));
    free(candidate);
    free(before);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_load_clears_pending_gradients(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_variable* loss = pattern_loss(model);
    EXPECT_OK(rt_variable_backward(loss));
    rt_variable_release(loss);
    float* values = copy_parameter_values(list);
    EXPECT_OK(rt_parameter_list_load_from_host_f32(list, values, total_numel(list)));

    /* Capturing optimizer state needs a step boundary with no pending gradient. */
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_adam_state state;
    memset(&state, 0, sizeof state);
    state.struct_size = sizeof state;
    EXPECT_OK(rt_adam_state_get(adam, &state));
    rt_adam_release(adam);
    free(values);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_load_is_rejected_while_a_variable_lives(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    float* values = copy_parameter_values(list);
    values[0] += 1.0f;
    rt_variable* logits = forward_pattern(model);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, values, total_numel(list)),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT(!parameters_equal(list, values));
    rt_variable_release(logits);
    EXPECT_OK(rt_parameter_list_load_from_host_f32(list, values, total_numel(list)));
    EXPECT(parameters_equal(list, values));
    free(values);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void parameter_load_is_rejected_while_an_optimizer_lives(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    float* values = copy_parameter_values(list);
    values[0] += 1.0f;
    rt_adam* adam = create_adam(list, 1e-2f);
    EXPECT_STATUS(rt_parameter_list_load_from_host_f32(list, values, total_numel(list)),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT(!parameters_equal(list, values));
    rt_adam_release(adam);
    EXPECT_OK(rt_parameter_list_load_from_host_f32(list, values, total_numel(list)));
    free(values);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* ==== Autograd ============================================================================ */

static void cross_entropy_of_uniform_logits_is_the_log_of_the_vocabulary(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t total = total_numel(list);
    float* zeros = calloc((size_t)total, sizeof *zeros);
    EXPECT(zeros != NULL);
    EXPECT_OK(rt_parameter_list_load_from_host_f32(list, zeros, total));

    rt_variable* loss = pattern_loss(model);
    uint64_t rank = UINT64_MAX;
    uint64_t numel = 0;
    EXPECT_OK(rt_variable_rank(loss, &rank));
    EXPECT_OK(rt_variable_numel(loss, &numel));
    EXPECT_EQ_U64(rank, 0u);
    EXPECT_EQ_U64(numel, 1u);
    EXPECT_NEAR(scalar_value(loss), log((double)TINY_VOCABULARY), 1e-5);
    rt_variable_release(loss);
    free(zeros);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void cross_entropy_rejects_a_target_count_other_than_the_positions(void) {
    uint32_t targets[PATTERN_TOKENS];
    pattern_targets(targets);
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    rt_variable* loss = NULL;
    EXPECT_STATUS(rt_cross_entropy(logits, targets, PATTERN_TOKENS - 1u, &loss),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(loss == NULL);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void cross_entropy_rejects_a_target_outside_the_vocabulary(void) {
    uint32_t targets[PATTERN_TOKENS];
    pattern_targets(targets);
    targets[3] = TINY_VOCABULARY;
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    rt_variable* loss = NULL;
    EXPECT_STATUS(rt_cross_entropy(logits, targets, PATTERN_TOKENS, &loss), RT_STATUS_OUT_OF_RANGE);
    EXPECT(loss == NULL);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void cross_entropy_rejects_null_handles_and_pointers(void) {
    uint32_t targets[PATTERN_TOKENS];
    pattern_targets(targets);
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    rt_variable* loss = NULL;
    EXPECT_STATUS(rt_cross_entropy(NULL, targets, PATTERN_TOKENS, &loss),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy(logits, NULL, PATTERN_TOKENS, &loss),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_cross_entropy(logits, targets, PATTERN_TOKENS, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(loss == NULL);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void backward_needs_a_scalar(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    EXPECT_STATUS(rt_variable_backward(logits), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_backward(NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void backward_replaces_the_gradients_instead_of_adding_to_them(void) {
    /* Two backward passes over identical graphs leave the gradient of one: the step sees the
     * same norm as after a single pass (it would double if they were summed). */
    rt_model* once_model = create_tiny_model();
    rt_model* twice_model = create_tiny_model();
    rt_parameter_list* once_list = parameters_of(once_model);
    rt_parameter_list* twice_list = parameters_of(twice_model);
    rt_adam* once = create_adam(once_list, 1e-2f);
    rt_adam* twice = create_adam(twice_list, 1e-2f);

    rt_variable* loss = pattern_loss(once_model);
    EXPECT_OK(rt_variable_backward(loss));
    rt_variable_release(loss);
    for (int pass = 0; pass < 2; ++pass) {
        loss = pattern_loss(twice_model);
        EXPECT_OK(rt_variable_backward(loss));
        rt_variable_release(loss);
    }
    rt_adam_step_stats once_stats;
    rt_adam_step_stats twice_stats;
    once_stats.struct_size = sizeof once_stats;
    twice_stats.struct_size = sizeof twice_stats;
    EXPECT_OK(rt_adam_step(once, &once_stats));
    EXPECT_OK(rt_adam_step(twice, &twice_stats));
    EXPECT_NEAR(twice_stats.gradient_norm, once_stats.gradient_norm,
                1e-6 * once_stats.gradient_norm);

    rt_adam_release(twice);
    rt_adam_release(once);
    rt_parameter_list_release(twice_list);
    rt_parameter_list_release(once_list);
    rt_model_release(twice_model);
    rt_model_release(once_model);
}

static void a_second_backward_is_a_runtime_error(void) {
    rt_model* model = create_tiny_model();
    rt_variable* loss = pattern_loss(model);
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT_STATUS(rt_variable_backward(loss), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(loss);
    rt_model_release(model);
}

static void backward_of_a_graph_built_before_an_adam_step_is_a_runtime_error(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_variable* stale = pattern_loss(model);
    train_step(model, adam, NULL);

    EXPECT_STATUS(rt_variable_backward(stale), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(stale);

    rt_variable* fresh = pattern_loss(model);
    EXPECT_OK(rt_variable_backward(fresh));
    rt_variable_release(fresh);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void a_loss_over_logits_from_before_an_adam_step_is_stale_too(void) {
    /* The loss is built after the step, but its graph reads the parameters of before. */
    uint32_t targets[PATTERN_TOKENS];
    pattern_targets(targets);
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_variable* stale_logits = forward_pattern(model);
    train_step(model, adam, NULL);

    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy(stale_logits, targets, PATTERN_TOKENS, &loss));
    EXPECT_STATUS(rt_variable_backward(loss), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(loss);
    rt_variable_release(stale_logits);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void variable_values_stay_readable_after_backward_and_a_step(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_variable* loss = pattern_loss(model);
    const float before = scalar_value(loss);
    EXPECT_OK(rt_variable_backward(loss));
    EXPECT(scalar_value(loss) == before);
    EXPECT_OK(rt_adam_step(adam, NULL));
    EXPECT(scalar_value(loss) == before);
    rt_variable_release(loss);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void variable_queries_reject_null_handles_and_outputs(void) {
    rt_model* model = create_tiny_model();
    rt_variable* logits = forward_pattern(model);
    uint64_t value = 0;
    int32_t backend = -1;
    EXPECT_STATUS(rt_variable_backend(NULL, &backend), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_backend(logits, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_rank(NULL, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_rank(logits, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_numel(NULL, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_numel(logits, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_shape(NULL, NULL, 0, &value), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_variable_copy_to_host_f32(NULL, NULL, 0, &value), RT_STATUS_INVALID_ARGUMENT);
    rt_variable_release(logits);
    rt_model_release(model);
}

static void model_derived_handles_outlive_the_model(void) {
    uint32_t targets[PATTERN_TOKENS];
    pattern_targets(targets);
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    float* before = copy_parameter_values(list);
    rt_variable* logits = forward_pattern(model);
    rt_model_release(model);

    rt_variable* loss = NULL;
    EXPECT_OK(rt_cross_entropy(logits, targets, PATTERN_TOKENS, &loss));
    rt_variable_release(logits);
    EXPECT_OK(rt_variable_backward(loss));
    rt_adam* adam = create_adam(list, 1e-2f); /* from a list whose model is released */
    rt_adam_step_stats stats;
    stats.struct_size = sizeof stats;
    EXPECT_OK(rt_adam_step(adam, &stats));
    EXPECT_EQ_U64(stats.step, 1u);
    EXPECT(stats.gradient_norm > 0.0);
    EXPECT(!parameters_equal(list, before));

    rt_variable_release(loss);
    rt_parameter_list_release(list);
    EXPECT_OK(rt_adam_step(adam, NULL)); /* the optimizer alone keeps the state alive */
    EXPECT_EQ_U64(step_count_of(adam), 2u);
    rt_adam_release(adam);
    free(before);
}

/* ==== Adam ================================================================================ */

static void adam_options_init_sets_the_defaults(void) {
    rt_adam_options options;
    memset(&options, SENTINEL_BYTE, sizeof options);
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    EXPECT_EQ_U64(options.struct_size, sizeof options);
    EXPECT(options.learning_rate == 1e-3f);
    EXPECT(options.beta1 == 0.9f);
    EXPECT(options.beta2 == 0.999f);
    EXPECT(options.epsilon == 1e-8f);
    EXPECT(options.maximum_gradient_norm == 1.0f);
    EXPECT_EQ_U64(options.reserved, 0u);
    EXPECT(options.state_storage == RT_ADAM_STATE_CONTIGUOUS);
    EXPECT_EQ_U64(options.reserved2, 0u);
    EXPECT_EQ_U64(options.page_size, 4096u);
}

static void adam_options_init_rejects_a_struct_size_below_the_2_3_prefix(void) {
    rt_adam_options options;
    memset(&options, SENTINEL_BYTE, sizeof options);
    EXPECT_STATUS(rt_adam_options_init(&options, 31), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_options_init(&options, 0), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(all_bytes_are(&options, sizeof options, SENTINEL_BYTE));
    EXPECT_STATUS(rt_adam_options_init(NULL, sizeof options), RT_STATUS_INVALID_ARGUMENT);
}

static void adam_options_in_a_larger_struct_keep_their_tail(void) {
    struct {
        rt_adam_options options;
        unsigned char tail[24];
    } larger;
    memset(&larger, SENTINEL_BYTE, sizeof larger);
    EXPECT_OK(rt_adam_options_init(&larger.options, sizeof larger));
    EXPECT_EQ_U64(larger.options.struct_size, sizeof larger);
    EXPECT_EQ_U64(larger.options.page_size, 4096u);
    EXPECT(all_bytes_are(larger.tail, sizeof larger.tail, SENTINEL_BYTE));

    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, &larger.options, &adam));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* Applies `edit` (a statement on `options`) to the defaults, then expects creation to be
 * rejected without yielding an optimizer. */
#define EXPECT_ADAM_OPTIONS_REJECTED(list, edit)                                            \
    do {                                                                                    \
        rt_adam_options options = default_adam_options();                                   \
        edit;                                                                               \
        rt_adam* adam = NULL;                                                               \
        EXPECT_STATUS(rt_adam_create((list), &options, &adam), RT_STATUS_INVALID_ARGUMENT); \
        EXPECT(adam == NULL);                                                               \
    } while (0)

static void adam_creation_rejects_invalid_options(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.learning_rate = 0.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.learning_rate = -1e-3f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.learning_rate = NAN);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.learning_rate = INFINITY);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.beta1 = 0.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.beta1 = 1.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.beta2 = 0.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.beta2 = 1.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.epsilon = 0.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.epsilon = INFINITY);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.maximum_gradient_norm = 0.0f);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.maximum_gradient_norm = NAN);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.state_storage = 2);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.page_size = 0);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.reserved = 1);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.reserved2 = 1);
    EXPECT_ADAM_OPTIONS_REJECTED(list, options.struct_size = 24);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void infinite_maximum_gradient_norm_disables_clipping(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam_options options = default_adam_options();
    options.maximum_gradient_norm = INFINITY;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, &options, &adam));
    rt_adam_step_stats stats;
    stats.struct_size = sizeof stats;
    train_step(model, adam, &stats);
    EXPECT(stats.gradient_norm > 1.0); /* would have been clipped at the default limit */
    EXPECT(stats.clip_scale == 1.0);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_with_null_options_uses_the_defaults(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, NULL, &adam));

    int32_t backend = -1;
    int32_t storage = -1;
    uint64_t page_size = 0;
    uint64_t parameter_count = 0;
    uint64_t list_count = 0;
    uint64_t payload = 0;
    EXPECT_OK(rt_adam_backend(adam, &backend));
    EXPECT_OK(rt_adam_state_storage(adam, &storage));
    EXPECT_OK(rt_adam_state_page_size(adam, &page_size));
    EXPECT_OK(rt_adam_parameter_count(adam, &parameter_count));
    EXPECT_OK(rt_parameter_list_count(list, &list_count));
    EXPECT_OK(rt_adam_state_payload_bytes(adam, &payload));
    EXPECT(backend == RT_BACKEND_CPU);
    EXPECT(storage == RT_ADAM_STATE_CONTIGUOUS);
    EXPECT_EQ_U64(page_size, 4096u);
    EXPECT_EQ_U64(parameter_count, list_count);
    EXPECT_EQ_U64(step_count_of(adam), 0u);
    EXPECT_EQ_U64(payload, 2u * total_numel(list) * sizeof(float));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void paged_adam_reports_its_page_layout(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam_options options = default_adam_options();
    options.state_storage = RT_ADAM_STATE_PAGED;
    options.page_size = 64;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(list, &options, &adam));

    /* Pages never span two parameters: each holds at most page_size scalars of one. */
    uint64_t count = 0;
    uint64_t expected_pages = 0;
    EXPECT_OK(rt_parameter_list_count(list, &count));
    for (uint64_t index = 0; index < count; ++index) {
        uint64_t numel = 0;
        EXPECT_OK(rt_parameter_list_numel(list, index, &numel));
        expected_pages += (numel + 63u) / 64u;
    }

    int32_t storage = -1;
    uint64_t page_size = 0;
    uint64_t pages = 0;
    uint64_t payload = 0;
    EXPECT_OK(rt_adam_state_storage(adam, &storage));
    EXPECT_OK(rt_adam_state_page_size(adam, &page_size));
    EXPECT_OK(rt_adam_state_page_count(adam, &pages));
    EXPECT_OK(rt_adam_state_payload_bytes(adam, &payload));
    EXPECT(storage == RT_ADAM_STATE_PAGED);
    EXPECT_EQ_U64(page_size, 64u);
    EXPECT_EQ_U64(pages, expected_pages);
    EXPECT_EQ_U64(payload, 2u * total_numel(list) * sizeof(float));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void paged_and_contiguous_state_train_identically(void) {
    rt_model* contiguous_model = create_tiny_model();
    rt_model* paged_model = create_tiny_model();
    rt_parameter_list* contiguous_list = parameters_of(contiguous_model);
    rt_parameter_list* paged_list = parameters_of(paged_model);
    rt_adam_options options = default_adam_options();
    options.learning_rate = 1e-2f;
    rt_adam* contiguous = NULL;
    EXPECT_OK(rt_adam_create(contiguous_list, &options, &contiguous));
    options.state_storage = RT_ADAM_STATE_PAGED;
    options.page_size = 7;
    rt_adam* paged = NULL;
    EXPECT_OK(rt_adam_create(paged_list, &options, &paged));
    for (int step = 0; step < 3; ++step) {
        train_step(contiguous_model, contiguous, NULL);
        train_step(paged_model, paged, NULL);
    }
    float* contiguous_values = copy_parameter_values(contiguous_list);
    EXPECT(parameters_equal(paged_list, contiguous_values));
    free(contiguous_values);
    rt_adam_release(paged);
    rt_adam_release(contiguous);
    rt_parameter_list_release(paged_list);
    rt_parameter_list_release(contiguous_list);
    rt_model_release(paged_model);
    rt_model_release(contiguous_model);
}

static void adam_step_updates_the_parameters_and_fills_the_stats(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    float* before = copy_parameter_values(list);
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_adam_step_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    train_step(model, adam, &stats);
    EXPECT_EQ_U64(stats.struct_size, sizeof stats);
    EXPECT_EQ_U64(stats.step, 1u);
    EXPECT(stats.gradient_norm > 0.0);
    EXPECT(stats.clip_scale > 0.0 && stats.clip_scale <= 1.0);
    EXPECT_EQ_U64(step_count_of(adam), 1u);
    EXPECT(!parameters_equal(list, before));
    free(before);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_step_with_a_small_stats_struct_fails_without_stepping(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);
    float* before = copy_parameter_values(list);

    rt_variable* loss = pattern_loss(model);
    EXPECT_OK(rt_variable_backward(loss));
    rt_adam_step_stats stats;
    memset(&stats, SENTINEL_BYTE, sizeof stats);
    stats.struct_size = 8;
    EXPECT_STATUS(rt_adam_step(adam, &stats), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ_U64(step_count_of(adam), 1u);
    EXPECT(parameters_equal(list, before));
    EXPECT(all_bytes_are((const unsigned char*)&stats + 8, sizeof stats - 8u, SENTINEL_BYTE));
    int32_t backend = -1;
    EXPECT_OK(rt_adam_backend(adam, &backend));
    EXPECT(backend == RT_BACKEND_CPU);

    /* The gradients are still pending: the same step now succeeds. */
    EXPECT_OK(rt_adam_step(adam, NULL));
    EXPECT_EQ_U64(step_count_of(adam), 2u);
    rt_variable_release(loss);
    free(before);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_step_writes_only_the_known_prefix_of_a_larger_stats_struct(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    struct {
        rt_adam_step_stats stats;
        unsigned char tail[16];
    } larger;
    memset(&larger, SENTINEL_BYTE, sizeof larger);
    larger.stats.struct_size = sizeof larger;
    train_step(model, adam, &larger.stats);
    EXPECT_EQ_U64(larger.stats.struct_size, sizeof larger);
    EXPECT_EQ_U64(larger.stats.step, 1u);
    EXPECT(all_bytes_are(larger.tail, sizeof larger.tail, SENTINEL_BYTE));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_queries_reject_null_handles_and_outputs(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    int32_t number32 = -1;
    uint64_t number64 = 0;
    rt_adam* missing = NULL;
    EXPECT_STATUS(rt_adam_create(NULL, NULL, &missing), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(missing == NULL);
    EXPECT_STATUS(rt_adam_create(list, NULL, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_backend(NULL, &number32), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_backend(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_step_count(NULL, &number64), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_step_count(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_parameter_count(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_storage(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_page_size(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_page_count(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_payload_bytes(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_step(NULL, NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_zero_gradients(NULL), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_get(adam, NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_needs_a_clean_step_boundary(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_variable* loss = pattern_loss(model);
    EXPECT_OK(rt_variable_backward(loss));
    rt_variable_release(loss);

    rt_adam_state state;
    memset(&state, SENTINEL_BYTE, sizeof state);
    state.struct_size = sizeof state;
    EXPECT_STATUS(rt_adam_state_get(adam, &state), RT_STATUS_RUNTIME_ERROR);
    EXPECT(all_bytes_are((const unsigned char*)&state + 8, sizeof state - 8u, SENTINEL_BYTE));
    const uint64_t total = total_numel(list);
    float* values = malloc((size_t)total * sizeof *values);
    EXPECT(values != NULL);
    memset(values, SENTINEL_BYTE, (size_t)total * sizeof *values);
    float* first_moments = malloc((size_t)total * sizeof *first_moments);
    float* second_moments = malloc((size_t)total * sizeof *second_moments);
    EXPECT(first_moments != NULL && second_moments != NULL);
    EXPECT_STATUS(
        rt_adam_state_copy_to_host_f32(adam, values, first_moments, second_moments, total),
        RT_STATUS_RUNTIME_ERROR);
    EXPECT(all_bytes_are(values, (size_t)total * sizeof *values, SENTINEL_BYTE));
    free(second_moments);
    free(first_moments);
    free(values);

    EXPECT_OK(rt_adam_zero_gradients(adam));
    EXPECT_OK(rt_adam_state_get(adam, &state));
    EXPECT_EQ_U64(state.step_count, 0u);
    EXPECT_EQ_U64(state.value_count, total_numel(list));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_get_rejects_a_small_struct(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    rt_adam_state state;
    memset(&state, SENTINEL_BYTE, sizeof state);
    state.struct_size = sizeof state - 8u;
    EXPECT_STATUS(rt_adam_state_get(adam, &state), RT_STATUS_INVALID_ARGUMENT);
    EXPECT(all_bytes_are((const unsigned char*)&state + 8, sizeof state - 8u, SENTINEL_BYTE));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_get_writes_only_the_known_prefix_of_a_larger_struct(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    struct {
        rt_adam_state state;
        unsigned char tail[16];
    } larger;
    memset(&larger, SENTINEL_BYTE, sizeof larger);
    larger.state.struct_size = sizeof larger;
    EXPECT_OK(rt_adam_state_get(adam, &larger.state));
    EXPECT_EQ_U64(larger.state.struct_size, sizeof larger);
    EXPECT_EQ_U64(larger.state.value_count, total_numel(list));
    EXPECT(all_bytes_are(larger.tail, sizeof larger.tail, SENTINEL_BYTE));
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* A captured logical optimizer state: the header struct and its three arrays. */
typedef struct captured_adam_state {
    rt_adam_state state;
    float* values;
    float* first_moments;
    float* second_moments;
} captured_adam_state;

static captured_adam_state capture_adam_state(const rt_adam* adam) {
    captured_adam_state captured;
    memset(&captured.state, 0, sizeof captured.state);
    captured.state.struct_size = sizeof captured.state;
    EXPECT_OK(rt_adam_state_get(adam, &captured.state));
    const size_t bytes = (size_t)captured.state.value_count * sizeof(float);
    captured.values = malloc(bytes);
    captured.first_moments = malloc(bytes);
    captured.second_moments = malloc(bytes);
    EXPECT(captured.values != NULL && captured.first_moments != NULL &&
           captured.second_moments != NULL);
    EXPECT_OK(rt_adam_state_copy_to_host_f32(adam, captured.values, captured.first_moments,
                                             captured.second_moments, captured.state.value_count));
    return captured;
}

static void release_captured_adam_state(captured_adam_state* captured) {
    free(captured->values);
    free(captured->first_moments);
    free(captured->second_moments);
}

static int captured_states_equal(const captured_adam_state* left,
                                 const captured_adam_state* right) {
    const size_t bytes = (size_t)left->state.value_count * sizeof(float);
    return left->state.step_count == right->state.step_count &&
           left->state.beta1_power == right->state.beta1_power &&
           left->state.beta2_power == right->state.beta2_power &&
           left->state.value_count == right->state.value_count &&
           memcmp(left->values, right->values, bytes) == 0 &&
           memcmp(left->first_moments, right->first_moments, bytes) == 0 &&
           memcmp(left->second_moments, right->second_moments, bytes) == 0;
}

static void adam_state_reports_the_step_and_beta_powers(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);
    train_step(model, adam, NULL);
    captured_adam_state captured = capture_adam_state(adam);
    EXPECT_EQ_U64(captured.state.step_count, 2u);
    EXPECT_NEAR(captured.state.beta1_power, pow((double)0.9f, 2.0), 1e-12);
    EXPECT_NEAR(captured.state.beta2_power, pow((double)0.999f, 2.0), 1e-12);
    EXPECT_EQ_U64(captured.state.value_count, total_numel(list));
    EXPECT(parameters_equal(list, captured.values));
    release_captured_adam_state(&captured);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_round_trip_restores_bit_identical_parameters_and_step_count(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);
    train_step(model, adam, NULL);
    captured_adam_state saved = capture_adam_state(adam);
    train_step(model, adam, NULL);
    float* after_third_step = copy_parameter_values(list);
    train_step(model, adam, NULL);
    EXPECT(!parameters_equal(list, saved.values));

    EXPECT_OK(rt_adam_state_load_from_host_f32(adam, &saved.state, saved.values,
                                               saved.first_moments, saved.second_moments,
                                               saved.state.value_count));
    EXPECT_EQ_U64(step_count_of(adam), 2u);
    EXPECT(parameters_equal(list, saved.values));
    captured_adam_state restored = capture_adam_state(adam);
    EXPECT(captured_states_equal(&restored, &saved));

    /* Exact resume: the restored optimizer repeats the third step bit for bit. */
    train_step(model, adam, NULL);
    EXPECT(parameters_equal(list, after_third_step));

    release_captured_adam_state(&restored);
    release_captured_adam_state(&saved);
    free(after_third_step);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_load_rejects_a_wrong_count_without_changing_anything(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);
    captured_adam_state saved = capture_adam_state(adam);
    train_step(model, adam, NULL);
    captured_adam_state current = capture_adam_state(adam);

    rt_adam_state shorter = saved.state;
    shorter.value_count -= 1u;
    EXPECT_STATUS(
        rt_adam_state_load_from_host_f32(adam, &shorter, saved.values, saved.first_moments,
                                         saved.second_moments, shorter.value_count),
        RT_STATUS_INVALID_ARGUMENT);
    /* value_count and count must agree too. */
    EXPECT_STATUS(
        rt_adam_state_load_from_host_f32(adam, &saved.state, saved.values, saved.first_moments,
                                         saved.second_moments, saved.state.value_count - 1u),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_load_from_host_f32(adam, &saved.state, saved.values, NULL,
                                                   saved.second_moments, saved.state.value_count),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_load_from_host_f32(adam, NULL, saved.values, saved.first_moments,
                                                   saved.second_moments, saved.state.value_count),
                  RT_STATUS_INVALID_ARGUMENT);

    captured_adam_state unchanged = capture_adam_state(adam);
    EXPECT(captured_states_equal(&unchanged, &current));
    EXPECT_EQ_U64(step_count_of(adam), 2u);
    release_captured_adam_state(&unchanged);
    release_captured_adam_state(&current);
    release_captured_adam_state(&saved);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_load_rejects_a_negative_second_moment(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);
    captured_adam_state saved = capture_adam_state(adam);
    saved.second_moments[0] = -1.0f;
    EXPECT_STATUS(
        rt_adam_state_load_from_host_f32(adam, &saved.state, saved.values, saved.first_moments,
                                         saved.second_moments, saved.state.value_count),
        RT_STATUS_INVALID_ARGUMENT);
    captured_adam_state unchanged = capture_adam_state(adam);
    EXPECT(unchanged.second_moments[0] >= 0.0f);
    release_captured_adam_state(&unchanged);
    release_captured_adam_state(&saved);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_load_is_rejected_while_a_variable_lives(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    train_step(model, adam, NULL);
    captured_adam_state saved = capture_adam_state(adam);
    train_step(model, adam, NULL);

    rt_variable* logits = forward_pattern(model);
    EXPECT_STATUS(
        rt_adam_state_load_from_host_f32(adam, &saved.state, saved.values, saved.first_moments,
                                         saved.second_moments, saved.state.value_count),
        RT_STATUS_RUNTIME_ERROR);
    EXPECT_EQ_U64(step_count_of(adam), 2u);
    rt_variable_release(logits);
    EXPECT_OK(rt_adam_state_load_from_host_f32(adam, &saved.state, saved.values,
                                               saved.first_moments, saved.second_moments,
                                               saved.state.value_count));
    EXPECT_EQ_U64(step_count_of(adam), 1u);
    release_captured_adam_state(&saved);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void adam_state_copy_rejects_a_capacity_below_the_value_count(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    const uint64_t total = total_numel(list);
    const size_t bytes = (size_t)total * sizeof(float);
    float* values = malloc(bytes);
    float* first = malloc(bytes);
    float* second = malloc(bytes);
    EXPECT(values != NULL && first != NULL && second != NULL);
    memset(values, SENTINEL_BYTE, bytes);
    memset(first, SENTINEL_BYTE, bytes);
    memset(second, SENTINEL_BYTE, bytes);
    EXPECT_STATUS(rt_adam_state_copy_to_host_f32(adam, values, first, second, total - 1u),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT(all_bytes_are(values, bytes, SENTINEL_BYTE));
    EXPECT(all_bytes_are(first, bytes, SENTINEL_BYTE));
    EXPECT(all_bytes_are(second, bytes, SENTINEL_BYTE));
    EXPECT_STATUS(rt_adam_state_copy_to_host_f32(adam, values, NULL, second, total),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_adam_state_copy_to_host_f32(NULL, values, first, second, total),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_adam_state_copy_to_host_f32(adam, values, first, second, total));
    EXPECT(parameters_equal(list, values));
    free(second);
    free(first);
    free(values);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* ==== Training ============================================================================ */

static void training_drives_the_loss_down_on_a_repeating_pattern(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    rt_adam* adam = create_adam(list, 1e-2f);
    float first_loss = 0.0f;
    float last_loss = 0.0f;
    for (uint64_t step = 1; step <= 30; ++step) {
        rt_adam_step_stats stats;
        memset(&stats, 0, sizeof stats);
        stats.struct_size = sizeof stats;
        const float loss = train_step(model, adam, &stats);
        EXPECT(isfinite(loss));
        EXPECT_EQ_U64(stats.step, step);
        EXPECT(stats.gradient_norm > 0.0);
        EXPECT(stats.clip_scale > 0.0 && stats.clip_scale <= 1.0);
        if (step == 1) {
            first_loss = loss;
        }
        last_loss = loss;
    }
    EXPECT(last_loss < 0.5f * first_loss);
    EXPECT_EQ_U64(step_count_of(adam), 30u);
    rt_adam_release(adam);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* ==== Thread-local errors ================================================================= */

/* What another thread saw; the thread only records, the test thread checks (expectations
 * must not run off the test thread). */
typedef struct other_thread_errors {
    char at_start[64];
    rt_status status;
    char after_failure[1024];
} other_thread_errors;

static void fail_on_this_thread(void* argument) {
    other_thread_errors* seen = argument;
    snprintf(seen->at_start, sizeof seen->at_start, "%s", rt_last_error());
    seen->status = rt_tensor_rank(NULL, NULL);
    snprintf(seen->after_failure, sizeof seen->after_failure, "%s", rt_last_error());
}

typedef struct thread_call {
    void (*body)(void*);
    void* argument;
} thread_call;

#if !defined(__STDC_NO_THREADS__)
static int c11_thread_entry(void* call) {
    ((thread_call*)call)->body(((thread_call*)call)->argument);
    return 0;
}

static int run_on_another_thread(thread_call call) {
    thrd_t thread;
    if (thrd_create(&thread, c11_thread_entry, &call) != thrd_success) {
        return 0;
    }
    return thrd_join(thread, NULL) == thrd_success;
}
#elif defined(__unix__) || defined(__APPLE__)
static void* posix_thread_entry(void* call) {
    ((thread_call*)call)->body(((thread_call*)call)->argument);
    return NULL;
}

static int run_on_another_thread(thread_call call) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, posix_thread_entry, &call) != 0) {
        return 0;
    }
    return pthread_join(thread, NULL) == 0;
}
#else
static int run_on_another_thread(thread_call call) {
    (void)call;
    return -1; /* no threads on this platform */
}
#endif

static void last_error_is_per_thread(void) {
    int32_t available = 0;
    EXPECT_STATUS(rt_backend_is_available(99, &available), RT_STATUS_INVALID_ARGUMENT);
    char own_error[1024];
    snprintf(own_error, sizeof own_error, "%s", rt_last_error());

    other_thread_errors seen;
    memset(&seen, 0, sizeof seen);
    const thread_call call = {fail_on_this_thread, &seen};
    const int ran = run_on_another_thread(call);
    if (ran < 0) {
        printf("last_error_is_per_thread: skipped (no threads on this platform)\n");
        return;
    }
    EXPECT(ran == 1);
    EXPECT_STREQ(seen.at_start, ""); /* a new thread starts with no error */
    EXPECT(seen.status == RT_STATUS_INVALID_ARGUMENT);
    EXPECT(seen.after_failure[0] != '\0');
    EXPECT(strcmp(seen.after_failure, own_error) != 0);
    EXPECT_STREQ(rt_last_error(), own_error); /* untouched by the other thread's failure */
}

/* ==== Runner ============================================================================== */

int main(void) {
    RUN_TEST(abi_version_is_the_header_version);
    RUN_TEST(abi_version_is_major_shifted_over_minor);
    RUN_TEST(status_string_names_every_status);
    RUN_TEST(status_string_of_an_unknown_value_is_unrecognized);
    RUN_TEST(a_successful_call_clears_the_last_error);
    RUN_TEST(last_error_survives_calls_that_return_no_status);
    RUN_TEST(last_error_is_truncated_to_1023_bytes);
    RUN_TEST(releasing_null_handles_is_a_no_op);

    RUN_TEST(cpu_backend_is_available);
    RUN_TEST(cpu_info_names_the_gemm_kernel_and_the_thread_count);
    RUN_TEST(stub_backends_are_unavailable_with_a_reason);
    RUN_TEST(backend_values_are_stable);
    RUN_TEST(pjrt_is_unavailable_in_a_default_build_naming_its_build_option);
    RUN_TEST(backends_have_their_stable_names);
    RUN_TEST(backend_queries_reject_an_unknown_backend);
    RUN_TEST(backend_is_available_rejects_a_null_out);

    RUN_TEST(tokenizer_options_init_sets_the_defaults);
    RUN_TEST(tokenizer_options_init_rejects_a_struct_size_below_the_minimum);
    RUN_TEST(tokenizer_options_in_a_larger_struct_keep_their_tail);
    RUN_TEST(tokenizer_creation_rejects_nonzero_reserved_options);
    RUN_TEST(tokenizer_creation_rejects_an_unknown_method);
    RUN_TEST(tokenizer_options_struct_size_is_checked_at_creation);
    RUN_TEST(tokenizer_creation_rejects_an_empty_or_missing_corpus);
    RUN_TEST(byte_tokenizer_vocabulary_is_the_sorted_distinct_corpus_bytes);
    RUN_TEST(byte_tokenizer_round_trips_bytes_with_embedded_nul);
    RUN_TEST(byte_tokenizer_rejects_an_unseen_byte);
    RUN_TEST(decoding_an_unknown_id_is_out_of_range);
    RUN_TEST(token_bytes_of_an_unknown_id_is_out_of_range);
    RUN_TEST(encoding_no_bytes_gives_no_ids);
    RUN_TEST(byte_tokenizer_has_no_merge_table);
    RUN_TEST(null_options_create_a_byte_tokenizer);
    RUN_TEST(byte_method_ignores_the_bpe_options);
    RUN_TEST(bpe_tokenizer_learns_merges_from_a_corpus);
    RUN_TEST(bpe_merge_rule_rejects_an_index_past_the_table);
    RUN_TEST(bpe_tokenizer_has_no_byte_vocabulary);
    RUN_TEST(bpe_tokenizer_round_trips_any_bytes_including_nul);
    RUN_TEST(bpe_options_out_of_range_are_rejected);
    RUN_TEST(byte_tokenizer_restored_from_its_vocabulary_encodes_identically);
    RUN_TEST(bpe_tokenizer_restored_from_its_merges_encodes_identically);
    RUN_TEST(an_empty_merge_table_restores_a_pure_byte_level_bpe);
    RUN_TEST(byte_vocabulary_restoration_rejects_invalid_vocabularies);
    RUN_TEST(bpe_restoration_rejects_an_inconsistent_merge_table);
    RUN_TEST(tokenizer_queries_reject_null_handles_and_outputs);

    RUN_TEST(context_reports_its_backend);
    RUN_TEST(context_on_an_unavailable_backend_fails_naming_it);
    RUN_TEST(tensor_reports_its_shape_rank_numel_and_backend);
    RUN_TEST(tensor_holds_a_copy_of_the_callers_values);
    RUN_TEST(scalar_tensor_has_rank_zero);
    RUN_TEST(zeros_tensor_holds_zeros);
    RUN_TEST(matmul_multiplies_row_major_matrices);
    RUN_TEST(matmul_multiplies_each_leading_batch);
    RUN_TEST(matmul_rejects_mismatched_inner_dimensions);
    RUN_TEST(tensor_creation_rejects_a_zero_dimension);
    RUN_TEST(tensor_creation_rejects_a_count_other_than_the_shape_product);
    RUN_TEST(tensor_creation_rejects_null_inputs_with_nonzero_counts);
    RUN_TEST(tensor_creation_rejects_a_shape_whose_element_count_overflows);
    RUN_TEST(tensor_creation_rejects_a_value_count_whose_byte_size_overflows);
    RUN_TEST(tensor_outlives_its_context);
    RUN_TEST(tensor_queries_reject_null_handles_and_outputs);

    RUN_TEST(backend_name_follows_the_size_query_protocol);
    RUN_TEST(unavailability_reason_follows_the_size_query_protocol);
    RUN_TEST(tokenizer_vocabulary_follows_the_size_query_protocol);
    RUN_TEST(token_bytes_follows_the_size_query_protocol);
    RUN_TEST(encode_follows_the_size_query_protocol);
    RUN_TEST(decode_follows_the_size_query_protocol);
    RUN_TEST(tensor_shape_and_values_follow_the_size_query_protocol);
    RUN_TEST(parameter_list_outputs_follow_the_size_query_protocol);
    RUN_TEST(variable_outputs_follow_the_size_query_protocol);

    RUN_TEST(transformer_config_init_sets_the_defaults);
    RUN_TEST(transformer_config_init_rejects_a_struct_size_below_the_minimum);
    RUN_TEST(model_creation_takes_the_gpt2_variant_fields);
    RUN_TEST(model_creation_of_an_older_client_ignores_the_bytes_past_its_struct);
    RUN_TEST(model_creation_rejects_unknown_gpt2_variant_values);
    RUN_TEST(transformer_config_in_a_larger_struct_keeps_its_tail);
    RUN_TEST(model_creation_rejects_a_zero_dimension);
    RUN_TEST(model_creation_rejects_a_width_not_divisible_by_the_heads);
    RUN_TEST(model_creation_rejects_a_block_count_whose_parameters_do_not_fit);
    RUN_TEST(model_creation_rejects_bad_config_pointers_and_sizes);
    RUN_TEST(model_config_returns_the_creation_config);
    RUN_TEST(model_config_rejects_a_small_output_struct);
    RUN_TEST(model_config_writes_only_the_known_prefix_of_a_larger_struct);
    RUN_TEST(new_model_is_on_cpu_with_materialized_attention_and_no_checkpointing);
    RUN_TEST(attention_policy_is_set_and_unknown_values_are_rejected);
    RUN_TEST(checkpointing_policy_is_set_and_unknown_values_are_rejected);
    RUN_TEST(forward_gives_batch_by_time_by_vocabulary_logits);
    RUN_TEST(models_with_the_same_seed_compute_the_same_logits);
    RUN_TEST(attention_and_checkpointing_policies_do_not_change_the_logits);
    RUN_TEST(forward_rejects_a_count_other_than_batch_times_time);
    RUN_TEST(forward_rejects_a_zero_batch_or_time);
    RUN_TEST(forward_rejects_an_id_outside_the_vocabulary);
    RUN_TEST(forward_rejects_time_beyond_the_maximum_context);
    RUN_TEST(forward_rejects_null_handles_and_pointers);
    RUN_TEST(model_to_cpu_keeps_the_model_on_cpu);
    RUN_TEST(model_to_an_unavailable_backend_fails_naming_it_and_changes_nothing);
    RUN_TEST(model_to_rejects_an_unknown_backend);
    RUN_TEST(model_to_is_rejected_while_a_variable_lives);
    RUN_TEST(model_to_is_rejected_while_an_optimizer_lives_and_changes_nothing);

    RUN_TEST(parameter_list_has_the_canonical_names_and_shapes);
    RUN_TEST(parameter_list_queries_reject_an_index_past_the_end);
    RUN_TEST(parameter_list_queries_reject_null_handles_and_outputs);
    RUN_TEST(parameter_list_reports_the_cpu_backend);
    RUN_TEST(parameter_values_round_trip_through_copy_and_load);
    RUN_TEST(loaded_parameters_are_what_forward_uses);
    RUN_TEST(parameter_load_rejects_a_wrong_count_without_changing_values);
    RUN_TEST(parameter_load_rejects_nan_without_changing_values);
    RUN_TEST(parameter_load_rejects_infinity_without_changing_values);
    RUN_TEST(parameter_load_clears_pending_gradients);
    RUN_TEST(parameter_load_is_rejected_while_a_variable_lives);
    RUN_TEST(parameter_load_is_rejected_while_an_optimizer_lives);

    RUN_TEST(cross_entropy_of_uniform_logits_is_the_log_of_the_vocabulary);
    RUN_TEST(cross_entropy_rejects_a_target_count_other_than_the_positions);
    RUN_TEST(cross_entropy_rejects_a_target_outside_the_vocabulary);
    RUN_TEST(cross_entropy_rejects_null_handles_and_pointers);
    RUN_TEST(backward_needs_a_scalar);
    RUN_TEST(backward_replaces_the_gradients_instead_of_adding_to_them);
    RUN_TEST(a_second_backward_is_a_runtime_error);
    RUN_TEST(backward_of_a_graph_built_before_an_adam_step_is_a_runtime_error);
    RUN_TEST(a_loss_over_logits_from_before_an_adam_step_is_stale_too);
    RUN_TEST(variable_values_stay_readable_after_backward_and_a_step);
    RUN_TEST(variable_queries_reject_null_handles_and_outputs);
    RUN_TEST(model_derived_handles_outlive_the_model);

    RUN_TEST(adam_options_init_sets_the_defaults);
    RUN_TEST(adam_options_init_rejects_a_struct_size_below_the_2_3_prefix);
    RUN_TEST(adam_options_in_a_larger_struct_keep_their_tail);
    RUN_TEST(adam_creation_rejects_invalid_options);
    RUN_TEST(infinite_maximum_gradient_norm_disables_clipping);
    RUN_TEST(adam_with_null_options_uses_the_defaults);
    RUN_TEST(paged_adam_reports_its_page_layout);
    RUN_TEST(paged_and_contiguous_state_train_identically);
    RUN_TEST(adam_step_updates_the_parameters_and_fills_the_stats);
    RUN_TEST(adam_step_with_a_small_stats_struct_fails_without_stepping);
    RUN_TEST(adam_step_writes_only_the_known_prefix_of_a_larger_stats_struct);
    RUN_TEST(adam_queries_reject_null_handles_and_outputs);
    RUN_TEST(adam_state_needs_a_clean_step_boundary);
    RUN_TEST(adam_state_get_rejects_a_small_struct);
    RUN_TEST(adam_state_get_writes_only_the_known_prefix_of_a_larger_struct);
    RUN_TEST(adam_state_reports_the_step_and_beta_powers);
    RUN_TEST(adam_state_round_trip_restores_bit_identical_parameters_and_step_count);
    RUN_TEST(adam_state_load_rejects_a_wrong_count_without_changing_anything);
    RUN_TEST(adam_state_load_rejects_a_negative_second_moment);
    RUN_TEST(adam_state_load_is_rejected_while_a_variable_lives);
    RUN_TEST(adam_state_copy_rejects_a_capacity_below_the_value_count);

    RUN_TEST(training_drives_the_loss_down_on_a_repeating_pattern);

    RUN_TEST(last_error_is_per_thread);
    return finish_tests();
}
