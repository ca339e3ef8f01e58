/* Multiplies [[1,2,3],[4,5,6]] by [[7,8],[9,10],[11,12]] through the installed C ABI. */
#include <stdio.h>

#include "riftco_transformer/c_api.h"

int main(void) {
    if (rt_abi_version() >> 16 != RT_ABI_VERSION_MAJOR ||
        (rt_abi_version() & 0xFFFFu) < RT_ABI_VERSION_MINOR) {
        fprintf(stderr, "incompatible library ABI 0x%08x\n", (unsigned)rt_abi_version());
        return 1;
    }
    const uint64_t left_shape[2] = {2, 3};
    const uint64_t right_shape[2] = {3, 2};
    const float left_values[6] = {1, 2, 3, 4, 5, 6};
    const float right_values[6] = {7, 8, 9, 10, 11, 12};
    rt_context* context = NULL;
    rt_tensor* left = NULL;
    rt_tensor* right = NULL;
    rt_tensor* product = NULL;
    float values[4] = {0};
    uint64_t required = 0;
    int ok =
        rt_context_create(RT_BACKEND_CPU, &context) == RT_STATUS_OK &&
        rt_tensor_create_f32(context, left_shape, 2, left_values, 6, &left) == RT_STATUS_OK &&
        rt_tensor_create_f32(context, right_shape, 2, right_values, 6, &right) == RT_STATUS_OK &&
        rt_tensor_matmul(left, right, &product) == RT_STATUS_OK &&
        rt_tensor_copy_to_host_f32(product, values, 4, &required) == RT_STATUS_OK;
    if (!ok) {
        fprintf(stderr, "C ABI call failed: %s\n", rt_last_error());
    } else {
        printf("%g %g %g %g\n", values[0], values[1], values[2], values[3]);
    }
    rt_tensor_release(product);
    rt_tensor_release(right);
    rt_tensor_release(left);
    rt_context_release(context);
    return ok ? 0 : 1;
}
