/*
 * RT_BACKEND_CUDA as a pure C11 client sees it without a device: availability 0, the reason
 * "no CUDA device visible" in a build with the CUDA adapter (RIFTCO_TRANSFORMER_TEST_HAVE_CUDA=1,
 * compiled in from the build's options, so the binary expects what its build did however it is
 * run) or the "not compiled" reason otherwise, and every request refused with
 * RT_STATUS_BACKEND_UNAVAILABLE naming the backend and the reason, leaving what exists usable.
 * With a device visible it reports itself skipped (the C++ suites hold the device parity)
 * unless the build's RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON asks for the device, where it checks
 * that the backend is available with an empty reason.
 */
#include <string.h>

#include "c_test_fixtures.h"

#ifndef RIFTCO_TRANSFORMER_TEST_HAVE_CUDA
#error "tests/CMakeLists.txt defines RIFTCO_TRANSFORMER_TEST_HAVE_CUDA from the build's options"
#endif
#ifndef RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA
#error "tests/CMakeLists.txt defines RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA from the build's options"
#endif

static int cuda_available(void) {
    int32_t available = -1;
    EXPECT_OK(rt_backend_is_available(RT_BACKEND_CUDA, &available));
    EXPECT(available == 0 || available == 1);
    return available == 1;
}

static void without_a_device_cuda_is_unavailable_with_its_reason(void) {
    if (cuda_available()) {
        char reason[64];
        uint64_t required = 0;
        EXPECT_OK(
            rt_backend_unavailability_reason(RT_BACKEND_CUDA, reason, sizeof reason, &required));
        EXPECT_STREQ(reason, "");
        printf("skipped: a CUDA device is visible here\n");
        return;
    }
    EXPECT(!RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA);
    char reason[512];
    uint64_t required = 0;
    EXPECT_OK(rt_backend_unavailability_reason(RT_BACKEND_CUDA, reason, sizeof reason, &required));
    EXPECT_EQ_U64(required, strlen(reason) + 1);
    if (RIFTCO_TRANSFORMER_TEST_HAVE_CUDA) {
        EXPECT_STREQ(reason, "no CUDA device visible");
    } else {
        EXPECT(strstr(reason, "RIFTCO_TRANSFORMER_ENABLE_CUDA=OFF") != NULL);
    }
}

static void without_a_device_requests_for_cuda_are_refused_naming_it(void) {
    if (cuda_available()) {
        printf("skipped: a CUDA device is visible here\n");
        return;
    }
    char reason[512];
    uint64_t required = 0;
    EXPECT_OK(rt_backend_unavailability_reason(RT_BACKEND_CUDA, reason, sizeof reason, &required));
    rt_context* context = NULL;
    EXPECT_STATUS(rt_context_create(RT_BACKEND_CUDA, &context), RT_STATUS_BACKEND_UNAVAILABLE);
    EXPECT(context == NULL);
    EXPECT_LAST_ERROR_MENTIONS("cuda");
    EXPECT(strstr(rt_last_error(), reason) != NULL);
    rt_model* model = create_tiny_model();
    EXPECT_STATUS(rt_model_to(model, RT_BACKEND_CUDA), RT_STATUS_BACKEND_UNAVAILABLE);
    EXPECT(strstr(rt_last_error(), reason) != NULL);
    int32_t backend = -1;
    EXPECT_OK(rt_model_backend(model, &backend));
    EXPECT(backend == RT_BACKEND_CPU);
    rt_model_release(model);
}

int main(void) {
    RUN_TEST(without_a_device_cuda_is_unavailable_with_its_reason);
    RUN_TEST(without_a_device_requests_for_cuda_are_refused_naming_it);
    return finish_tests();
}
