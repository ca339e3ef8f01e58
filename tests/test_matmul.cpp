// Batched matrix multiplication (docs/ARCHITECTURE.md, 'Tensor operations'): shape rules, plain /
// transposed / batched products against a double-precision triple-loop oracle written here, awkward
// and large sizes, and the private GEMM seam (the BLAS path and the portable blocked fallback).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/cpu/gemm.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using tensor_ops::matmul;

Tensor tensor_of(const Shape& shape, const std::vector<float>& values) {
    return Tensor(shape, std::span<const float>(values));
}

// C[b] = op(A[b]) · op(B[b]) in double, where A[b] is stored [M,K] (or [K,M] when
// transpose_a) and B[b] is stored [K,N] (or [N,K] when transpose_b).
std::vector<double> matmul_oracle(const std::vector<float>& a, const std::vector<float>& b,
                                  std::size_t batch, std::size_t m, std::size_t k, std::size_t n,
                                  bool transpose_a, bool transpose_b) {
    std::vector<double> c(batch * m * n, 0.0);
    for (std::size_t index = 0; index < batch; ++index) {
        const float* a_matrix = a.data() + index * m * k;
        const float* b_matrix = b.data() + index * k * n;
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                double total = 0.0;
                for (std::size_t p = 0; p < k; ++p) {
                    const double a_ip = transpose_a ? a_matrix[p * m + i] : a_matrix[i * k + p];
                    const double b_pj = transpose_b ? b_matrix[j * k + p] : b_matrix[p * n + j];
                    total += a_ip * b_pj;
                }
                c[(index * m + i) * n + j] = total;
            }
        }
    }
    return c;
}

// The stored shape of an operand: batch dims then [rows, columns] (swapped when transposed).
Shape operand_shape(const Shape& batch_dims, std::size_t rows, std::size_t columns,
                    bool transposed) {
    Shape shape = batch_dims;
    shape.push_back(transposed ? columns : rows);
    shape.push_back(transposed ? rows : columns);
    return shape;
}

std::size_t product_of(const Shape& dims) {
    std::size_t total = 1;
    for (const std::size_t d : dims)
        total *= d;
    return total;
}

// Checks matmul(left, right, transpose_a, transpose_b) against the oracle for op(A)[.., M, K]
// and op(B)[.., K, N] with random entries in [-1, 1).
::testing::AssertionResult product_matches_oracle(const Shape& batch_dims, std::size_t m,
                                                  std::size_t k, std::size_t n, bool transpose_a,
                                                  bool transpose_b, double tolerance = 1e-5,
                                                  std::uint32_t seed = 31U) {
    const std::size_t batch = product_of(batch_dims);
    const std::vector<float> a = testing::pseudo_random(batch * m * k, -1.0F, 1.0F, seed);
    const std::vector<float> b = testing::pseudo_random(batch * k * n, -1.0F, 1.0F, seed + 1);
    const Tensor left = tensor_of(operand_shape(batch_dims, m, k, transpose_a), a);
    const Tensor right = tensor_of(operand_shape(batch_dims, k, n, transpose_b), b);
    const Tensor product = transpose_a || transpose_b
                               ? matmul(left, right, transpose_a, transpose_b)
                               : matmul(left, right);
    Shape expected_shape = batch_dims;
    expected_shape.push_back(m);
    expected_shape.push_back(n);
    if (product.shape() != expected_shape) {
        return ::testing::AssertionFailure() << "shape " << shape_to_string(product.shape())
                                             << " != expected " << shape_to_string(expected_shape);
    }
    return testing::all_close(product,
                              matmul_oracle(a, b, batch, m, k, n, transpose_a, transpose_b),
                              tolerance, tolerance);
}

std::string thrown_invalid_argument_message(const Tensor& left, const Tensor& right) {
    try {
        static_cast<void>(matmul(left, right));
    } catch (const std::invalid_argument& error) {
        return error.what();
    }
    return "<no invalid_argument thrown>";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Values

TEST(Matmul, TwoByThreeTimesThreeByTwoMatchesHandValues) {
    // [[1,2,3],[4,5,6]]·[[7,8],[9,10],[11,12]] = [[58,64],[139,154]]
    const Tensor product =
        matmul(tensor_of({2, 3}, {1, 2, 3, 4, 5, 6}), tensor_of({3, 2}, {7, 8, 9, 10, 11, 12}));
    EXPECT_EQ(product.shape(), (Shape{2, 2}));
    EXPECT_TRUE(testing::all_close(product, {58, 64, 139, 154}));
}

TEST(Matmul, OneByOneAndOuterAndInnerProducts) {
    EXPECT_EQ(matmul(tensor_of({1, 1}, {3}), tensor_of({1, 1}, {-2})).item(), -6.0F);
    // Outer product [3,1]·[1,2]
    EXPECT_TRUE(testing::all_close(matmul(tensor_of({3, 1}, {1, 2, 3}), tensor_of({1, 2}, {4, 5})),
                                   {4, 5, 8, 10, 12, 15}));
    // Inner product [1,3]·[3,1]
    EXPECT_TRUE(testing::all_close(
        matmul(tensor_of({1, 3}, {1, 2, 3}), tensor_of({3, 1}, {4, 5, 6})), {32}));
}

TEST(Matmul, IdentityLeavesTheMatrixUnchanged) {
    const std::vector<float> values = testing::pseudo_random(12);
    const Tensor identity = tensor_of({3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1});
    EXPECT_TRUE(
        testing::bit_identical(matmul(tensor_of({4, 3}, values), identity).to_host(), values));
}

TEST(Matmul, BatchedRank3MatchesHandValues) {
    // Batch 0: [[1,2]]·[[1],[1]] = 3; batch 1: [[3,4]]·[[2],[-1]] = 2.
    const Tensor product =
        matmul(tensor_of({2, 1, 2}, {1, 2, 3, 4}), tensor_of({2, 2, 1}, {1, 1, 2, -1}));
    EXPECT_EQ(product.shape(), (Shape{2, 1, 1}));
    EXPECT_TRUE(testing::all_close(product, {3, 2}));
}

TEST(Matmul, BatchedRank3MatchesTheOracle) {
    EXPECT_TRUE(product_matches_oracle({4}, 5, 7, 3, false, false));
    EXPECT_TRUE(product_matches_oracle({3}, 16, 16, 16, false, false));
}

TEST(Matmul, BatchedRank4AttentionShapedMatchesTheOracle) {
    // [B,H,T,d]·[B,H,d,T] -> scores [B,H,T,T]
    EXPECT_TRUE(product_matches_oracle({2, 4}, 9, 8, 9, false, false));
    // Many small products spread over the pool.
    EXPECT_TRUE(product_matches_oracle({8, 16}, 8, 8, 8, false, false));
}

TEST(Matmul, SizesThatAreNotMultiplesOfTheBlockingMatchTheOracle) {
    EXPECT_TRUE(product_matches_oracle({}, 5, 7, 3, false, false));
    EXPECT_TRUE(product_matches_oracle({}, 33, 17, 65, false, false));
    EXPECT_TRUE(product_matches_oracle({}, 1, 129, 1, false, false));
    EXPECT_TRUE(product_matches_oracle({}, 3, 1, 5, false, false));
    EXPECT_TRUE(product_matches_oracle({}, 67, 259, 515, false, false, 1e-5));
}

TEST(Matmul, LargeProductMatchesTheOracle) {
    EXPECT_TRUE(product_matches_oracle({}, 256, 384, 512, false, false, 1e-4));
}

TEST(Matmul, LargeBatchedProductMatchesTheOracle) {
    EXPECT_TRUE(product_matches_oracle({3}, 130, 200, 170, false, false, 1e-4));
}

TEST(MatmulTransposed, TransposedLeftMatchesHandValues) {
    // Aᵀ with A = [[1,2],[3,4],[5,6]] ([3,2]): Aᵀ·[[1],[1],[1]] = [[9],[12]]
    const Tensor product =
        matmul(tensor_of({3, 2}, {1, 2, 3, 4, 5, 6}), tensor_of({3, 1}, {1, 1, 1}), true, false);
    EXPECT_EQ(product.shape(), (Shape{2, 1}));
    EXPECT_TRUE(testing::all_close(product, {9, 12}));
}

TEST(MatmulTransposed, TransposedRightMatchesHandValues) {
    // [[1,2,3]]·Bᵀ with B = [[1,0,1],[0,1,0]] ([2,3]): [[4, 2]]
    const Tensor product =
        matmul(tensor_of({1, 3}, {1, 2, 3}), tensor_of({2, 3}, {1, 0, 1, 0, 1, 0}), false, true);
    EXPECT_EQ(product.shape(), (Shape{1, 2}));
    EXPECT_TRUE(testing::all_close(product, {4, 2}));
}

TEST(MatmulTransposed, BothTransposedMatchesHandValues) {
    // Aᵀ·Bᵀ = (B·A)ᵀ with A = [[1,2],[3,4]], B = [[0,1],[1,0]]: B·A = [[3,4],[1,2]],
    // transposed [[3,1],[4,2]].
    const Tensor product =
        matmul(tensor_of({2, 2}, {1, 2, 3, 4}), tensor_of({2, 2}, {0, 1, 1, 0}), true, true);
    EXPECT_TRUE(testing::all_close(product, {3, 1, 4, 2}));
}

TEST(MatmulTransposed, EveryTransposeCombinationMatchesTheOracle) {
    for (const bool transpose_a : {false, true}) {
        for (const bool transpose_b : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << "transpose_a=" << transpose_a << " transpose_b=" << transpose_b);
            EXPECT_TRUE(product_matches_oracle({}, 5, 7, 3, transpose_a, transpose_b));
            EXPECT_TRUE(product_matches_oracle({}, 33, 17, 65, transpose_a, transpose_b));
            EXPECT_TRUE(product_matches_oracle({2, 3}, 6, 11, 9, transpose_a, transpose_b));
            EXPECT_TRUE(product_matches_oracle({}, 256, 384, 512, transpose_a, transpose_b, 1e-4));
        }
    }
}

TEST(MatmulTransposed, NoTransposeFlagsEqualThePlainProduct) {
    const std::vector<float> a = testing::pseudo_random(2 * 5 * 7, -1.0F, 1.0F, 41U);
    const std::vector<float> b = testing::pseudo_random(2 * 7 * 3, -1.0F, 1.0F, 42U);
    const Tensor left = tensor_of({2, 5, 7}, a);
    const Tensor right = tensor_of({2, 7, 3}, b);
    EXPECT_TRUE(testing::bit_identical(matmul(left, right, false, false).to_host(),
                                       matmul(left, right).to_host()));
}

TEST(MatmulTransposed, TransposedFormsGiveTheAdjointsOfTheProduct) {
    // For C = A·B and any G: <G, A·B> = <G·Bᵀ, A> = <B, Aᵀ·G> (the matmul VJPs).
    const std::vector<float> a = testing::pseudo_random(2 * 6 * 4, -1.0F, 1.0F, 45U);
    const std::vector<float> b = testing::pseudo_random(2 * 4 * 5, -1.0F, 1.0F, 46U);
    const std::vector<float> g = testing::pseudo_random(2 * 6 * 5, -1.0F, 1.0F, 47U);
    const Tensor left = tensor_of({2, 6, 4}, a);
    const Tensor right = tensor_of({2, 4, 5}, b);
    const Tensor upstream = tensor_of({2, 6, 5}, g);
    const Tensor left_gradient = matmul(upstream, right, false, true);
    const Tensor right_gradient = matmul(left, upstream, true, false);
    EXPECT_EQ(left_gradient.shape(), (Shape{2, 6, 4}));
    EXPECT_EQ(right_gradient.shape(), (Shape{2, 4, 5}));
    const auto dot = [](const std::vector<float>& x, const std::vector<float>& y) {
        double total = 0.0;
        for (std::size_t i = 0; i < x.size(); ++i)
            total += static_cast<double>(x[i]) * y[i];
        return total;
    };
    const double forward = dot(g, matmul(left, right).to_host());
    EXPECT_NEAR(dot(left_gradient.to_host(), a), forward, 1e-5);
    EXPECT_NEAR(dot(b, right_gradient.to_host()), forward, 1e-5);
}

TEST(MatmulExplicitBackend, CpuExecutionEqualsThePlainProduct) {
    const std::vector<float> a = testing::pseudo_random(3 * 4 * 5, -1.0F, 1.0F, 43U);
    const std::vector<float> b = testing::pseudo_random(3 * 5 * 6, -1.0F, 1.0F, 44U);
    const Tensor left = tensor_of({3, 4, 5}, a);
    const Tensor right = tensor_of({3, 5, 6}, b);
    const Tensor product = matmul(left, right, ExecutionBackend::Cpu);
    EXPECT_EQ(product.backend(), ExecutionBackend::Cpu);
    EXPECT_TRUE(
        testing::all_close(product, matmul_oracle(a, b, 3, 4, 5, 6, false, false), 1e-5, 1e-5));
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
}

// ---------------------------------------------------------------------------------------------
// Shape rules (each invalid_argument; inputs unchanged)

TEST(MatmulShapes, RankBelowTwoIsInvalidArgumentWithoutChangingInputs) {
    const Tensor vector = tensor_of({3}, {1, 2, 3});
    const Tensor matrix = tensor_of({3, 2}, {1, 2, 3, 4, 5, 6});
    EXPECT_THROW(static_cast<void>(matmul(vector, matrix)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(tensor_of({1, 2}, {1, 2}), tensor_of({2}, {1, 2}))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(Tensor::scalar(2.0F), Tensor::scalar(3.0F))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(vector, vector, true, false)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(vector, matrix, ExecutionBackend::Cpu)),
                 std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(vector.to_host(), {1, 2, 3}));
    EXPECT_TRUE(testing::bit_identical(matrix.to_host(), {1, 2, 3, 4, 5, 6}));
}

TEST(MatmulShapes, RankMismatchIsInvalidArgument) {
    // No batch broadcasting: [2,2,3]·[3,2] is rejected even though it would broadcast.
    const Tensor batched = tensor_of({2, 2, 3}, std::vector<float>(12, 1.0F));
    const Tensor matrix = tensor_of({3, 2}, std::vector<float>(6, 1.0F));
    EXPECT_THROW(static_cast<void>(matmul(batched, matrix)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(tensor_of({2, 3}, std::vector<float>(6, 1.0F)),
                                          tensor_of({1, 3, 2}, std::vector<float>(6, 1.0F)))),
                 std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(batched.to_host(), std::vector<float>(12, 1.0F)));
}

TEST(MatmulShapes, BatchDimensionMismatchIsInvalidArgument) {
    const Tensor left = tensor_of({2, 2, 3}, std::vector<float>(12, 1.0F));
    EXPECT_THROW(
        static_cast<void>(matmul(left, tensor_of({3, 3, 2}, std::vector<float>(18, 1.0F)))),
        std::invalid_argument);
    // A batch dimension of 1 does not broadcast either.
    EXPECT_THROW(static_cast<void>(matmul(left, tensor_of({1, 3, 2}, std::vector<float>(6, 1.0F)))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(tensor_of({2, 3, 1, 1}, std::vector<float>(6, 1.0F)),
                                          tensor_of({2, 4, 1, 1}, std::vector<float>(8, 1.0F)))),
                 std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(left.to_host(), std::vector<float>(12, 1.0F)));
}

TEST(MatmulShapes, InnerDimensionMismatchIsInvalidArgumentNamingBothK) {
    const Tensor left = tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});
    const Tensor right = tensor_of({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    const std::string message = thrown_invalid_argument_message(left, right);
    EXPECT_NE(message.find("K=3"), std::string::npos) << message;
    EXPECT_NE(message.find("K=4"), std::string::npos) << message;
    EXPECT_TRUE(testing::bit_identical(left.to_host(), {1, 2, 3, 4, 5, 6}));
    EXPECT_TRUE(testing::bit_identical(right.to_host(), {1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(MatmulShapes, InnerDimensionRuleFollowsTheTransposeFlags) {
    const Tensor a23 = tensor_of({2, 3}, std::vector<float>(6, 1.0F));
    const Tensor b34 = tensor_of({3, 4}, std::vector<float>(12, 1.0F));
    const Tensor b43 = tensor_of({4, 3}, std::vector<float>(12, 1.0F));
    // Valid: A·B, A·(B')ᵀ with B' = [4,3]
    EXPECT_EQ(matmul(a23, b34).shape(), (Shape{2, 4}));
    EXPECT_EQ(matmul(a23, b43, false, true).shape(), (Shape{2, 4}));
    EXPECT_EQ(matmul(tensor_of({3, 2}, std::vector<float>(6, 1.0F)), b34, true, false).shape(),
              (Shape{2, 4}));
    // Invalid: Aᵀ is [3,2] (K=2) against B [3,4] (K=3); A·B43ᵀ OK but A·B34ᵀ has K=4.
    EXPECT_THROW(static_cast<void>(matmul(a23, b34, true, false)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(a23, b34, false, true)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(a23, b43)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(a23, b43, true, true)), std::invalid_argument);
}

TEST(MatmulShapes, ExplicitBackendChecksShapesLikeThePlainForm) {
    const Tensor left = tensor_of({2, 3}, std::vector<float>(6, 1.0F));
    const Tensor right = tensor_of({4, 2}, std::vector<float>(8, 1.0F));
    EXPECT_THROW(static_cast<void>(matmul(left, right, ExecutionBackend::Cpu)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(matmul(tensor_of({2, 2, 3}, std::vector<float>(12, 1.0F)),
                                          tensor_of({3, 3, 2}, std::vector<float>(18, 1.0F)),
                                          ExecutionBackend::Cpu)),
                 std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// The GEMM seam: gemm (BLAS when configured) and gemm_blocked (the portable fallback)

namespace {

struct GemmCase {
    std::size_t m;
    std::size_t n;
    std::size_t k;
    bool transpose_a;
    bool transpose_b;
    std::size_t padding;  // extra columns in every leading dimension
};

// Runs `kernel` on a case with padded leading dimensions and NaN-prefilled C, then checks the
// [m,n] block against the oracle and every padding element of C for being untouched.
template <typename Kernel>
::testing::AssertionResult gemm_matches_oracle(Kernel kernel, const GemmCase& c, double tolerance) {
    const std::size_t a_rows = c.transpose_a ? c.k : c.m;
    const std::size_t a_columns = c.transpose_a ? c.m : c.k;
    const std::size_t b_rows = c.transpose_b ? c.n : c.k;
    const std::size_t b_columns = c.transpose_b ? c.k : c.n;
    const std::size_t lda = a_columns + c.padding;
    const std::size_t ldb = b_columns + c.padding;
    const std::size_t ldc = c.n + c.padding;
    const std::vector<float> a_padded = testing::pseudo_random(a_rows * lda, -1.0F, 1.0F, 51U);
    const std::vector<float> b_padded = testing::pseudo_random(b_rows * ldb, -1.0F, 1.0F, 52U);
    const float sentinel = -12345.0F;
    std::vector<float> c_padded(c.m * ldc, sentinel);
    for (std::size_t i = 0; i < c.m; ++i) {
        for (std::size_t j = 0; j < c.n; ++j) {
            c_padded[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();  // beta = 0
        }
    }
    detail::GemmArguments arguments;
    arguments.transpose_a = c.transpose_a;
    arguments.transpose_b = c.transpose_b;
    arguments.m = c.m;
    arguments.n = c.n;
    arguments.k = c.k;
    arguments.a = a_padded.data();
    arguments.lda = lda;
    arguments.b = b_padded.data();
    arguments.ldb = ldb;
    arguments.c = c_padded.data();
    arguments.ldc = ldc;
    kernel(arguments);

    // Oracle on the unpadded operands.
    std::vector<float> a(a_rows * a_columns);
    std::vector<float> b(b_rows * b_columns);
    for (std::size_t r = 0; r < a_rows; ++r)
        for (std::size_t col = 0; col < a_columns; ++col)
            a[r * a_columns + col] = a_padded[r * lda + col];
    for (std::size_t r = 0; r < b_rows; ++r)
        for (std::size_t col = 0; col < b_columns; ++col)
            b[r * b_columns + col] = b_padded[r * ldb + col];
    const std::vector<double> expected =
        matmul_oracle(a, b, 1, c.m, c.k, c.n, c.transpose_a, c.transpose_b);

    std::vector<float> actual(c.m * c.n);
    for (std::size_t i = 0; i < c.m; ++i) {
        for (std::size_t j = 0; j < c.n; ++j)
            actual[i * c.n + j] = c_padded[i * ldc + j];
        for (std::size_t j = c.n; j < ldc; ++j) {
            if (c_padded[i * ldc + j] != sentinel) {
                return ::testing::AssertionFailure()
                       << "padding C[" << i << "," << j << "] was overwritten";
            }
        }
    }
    return testing::all_close(actual, expected, tolerance, tolerance);
}

const std::vector<GemmCase>& awkward_gemm_cases() {
    static const std::vector<GemmCase> cases = [] {
        std::vector<GemmCase> all;
        const std::size_t sizes[][3] = {{1, 1, 1},
                                        {5, 3, 7},
                                        {33, 65, 17},
                                        {4, 4, 4},
                                        {3, 1, 300},
                                        {7, 513, 2},
                                        {37, 515, 259},  // more than one k-block (256) and one
                                                         // n-block (512)
                                        {130, 40, 600}};
        for (const auto& size : sizes) {
            for (const bool transpose_a : {false, true}) {
                for (const bool transpose_b : {false, true}) {
                    for (const std::size_t padding : {std::size_t{0}, std::size_t{3}}) {
                        all.push_back(
                            {size[0], size[1], size[2], transpose_a, transpose_b, padding});
                    }
                }
            }
        }
        return all;
    }();
    return cases;
}

std::string describe(const GemmCase& c) {
    return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
           " transpose_a=" + std::to_string(c.transpose_a) +
           " transpose_b=" + std::to_string(c.transpose_b) +
           " padding=" + std::to_string(c.padding);
}

}  // namespace

TEST(GemmBlocked, AwkwardSizesAndLeadingDimensionsMatchTheOracle) {
    for (const GemmCase& c : awkward_gemm_cases()) {
        SCOPED_TRACE(describe(c));
        EXPECT_TRUE(gemm_matches_oracle(
            [](const detail::GemmArguments& g) { detail::gemm_blocked(g); }, c, 1e-5));
    }
}

TEST(GemmBlocked, LargeProductMatchesTheOracle) {
    EXPECT_TRUE(gemm_matches_oracle([](const detail::GemmArguments& g) { detail::gemm_blocked(g); },
                                    {256, 512, 384, false, false, 0}, 1e-4));
    EXPECT_TRUE(gemm_matches_oracle([](const detail::GemmArguments& g) { detail::gemm_blocked(g); },
                                    {255, 517, 383, true, true, 1}, 1e-4));
}

TEST(Gemm, ConfiguredImplementationMatchesTheOracle) {
    ASSERT_NE(detail::gemm_implementation_name(), nullptr);
    SCOPED_TRACE(detail::gemm_implementation_name());
    for (const GemmCase& c : awkward_gemm_cases()) {
        SCOPED_TRACE(describe(c));
        EXPECT_TRUE(
            gemm_matches_oracle([](const detail::GemmArguments& g) { detail::gemm(g); }, c, 1e-5));
    }
}

}  // namespace riftco_transformer
