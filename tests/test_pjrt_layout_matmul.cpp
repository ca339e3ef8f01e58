// The PJRT backend's layout, reduction and matmul capabilities on a real plugin (XLA's CPU
// plugin in CI), each checked against the CPU reference through the public tensor_ops API,
// plus a device autograd pass and the compile cache.
//
// Tolerances:
// - permute, broadcast_to, concatenate_last_axis, slice, slice_backward move data only: the
//   device must match the reference bit for bit (NaN, ±inf and −0 included).
// - Sums (sum, mean, sum_to_shape) and matmul: the reference accumulates in double (sums) or
//   in float32 in its GEMM's order (matmul); the device accumulates in float32 in XLA's order.
//   Either result is within the classic summation bound n·u·Σ|terms| (u = 2⁻²⁴) of the exact
//   value, which for long rows (n in the thousands) would allow ~1e-4 relative. Instead every
//   element is held to |device − reference| <= summation_tolerance · Σ|terms|, with Σ|terms|
//   computed by the same CPU operation on |x| (|A|·|B| for matmul): scaling by Σ|terms|
//   rather than |result| keeps the bound meaningful where terms cancel. summation_tolerance
//   = 1e-6 ≈ 17u: the worst ratio measured on these inputs with XLA's CPU plugin 0.11.2 is
//   3u (the 64x96x80 matmuls; sums of up to 4099 terms stay within 2.2u), and a wrong
//   element, axis or multiplier misses it by orders of magnitude. Special values are exact:
//   NaN/±inf propagate as in the reference, and a zero sum is +0 as the reference's 0.0 + x.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "riftco_transformer/core/tensor_ops/reduction.hpp"
#include "support/pjrt_support.hpp"

namespace riftco_transformer {
namespace {

using test::close_to;
using test::pjrt_test_backend;
using test::uniform_values;

constexpr double summation_tolerance = 1e-6;

std::size_t count_of(const Shape& shape) {
    std::size_t count = 1;
    for (const std::size_t extent : shape) {
        count *= extent;
    }
    return count;
}

// Uniform values in [-1, 1) with NaN, ±inf and −0 planted (for the data-movement checks).
std::vector<float> values_with_specials(std::size_t count, unsigned seed) {
    std::vector<float> values = uniform_values(count, -1.0F, 1.0F, seed);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(), -0.0F,
                              -std::numeric_limits<float>::infinity()};
    for (std::size_t i = 0; i < std::size(specials) && 3 * i + 1 < count; ++i) {
        values[3 * i + 1] = specials[i];
    }
    return values;
}

std::vector<float> absolute(std::vector<float> values) {
    for (float& value : values) {
        value = std::abs(value);
    }
    return values;
}

// The same host values on the CPU and on the device.
struct Pair {
    Tensor cpu;
    Tensor device;
    std::vector<float> values;
};

class PjrtLayoutMatmul : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }

    Pair pair(const Shape& shape, unsigned seed, bool specials = false) const {
        std::vector<float> values = specials ? values_with_specials(count_of(shape), seed)
                                             : uniform_values(count_of(shape), -1.0F, 1.0F, seed);
        return {Tensor(shape, values, ExecutionBackend::Cpu), Tensor(shape, values, device),
                values};
    }

    // Same shape, result on the device, every element bit-identical to the reference.
    ::testing::AssertionResult identical(const Tensor& result, const Tensor& reference) const {
        if (result.backend() != device) {
            return ::testing::AssertionFailure() << "the result left the device";
        }
        if (result.shape() != reference.shape()) {
            return ::testing::AssertionFailure()
                   << "shape " << shape_to_string(result.shape()) << ", reference "
                   << shape_to_string(reference.shape());
        }
        const std::vector<float> got = result.to_host();
        const std::vector<float> expected = reference.to_host();
        for (std::size_t i = 0; i < got.size(); ++i) {
            if (std::memcmp(&got[i], &expected[i], sizeof(float)) != 0) {
                return ::testing::AssertionFailure()
                       << "element " << i << ": device " << got[i] << ", reference " << expected[i];
            }
        }
        return ::testing::AssertionSuccess();
    }

    // |device − reference| <= summation_tolerance · magnitude, elementwise (see the top).
    ::testing::AssertionResult within_summation_bound(const Tensor& result, const Tensor& reference,
                                                      const Tensor& magnitude) const {
        if (result.backend() != device) {
            return ::testing::AssertionFailure() << "the result left the device";
        }
        if (result.shape() != reference.shape()) {
            return ::testing::AssertionFailure()
                   << "shape " << shape_to_string(result.shape()) << ", reference "
                   << shape_to_string(reference.shape());
        }
        const std::vector<float> got = result.to_host();
        const std::vector<float> expected = reference.to_host();
        const std::vector<float> scale = magnitude.to_host();
        for (std::size_t i = 0; i < got.size(); ++i) {
            const double error = std::abs(static_cast<double>(got[i]) - expected[i]);
            if (!(error <= summation_tolerance * scale[i])) {
                return ::testing::AssertionFailure()
                       << "element " << i << ": device " << got[i] << ", reference " << expected[i]
                       << ", error " << error << " > " << summation_tolerance << " · " << scale[i];
            }
        }
        return ::testing::AssertionSuccess();
    }

    ExecutionBackend device = pjrt_test_backend();
};

// ---- permute ------------------------------------------------------------------------------

TEST_F(PjrtLayoutMatmul, PermuteMatchesTheReferenceBitForBit) {
    struct Case {
        Shape shape;
        std::vector<std::size_t> axes;
    };
    const Case cases[] = {
        {{7}, {0}},
        {{7, 5}, {1, 0}},
        {{1, 9}, {1, 0}},
        {{2, 3, 4}, {2, 0, 1}},
        {{5, 1, 3}, {1, 2, 0}},
        {{2, 3, 4, 5}, {3, 1, 0, 2}},
        {{3, 1, 4, 2}, {0, 2, 1, 3}},
        {{2, 3, 4}, {0, 1, 2}},
        {{}, {}},
    };
    unsigned seed = 100;
    for (const Case& c : cases) {
        const Pair x = pair(c.shape, ++seed, true);
        EXPECT_TRUE(
            identical(tensor_ops::permute(x.device, c.axes), tensor_ops::permute(x.cpu, c.axes)))
            << shape_to_string(c.shape) << " axes " << c.axes.size();
    }
}

// ---- broadcast_to and sum_to_shape --------------------------------------------------------

TEST_F(PjrtLayoutMatmul, BroadcastToMatchesTheReferenceBitForBit) {
    struct Case {
        Shape from;
        Shape to;
    };
    const Case cases[] = {
        {{}, {3, 4}},         // a scalar everywhere
        {{}, {1}},            // a scalar as one element
        {{1}, {7}},           // rank 1
        {{4}, {2, 3, 4}},     // right-aligned: new leading axes
        {{3, 1}, {2, 3, 5}},  // a new axis and a repeated unit axis
        {{2, 1, 3}, {4, 2, 5, 3}},
        {{1, 1, 3}, {2, 5, 3}},  // unit axes at the front
        {{3, 1}, {1, 3, 1}},     // only a unit axis added: same elements
        {{2, 3}, {2, 3}},
    };
    unsigned seed = 200;
    for (const Case& c : cases) {
        const Pair x = pair(c.from, ++seed, true);
        EXPECT_TRUE(identical(tensor_ops::broadcast_to(x.device, c.to),
                              tensor_ops::broadcast_to(x.cpu, c.to)))
            << shape_to_string(c.from) << " -> " << shape_to_string(c.to);
    }
}

TEST_F(PjrtLayoutMatmul, SumToShapeMatchesTheReference) {
    struct Case {
        Shape from;
        Shape to;
    };
    const Case cases[] = {
        {{3, 4}, {}},  // back to a scalar
        {{7}, {1}},
        {{2, 3, 4}, {4}},     // bias-gradient form: leading axes summed
        {{2, 3, 5}, {3, 1}},  // a leading axis and an inner unit axis
        {{4, 2, 5, 3}, {2, 1, 3}},
        {{5, 7}, {1, 7}},
        {{5, 7}, {5, 1}},
        {{1, 3, 1}, {3, 1}},  // unit axes only
        {{33, 17}, {17}},
    };
    unsigned seed = 300;
    for (const Case& c : cases) {
        const Pair x = pair(c.from, ++seed);
        const Tensor magnitude = tensor_ops::sum_to_shape(Tensor(c.from, absolute(x.values)), c.to);
        EXPECT_TRUE(within_summation_bound(tensor_ops::sum_to_shape(x.device, c.to),
                                           tensor_ops::sum_to_shape(x.cpu, c.to), magnitude))
            << shape_to_string(c.from) << " -> " << shape_to_string(c.to);
    }
}

TEST_F(PjrtLayoutMatmul, SumToShapeUndoesBroadcastToOfAScalar) {
    const Tensor scalar({}, std::vector<float>{0.25F}, device);
    const Tensor spread = tensor_ops::broadcast_to(scalar, {4, 3, 2});
    const Tensor back = tensor_ops::sum_to_shape(spread, {});
    EXPECT_EQ(back.shape(), Shape{});
    EXPECT_EQ(back.item(), 6.0F);  // 24 · 0.25, exact in float32
}

// ---- concatenate_last_axis -----------------------------------------------------------------

TEST_F(PjrtLayoutMatmul, ConcatenateMatchesTheReferenceBitForBit) {
    const std::vector<std::vector<Shape>> cases = {
        {{2, 3, 2}, {2, 3, 5}, {2, 3, 1}},  // three inputs of different widths
        {{3}, {4}},                         // rank 1
        {{1, 1}, {1, 1}, {1, 1}},
        {{2, 1, 3, 2}, {2, 1, 3, 7}},
        {{4, 6}},  // one input
    };
    unsigned seed = 400;
    for (const std::vector<Shape>& shapes : cases) {
        std::vector<Tensor> on_cpu;
        std::vector<Tensor> on_device;
        for (const Shape& shape : shapes) {
            const Pair x = pair(shape, ++seed, true);
            on_cpu.push_back(x.cpu);
            on_device.push_back(x.device);
        }
        EXPECT_TRUE(identical(tensor_ops::concatenate_last_axis(on_device),
                              tensor_ops::concatenate_last_axis(on_cpu)))
            << shapes.size() << " inputs, first " << shape_to_string(shapes.front());
    }
}

// ---- slice and slice_backward --------------------------------------------------------------

struct Window {
    Shape shape;
    std::size_t axis;
    std::size_t start;
    std::size_t length;
};

const Window windows[] = {
    {{4, 9, 5}, 1, 0, 3},  // at the start
    {{4, 9, 5}, 1, 3, 4},  // in the middle
    {{4, 9, 5}, 1, 6, 3},  // at the end
    {{4, 9, 5}, 0, 1, 2},  // the outermost axis
    {{4, 9, 5}, 2, 4, 1},  // the innermost axis, one column
    {{11}, 0, 5, 6},       // rank 1
    {{3, 7}, 1, 0, 7},     // the whole axis
    {{2, 3, 5, 4}, 2, 2, 2}, {{1, 1}, 0, 0, 1},
};

TEST_F(PjrtLayoutMatmul, SliceMatchesTheReferenceBitForBit) {
    unsigned seed = 500;
    for (const Window& w : windows) {
        const Pair x = pair(w.shape, ++seed, true);
        EXPECT_TRUE(identical(tensor_ops::slice(x.device, w.axis, w.start, w.length),
                              tensor_ops::slice(x.cpu, w.axis, w.start, w.length)))
            << shape_to_string(w.shape) << " axis " << w.axis << " [" << w.start << ", +"
            << w.length << ")";
    }
}

TEST_F(PjrtLayoutMatmul, SliceBackwardMatchesTheReferenceBitForBit) {
    unsigned seed = 600;
    for (const Window& w : windows) {
        Shape window_shape = w.shape;
        window_shape[w.axis] = w.length;
        const Pair upstream = pair(window_shape, ++seed, true);
        const std::size_t extent = w.shape[w.axis];
        EXPECT_TRUE(identical(tensor_ops::slice_backward(upstream.device, w.axis, w.start, extent),
                              tensor_ops::slice_backward(upstream.cpu, w.axis, w.start, extent)))
            << shape_to_string(w.shape) << " axis " << w.axis << " [" << w.start << ", +"
            << w.length << ")";
    }
}

// ---- reductions ----------------------------------------------------------------------------

TEST_F(PjrtLayoutMatmul, SumAndMeanOfEveryElementMatchTheReference) {
    const Shape shapes[] = {{}, {1}, {7}, {3, 4, 5}, {2, 3, 4, 5}, {4099}, {64, 257}};
    unsigned seed = 700;
    for (const Shape& shape : shapes) {
        const Pair x = pair(shape, ++seed);
        const Tensor magnitude = tensor_ops::sum(Tensor(shape, absolute(x.values)));
        EXPECT_TRUE(
            within_summation_bound(tensor_ops::sum(x.device), tensor_ops::sum(x.cpu), magnitude))
            << "sum " << shape_to_string(shape);
        const Tensor mean_magnitude = tensor_ops::mean(Tensor(shape, absolute(x.values)));
        EXPECT_TRUE(within_summation_bound(tensor_ops::mean(x.device), tensor_ops::mean(x.cpu),
                                           mean_magnitude))
            << "mean " << shape_to_string(shape);
    }
}

TEST_F(PjrtLayoutMatmul, SumAndMeanAlongEachAxisMatchTheReference) {
    const Shape shapes[] = {{9}, {1, 6}, {3, 4, 5}, {2, 1, 3, 7}, {4, 3001}, {513, 3}};
    unsigned seed = 800;
    for (const Shape& shape : shapes) {
        const Pair x = pair(shape, ++seed);
        const Tensor magnitude_source(shape, absolute(x.values));
        for (std::size_t axis = 0; axis < shape.size(); ++axis) {
            for (const bool keep_dims : {false, true}) {
                EXPECT_TRUE(
                    within_summation_bound(tensor_ops::sum(x.device, axis, keep_dims),
                                           tensor_ops::sum(x.cpu, axis, keep_dims),
                                           tensor_ops::sum(magnitude_source, axis, keep_dims)))
                    << "sum " << shape_to_string(shape) << " axis " << axis;
                EXPECT_TRUE(
                    within_summation_bound(tensor_ops::mean(x.device, axis, keep_dims),
                                           tensor_ops::mean(x.cpu, axis, keep_dims),
                                           tensor_ops::mean(magnitude_source, axis, keep_dims)))
                    << "mean " << shape_to_string(shape) << " axis " << axis;
            }
        }
    }
}

TEST_F(PjrtLayoutMatmul, SumsPropagateSpecialValuesLikeTheReference) {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> values = {1.0F, inf, 2.0F, -inf, nan, 3.0F, inf, 4.0F, 5.0F};
    const Tensor on_cpu({3, 3}, values, ExecutionBackend::Cpu);
    const Tensor on_device({3, 3}, values, device);
    EXPECT_TRUE(close_to(tensor_ops::sum(on_device, 1).to_host(),
                         tensor_ops::sum(on_cpu, 1).to_host(), 0.0, 0.0));
    EXPECT_TRUE(close_to(tensor_ops::sum(on_device, 0).to_host(),
                         tensor_ops::sum(on_cpu, 0).to_host(), 0.0, 0.0));
    EXPECT_TRUE(std::isnan(tensor_ops::sum(on_device).item()));
}

TEST_F(PjrtLayoutMatmul, SumsOfNegativeZerosAreZeroLikeTheReference) {
    const std::vector<float> zeros(6, -0.0F);
    const Tensor on_cpu({1, 6, 1}, zeros, ExecutionBackend::Cpu);
    const Tensor on_device({1, 6, 1}, zeros, device);
    EXPECT_TRUE(identical(tensor_ops::sum(on_device), tensor_ops::sum(on_cpu)));
    EXPECT_TRUE(identical(tensor_ops::sum(on_device, 0), tensor_ops::sum(on_cpu, 0)));
    EXPECT_TRUE(identical(tensor_ops::sum(on_device, 2), tensor_ops::sum(on_cpu, 2)));
    EXPECT_TRUE(identical(tensor_ops::sum(on_device, 1), tensor_ops::sum(on_cpu, 1)));
    EXPECT_TRUE(identical(tensor_ops::sum_to_shape(on_device, {6, 1}),
                          tensor_ops::sum_to_shape(on_cpu, {6, 1})));
    EXPECT_TRUE(identical(tensor_ops::sum_to_shape(on_device, {1, 1, 1}),
                          tensor_ops::sum_to_shape(on_cpu, {1, 1, 1})));
    const Tensor one_cpu({1}, std::vector<float>{-0.0F}, ExecutionBackend::Cpu);
    const Tensor one_device({1}, std::vector<float>{-0.0F}, device);
    EXPECT_TRUE(identical(tensor_ops::sum(one_device), tensor_ops::sum(one_cpu)));
    EXPECT_TRUE(identical(tensor_ops::mean(one_device, 0), tensor_ops::mean(one_cpu, 0)));
}

// ---- matmul --------------------------------------------------------------------------------

class PjrtMatmulParity : public PjrtLayoutMatmul {
  public:
    // op(left)·op(right): left stored [.., m, k] ([.., k, m] when transposed), right
    // [.., k, n] ([.., n, k] when transposed).
    void expect_parity(const Shape& batch, std::size_t m, std::size_t k, std::size_t n,
                       bool transpose_left, bool transpose_right, unsigned seed) const {
        Shape left_shape = batch;
        left_shape.push_back(transpose_left ? k : m);
        left_shape.push_back(transpose_left ? m : k);
        Shape right_shape = batch;
        right_shape.push_back(transpose_right ? n : k);
        right_shape.push_back(transpose_right ? k : n);
        const Pair left = pair(left_shape, seed);
        const Pair right = pair(right_shape, seed + 1000);
        const Tensor magnitude = tensor_ops::matmul(Tensor(left_shape, absolute(left.values)),
                                                    Tensor(right_shape, absolute(right.values)),
                                                    transpose_left, transpose_right);
        EXPECT_TRUE(within_summation_bound(
            tensor_ops::matmul(left.device, right.device, transpose_left, transpose_right),
            tensor_ops::matmul(left.cpu, right.cpu, transpose_left, transpose_right), magnitude))
            << "batch " << shape_to_string(batch) << " m=" << m << " k=" << k << " n=" << n
            << " transpose_left=" << transpose_left << " transpose_right=" << transpose_right;
    }
};

TEST_F(PjrtMatmulParity, EveryTransposeCombinationMatchesTheReference) {
    unsigned seed = 900;
    for (const Shape& batch : {Shape{}, Shape{1}, Shape{3}, Shape{2, 3}}) {
        for (const bool transpose_left : {false, true}) {
            for (const bool transpose_right : {false, true}) {
                expect_parity(batch, 5, 7, 3, transpose_left, transpose_right, ++seed);
            }
        }
    }
}

TEST_F(PjrtMatmulParity, EdgeShapesMatchTheReference) {
    expect_parity({}, 1, 16, 9, false, false, 950);  // [1,k]·[k,n]: one row
    expect_parity({}, 1, 16, 9, false, true, 951);
    expect_parity({}, 6, 1, 4, false, false, 952);  // k = 1: an outer product
    expect_parity({}, 1, 1, 1, true, true, 953);
    expect_parity({3}, 4, 13, 1, true, false, 954);  // one column per batch
}

TEST_F(PjrtMatmulParity, LargerProductsMatchTheReference) {
    expect_parity({}, 64, 96, 80, false, false, 960);
    expect_parity({}, 64, 96, 80, true, true, 961);
    expect_parity({3}, 64, 96, 80, false, true, 962);
}

// ---- autograd ------------------------------------------------------------------------------

// loss = Σ_columns mean_batch Σ_rows slice(concat(A·Bᵀ, C), last axis, [1, 4)): the backward
// runs broadcast_to, slice_backward, slice (concatenate's VJP) and both matmul VJPs on the
// device.
struct Gradients {
    float loss;
    std::vector<float> left;
    std::vector<float> right;
    std::vector<float> side;
};

Gradients run_expression(ExecutionBackend backend, const std::vector<float>& a,
                         const std::vector<float>& b, const std::vector<float>& c) {
    Variable left(Tensor({3, 4, 5}, a, backend));
    Variable right(Tensor({3, 2, 5}, b, backend));
    Variable side(Tensor({3, 4, 3}, c, backend));
    const Variable product = matmul(left, right, false, true);     // [3,4,2]
    const Variable joined = concatenate_last_axis(product, side);  // [3,4,5]
    const Variable window = slice(joined, 2, 1, 3);                // [3,4,3]
    const Variable per_batch = mean(sum(window, 1), 0);            // [3]
    Variable total = sum(per_batch);
    total.backward();
    return {total.value().item(), left.gradient().to_host(), right.gradient().to_host(),
            side.gradient().to_host()};
}

TEST_F(PjrtLayoutMatmul, GradientsThroughMatmulAndSumMatchTheReference) {
    const std::vector<float> a = uniform_values(60, -1.0F, 1.0F, 1001);
    const std::vector<float> b = uniform_values(30, -1.0F, 1.0F, 1002);
    const std::vector<float> c = uniform_values(36, -1.0F, 1.0F, 1003);
    const Gradients on_device = run_expression(device, a, b, c);
    const Gradients on_cpu = run_expression(ExecutionBackend::Cpu, a, b, c);
    // The loss is (1/3)·Σ of 12 dot products of 5 terms and 24 entries of C, all terms of
    // magnitude < 1: Σ|terms| < 12·5/3 + 24/3 = 28.
    EXPECT_NEAR(on_device.loss, on_cpu.loss, summation_tolerance * 28.0);
    // Gradients are sums of at most 4 products (dA, dB) or exact copies of 1/3 (dC).
    EXPECT_TRUE(close_to(on_device.left, on_cpu.left, 1e-6, 1e-6));
    EXPECT_TRUE(close_to(on_device.right, on_cpu.right, 1e-6, 1e-6));
    EXPECT_TRUE(close_to(on_device.side, on_cpu.side, 0.0, 0.0));
}

// ---- the compile cache and device residency ------------------------------------------------

TEST_F(PjrtLayoutMatmul, RepeatedShapesReuseTheirCompiledPrograms) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const Pair left = pair({3, 6, 5}, 1100);
    const Pair right = pair({3, 5, 4}, 1101);
    const Pair wide = pair({4, 10}, 1102);
    auto once = [&](std::size_t start) {
        static_cast<void>(tensor_ops::matmul(left.device, right.device));
        static_cast<void>(tensor_ops::matmul(right.device, right.device, true, false));
        static_cast<void>(tensor_ops::sum(wide.device, 1));
        static_cast<void>(tensor_ops::mean(wide.device));
        static_cast<void>(tensor_ops::permute(left.device, {2, 0, 1}));
        static_cast<void>(tensor_ops::broadcast_to(wide.device, {2, 4, 10}));
        static_cast<void>(tensor_ops::sum_to_shape(wide.device, {10}));
        static_cast<void>(tensor_ops::slice(wide.device, 1, start, 3));
        static_cast<void>(tensor_ops::slice_backward(wide.device, 0, start, 9));
        const Tensor columns[] = {wide.device, wide.device, wide.device};
        static_cast<void>(tensor_ops::concatenate_last_axis(columns));
    };
    once(0);  // compiled here, or earlier in this process
    const auto first = test::pjrt_statistics();
    once(0);
    once(5);  // another window start of the same shapes: the start is a runtime parameter
    const auto second = test::pjrt_statistics();
    EXPECT_EQ(second.compiles, first.compiles);
    EXPECT_EQ(second.cache_hits - first.cache_hits, 2U * 10U);
    // A new shape is a new program.
    static_cast<void>(tensor_ops::sum(pair({4, 11}, 1103).device, 1));
    EXPECT_EQ(test::pjrt_statistics().compiles, second.compiles + 1);
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

TEST_F(PjrtLayoutMatmul, ChainedOperationsReadNoHostMemory) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const Pair left = pair({2, 8, 6}, 1200);
    const Pair right = pair({2, 6, 8}, 1201);
    const auto before = test::pjrt_statistics();
    Tensor x = tensor_ops::matmul(left.device, right.device);  // [2,8,8]
    x = tensor_ops::permute(x, {0, 2, 1});
    x = tensor_ops::slice(x, 1, 2, 4);            // [2,4,8]
    x = tensor_ops::concatenate_last_axis(x, x);  // [2,4,16]
    x = tensor_ops::sum(x, 0);                    // [4,16]
    x = tensor_ops::broadcast_to(x, {3, 4, 16});
    x = tensor_ops::sum_to_shape(x, {1, 16});
    EXPECT_EQ(x.backend(), device);
    EXPECT_EQ(test::pjrt_statistics().bytes_to_host, before.bytes_to_host);
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

}  // namespace
}  // namespace riftco_transformer
