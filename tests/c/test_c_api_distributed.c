/*
 * The data-parallel C ABI in one process: what a build says about MPI, the world of one
 * (rt_process_group_create_single), argument rules of every function, and a gradient
 * reduction over a world of one that leaves the gradient exactly as it was. (Several ranks
 * are tested under mpirun by the `mpi` preset.)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_fixtures.h"
#include "c_test_support.h"

static void a_build_says_whether_it_links_mpi(void) {
    int32_t compiled_in = -1;
    EXPECT_OK(rt_distributed_compiled_in(&compiled_in));
    EXPECT(compiled_in == 0 || compiled_in == 1);
    EXPECT_STATUS(rt_distributed_compiled_in(NULL), RT_STATUS_INVALID_ARGUMENT);
    rt_process_group* group = NULL;
    EXPECT_STATUS(rt_process_group_create(0, &group), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("timeout_ms must be in [1, 2^40], got 0");
    EXPECT(group == NULL);
    if (compiled_in == 0) {
        EXPECT_STATUS(rt_process_group_create(1000, &group), RT_STATUS_RUNTIME_ERROR);
        EXPECT_LAST_ERROR_MENTIONS("distributed support is not compiled in");
        EXPECT(group == NULL);
    }
}

static void a_world_of_one(void) {
    rt_process_group* group = NULL;
    EXPECT_OK(rt_process_group_create_single(&group));
    int32_t rank = -1;
    int32_t size = -1;
    EXPECT_OK(rt_process_group_rank(group, &rank));
    EXPECT_OK(rt_process_group_world_size(group, &size));
    EXPECT(rank == 0 && size == 1);
    EXPECT_OK(rt_process_group_barrier(group));
    double values[2] = {1.5, -2.0};
    EXPECT_OK(rt_process_group_allreduce_sum_f64(group, values, 2));
    EXPECT(values[0] == 1.5 && values[1] == -2.0);
    EXPECT_STATUS(rt_process_group_allreduce_sum_f64(group, NULL, 2), RT_STATUS_INVALID_ARGUMENT);
    uint8_t bytes[3] = {1, 2, 3};
    EXPECT_OK(rt_process_group_broadcast_bytes(group, bytes, 3, 0));
    EXPECT_STATUS(rt_process_group_broadcast_bytes(group, bytes, 3, 1), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("root 1 is not a rank of a world of 1");
    uint64_t gathered[2] = {0, 0};
    uint64_t required = 0;
    EXPECT_OK(rt_process_group_allgather_u64(group, 42, NULL, 0, &required));
    EXPECT_EQ_U64(required, 1u);
    EXPECT_OK(rt_process_group_allgather_u64(group, 42, gathered, 2, &required));
    EXPECT_EQ_U64(gathered[0], 42u);
    EXPECT_STATUS(rt_process_group_set_bucket_bytes(group, 3), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("bucket_bytes must be at least 4, got 3");
    EXPECT_OK(rt_process_group_set_bucket_bytes(group, 64));
    EXPECT_STATUS(rt_process_group_rank(NULL, &rank), RT_STATUS_INVALID_ARGUMENT);
    rt_process_group_release(group);
    rt_process_group_release(NULL);
}

static void reducing_over_a_world_of_one_keeps_the_gradient(void) {
    rt_model* model = create_tiny_model();
    rt_parameter_list* list = parameters_of(model);
    static const uint32_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const uint32_t targets[] = {2, 3, 4, 5, 6, 7, 8, 9};
    rt_variable* logits = NULL;
    rt_variable* loss = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
    EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
    EXPECT_OK(rt_variable_backward(loss));
    rt_process_group* group = NULL;
    EXPECT_OK(rt_process_group_create_single(&group));
    EXPECT_OK(rt_process_group_set_bucket_bytes(group, 256)); /* several buckets */
    uint64_t hash = 0;
    uint64_t again = 0;
    EXPECT_OK(rt_data_parallel_parameter_hash(list, &hash));
    EXPECT_OK(rt_data_parallel_synchronize_parameters(group, list));
    EXPECT_OK(rt_data_parallel_parameter_hash(list, &again));
    EXPECT_EQ_U64(hash, again);
    double total = 0.0;
    EXPECT_OK(rt_data_parallel_reduce_gradients(group, list, 8.0, &total));
    EXPECT(total == 8.0);
    EXPECT_STATUS(rt_data_parallel_reduce_gradients(group, list, -1.0, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_data_parallel_reduce_gradients(group, list, NAN, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_data_parallel_reduce_gradients(group, list, 0.0, NULL),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_STATUS(rt_data_parallel_reduce_gradients(group, NULL, 1.0, NULL),
                  RT_STATUS_INVALID_ARGUMENT);
    uint64_t bytes = 0;
    double seconds = -1.0;
    EXPECT_OK(rt_process_group_communication(group, &bytes, &seconds));
    EXPECT(bytes > 0 && seconds >= 0.0);
    rt_process_group_release(group);
    rt_variable_release(loss);
    rt_variable_release(logits);
    rt_parameter_list_release(list);
    rt_model_release(model);
}

/* The overlapped reduction equals backward followed by the blocking one, bit for bit; the
 * graph rules of rt_variable_backward hold (single use, the same model). */
static void the_overlapped_reduction_equals_backward_then_reduce(void) {
    static const uint32_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const uint32_t targets[] = {2, 3, 4, 5, 6, 7, 8, 9};
    rt_process_group* group = NULL;
    EXPECT_OK(rt_process_group_create_single(&group));
    EXPECT_OK(rt_process_group_set_bucket_bytes(group, 256));
    uint64_t hashes[2] = {0, 0};
    for (int overlapped = 0; overlapped < 2; ++overlapped) {
        rt_model* model = create_tiny_model();
        rt_parameter_list* list = parameters_of(model);
        rt_variable* logits = NULL;
        rt_variable* loss = NULL;
        EXPECT_OK(rt_model_forward(model, tokens, 8, 1, 8, &logits));
        EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
        double total = 0.0;
        if (overlapped) {
            EXPECT_STATUS(
                rt_data_parallel_backward_and_reduce(group, list, loss, 8.0, NAN, 0, NULL),
                RT_STATUS_INVALID_ARGUMENT);
            EXPECT_LAST_ERROR_MENTIONS("seed_scale must be finite");
            EXPECT_STATUS(
                rt_data_parallel_backward_and_reduce(group, list, loss, 8.0, 0.5F, 2, NULL),
                RT_STATUS_INVALID_ARGUMENT);
            EXPECT_OK(
                rt_data_parallel_backward_and_reduce(group, list, loss, 8.0, 0.5F, 0, &total));
            EXPECT_STATUS(
                rt_data_parallel_backward_and_reduce(group, list, loss, 8.0, 0.5F, 0, NULL),
                RT_STATUS_RUNTIME_ERROR); /* the graph is single-use */
            EXPECT_LAST_ERROR_MENTIONS("consumed this graph");
        } else {
            EXPECT_OK(rt_variable_backward_scaled(loss, 0.5F, 0));
            EXPECT_OK(rt_data_parallel_reduce_gradients(group, list, 8.0, &total));
        }
        EXPECT(total == 8.0);
        /* The gradients, read through one Adam step with a fixed rate: equal steps, equal
         * values. */
        rt_adam* adam = NULL;
        EXPECT_OK(rt_adam_create(list, NULL, &adam));
        EXPECT_OK(rt_adam_step(adam, NULL));
        EXPECT_OK(rt_data_parallel_parameter_hash(list, &hashes[overlapped]));
        rt_adam_release(adam);
        rt_variable_release(loss);
        rt_variable_release(logits);
        rt_parameter_list_release(list);
        rt_model_release(model);
    }
    EXPECT_EQ_U64(hashes[0], hashes[1]);
    rt_process_group_release(group);
}

/* ZeRO-1 over a world of one steps exactly like rt_adam_create, reports its bytes, and its
 * state loads into an unsharded optimizer. */
static void a_sharded_adam_over_a_world_of_one_is_adam(void) {
    static const uint32_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const uint32_t targets[] = {2, 3, 4, 5, 6, 7, 8, 9};
    rt_process_group* group = NULL;
    EXPECT_OK(rt_process_group_create_single(&group));
    rt_model* models[2] = {create_tiny_model(), create_tiny_model()};
    rt_parameter_list* lists[2] = {parameters_of(models[0]), parameters_of(models[1])};
    rt_adam* sharded = NULL;
    rt_adam* plain = NULL;
    EXPECT_STATUS(rt_adam_create_sharded(NULL, lists[0], NULL, &sharded),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(rt_adam_create_sharded(group, lists[0], NULL, &sharded));
    rt_process_group_release(group); /* the optimizer keeps the group alive */
    EXPECT_OK(rt_adam_create(lists[1], NULL, &plain));
    uint64_t held = 0;
    uint64_t unsharded = 0;
    uint64_t payload = 0;
    EXPECT_OK(rt_adam_sharded_state_bytes(sharded, &held, &unsharded));
    EXPECT_OK(rt_adam_state_payload_bytes(plain, &payload));
    EXPECT_EQ_U64(held, payload);
    EXPECT_EQ_U64(unsharded, payload);
    for (int step = 0; step < 2; ++step) {
        for (int i = 0; i < 2; ++i) {
            rt_variable* logits = NULL;
            rt_variable* loss = NULL;
            EXPECT_OK(rt_model_forward(models[i], tokens, 8, 1, 8, &logits));
            EXPECT_OK(rt_cross_entropy(logits, targets, 8, &loss));
            EXPECT_OK(rt_variable_backward(loss));
            rt_variable_release(loss);
            rt_variable_release(logits);
        }
        EXPECT_OK(rt_adam_step(sharded, NULL));
        EXPECT_OK(rt_adam_step(plain, NULL));
    }
    uint64_t hashes[2] = {0, 0};
    EXPECT_OK(rt_data_parallel_parameter_hash(lists[0], &hashes[0]));
    EXPECT_OK(rt_data_parallel_parameter_hash(lists[1], &hashes[1]));
    EXPECT_EQ_U64(hashes[0], hashes[1]);
    uint64_t count = 0;
    EXPECT_OK(rt_adam_step_count(sharded, &count));
    EXPECT_EQ_U64(count, 2u);
    rt_adam_state state;
    state.struct_size = sizeof state;
    EXPECT_OK(rt_adam_state_get(sharded, &state));
    const size_t n = (size_t)state.value_count;
    float* buffers = (float*)malloc(3 * n * sizeof(float));
    EXPECT_OK(rt_adam_state_copy_to_host_f32(sharded, buffers, buffers + n, buffers + 2 * n, n));
    EXPECT_OK(
        rt_adam_state_load_from_host_f32(plain, &state, buffers, buffers + n, buffers + 2 * n, n));
    EXPECT_OK(rt_adam_state_load_from_host_f32(sharded, &state, buffers, buffers + n,
                                               buffers + 2 * n, n));
    buffers[2 * n] = -1.0F; /* a negative second moment: refused */
    EXPECT_STATUS(
        rt_adam_state_load_from_host_f32(sharded, &state, buffers, buffers + n, buffers + 2 * n, n),
        RT_STATUS_INVALID_ARGUMENT);
    free(buffers);
    rt_adam_release(sharded);
    rt_adam_release(plain);
    for (int i = 0; i < 2; ++i) {
        rt_parameter_list_release(lists[i]);
        rt_model_release(models[i]);
    }
}

int main(void) {
    RUN_TEST(a_build_says_whether_it_links_mpi);
    RUN_TEST(a_world_of_one);
    RUN_TEST(reducing_over_a_world_of_one_keeps_the_gradient);
    RUN_TEST(the_overlapped_reduction_equals_backward_then_reduce);
    RUN_TEST(a_sharded_adam_over_a_world_of_one_is_adam);
    return finish_tests();
}
