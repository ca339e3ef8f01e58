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

int main(void) {
    RUN_TEST(a_build_says_whether_it_links_mpi);
    RUN_TEST(a_world_of_one);
    RUN_TEST(reducing_over_a_world_of_one_keeps_the_gradient);
    return finish_tests();
}
