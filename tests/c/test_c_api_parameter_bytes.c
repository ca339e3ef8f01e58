/*
 * rt_parameter_list_load_from_bytes as a pure C11 client sees it: F32, F16 and BF16 bytes
 * become the float32 bit patterns written out by hand below (IEEE 754 binary16/bfloat16 ->
 * binary32, subnormals, signed zeros, infinities and NaN payloads included), only the named
 * parameter changes, and every rejection leaves every parameter as it was.
 */
#include "c_test_fixtures.h"

/* The expected conversions: source bits -> float32 bits, worked out from the formats. */
typedef struct {
    uint32_t source;
    uint32_t expected;
} bit_case;

static const bit_case f32_cases[] = {
    {0x3F800000u, 0x3F800000u}, /* 1 */
    {0x80000000u, 0x80000000u}, /* -0 */
    {0x00000001u, 0x00000001u}, /* the smallest subnormal */
    {0x7F7FFFFFu, 0x7F7FFFFFu}, /* FLT_MAX */
    {0xFF800000u, 0xFF800000u}, /* -inf */
    {0x7FC00001u, 0x7FC00001u}, /* a quiet NaN with a payload */
    {0x7F800001u, 0x7F800001u}, /* a signalling NaN */
    {0xC0490FDBu, 0xC0490FDBu}, /* -pi */
};

static const bit_case f16_cases[] = {
    {0x3C00u, 0x3F800000u}, /* 1 */
    {0xC000u, 0xC0000000u}, /* -2 */
    {0x3555u, 0x3EAAA000u}, /* 0.333251953125: exponent 13 - 15 + 127 = 125, mantissa << 13 */
    {0x0000u, 0x00000000u}, /* +0 */
    {0x8000u, 0x80000000u}, /* -0 */
    {0x0001u, 0x33800000u}, /* 2^-24, the smallest subnormal, is a normal float */
    {0x8001u, 0xB3800000u}, /* -2^-24 */
    {0x03FFu, 0x387FC000u}, /* 1023 * 2^-24, the largest subnormal */
    {0x0200u, 0x38000000u}, /* 2^-15 */
    {0x0400u, 0x38800000u}, /* 2^-14, the smallest normal */
    {0x7BFFu, 0x477FE000u}, /* 65504, the largest finite */
    {0x7C00u, 0x7F800000u}, /* +inf */
    {0xFC00u, 0xFF800000u}, /* -inf */
    {0x7E00u, 0x7FC00000u}, /* the default quiet NaN */
    {0x7C01u, 0x7F802000u}, /* a signalling NaN keeps its payload (mantissa << 13) */
    {0xFE01u, 0xFFC02000u}, /* a negative quiet NaN with a payload */
};

static const bit_case bf16_cases[] = {
    {0x3F80u, 0x3F800000u}, /* 1 */
    {0xC049u, 0xC0490000u}, /* -3.140625 */
    {0x8000u, 0x80000000u}, /* -0 */
    {0x0001u, 0x00010000u}, /* a subnormal stays one */
    {0x7F7Fu, 0x7F7F0000u}, /* the largest finite */
    {0x7F80u, 0x7F800000u}, /* +inf */
    {0xFF80u, 0xFF800000u}, /* -inf */
    {0xFFC1u, 0xFFC10000u}, /* a NaN with a payload */
    {0x7F81u, 0x7F810000u}, /* a signalling NaN */
};

#define CASE_COUNT(cases) (sizeof(cases) / sizeof(cases[0]))

static uint64_t numel_of(const rt_parameter_list* list, uint64_t index) {
    uint64_t numel = 0;
    EXPECT_OK(rt_parameter_list_numel(list, index, &numel));
    return numel;
}

/* numel values cycling through the cases' source bits, as little-endian bytes of
 * `element_bytes` each; the caller frees them. */
static uint8_t* encode_cycle(const bit_case* cases, size_t case_count, uint64_t numel,
                             unsigned element_bytes) {
    uint8_t* bytes = malloc(numel * element_bytes);
    EXPECT(bytes != NULL);
    for (uint64_t i = 0; i < numel; ++i) {
        const uint32_t bits = cases[i % case_count].source;
        for (unsigned b = 0; b < element_bytes; ++b) {
            bytes[i * element_bytes + b] = (uint8_t)(bits >> (8u * b));
        }
    }
    return bytes;
}

static uint32_t bits_of(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* Loads parameter 0 from the cycled cases and checks every value's float32 bits. */
static void check_conversion(int32_t dtype, const bit_case* cases, size_t case_count,
                             unsigned element_bytes) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    const uint64_t numel = numel_of(list, 0);
    EXPECT(numel > case_count);
    uint8_t* bytes = encode_cycle(cases, case_count, numel, element_bytes);
    EXPECT_OK(rt_parameter_list_load_from_bytes(list, 0, dtype, bytes, numel * element_bytes));
    float* values = copy_parameter_values(list);
    for (uint64_t i = 0; i < numel; ++i) {
        const uint32_t expected = cases[i % case_count].expected;
        if (bits_of(values[i]) != expected) {
            test_fail(__FILE__, __LINE__, "value %llu: bits 0x%08lX, expected 0x%08lX",
                      (unsigned long long)i, (unsigned long)bits_of(values[i]),
                      (unsigned long)expected);
        }
    }
    free(values);
    free(bytes);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

static void f32_bytes_load_bit_for_bit(void) {
    check_conversion(RT_DTYPE_F32, f32_cases, CASE_COUNT(f32_cases), 4);
}

static void f16_bytes_convert_exactly_with_subnormals_infinities_and_nan_payloads(void) {
    check_conversion(RT_DTYPE_F16, f16_cases, CASE_COUNT(f16_cases), 2);
}

static void bf16_bytes_convert_to_their_bits_shifted_left_by_16(void) {
    check_conversion(RT_DTYPE_BF16, bf16_cases, CASE_COUNT(bf16_cases), 2);
}

static void dtype_values_are_the_published_ones(void) {
    EXPECT_EQ_U64(RT_DTYPE_F32, 0);
    EXPECT_EQ_U64(RT_DTYPE_F16, 1);
    EXPECT_EQ_U64(RT_DTYPE_BF16, 2);
}

static void only_the_named_parameter_changes(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(list, &count));
    EXPECT(count >= 3);
    const uint64_t total = total_numel(list);
    float* before = copy_parameter_values(list);
    const uint64_t offset = numel_of(list, 0);
    const uint64_t numel = numel_of(list, 1);
    uint8_t* bytes = encode_cycle(bf16_cases, CASE_COUNT(bf16_cases), numel, 2);
    EXPECT_OK(rt_parameter_list_load_from_bytes(list, 1, RT_DTYPE_BF16, bytes, numel * 2));
    float* after = copy_parameter_values(list);
    EXPECT(memcmp(after, before, offset * sizeof(float)) == 0);
    EXPECT(memcmp(after + offset + numel, before + offset + numel,
                  (total - offset - numel) * sizeof(float)) == 0);
    for (uint64_t i = 0; i < numel; ++i) {
        EXPECT_EQ_U64(bits_of(after[offset + i]), bf16_cases[i % CASE_COUNT(bf16_cases)].expected);
    }
    free(after);
    free(before);
    free(bytes);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* The rejection rules, each checked to leave every parameter as it was. */
typedef struct {
    rt_model* model;
    rt_parameter_list* list;
    float* before;
    uint64_t total;
    uint64_t numel; /* of parameter 0 */
    uint8_t* bytes; /* numel F32 values of 0.5 */
} rejection_fixture;

static rejection_fixture rejection_setup(void) {
    rejection_fixture fixture;
    fixture.model = create_tiny_model();
    fixture.list = parameters_of(fixture.model);
    fixture.before = copy_parameter_values(fixture.list);
    fixture.total = total_numel(fixture.list);
    fixture.numel = numel_of(fixture.list, 0);
    static const bit_case half = {0x3F000000u, 0x3F000000u};
    fixture.bytes = encode_cycle(&half, 1, fixture.numel, 4);
    return fixture;
}

static void expect_unchanged_and_release(rejection_fixture* fixture) {
    float* now = copy_parameter_values(fixture->list);
    EXPECT(memcmp(now, fixture->before, fixture->total * sizeof(float)) == 0);
    free(now);
    free(fixture->bytes);
    free(fixture->before);
    rt_parameter_list_release(fixture->list);
    rt_model_release(fixture->model);
}

static void a_null_list_is_an_invalid_argument(void) {
    uint8_t bytes[4] = {0};
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(NULL, 0, RT_DTYPE_F32, bytes, 4),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("list is NULL");
}

static void an_index_past_the_list_is_out_of_range(void) {
    rejection_fixture fixture = rejection_setup();
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(fixture.list, &count));
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(fixture.list, count, RT_DTYPE_F32,
                                                    fixture.bytes, fixture.numel * 4),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_LAST_ERROR_MENTIONS("rt_parameter_list_load_from_bytes: index");
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(fixture.list, UINT64_MAX, RT_DTYPE_F32,
                                                    fixture.bytes, fixture.numel * 4),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_LAST_ERROR_MENTIONS("18446744073709551615");
    expect_unchanged_and_release(&fixture);
}

static void an_unknown_dtype_is_an_invalid_argument(void) {
    rejection_fixture fixture = rejection_setup();
    EXPECT_STATUS(
        rt_parameter_list_load_from_bytes(fixture.list, 0, 3, fixture.bytes, fixture.numel * 4),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("dtype: unknown value 3");
    EXPECT_STATUS(
        rt_parameter_list_load_from_bytes(fixture.list, 0, -1, fixture.bytes, fixture.numel * 4),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("dtype: unknown value -1");
    expect_unchanged_and_release(&fixture);
}

static void null_bytes_with_a_count_are_an_invalid_argument(void) {
    rejection_fixture fixture = rejection_setup();
    EXPECT_STATUS(
        rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F32, NULL, fixture.numel * 4),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("bytes is NULL");
    /* NULL with a zero count is a well-formed empty input, but no parameter is empty. */
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F32, NULL, 0),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("byte_count 0");
    expect_unchanged_and_release(&fixture);
}

static void a_byte_count_other_than_numel_times_the_element_size_is_an_invalid_argument(void) {
    rejection_fixture fixture = rejection_setup();
    const uint64_t f32_bytes = fixture.numel * 4;
    char expected[160];
    /* One byte short, one byte over, and F32's size offered as F16 or BF16. */
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F32, fixture.bytes,
                                                    f32_bytes - 1),
                  RT_STATUS_INVALID_ARGUMENT);
    snprintf(expected, sizeof expected, "byte_count %llu differs from the %llu bytes of %llu F32",
             (unsigned long long)(f32_bytes - 1), (unsigned long long)f32_bytes,
             (unsigned long long)fixture.numel);
    EXPECT_LAST_ERROR_MENTIONS(expected);
    EXPECT_LAST_ERROR_MENTIONS("parameter 0 (");
    uint8_t* longer = malloc(f32_bytes + 1);
    EXPECT(longer != NULL);
    memcpy(longer, fixture.bytes, f32_bytes);
    longer[f32_bytes] = 0;
    EXPECT_STATUS(
        rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F32, longer, f32_bytes + 1),
        RT_STATUS_INVALID_ARGUMENT);
    free(longer);
    EXPECT_STATUS(
        rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F16, fixture.bytes, f32_bytes),
        RT_STATUS_INVALID_ARGUMENT);
    snprintf(expected, sizeof expected, "differs from the %llu bytes of %llu F16",
             (unsigned long long)(fixture.numel * 2), (unsigned long long)fixture.numel);
    EXPECT_LAST_ERROR_MENTIONS(expected);
    EXPECT_STATUS(
        rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_BF16, fixture.bytes, f32_bytes),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("BF16");
    expect_unchanged_and_release(&fixture);
}

static void a_live_variable_pins_the_parameters(void) {
    rejection_fixture fixture = rejection_setup();
    static const uint32_t tokens[4] = {1, 2, 3, 4};
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(fixture.model, tokens, 4, 1, 4, &logits));
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F32, fixture.bytes,
                                                    fixture.numel * 4),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("live variable");
    rt_variable_release(logits);
    expect_unchanged_and_release(&fixture);
}

static void a_live_adam_optimizer_pins_the_parameters(void) {
    rejection_fixture fixture = rejection_setup();
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(fixture.list, &options, &adam));
    EXPECT_STATUS(rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_BF16, fixture.bytes,
                                                    fixture.numel * 2),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("Adam optimizer");
    rt_adam_release(adam);
    expect_unchanged_and_release(&fixture);
}

static void a_load_after_the_pins_are_released_succeeds(void) {
    rejection_fixture fixture = rejection_setup();
    static const uint32_t tokens[4] = {1, 2, 3, 4};
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(fixture.model, tokens, 4, 1, 4, &logits));
    rt_variable_release(logits);
    EXPECT_OK(rt_parameter_list_load_from_bytes(fixture.list, 0, RT_DTYPE_F32, fixture.bytes,
                                                fixture.numel * 4));
    float* now = copy_parameter_values(fixture.list);
    for (uint64_t i = 0; i < fixture.numel; ++i) {
        EXPECT(now[i] == 0.5f);
    }
    free(now);
    free(fixture.bytes);
    free(fixture.before);
    rt_parameter_list_release(fixture.list);
    rt_model_release(fixture.model);
}

int main(void) {
    RUN_TEST(dtype_values_are_the_published_ones);
    RUN_TEST(f32_bytes_load_bit_for_bit);
    RUN_TEST(f16_bytes_convert_exactly_with_subnormals_infinities_and_nan_payloads);
    RUN_TEST(bf16_bytes_convert_to_their_bits_shifted_left_by_16);
    RUN_TEST(only_the_named_parameter_changes);
    RUN_TEST(a_null_list_is_an_invalid_argument);
    RUN_TEST(an_index_past_the_list_is_out_of_range);
    RUN_TEST(an_unknown_dtype_is_an_invalid_argument);
    RUN_TEST(null_bytes_with_a_count_are_an_invalid_argument);
    RUN_TEST(a_byte_count_other_than_numel_times_the_element_size_is_an_invalid_argument);
    RUN_TEST(a_live_variable_pins_the_parameters);
    RUN_TEST(a_live_adam_optimizer_pins_the_parameters);
    RUN_TEST(a_load_after_the_pins_are_released_succeeds);
    return finish_tests();
}
