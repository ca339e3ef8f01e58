// Softmax, its VJP, and the causal (masked, scaled) attention softmax: values against double
// oracles written here, gradients against centred finite differences, and every documented
// error rule (docs/ARCHITECTURE.md, 'Tensor operations').
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::all_close;
using testing::bit_identical;
using testing::finite_difference_gradient;
using testing::pseudo_random;

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr float quiet_nan = std::numeric_limits<float>::quiet_NaN();

// A shape viewed as [outer, extent, inner] around `axis`.
struct AxisView {
    std::size_t outer = 1;
    std::size_t extent = 1;
    std::size_t inner = 1;
};

AxisView view_of(const Shape& shape, std::size_t axis) {
    AxisView view;
    for (std::size_t d = 0; d < axis; ++d)
        view.outer *= shape[d];
    view.extent = shape[axis];
    for (std::size_t d = axis + 1; d < shape.size(); ++d)
        view.inner *= shape[d];
    return view;
}

// Double-precision softmax along `axis`, with the max subtracted and std::exp.
std::vector<double> softmax_oracle(const std::vector<float>& x, const Shape& shape,
                                   std::size_t axis) {
    const AxisView view = view_of(shape, axis);
    std::vector<double> y(x.size());
    for (std::size_t o = 0; o < view.outer; ++o) {
        for (std::size_t i = 0; i < view.inner; ++i) {
            const std::size_t base = o * view.extent * view.inner + i;
            double max = -std::numeric_limits<double>::infinity();
            for (std::size_t e = 0; e < view.extent; ++e) {
                max = std::max(max, static_cast<double>(x[base + e * view.inner]));
            }
            double sum = 0.0;
            for (std::size_t e = 0; e < view.extent; ++e) {
                sum += std::exp(static_cast<double>(x[base + e * view.inner]) - max);
            }
            for (std::size_t e = 0; e < view.extent; ++e) {
                const std::size_t k = base + e * view.inner;
                y[k] = std::exp(static_cast<double>(x[k]) - max) / sum;
            }
        }
    }
    return y;
}

// Double-precision p ⊙ (g − Σ_axis g ⊙ p).
std::vector<double> softmax_backward_oracle(const std::vector<float>& p,
                                            const std::vector<float>& g, const Shape& shape,
                                            std::size_t axis) {
    const AxisView view = view_of(shape, axis);
    std::vector<double> dx(p.size());
    for (std::size_t o = 0; o < view.outer; ++o) {
        for (std::size_t i = 0; i < view.inner; ++i) {
            const std::size_t base = o * view.extent * view.inner + i;
            double dot = 0.0;
            for (std::size_t e = 0; e < view.extent; ++e) {
                const std::size_t k = base + e * view.inner;
                dot += static_cast<double>(g[k]) * p[k];
            }
            for (std::size_t e = 0; e < view.extent; ++e) {
                const std::size_t k = base + e * view.inner;
                dx[k] = p[k] * (g[k] - dot);
            }
        }
    }
    return dx;
}

// Causal oracle on [B,H,T,T]: row (b,h,q) is softmax(scale · scores[0..q]), zeros after q.
std::vector<double> causal_softmax_oracle(const std::vector<float>& scores, std::size_t t_count,
                                          double scale) {
    std::vector<double> y(scores.size(), 0.0);
    for (std::size_t row = 0; row < scores.size() / t_count; ++row) {
        const std::size_t query = row % t_count;
        const float* x = scores.data() + row * t_count;
        double max = -std::numeric_limits<double>::infinity();
        for (std::size_t k = 0; k <= query; ++k)
            max = std::max(max, scale * x[k]);
        double sum = 0.0;
        for (std::size_t k = 0; k <= query; ++k)
            sum += std::exp(scale * x[k] - max);
        for (std::size_t k = 0; k <= query; ++k) {
            y[row * t_count + k] = std::exp(scale * x[k] - max) / sum;
        }
    }
    return y;
}

std::vector<float> to_float(const std::vector<double>& values) {
    std::vector<float> result(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
        result[i] = static_cast<float>(values[i]);
    return result;
}

bool is_positive_zero(float value) {
    return value == 0.0F && !std::signbit(value);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// softmax

TEST(Softmax, MatchesDoubleOracleOnEveryAxisOfRank3Tensor) {
    const Shape shape{3, 4, 5};
    const std::vector<float> values = pseudo_random(60, -3.0F, 3.0F);
    const Tensor x(shape, values);
    for (std::size_t axis = 0; axis < 3; ++axis) {
        const Tensor y = tensor_ops::softmax(x, axis);
        EXPECT_EQ(y.shape(), shape);
        EXPECT_TRUE(all_close(y, softmax_oracle(values, shape, axis))) << "axis " << axis;
    }
}

TEST(Softmax, HandComputedRow) {
    // softmax([0, ln 2, ln 5]) = [1, 2, 5]/8.
    const Tensor x({1, 3}, {0.0F, 0.693147180559945F, 1.6094379124341F});
    EXPECT_TRUE(all_close(tensor_ops::softmax(x, 1), {0.125, 0.25, 0.625}));
    // Along axis 0 every slice has one element: exactly 1.
    const Tensor y = tensor_ops::softmax(x, 0);
    EXPECT_TRUE(bit_identical(y.to_host(), {1.0F, 1.0F, 1.0F}));
}

TEST(Softmax, EverySliceSumsToOne) {
    const Shape shape{2, 6, 3};
    const Tensor x(shape, pseudo_random(36, -10.0F, 10.0F, 99U));
    for (std::size_t axis = 0; axis < 3; ++axis) {
        const std::vector<float> y = tensor_ops::softmax(x, axis).to_host();
        const AxisView view = view_of(shape, axis);
        for (std::size_t o = 0; o < view.outer; ++o) {
            for (std::size_t i = 0; i < view.inner; ++i) {
                double sum = 0.0;
                for (std::size_t e = 0; e < view.extent; ++e) {
                    sum += y[o * view.extent * view.inner + i + e * view.inner];
                }
                EXPECT_NEAR(sum, 1.0, 1e-6) << "axis " << axis << " slice " << o << "," << i;
            }
        }
    }
}

TEST(Softmax, WorksOnRankOneTensor) {
    const std::vector<float> values = {0.5F, -1.0F, 2.0F, 0.0F, 3.5F};
    const Tensor y = tensor_ops::softmax(Tensor({5}, values), 0);
    EXPECT_EQ(y.shape(), (Shape{5}));
    EXPECT_TRUE(all_close(y, softmax_oracle(values, {5}, 0)));
}

TEST(Softmax, NegativeInfinityEntriesGiveExactZero) {
    // Row 0 masks two keys; row 1 masks one; along axis 0 too (the strided path).
    const Shape shape{2, 4};
    const std::vector<float> values = {1.0F,      -infinity, 2.0F,  -infinity,
                                       -infinity, 0.5F,      0.25F, -1.0F};
    const Tensor x(shape, values);
    const std::vector<float> y = tensor_ops::softmax(x, 1).to_host();
    for (const std::size_t masked : {1U, 3U, 4U}) {
        EXPECT_TRUE(is_positive_zero(y[masked])) << "element " << masked << " = " << y[masked];
    }
    EXPECT_TRUE(all_close(y, softmax_oracle(values, shape, 1)));

    const Shape column_shape{4, 2};  // axis 0 slices have inner stride 2
    const std::vector<float> columns = {1.0F, -infinity, -infinity, 0.5F,
                                        2.0F, 0.25F,     -infinity, -1.0F};
    const std::vector<float> z = tensor_ops::softmax(Tensor(column_shape, columns), 0).to_host();
    for (const std::size_t masked : {1U, 2U, 6U}) {
        EXPECT_TRUE(is_positive_zero(z[masked])) << "element " << masked << " = " << z[masked];
    }
    EXPECT_TRUE(all_close(z, softmax_oracle(columns, column_shape, 0)));
}

TEST(Softmax, SingleFiniteEntryAmongNegativeInfinitiesGivesExactOne) {
    const Tensor x({1, 4}, {-infinity, -infinity, -12.0F, -infinity});
    EXPECT_TRUE(bit_identical(tensor_ops::softmax(x, 1).to_host(), {0.0F, 0.0F, 1.0F, 0.0F}));
}

TEST(Softmax, RejectsSliceWithNaNWithoutChangingInput) {
    for (std::size_t axis = 0; axis < 3; ++axis) {
        std::vector<float> values = pseudo_random(24);
        values[13] = quiet_nan;
        const Tensor x({2, 3, 4}, values);
        const std::vector<float> before = x.to_host();
        EXPECT_THROW(static_cast<void>(tensor_ops::softmax(x, axis)), std::domain_error)
            << "axis " << axis;
        EXPECT_TRUE(bit_identical(x.to_host(), before));
    }
}

TEST(Softmax, RejectsSliceWithPositiveInfinityWithoutChangingInput) {
    for (std::size_t axis = 0; axis < 3; ++axis) {
        std::vector<float> values = pseudo_random(24);
        values[22] = infinity;
        const Tensor x({2, 3, 4}, values);
        const std::vector<float> before = x.to_host();
        EXPECT_THROW(static_cast<void>(tensor_ops::softmax(x, axis)), std::domain_error)
            << "axis " << axis;
        EXPECT_TRUE(bit_identical(x.to_host(), before));
    }
}

TEST(Softmax, RejectsSliceThatIsEntirelyNegativeInfinityWithoutChangingInput) {
    // Row 1 of [3,4] is all −inf (axis 1); column 2 of the same layout is all −inf (axis 0).
    std::vector<float> values = pseudo_random(12);
    for (std::size_t j = 0; j < 4; ++j)
        values[4 + j] = -infinity;
    const Tensor rows({3, 4}, values);
    const std::vector<float> before = rows.to_host();
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(rows, 1)), std::domain_error);
    EXPECT_TRUE(bit_identical(rows.to_host(), before));
    // Along axis 0 each slice still has finite values: accepted.
    EXPECT_NO_THROW(static_cast<void>(tensor_ops::softmax(rows, 0)));

    std::vector<float> column_values = pseudo_random(12);
    for (std::size_t i = 0; i < 3; ++i)
        column_values[i * 4 + 2] = -infinity;
    const Tensor columns({3, 4}, column_values);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(columns, 0)), std::domain_error);
    EXPECT_TRUE(bit_identical(columns.to_host(), column_values));
}

TEST(Softmax, RejectsAxisAtOrBeyondRank) {
    const Tensor x({2, 3, 4}, 0.5F);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(x, 3)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(x, 100)), std::out_of_range);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(Tensor::scalar(1.0F), 0)),
                 std::out_of_range);
}

TEST(Softmax, RejectsSingularInput) {
    const Tensor singular;
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(singular, 0)), std::logic_error);
}

TEST(Softmax, StableForLargeMagnitudeLogits) {
    // A 2e4 spread: naive exp would overflow to inf (and underflow to 0 for the whole row).
    const Shape shape{2, 5};
    const std::vector<float> values = {1e4F,  9999.0F,  9998.0F, -1e4F,    0.0F,
                                       -1e4F, -9999.0F, -1e4F,   -9998.5F, -1e4F};
    const Tensor x(shape, values);
    const std::vector<float> y = tensor_ops::softmax(x, 1).to_host();
    for (const float value : y)
        EXPECT_TRUE(std::isfinite(value));
    EXPECT_TRUE(all_close(y, softmax_oracle(values, shape, 1)));
    // Shifting a row by a constant does not change it.
    const Tensor shifted({1, 3}, {1e4F, 1e4F + 1.0F, 1e4F + 2.0F});
    EXPECT_TRUE(
        all_close(tensor_ops::softmax(shifted, 1), softmax_oracle({0.0F, 1.0F, 2.0F}, {1, 3}, 1)));
}

TEST(Softmax, ExtremeFiniteLogitsGiveExactZeroAndOne) {
    // x − max = −6e38 rounds to −inf in float; the result must still be [0, 1], not NaN.
    const Tensor x({1, 2}, {-3e38F, 3e38F});
    EXPECT_TRUE(bit_identical(tensor_ops::softmax(x, 1).to_host(), {0.0F, 1.0F}));
}

TEST(Softmax, RejectsSingleElementSliceOfNegativeInfinity) {
    // Along an axis of extent 1 the slice is just the element: −inf there has no finite value.
    const Tensor x({2, 1}, {0.5F, -infinity});
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(x, 1)), std::domain_error);
    EXPECT_TRUE(bit_identical(tensor_ops::softmax(x, 0).to_host(), {1.0F, 0.0F}));
}

TEST(Softmax, LargeThreadedCaseMatchesOracleAndIsThreadCountIndependent) {
    const testing::ThreadCountGuard guard;
    // Last axis ([256,1024]) and a strided middle axis ([64,128,8]) both cross the threading
    // threshold.
    const std::vector<std::pair<Shape, std::size_t>> cases = {{{256, 1024}, 1}, {{64, 128, 8}, 1}};
    for (const auto& [shape, axis] : cases) {
        const std::size_t count = checked_element_count(shape);
        const std::vector<float> values = pseudo_random(count, -6.0F, 6.0F, 7U);
        const Tensor x(shape, values);
        set_cpu_thread_count(1);
        const std::vector<float> serial = tensor_ops::softmax(x, axis).to_host();
        set_cpu_thread_count(2);
        const std::vector<float> two = tensor_ops::softmax(x, axis).to_host();
        set_cpu_thread_count(3);
        const std::vector<float> three = tensor_ops::softmax(x, axis).to_host();
        EXPECT_TRUE(all_close(serial, softmax_oracle(values, shape, axis)));
        EXPECT_TRUE(bit_identical(serial, two));
        EXPECT_TRUE(bit_identical(serial, three));
    }
}

TEST(Softmax, ReportsFailureInLargeThreadedInput) {
    const testing::ThreadCountGuard guard;
    set_cpu_thread_count(2);
    std::vector<float> values = pseudo_random(256 * 1024);
    values[200 * 1024 + 17] = quiet_nan;  // a row owned by the second thread
    const Tensor x({256, 1024}, values);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax(x, 1)), std::domain_error);
    EXPECT_TRUE(bit_identical(x.to_host(), values));
}

// ---------------------------------------------------------------------------------------------
// softmax_backward

TEST(SoftmaxBackward, MatchesDoubleOracleOnEveryAxis) {
    const Shape shape{3, 4, 5};
    const std::vector<float> logits = pseudo_random(60, -2.0F, 2.0F, 3U);
    const std::vector<float> upstream = pseudo_random(60, -1.0F, 1.0F, 4U);
    for (std::size_t axis = 0; axis < 3; ++axis) {
        const std::vector<float> p = to_float(softmax_oracle(logits, shape, axis));
        const Tensor dx =
            tensor_ops::softmax_backward(Tensor(shape, p), Tensor(shape, upstream), axis);
        EXPECT_EQ(dx.shape(), shape);
        EXPECT_TRUE(all_close(dx, softmax_backward_oracle(p, upstream, shape, axis)))
            << "axis " << axis;
    }
}

TEST(SoftmaxBackward, HandComputedExample) {
    // p = [0.25, 0.75], g = [1, 3]: Σ g p = 2.5, dx = [0.25·(−1.5), 0.75·0.5] = [−0.375, 0.375].
    const Tensor dx = tensor_ops::softmax_backward(Tensor({1, 2}, {0.25F, 0.75F}),
                                                   Tensor({1, 2}, {1.0F, 3.0F}), 1);
    EXPECT_TRUE(all_close(dx, {-0.375, 0.375}));
}

TEST(SoftmaxBackward, MatchesFiniteDifferencesOfWeightedSumOnEveryAxis) {
    // Objective f(x) = Σ w ⊙ softmax(x, axis); its gradient is softmax_backward(p, w, axis).
    const Shape shape{2, 3, 4};
    const std::vector<float> x = pseudo_random(24, -2.0F, 2.0F, 11U);
    const std::vector<float> w = pseudo_random(24, -1.0F, 1.0F, 12U);
    for (std::size_t axis = 0; axis < 3; ++axis) {
        const auto objective = [&](const std::vector<float>& input) {
            return testing::inner_product(tensor_ops::softmax(Tensor(shape, input), axis).to_host(),
                                          w);
        };
        const Tensor p = tensor_ops::softmax(Tensor(shape, x), axis);
        const Tensor dx = tensor_ops::softmax_backward(p, Tensor(shape, w), axis);
        EXPECT_TRUE(all_close(dx, finite_difference_gradient(objective, x, 1e-2), 5e-3, 5e-3))
            << "axis " << axis << ", eps 1e-2";
        EXPECT_TRUE(all_close(dx, finite_difference_gradient(objective, x, 1e-3), 2e-3, 2e-3))
            << "axis " << axis << ", eps 1e-3";
    }
}

TEST(SoftmaxBackward, RejectsShapeMismatch) {
    const Tensor p({2, 3}, 1.0F / 3.0F);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax_backward(p, Tensor({3, 2}, 1.0F), 1)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax_backward(p, Tensor({6}, 1.0F), 0)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax_backward(p, Tensor({2, 3, 1}, 1.0F), 1)),
                 std::invalid_argument);
}

TEST(SoftmaxBackward, RejectsAxisAtOrBeyondRank) {
    const Tensor p({2, 3}, 1.0F / 3.0F);
    EXPECT_THROW(static_cast<void>(tensor_ops::softmax_backward(p, p, 2)), std::out_of_range);
}

TEST(SoftmaxBackward, LargeThreadedCaseIsThreadCountIndependent) {
    const testing::ThreadCountGuard guard;
    const Shape shape{64, 128, 8};
    const std::vector<float> logits = pseudo_random(64 * 128 * 8, -3.0F, 3.0F, 5U);
    const std::vector<float> upstream = pseudo_random(64 * 128 * 8, -1.0F, 1.0F, 6U);
    for (const std::size_t axis : {1U, 2U}) {
        const std::vector<float> p = to_float(softmax_oracle(logits, shape, axis));
        const Tensor pt(shape, p);
        const Tensor gt(shape, upstream);
        set_cpu_thread_count(1);
        const std::vector<float> serial = tensor_ops::softmax_backward(pt, gt, axis).to_host();
        set_cpu_thread_count(2);
        const std::vector<float> threaded = tensor_ops::softmax_backward(pt, gt, axis).to_host();
        EXPECT_TRUE(all_close(serial, softmax_backward_oracle(p, upstream, shape, axis)));
        EXPECT_TRUE(bit_identical(serial, threaded));
    }
}

// ---------------------------------------------------------------------------------------------
// causal_softmax

TEST(CausalSoftmax, VisibleKeysMatchScaledSoftmaxAndFutureKeysAreExactZero) {
    constexpr std::size_t t_count = 5;
    const Shape shape{2, 3, t_count, t_count};
    const std::vector<float> scores = pseudo_random(2 * 3 * t_count * t_count, -4.0F, 4.0F, 21U);
    constexpr float scale = 0.35F;
    const std::vector<float> y = tensor_ops::causal_softmax(Tensor(shape, scores), scale).to_host();
    ASSERT_EQ(y.size(), scores.size());
    EXPECT_TRUE(all_close(y, causal_softmax_oracle(scores, t_count, scale)));
    for (std::size_t row = 0; row < scores.size() / t_count; ++row) {
        const std::size_t query = row % t_count;
        for (std::size_t key = query + 1; key < t_count; ++key) {
            EXPECT_TRUE(is_positive_zero(y[row * t_count + key]))
                << "row " << row << " key " << key << " = " << y[row * t_count + key];
        }
    }
}

TEST(CausalSoftmax, HandComputedSingleHead) {
    // T = 2, scale 0.5: row 0 sees only key 0 -> [1, 0]; row 1 = softmax(0.5·[0, 2·ln 3]) =
    // softmax([0, ln 3]) = [0.25, 0.75].
    const Tensor scores({1, 1, 2, 2}, {7.0F, -3.0F, 0.0F, 2.1972245773362196F});
    EXPECT_TRUE(all_close(tensor_ops::causal_softmax(scores, 0.5F), {1.0, 0.0, 0.25, 0.75}));
}

TEST(CausalSoftmax, DefaultScaleIsOne) {
    const Shape shape{1, 2, 3, 3};
    const std::vector<float> scores = pseudo_random(18, -2.0F, 2.0F, 8U);
    EXPECT_TRUE(all_close(tensor_ops::causal_softmax(Tensor(shape, scores)),
                          causal_softmax_oracle(scores, 3, 1.0)));
}

TEST(CausalSoftmax, SingleTokenGivesProbabilityOne) {
    const Tensor scores({2, 3, 1, 1}, {-5.0F, 0.0F, 3.0F, 1e4F, -1e4F, 0.25F});
    const Tensor y = tensor_ops::causal_softmax(scores, 0.125F);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
    EXPECT_TRUE(all_close(y, std::vector<double>(6, 1.0)));
}

TEST(CausalSoftmax, LargeScaledScoresStayStable) {
    const Tensor scores({1, 1, 3, 3},
                        {1e4F, 0.0F, 0.0F, -1e4F, 1e4F, 0.0F, 3e4F, -3e4F, 2.9999e4F});
    const std::vector<float> y = tensor_ops::causal_softmax(scores, 4.0F).to_host();
    for (const float value : y)
        EXPECT_TRUE(std::isfinite(value));
    EXPECT_TRUE(all_close(y, causal_softmax_oracle(scores.to_host(), 3, 4.0)));
}

TEST(CausalSoftmax, ScaledScoresBeyondFloatRangeStillGiveProbabilities) {
    // Finite scores and a finite positive scale are valid inputs even when scale · score
    // exceeds FLT_MAX: softmax(2·[3e38, 0]) = [1, 0] (computable stably as scale·(x − max)).
    // The result must be these probabilities, never NaN.
    const Tensor scores({1, 1, 2, 2}, {3e38F, 0.0F, 3e38F, 0.0F});
    const std::vector<float> y = tensor_ops::causal_softmax(scores, 2.0F).to_host();
    EXPECT_TRUE(all_close(y, {1.0, 0.0, 1.0, 0.0}));
}

TEST(CausalSoftmax, RejectsNonSquareScores) {
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(Tensor({1, 1, 3, 4}, 0.0F))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(Tensor({1, 1, 4, 3}, 0.0F))),
                 std::invalid_argument);
}

TEST(CausalSoftmax, RejectsRankOtherThanFour) {
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(Tensor({3, 3}, 0.0F))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(Tensor({2, 3, 3}, 0.0F))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(Tensor({1, 1, 1, 3, 3}, 0.0F))),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(Tensor::scalar(0.0F))),
                 std::invalid_argument);
}

TEST(CausalSoftmax, RejectsScaleThatIsNotFiniteAndPositive) {
    const Tensor scores({1, 1, 2, 2}, 0.5F);
    for (const float scale : {0.0F, -0.0F, -1.0F, -1e-30F, infinity, -infinity, quiet_nan}) {
        EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(scores, scale)),
                     std::invalid_argument)
            << "scale " << scale;
    }
}

TEST(CausalSoftmax, RejectsNaNInVisibleScoreWithoutChangingInput) {
    std::vector<float> values = pseudo_random(2 * 4 * 4);
    values[16 + 2 * 4 + 1] = quiet_nan;  // head 1, query 2, key 1: visible
    const Tensor scores({1, 2, 4, 4}, values);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(scores, 0.5F)), std::domain_error);
    EXPECT_TRUE(bit_identical(scores.to_host(), values));
}

TEST(CausalSoftmax, RejectsPositiveInfinityInVisibleScoreWithoutChangingInput) {
    std::vector<float> values = pseudo_random(2 * 4 * 4);
    values[3 * 4 + 3] = infinity;  // head 0, query 3, key 3 (the diagonal is visible)
    const Tensor scores({1, 2, 4, 4}, values);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(scores, 0.5F)), std::domain_error);
    EXPECT_TRUE(bit_identical(scores.to_host(), values));
}

TEST(CausalSoftmax, RejectsQueryWhoseVisibleScoresAreAllNegativeInfinity) {
    std::vector<float> values = pseudo_random(3 * 3);
    values[3] = -infinity;  // query 1 sees keys 0 and 1, both −inf; its future key stays finite
    values[4] = -infinity;
    const Tensor scores({1, 1, 3, 3}, values);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax(scores)), std::domain_error);
    EXPECT_TRUE(bit_identical(scores.to_host(), values));
}

TEST(CausalSoftmax, NegativeInfinityInVisibleScoreGivesExactZero) {
    std::vector<float> values = pseudo_random(3 * 3, -1.0F, 1.0F, 31U);
    values[2 * 3 + 1] = -infinity;  // query 2, key 1
    const Tensor scores({1, 1, 3, 3}, values);
    const std::vector<float> y = tensor_ops::causal_softmax(scores, 2.0F).to_host();
    EXPECT_TRUE(is_positive_zero(y[2 * 3 + 1]));
    EXPECT_TRUE(all_close(y, causal_softmax_oracle(values, 3, 2.0)));
}

TEST(CausalSoftmax, IgnoresNaNAndInfinityInMaskedPositions) {
    // Future scores never influence the result: poisoned future entries give bit-identical
    // probabilities, with the masked outputs still exactly 0.
    constexpr std::size_t t_count = 4;
    const Shape shape{2, 1, t_count, t_count};
    const std::vector<float> clean = pseudo_random(2 * t_count * t_count, -2.0F, 2.0F, 41U);
    std::vector<float> poisoned = clean;
    for (std::size_t row = 0; row < 2 * t_count; ++row) {
        const std::size_t query = row % t_count;
        for (std::size_t key = query + 1; key < t_count; ++key) {
            poisoned[row * t_count + key] = (key + row) % 3 == 0   ? quiet_nan
                                            : (key + row) % 3 == 1 ? infinity
                                                                   : -infinity;
        }
    }
    std::vector<float> y;
    ASSERT_NO_THROW(y = tensor_ops::causal_softmax(Tensor(shape, poisoned), 0.7F).to_host());
    EXPECT_TRUE(bit_identical(y, tensor_ops::causal_softmax(Tensor(shape, clean), 0.7F).to_host()));
    for (std::size_t row = 0; row < 2 * t_count; ++row) {
        for (std::size_t key = row % t_count + 1; key < t_count; ++key) {
            EXPECT_TRUE(is_positive_zero(y[row * t_count + key]));
        }
    }
    EXPECT_TRUE(all_close(y, causal_softmax_oracle(clean, t_count, 0.7)));
}

TEST(CausalSoftmax, EarlierQueriesAreBitIdenticalWhenLaterScoresChange) {
    // Causality: changing every score of query 3 leaves queries 0..2 bit-identical.
    constexpr std::size_t t_count = 4;
    const Shape shape{1, 1, t_count, t_count};
    const std::vector<float> before = pseudo_random(16, -3.0F, 3.0F, 51U);
    std::vector<float> after = before;
    for (std::size_t key = 0; key < t_count; ++key)
        after[3 * t_count + key] += 1.5F;
    const std::vector<float> y0 = tensor_ops::causal_softmax(Tensor(shape, before)).to_host();
    const std::vector<float> y1 = tensor_ops::causal_softmax(Tensor(shape, after)).to_host();
    EXPECT_TRUE(bit_identical(std::vector<float>(y0.begin(), y0.begin() + 12),
                              std::vector<float>(y1.begin(), y1.begin() + 12)));
}

TEST(CausalSoftmax, LargeThreadedCaseMatchesOracleAndIsThreadCountIndependent) {
    const testing::ThreadCountGuard guard;
    constexpr std::size_t t_count = 64;
    const Shape shape{2, 8, t_count, t_count};
    const std::vector<float> scores = pseudo_random(2 * 8 * t_count * t_count, -5.0F, 5.0F, 61U);
    const Tensor x(shape, scores);
    set_cpu_thread_count(1);
    const std::vector<float> serial = tensor_ops::causal_softmax(x, 0.125F).to_host();
    set_cpu_thread_count(2);
    const std::vector<float> threaded = tensor_ops::causal_softmax(x, 0.125F).to_host();
    EXPECT_TRUE(all_close(serial, causal_softmax_oracle(scores, t_count, 0.125)));
    EXPECT_TRUE(bit_identical(serial, threaded));
}

// ---------------------------------------------------------------------------------------------
// causal_softmax_backward

TEST(CausalSoftmaxBackward, MatchesScaledOracleAndZeroesMaskedEntries) {
    // d scores = scale · p ⊙ (g − Σ_visible g ⊙ p); the upstream is nonzero in masked positions
    // too, and they must still come out exactly 0.
    constexpr std::size_t t_count = 4;
    const Shape shape{2, 2, t_count, t_count};
    const std::vector<float> scores = pseudo_random(64, -2.0F, 2.0F, 71U);
    const std::vector<float> upstream = pseudo_random(64, -1.0F, 1.0F, 72U);
    constexpr float scale = 1.75F;
    const std::vector<float> p = to_float(causal_softmax_oracle(scores, t_count, scale));
    const std::vector<float> dx =
        tensor_ops::causal_softmax_backward(Tensor(shape, p), Tensor(shape, upstream), scale)
            .to_host();
    std::vector<double> expected(64, 0.0);
    for (std::size_t row = 0; row < 16; ++row) {
        const std::size_t query = row % t_count;
        double dot = 0.0;
        for (std::size_t k = 0; k <= query; ++k) {
            dot += static_cast<double>(upstream[row * t_count + k]) * p[row * t_count + k];
        }
        for (std::size_t k = 0; k <= query; ++k) {
            const std::size_t i = row * t_count + k;
            expected[i] = scale * static_cast<double>(p[i]) * (upstream[i] - dot);
        }
        for (std::size_t k = query + 1; k < t_count; ++k) {
            EXPECT_TRUE(is_positive_zero(dx[row * t_count + k])) << "row " << row << " key " << k;
        }
    }
    EXPECT_TRUE(all_close(dx, expected));
}

TEST(CausalSoftmaxBackward, MatchesFiniteDifferencesIncludingScale) {
    // Objective f(s) = Σ w ⊙ causal_softmax(s, scale): its gradient is
    // causal_softmax_backward(p, w, scale), and is exactly 0 at masked scores.
    constexpr std::size_t t_count = 4;
    const Shape shape{1, 2, t_count, t_count};
    const std::vector<float> scores = pseudo_random(32, -1.5F, 1.5F, 81U);
    const std::vector<float> w = pseudo_random(32, -1.0F, 1.0F, 82U);
    for (const float scale : {0.5F, 1.0F, 2.5F}) {
        const auto objective = [&](const std::vector<float>& input) {
            return testing::inner_product(
                tensor_ops::causal_softmax(Tensor(shape, input), scale).to_host(), w);
        };
        const Tensor p = tensor_ops::causal_softmax(Tensor(shape, scores), scale);
        const Tensor dx = tensor_ops::causal_softmax_backward(p, Tensor(shape, w), scale);
        EXPECT_TRUE(all_close(dx, finite_difference_gradient(objective, scores, 1e-2), 5e-3, 5e-3))
            << "scale " << scale << ", eps 1e-2";
        EXPECT_TRUE(all_close(dx, finite_difference_gradient(objective, scores, 1e-3), 2e-3, 2e-3))
            << "scale " << scale << ", eps 1e-3";
        const std::vector<float> gradient = dx.to_host();
        for (std::size_t row = 0; row < 2 * t_count; ++row) {
            for (std::size_t key = row % t_count + 1; key < t_count; ++key) {
                EXPECT_TRUE(is_positive_zero(gradient[row * t_count + key]))
                    << "scale " << scale << " row " << row << " key " << key;
            }
        }
    }
}

TEST(CausalSoftmaxBackward, SingleTokenHasZeroGradient) {
    // T = 1: p = 1 and d score = scale · 1 · (g − g) = 0.
    const Tensor p({1, 2, 1, 1}, 1.0F);
    const Tensor g({1, 2, 1, 1}, {0.75F, -3.0F});
    EXPECT_TRUE(all_close(tensor_ops::causal_softmax_backward(p, g, 2.0F), {0.0, 0.0}));
}

TEST(CausalSoftmaxBackward, RejectsShapeMismatchAndBadShapes) {
    const Tensor p({1, 1, 3, 3}, 0.25F);
    EXPECT_THROW(
        static_cast<void>(tensor_ops::causal_softmax_backward(p, Tensor({1, 1, 4, 4}, 1.0F))),
        std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax_backward(p, Tensor({1, 3, 3}, 1.0F))),
                 std::invalid_argument);
    const Tensor non_square({1, 1, 2, 3}, 0.25F);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax_backward(non_square, non_square)),
                 std::invalid_argument);
    const Tensor rank3({1, 3, 3}, 0.25F);
    EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax_backward(rank3, rank3)),
                 std::invalid_argument);
}

TEST(CausalSoftmaxBackward, RejectsScaleThatIsNotFiniteAndPositive) {
    const Tensor p({1, 1, 2, 2}, 0.5F);
    for (const float scale : {0.0F, -2.0F, infinity, quiet_nan}) {
        EXPECT_THROW(static_cast<void>(tensor_ops::causal_softmax_backward(p, p, scale)),
                     std::invalid_argument)
            << "scale " << scale;
    }
}

}  // namespace riftco_transformer
