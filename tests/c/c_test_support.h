/*
 * The little test support the pure C11 clients of the C ABI share. There is no framework:
 * each test is a void function run by RUN_TEST. A failed expectation prints where it failed
 * and why (for a status: the call, both status names and rt_last_error()), then abandons the
 * current test by longjmp back to the runner, so the remaining tests still run. main ends
 * with `return finish_tests();`, which fails the program if any test failed.
 *
 * Expectations must be used on the thread that runs the tests (the runner's jmp_buf is not
 * shared with other threads).
 */
#ifndef RIFTCO_TRANSFORMER_TESTS_C_TEST_SUPPORT_H
#define RIFTCO_TRANSFORMER_TESTS_C_TEST_SUPPORT_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "riftco_transformer/c_api.h"

static jmp_buf test_abandon_point;
static const char* test_current_name = "";
static int test_count = 0;
static int test_failure_count = 0;

static inline void test_fail(const char* file, int line, const char* format, ...) {
    va_list arguments;
    va_start(arguments, format);
    fprintf(stderr, "%s:%d: in %s: ", file, line, test_current_name);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    va_end(arguments);
    longjmp(test_abandon_point, 1);
}

static inline void run_test(const char* name, void (*test)(void)) {
    test_current_name = name;
    ++test_count;
    if (setjmp(test_abandon_point) == 0) {
        test();
    } else {
        ++test_failure_count;
        fprintf(stderr, "FAILED %s\n", name);
    }
}

#define RUN_TEST(test) run_test(#test, test)

static inline int finish_tests(void) {
    printf("%d of %d tests passed\n", test_count - test_failure_count, test_count);
    return test_failure_count == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* A status-returning call must return `expected`, and rt_last_error() must agree with it:
 * "" after success, a non-empty explanation after failure. */
static inline void test_expect_status(rt_status actual, rt_status expected, const char* call,
                                      const char* file, int line) {
    const char* error = rt_last_error(); /* read before anything else can replace it */
    if (actual != expected) {
        test_fail(file, line, "%s\n  returned %s (%d), expected %s (%d); rt_last_error(): \"%s\"",
                  call, rt_status_string(actual), (int)actual, rt_status_string(expected),
                  (int)expected, error);
    }
    if (actual == RT_STATUS_OK && error[0] != '\0') {
        test_fail(file, line, "%s\n  returned ok but rt_last_error() is \"%s\"", call, error);
    }
    if (actual != RT_STATUS_OK && error[0] == '\0') {
        test_fail(file, line, "%s\n  returned %s with an empty rt_last_error()", call,
                  rt_status_string(actual));
    }
}

#define EXPECT_STATUS(call, expected) \
    test_expect_status((call), (expected), #call, __FILE__, __LINE__)
#define EXPECT_OK(call) EXPECT_STATUS(call, RT_STATUS_OK)

static inline void test_expect(int holds, const char* condition, const char* file, int line) {
    if (!holds) {
        test_fail(file, line, "expected %s", condition);
    }
}

#define EXPECT(condition) test_expect((condition) ? 1 : 0, #condition, __FILE__, __LINE__)

static inline void test_expect_eq_u64(uint64_t actual, uint64_t expected, const char* actual_text,
                                      const char* expected_text, const char* file, int line) {
    if (actual != expected) {
        test_fail(file, line, "expected %s == %s\n  got %llu, expected %llu", actual_text,
                  expected_text, (unsigned long long)actual, (unsigned long long)expected);
    }
}

#define EXPECT_EQ_U64(actual, expected) \
    test_expect_eq_u64((actual), (expected), #actual, #expected, __FILE__, __LINE__)

static inline void test_expect_streq(const char* actual, const char* expected,
                                     const char* actual_text, const char* file, int line) {
    if (strcmp(actual, expected) != 0) {
        test_fail(file, line, "expected %s to be \"%s\"\n  got \"%s\"", actual_text, expected,
                  actual);
    }
}

#define EXPECT_STREQ(actual, expected) \
    test_expect_streq((actual), (expected), #actual, __FILE__, __LINE__)

static inline void test_expect_near(double actual, double expected, double tolerance,
                                    const char* actual_text, const char* file, int line) {
    if (!(fabs(actual - expected) <= tolerance)) {
        test_fail(file, line, "expected %s to be %.9g (within %.3g)\n  got %.9g", actual_text,
                  expected, tolerance, actual);
    }
}

#define EXPECT_NEAR(actual, expected, tolerance) \
    test_expect_near((actual), (expected), (tolerance), #actual, __FILE__, __LINE__)

/* The current rt_last_error() contains `fragment` (e.g. the name of a rejected backend). */
static inline void test_expect_last_error_mentions(const char* fragment, const char* file,
                                                   int line) {
    const char* error = rt_last_error();
    if (strstr(error, fragment) == NULL) {
        test_fail(file, line, "expected rt_last_error() to mention \"%s\"\n  got \"%s\"", fragment,
                  error);
    }
}

#define EXPECT_LAST_ERROR_MENTIONS(fragment) \
    test_expect_last_error_mentions((fragment), __FILE__, __LINE__)

/* Every one of `size` bytes at `bytes` equals `value`: how tests see that a call left a
 * buffer (filled with a sentinel beforehand) untouched. */
static inline int all_bytes_are(const void* bytes, size_t size, unsigned char value) {
    const unsigned char* byte = (const unsigned char*)bytes;
    for (size_t index = 0; index < size; ++index) {
        if (byte[index] != value) {
            return 0;
        }
    }
    return 1;
}

#endif /* RIFTCO_TRANSFORMER_TESTS_C_TEST_SUPPORT_H */
