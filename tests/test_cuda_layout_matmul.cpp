// CUDA layout, reduction and matmul capabilities against the CPU reference: data movement
// (permute, broadcast_to, concatenation, slices) bit-exact; sums (sum_to_shape, sum, mean)
// within form B of docs/ARCHITECTURE.md, 'Numeric parity' (3e-4; both sides accumulate in double,
// so they agree far closer); cuBLAS matmul at every transpose combination, batch 1 and 3, within
// form A 3e-4/3e-4, and its VJP products through autograd's raw ops. They skip without a device
// (fail under RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON).

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "riftco_transformer/core/tensor_ops/reduction.hpp"
#include "support/cuda_support.hpp"

namespace riftco_transformer {
namespace {

using test::matches_product;
using test::matches_reference;
using test::uniform_values;

constexpr ExecutionBackend cuda = ExecutionBackend::Cuda;
constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr double nn_tolerance = 3e-4;      // form B of docs/ARCHITECTURE.md, 'Numeric parity'
constexpr double matmul_tolerance = 3e-4;  // form A, CUDA (docs/ARCHITECTURE.md, 'Numeric parity')

class CudaLayoutMatmul : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_CUDA_DEVICE(); }

    // The same values on both backends.
    static std::pair<Tensor, Tensor> pair_of(const Shape& shape, unsigned seed) {
        std::size_t count = 1;
        for (const std::size_t extent : shape) {
            count *= extent;
        }
        const std::vector<float> values = uniform_values(count, -2.0F, 2.0F, seed);
        return {Tensor(shape, values, cpu), Tensor(shape, values, cuda)};
    }
};

::testing::AssertionResult bit_identical(const Tensor& device, const Tensor& reference) {
    if (device.shape() != reference.shape()) {
        return ::testing::AssertionFailure() << "shapes differ";
    }
    const std::vector<float> d = device.to_host();
    const std::vector<float> r = reference.to_host();
    if (std::memcmp(d.data(), r.data(), d.size() * sizeof(float)) != 0) {
        return ::testing::AssertionFailure() << "values differ";
    }
    return ::testing::AssertionSuccess();
}

TEST_F(CudaLayoutMatmul, PermuteAndTransposeMoveDataExactly) {
    const auto [x_cpu, x] = pair_of({3, 4, 5, 6}, 1);
    const std::vector<std::vector<std::size_t>> orders = {
        {0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 0, 3, 2}, {2, 3, 0, 1}};
    for (const std::vector<std::size_t>& axes : orders) {
        EXPECT_TRUE(bit_identical(tensor_ops::permute(x, axes), tensor_ops::permute(x_cpu, axes)));
    }
    const auto [m_cpu, m] = pair_of({37, 129}, 2);
    EXPECT_TRUE(bit_identical(tensor_ops::transpose_2d(m), tensor_ops::transpose_2d(m_cpu)));
}

TEST_F(CudaLayoutMatmul, BroadcastAndItsAdjointMatchTheReference) {
    const std::vector<std::pair<Shape, Shape>> cases = {{{5}, {4, 3, 5}},
                                                        {{3, 1}, {2, 3, 7}},
                                                        {{1, 1}, {6, 4}},
                                                        {{}, {3, 2}},
                                                        {{4, 1, 6}, {4, 5, 6}}};
    unsigned seed = 10;
    for (const auto& [small, large] : cases) {
        const auto [s_cpu, s] = pair_of(small, seed++);
        EXPECT_TRUE(bit_identical(tensor_ops::broadcast_to(s, large),
                                  tensor_ops::broadcast_to(s_cpu, large)));
        const auto [l_cpu, l] = pair_of(large, seed++);
        const Tensor reduced = tensor_ops::sum_to_shape(l, small);
        EXPECT_EQ(reduced.shape(), small);
        EXPECT_TRUE(matches_reference(
            reduced.to_host(), tensor_ops::sum_to_shape(l_cpu, small).to_host(), nn_tolerance));
    }
}

TEST_F(CudaLayoutMatmul, ConcatenationAndSlicesMoveDataExactly) {
    const auto [a_cpu, a] = pair_of({2, 3, 4}, 20);
    const auto [b_cpu, b] = pair_of({2, 3, 1}, 21);
    const auto [c_cpu, c] = pair_of({2, 3, 7}, 22);
    const std::vector<Tensor> device = {a, b, c};
    const std::vector<Tensor> host = {a_cpu, b_cpu, c_cpu};
    EXPECT_TRUE(bit_identical(tensor_ops::concatenate_last_axis(device),
                              tensor_ops::concatenate_last_axis(host)));
    const auto [x_cpu, x] = pair_of({4, 9, 5}, 23);
    for (std::size_t axis = 0; axis < 3; ++axis) {
        const std::size_t start = 1;
        const std::size_t length = x.shape()[axis] - 2;
        const Tensor window = tensor_ops::slice(x, axis, start, length);
        EXPECT_TRUE(bit_identical(window, tensor_ops::slice(x_cpu, axis, start, length)));
        EXPECT_TRUE(bit_identical(
            tensor_ops::slice_backward(window, axis, start, x.shape()[axis]),
            tensor_ops::slice_backward(window.to(cpu), axis, start, x.shape()[axis])));
    }
}

TEST_F(CudaLayoutMatmul, SumsAndMeansMatchTheReference) {
    const auto [x_cpu, x] = pair_of({7, 300, 11}, 30);
    EXPECT_TRUE(matches_reference(tensor_ops::sum(x).to_host(), tensor_ops::sum(x_cpu).to_host(),
                                  nn_tolerance));
    EXPECT_TRUE(matches_reference(tensor_ops::mean(x).to_host(), tensor_ops::mean(x_cpu).to_host(),
                                  nn_tolerance));
    for (std::size_t axis = 0; axis < 3; ++axis) {
        SCOPED_TRACE(axis);
        EXPECT_TRUE(matches_reference(tensor_ops::sum(x, axis).to_host(),
                                      tensor_ops::sum(x_cpu, axis).to_host(), nn_tolerance));
        EXPECT_TRUE(matches_reference(tensor_ops::mean(x, axis, true).to_host(),
                                      tensor_ops::mean(x_cpu, axis, true).to_host(), nn_tolerance));
    }
    // A long sum over several partial blocks.
    const auto [long_cpu, long_device] = pair_of({1000003}, 31);
    EXPECT_TRUE(matches_reference(tensor_ops::sum(long_device).to_host(),
                                  tensor_ops::sum(long_cpu).to_host(), nn_tolerance));
}

TEST_F(CudaLayoutMatmul, MatmulMatchesTheReferenceAtEveryTransposeAndBatch) {
    for (const std::size_t batch : {std::size_t{1}, std::size_t{3}}) {
        for (const bool transpose_left : {false, true}) {
            for (const bool transpose_right : {false, true}) {
                SCOPED_TRACE(::testing::Message()
                             << "batch " << batch << ", transpose_left " << transpose_left
                             << ", transpose_right " << transpose_right);
                const std::size_t m = 33;
                const std::size_t n = 65;
                const std::size_t k = 129;
                const Shape left_shape = transpose_left ? Shape{batch, k, m} : Shape{batch, m, k};
                const Shape right_shape = transpose_right ? Shape{batch, n, k} : Shape{batch, k, n};
                const auto [l_cpu, l] = pair_of(left_shape, 40);
                const auto [r_cpu, r] = pair_of(right_shape, 41);
                const Tensor product = tensor_ops::matmul(l, r, transpose_left, transpose_right);
                EXPECT_EQ(product.backend(), cuda);
                EXPECT_EQ(product.shape(), (Shape{batch, m, n}));
                EXPECT_TRUE(matches_product(
                    product.to_host(),
                    tensor_ops::matmul(l_cpu, r_cpu, transpose_left, transpose_right).to_host(),
                    matmul_tolerance, matmul_tolerance));
            }
        }
    }
}

TEST_F(CudaLayoutMatmul, MatmulOfSmallHandComputedProductIsExact) {
    const Tensor left({2, 3}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F}, cuda);
    const Tensor right({3, 2}, {7.0F, 8.0F, 9.0F, 10.0F, 11.0F, 12.0F}, cuda);
    EXPECT_EQ(tensor_ops::matmul(left, right).to_host(),
              (std::vector<float>{58.0F, 64.0F, 139.0F, 154.0F}));
    // Staging a CPU product through the device returns on the CPU.
    const Tensor left_cpu = left.to(cpu);
    const Tensor right_cpu = right.to(cpu);
    const Tensor staged = tensor_ops::matmul(left_cpu, right_cpu, cuda);
    EXPECT_EQ(staged.backend(), cpu);
    EXPECT_EQ(staged.to_host(), (std::vector<float>{58.0F, 64.0F, 139.0F, 154.0F}));
}

}  // namespace
}  // namespace riftco_transformer
