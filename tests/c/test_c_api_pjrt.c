/*
 * RT_BACKEND_PJRT as a pure C11 client uses it: a model moved to the PJRT backend computes the
 * CPU's logits and trains with Adam there, following the CPU's losses step by step. Runs where
 * the library has the PJRT adapter and RIFTCO_TRANSFORMER_PJRT_PLUGIN names a plugin (ctest
 * sets it for the tpu-release workflow: XLA's CPU plugin); elsewhere it checks that the backend
 * reports itself unavailable with a reason and refuses the move, leaving the model on the CPU.
 * Tolerance: 1e-4 relative on losses after several steps (float32 on both sides, different
 * reduction order), 1e-5 on logits.
 */
#include "c_test_fixtures.h"

static const uint32_t tokens[8] = {1, 5, 2, 9, 3, 7, 4, 0};
static const uint32_t targets[8] = {5, 2, 9, 3, 7, 4, 0, 1};

static int pjrt_available(void) {
    int32_t available = 0;
    EXPECT_OK(rt_backend_is_available(RT_BACKEND_PJRT, &available));
    return available;
}

static float* logits_of(rt_model* model) {
    return tiny_logits(model, tokens);
}

/* `steps` Adam steps on the fixed batch; the loss of each step goes to `losses`. */
static void train(rt_model* model, int steps, float* losses) {
    rt_parameter_list* parameters = parameters_of(model);
    rt_adam_options options;
    EXPECT_OK(rt_adam_options_init(&options, sizeof options));
    options.learning_rate = 1e-2f;
    rt_adam* adam = NULL;
    EXPECT_OK(rt_adam_create(parameters, &options, &adam));
    for (int step = 0; step < steps; ++step) {
        rt_variable* logits = NULL;
        EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
        rt_variable* loss = NULL;
        EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
        uint64_t required = 0;
        EXPECT_OK(rt_variable_copy_to_host_f32(loss, &losses[step], 1, &required));
        EXPECT_OK(rt_variable_backward(loss));
        EXPECT_OK(rt_adam_step(adam, NULL));
        rt_variable_release(loss);
        rt_variable_release(logits);
    }
    rt_adam_release(adam);
    rt_parameter_list_release(parameters);
}

static void a_model_on_pjrt_computes_and_trains_like_on_the_cpu(void) {
    if (!pjrt_available()) {
        printf("skipped: the pjrt backend is unavailable here\n");
        return;
    }
    rt_model* on_cpu = create_tiny_model();
    rt_model* on_device = create_tiny_model(); /* same seed: same initial values */
    EXPECT_OK(rt_model_to(on_device, RT_BACKEND_PJRT));
    float* expected = logits_of(on_cpu);
    float* actual = logits_of(on_device);
    for (uint64_t i = 0; i < 8u * TINY_VOCABULARY; ++i) {
        EXPECT(fabsf(actual[i] - expected[i]) <= 1e-5f + 1e-5f * fabsf(expected[i]));
    }
    free(expected);
    free(actual);
    float cpu_losses[6];
    float device_losses[6];
    train(on_cpu, 6, cpu_losses);
    train(on_device, 6, device_losses);
    for (int step = 0; step < 6; ++step) {
        EXPECT(fabsf(device_losses[step] - cpu_losses[step]) <=
               1e-4f + 1e-4f * fabsf(cpu_losses[step]));
    }
    EXPECT(device_losses[5] < device_losses[0]);
    rt_model_release(on_cpu);
    rt_model_release(on_device);
}

static void an_unavailable_pjrt_backend_refuses_the_move_and_says_why(void) {
    if (pjrt_available()) {
        printf("skipped: the pjrt backend is available here\n");
        return;
    }
    char reason[512];
    uint64_t required = 0;
    EXPECT_OK(rt_backend_unavailability_reason(RT_BACKEND_PJRT, reason, sizeof reason, &required));
    EXPECT(strlen(reason) > 0);
    rt_model* model = create_tiny_model();
    EXPECT_STATUS(rt_model_to(model, RT_BACKEND_PJRT), RT_STATUS_BACKEND_UNAVAILABLE);
    EXPECT(strstr(rt_last_error(), reason) != NULL);
    float* logits = logits_of(model); /* still usable on the CPU */
    free(logits);
    rt_model_release(model);
}

int main(void) {
    RUN_TEST(a_model_on_pjrt_computes_and_trains_like_on_the_cpu);
    RUN_TEST(an_unavailable_pjrt_backend_refuses_the_move_and_says_why);
    return finish_tests();
}
