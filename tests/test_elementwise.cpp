// Elementwise operations (docs/ARCHITECTURE.md, 'Tensor operations'): binary arithmetic with
// identical shapes, the value-domain rules of divide/log/sqrt, exp/erf/GELU/ReLU/SiLU forward
// values against double-precision std:: functions, their backward forms against analytic
// derivatives and centred finite differences, and the IEEE edge cases the header documents.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

namespace ops = tensor_ops;

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr float quiet_nan = std::numeric_limits<float>::quiet_NaN();

Tensor vector_of(const std::vector<float>& values) {
    return Tensor({values.size()}, std::span<const float>(values));
}

// Values of `f` (double) at every element of x.
template <typename Function>
std::vector<double> map_double(const std::vector<float>& x, Function f) {
    std::vector<double> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        out[i] = f(static_cast<double>(x[i]));
    return out;
}

double gelu_reference(double x) {
    return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
}

double gelu_derivative_reference(double x) {
    const double density = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
    return 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2)) + x * density;
}

// GPT-2's tanh form, in double, written as the paper gives it (not through σ).
double gelu_tanh_reference(double x) {
    const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
}

double gelu_tanh_derivative_reference(double x) {
    const double c = std::sqrt(2.0 / std::numbers::pi);
    const double t = std::tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

double sigmoid_reference(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}

double silu_reference(double x) {
    return x * sigmoid_reference(x);
}

double silu_derivative_reference(double x) {
    const double s = sigmoid_reference(x);
    return s * (1.0 + x * (1.0 - s));
}

// Σ_i w_i · f(x)_i in double: a scalar whose gradient is w ⊙ f'(x).
template <typename Forward>
std::function<double(const std::vector<float>&)> weighted_sum_of(Forward forward,
                                                                 const std::vector<float>& w) {
    return [forward, w](const std::vector<float>& x) {
        const std::vector<float> y = forward(vector_of(x)).to_host();
        double total = 0.0;
        for (std::size_t i = 0; i < y.size(); ++i)
            total += static_cast<double>(w[i]) * y[i];
        return total;
    };
}

std::vector<double> hadamard(const std::vector<float>& w, const std::vector<double>& d) {
    std::vector<double> out(w.size());
    for (std::size_t i = 0; i < w.size(); ++i)
        out[i] = w[i] * d[i];
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Binary arithmetic

TEST(Add, AddsElementByElement) {
    const Tensor left({2, 2}, {1.0F, -2.0F, 0.5F, 100.0F});
    const Tensor right({2, 2}, {3.0F, 2.0F, 0.25F, -50.0F});
    const Tensor sum = ops::add(left, right);
    EXPECT_EQ(sum.shape(), (Shape{2, 2}));
    EXPECT_TRUE(testing::all_close(sum, {4.0, 0.0, 0.75, 50.0}));
}

TEST(Subtract, SubtractsElementByElement) {
    const Tensor left({3}, {1.0F, -2.0F, 0.5F});
    const Tensor right({3}, {3.0F, -2.0F, 0.25F});
    EXPECT_TRUE(testing::all_close(ops::subtract(left, right), {-2.0, 0.0, 0.25}));
}

TEST(Multiply, MultipliesElementByElement) {
    const Tensor left({4}, {1.5F, -2.0F, 0.0F, 1e10F});
    const Tensor right({4}, {2.0F, -3.0F, 5.0F, 1e10F});
    EXPECT_TRUE(testing::all_close(ops::multiply(left, right), {3.0, 6.0, 0.0, 1e20}));
}

TEST(Divide, DividesElementByElement) {
    const Tensor numerator({4}, {1.0F, -3.0F, 0.0F, 7.0F});
    const Tensor denominator({4}, {4.0F, 2.0F, 5.0F, -0.5F});
    EXPECT_TRUE(testing::all_close(ops::divide(numerator, denominator), {0.25, -1.5, 0.0, -14.0}));
}

TEST(Divide, TinyNonZeroDenominatorIsAllowed) {
    const float tiny = std::numeric_limits<float>::denorm_min();
    const Tensor result = ops::divide(Tensor({2}, {0.0F, 1.0F}), Tensor({2}, {tiny, 1e30F}));
    EXPECT_TRUE(testing::all_close(result, {0.0, 1e-30}));
}

TEST(Divide, RejectsZeroDenominatorWithoutChangingInputs) {
    const std::vector<float> numerator_values = {1.0F, 2.0F, 3.0F};
    const std::vector<float> denominator_values = {1.0F, 0.0F, 2.0F};
    const Tensor numerator = vector_of(numerator_values);
    const Tensor denominator = vector_of(denominator_values);
    EXPECT_THROW(static_cast<void>(ops::divide(numerator, denominator)), std::domain_error);
    EXPECT_TRUE(testing::bit_identical(numerator.to_host(), numerator_values));
    EXPECT_TRUE(testing::bit_identical(denominator.to_host(), denominator_values));
}

TEST(Divide, RejectsNegativeZeroDenominator) {
    EXPECT_THROW(static_cast<void>(ops::divide(vector_of({1.0F, 1.0F}), vector_of({1.0F, -0.0F}))),
                 std::domain_error);
}

TEST(Divide, RejectsZeroNumeratorOverZero) {
    EXPECT_THROW(static_cast<void>(ops::divide(vector_of({0.0F}), vector_of({0.0F}))),
                 std::domain_error);
}

TEST(Divide, RejectsASingleZeroAtTheEndOfALargeDenominator) {
    std::vector<float> denominator(100003, 2.0F);
    denominator.back() = 0.0F;
    const std::vector<float> numerator(denominator.size(), 1.0F);
    EXPECT_THROW(static_cast<void>(ops::divide(vector_of(numerator), vector_of(denominator))),
                 std::domain_error);
}

TEST(BinaryElementwise, ShapeMismatchIsInvalidArgumentWithoutChangingInputs) {
    const std::vector<float> six = {1, 2, 3, 4, 5, 6};
    const Tensor a({2, 3}, std::span<const float>(six));
    const Tensor b({3, 2}, std::span<const float>(six));  // same element count, other shape
    const Tensor c({6}, std::span<const float>(six));
    const Tensor row({1, 3}, {1.0F, 2.0F, 3.0F});  // would broadcast, but there is none
    EXPECT_THROW(static_cast<void>(ops::add(a, b)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::subtract(a, c)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::multiply(a, row)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::divide(c, a)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::add(Tensor::scalar(1.0F), a)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(a.to_host(), six));
    EXPECT_TRUE(testing::bit_identical(b.to_host(), six));
    EXPECT_TRUE(testing::bit_identical(c.to_host(), six));
}

TEST(BinaryElementwise, ShapeMismatchIsReportedBeforeAZeroDenominator) {
    EXPECT_THROW(static_cast<void>(ops::divide(vector_of({1.0F}), vector_of({0.0F, 0.0F}))),
                 std::invalid_argument);
}

TEST(BinaryElementwise, ScalarsCombine) {
    EXPECT_EQ(ops::add(Tensor::scalar(1.5F), Tensor::scalar(2.0F)).item(), 3.5F);
    EXPECT_EQ(ops::divide(Tensor::scalar(1.0F), Tensor::scalar(4.0F)).shape(), Shape{});
}

TEST(BinaryElementwise, LargeInputsMatchTheDoubleOracle) {
    const std::size_t count = 300007;  // spans several threads, odd tail
    const std::vector<float> a = testing::pseudo_random(count, -4.0F, 4.0F, 3U);
    const std::vector<float> b = testing::pseudo_random(count, 0.5F, 4.0F, 4U);
    std::vector<double> sum(count), difference(count), product(count), quotient(count);
    for (std::size_t i = 0; i < count; ++i) {
        sum[i] = static_cast<double>(a[i]) + b[i];
        difference[i] = static_cast<double>(a[i]) - b[i];
        product[i] = static_cast<double>(a[i]) * b[i];
        quotient[i] = static_cast<double>(a[i]) / b[i];
    }
    const Tensor left = vector_of(a);
    const Tensor right = vector_of(b);
    EXPECT_TRUE(testing::all_close(ops::add(left, right), sum));
    EXPECT_TRUE(testing::all_close(ops::subtract(left, right), difference));
    EXPECT_TRUE(testing::all_close(ops::multiply(left, right), product));
    EXPECT_TRUE(testing::all_close(ops::divide(left, right), quotient));
}

// ---------------------------------------------------------------------------------------------
// negate, scale, add_scalar

TEST(Negate, FlipsTheSignIncludingZero) {
    const std::vector<float> out = ops::negate(vector_of({1.5F, -2.0F, 0.0F, infinity})).to_host();
    EXPECT_EQ(out[0], -1.5F);
    EXPECT_EQ(out[1], 2.0F);
    EXPECT_EQ(out[2], 0.0F);
    EXPECT_TRUE(std::signbit(out[2]));
    EXPECT_EQ(out[3], -infinity);
}

TEST(Scale, MultipliesByTheFactor) {
    EXPECT_TRUE(
        testing::all_close(ops::scale(vector_of({1.0F, -2.0F, 0.5F}), 3.0F), {3.0, -6.0, 1.5}));
    EXPECT_TRUE(testing::all_close(ops::scale(vector_of({1.0F, -2.0F}), 0.0F), {0.0, 0.0}));
}

TEST(Scale, NonFiniteFactorIsInvalidArgumentWithoutChangingInput) {
    const Tensor x = vector_of({1.0F, 2.0F});
    EXPECT_THROW(static_cast<void>(ops::scale(x, infinity)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::scale(x, -infinity)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::scale(x, quiet_nan)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1.0F, 2.0F}));
}

TEST(AddScalar, AddsTheAddend) {
    EXPECT_TRUE(testing::all_close(ops::add_scalar(vector_of({1.0F, -2.0F, 0.5F}), -0.5F),
                                   {0.5, -2.5, 0.0}));
}

TEST(AddScalar, NonFiniteAddendIsInvalidArgumentWithoutChangingInput) {
    const Tensor x = vector_of({1.0F, 2.0F});
    EXPECT_THROW(static_cast<void>(ops::add_scalar(x, infinity)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::add_scalar(x, -infinity)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::add_scalar(x, quiet_nan)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1.0F, 2.0F}));
}

// ---------------------------------------------------------------------------------------------
// exp

TEST(Exp, MatchesStdExpOverTheNormalRange) {
    std::vector<float> x = testing::pseudo_random(4001, -87.0F, 88.0F, 5U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 0.5F, 10.0F, -10.0F, 50.0F, 80.0F, 88.0F, -87.0F});
    const auto reference = [](double v) { return std::exp(v); };
    EXPECT_TRUE(testing::all_close(ops::exp(vector_of(x)), map_double(x, reference), 0.0, 1e-6));
}

TEST(Exp, ZeroGivesExactlyOne) {
    EXPECT_EQ(ops::exp(Tensor::scalar(0.0F)).item(), 1.0F);
}

TEST(Exp, NegativeInfinityGivesExactlyZero) {
    const float value = ops::exp(Tensor::scalar(-infinity)).item();
    EXPECT_EQ(value, 0.0F);
    EXPECT_FALSE(std::signbit(value));
}

TEST(Exp, OverflowGivesPositiveInfinity) {
    const std::vector<float> out = ops::exp(vector_of({100.0F, 89.0F, 1e30F, infinity})).to_host();
    for (const float value : out)
        EXPECT_EQ(value, infinity);
}

TEST(Exp, NaNPropagates) {
    EXPECT_TRUE(std::isnan(ops::exp(Tensor::scalar(quiet_nan)).item()));
}

TEST(Exp, MatchesStdExpNearTheFloatOverflowAndUnderflowLimits) {
    // e^x is a normal float for x in (ln FLT_MIN, ln FLT_MAX) ≈ (-87.3365, 88.7228): these
    // results are representable and must be accurate, not clamped to e^88 or e^-87.
    const std::vector<float> x = {88.1F, 88.3F, 88.5F, 88.7F, -87.1F, -87.2F, -87.3F};
    const std::vector<float> out = ops::exp(vector_of(x)).to_host();
    for (std::size_t i = 0; i < x.size(); ++i) {
        EXPECT_TRUE(testing::all_close({out[i]}, {std::exp(static_cast<double>(x[i]))}, 0.0, 1e-6))
            << "exp(" << x[i] << ")";
    }
}

// ---------------------------------------------------------------------------------------------
// log, sqrt

TEST(Log, MatchesStdLog) {
    const std::vector<float> x = {1.0F,  2.0F, 0.5F,  1e-30F,
                                  1e30F, 3.0F, 7.25F, std::numeric_limits<float>::denorm_min()};
    const auto reference = [](double v) { return std::log(v); };
    EXPECT_TRUE(testing::all_close(ops::log(vector_of(x)), map_double(x, reference)));
    EXPECT_EQ(ops::log(Tensor::scalar(1.0F)).item(), 0.0F);
    EXPECT_EQ(ops::log(Tensor::scalar(infinity)).item(), infinity);
}

TEST(Log, ZeroIsDomainErrorWithoutChangingInput) {
    const std::vector<float> values = {1.0F, 0.0F, 2.0F};
    const Tensor x = vector_of(values);
    EXPECT_THROW(static_cast<void>(ops::log(x)), std::domain_error);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
    EXPECT_THROW(static_cast<void>(ops::log(Tensor::scalar(-0.0F))), std::domain_error);
}

TEST(Log, NegativeIsDomainErrorWithoutChangingInput) {
    const std::vector<float> values = {1.0F, -1.0F};
    const Tensor x = vector_of(values);
    EXPECT_THROW(static_cast<void>(ops::log(x)), std::domain_error);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
    EXPECT_THROW(static_cast<void>(ops::log(Tensor::scalar(-infinity))), std::domain_error);
}

TEST(Log, NaNIsDomainError) {
    EXPECT_THROW(static_cast<void>(ops::log(vector_of({1.0F, quiet_nan}))), std::domain_error);
}

TEST(Sqrt, MatchesStdSqrtAndSqrtOfZeroIsZero) {
    const std::vector<float> x = {0.0F, 1.0F, 4.0F, 2.0F, 0.25F, 1e-30F, 1e30F};
    const auto reference = [](double v) { return std::sqrt(v); };
    EXPECT_TRUE(testing::all_close(ops::sqrt(vector_of(x)), map_double(x, reference)));
    EXPECT_EQ(ops::sqrt(Tensor::scalar(0.0F)).item(), 0.0F);
    EXPECT_EQ(ops::sqrt(Tensor::scalar(infinity)).item(), infinity);
}

TEST(Sqrt, NegativeIsDomainErrorWithoutChangingInput) {
    const std::vector<float> values = {4.0F, -1.0F};
    const Tensor x = vector_of(values);
    EXPECT_THROW(static_cast<void>(ops::sqrt(x)), std::domain_error);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
    EXPECT_THROW(static_cast<void>(ops::sqrt(Tensor::scalar(-1e-30F))), std::domain_error);
}

TEST(Sqrt, NaNIsDomainError) {
    EXPECT_THROW(static_cast<void>(ops::sqrt(vector_of({quiet_nan, 1.0F}))), std::domain_error);
}

TEST(Sqrt, ANegativeElementAnywhereInALargeInputIsDomainError) {
    std::vector<float> values(65537, 1.0F);
    values[40000] = -2.0F;
    EXPECT_THROW(static_cast<void>(ops::sqrt(vector_of(values))), std::domain_error);
}

// ---------------------------------------------------------------------------------------------
// erf

TEST(Erf, MatchesStdErf) {
    std::vector<float> x = testing::pseudo_random(2001, -6.0F, 6.0F, 6U);
    x.insert(x.end(), {0.0F, 0.5F, -0.5F, 1.0F, -3.0F, 10.0F, -10.0F});
    const auto reference = [](double v) { return std::erf(v); };
    EXPECT_TRUE(testing::all_close(ops::erf(vector_of(x)), map_double(x, reference)));
}

TEST(Erf, SaturatesAtInfinity) {
    EXPECT_TRUE(testing::all_close(ops::erf(vector_of({infinity, -infinity})), {1.0, -1.0}));
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh form (GPT-2)

TEST(GeluTanh, MatchesTheTanhFormula) {
    std::vector<float> x = testing::pseudo_random(2001, -8.0F, 8.0F, 17U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 0.5F, -0.5F, 2.0F, -2.0F, 3.0F, -3.0F, 1e-6F});
    EXPECT_TRUE(
        testing::all_close(ops::gelu_tanh(vector_of(x)), map_double(x, gelu_tanh_reference)));
}

TEST(GeluTanh, HandValuesDifferFromTheErfForm) {
    // u(1) = √(2/π)·1.044715 = 0.8335767; 0.5·(1 + tanh(u)) = 0.8411919906082768.
    // x = -1: -0.15880800939172324; x = 2: 1.954597694087775 (erf form: 0.84134, 1.95450).
    EXPECT_TRUE(testing::all_close(ops::gelu_tanh(vector_of({1.0F, -1.0F, 2.0F})),
                                   {0.8411919906082768, -0.15880800939172324, 1.954597694087775},
                                   1e-6, 1e-6));
    EXPECT_GT(std::abs(ops::gelu_tanh(vector_of({1.0F})).to_host()[0] -
                       ops::gelu(vector_of({1.0F})).to_host()[0]),
              1e-4F);
}

TEST(GeluTanh, LimitsAndNaN) {
    const std::vector<float> out =
        ops::gelu_tanh(vector_of({infinity, -infinity, 1e4F, -1e4F, 1e20F, -1e20F})).to_host();
    EXPECT_EQ(out[0], infinity);
    EXPECT_EQ(out[1], 0.0F);
    EXPECT_TRUE(std::signbit(out[1]));
    EXPECT_EQ(out[2], 1e4F);
    EXPECT_EQ(out[3], 0.0F);
    EXPECT_EQ(out[4], 1e20F);  // x³ overflows to inf inside; σ saturates to exactly 1
    EXPECT_EQ(out[5], 0.0F);
    EXPECT_TRUE(
        std::isnan(ops::gelu_tanh(Tensor::scalar(std::numeric_limits<float>::quiet_NaN())).item()));
}

TEST(GeluTanhBackward, MatchesTheAnalyticDerivativeAndItsLimits) {
    std::vector<float> x = testing::pseudo_random(1001, -6.0F, 6.0F, 18U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 10.0F, -10.0F});
    const std::vector<float> upstream = testing::pseudo_random(x.size(), -2.0F, 2.0F, 19U);
    EXPECT_TRUE(
        testing::all_close(ops::gelu_tanh_backward(vector_of(x), vector_of(upstream)),
                           hadamard(upstream, map_double(x, gelu_tanh_derivative_reference))));
    const std::vector<float> limits =
        ops::gelu_tanh_backward(vector_of({-infinity, infinity, -1e20F, 1e20F}),
                                vector_of({3.0F, 3.0F, 3.0F, 3.0F}))
            .to_host();
    EXPECT_EQ(limits[0], 0.0F);
    EXPECT_EQ(limits[1], 3.0F);
    EXPECT_EQ(limits[2], 0.0F);
    EXPECT_EQ(limits[3], 3.0F);
}

TEST(GeluTanhBackward, MatchesCentredFiniteDifferences) {
    const std::vector<float> x = testing::pseudo_random(64, -4.0F, 4.0F, 20U);
    const std::vector<float> w = testing::pseudo_random(64, -1.0F, 1.0F, 21U);
    const std::vector<double> numeric = testing::finite_difference_gradient(
        weighted_sum_of([](const Tensor& t) { return ops::gelu_tanh(t); }, w), x, 1e-2);
    EXPECT_TRUE(testing::all_close(ops::gelu_tanh_backward(vector_of(x), vector_of(w)), numeric,
                                   5e-3, 5e-3));
    const Tensor matrix({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F});
    EXPECT_THROW(static_cast<void>(ops::gelu_tanh_backward(matrix, vector_of({1, 1, 1, 1}))),
                 std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// GELU (exact erf form)

TEST(Gelu, MatchesTheExactErfForm) {
    std::vector<float> x = testing::pseudo_random(2001, -8.0F, 8.0F, 7U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 0.5F, -0.5F, 2.0F, -2.0F, 3.0F, -3.0F});
    EXPECT_TRUE(testing::all_close(ops::gelu(vector_of(x)), map_double(x, gelu_reference)));
}

TEST(Gelu, HandValuesDistinguishItFromTheTanhApproximation) {
    // 0.5·x·(1 + erf(x/√2)) at x = 1: 0.8413447460685429; tanh form gives 0.8411919906.
    // At x = -1: -0.15865525393145707; at x = 2: 1.9544997361036416.
    EXPECT_TRUE(testing::all_close(ops::gelu(vector_of({1.0F, -1.0F, 2.0F})),
                                   {0.8413447460685429, -0.15865525393145707, 1.9544997361036416}));
}

TEST(Gelu, LargeMagnitudesSaturate) {
    const std::vector<float> x = {10.0F, -10.0F, 30.0F, -30.0F, 1e4F, -1e4F};
    EXPECT_TRUE(testing::all_close(ops::gelu(vector_of(x)), map_double(x, gelu_reference)));
    const std::vector<float> out = ops::gelu(vector_of(x)).to_host();
    EXPECT_EQ(out[0], 10.0F);
    EXPECT_EQ(out[2], 30.0F);
    for (const float value : out)
        EXPECT_TRUE(std::isfinite(value));
}

TEST(Gelu, PositiveInfinityGivesPositiveInfinity) {
    EXPECT_EQ(ops::gelu(Tensor::scalar(infinity)).item(), infinity);
}

TEST(Gelu, NegativeInfinityGivesNegativeZero) {
    const float value = ops::gelu(Tensor::scalar(-infinity)).item();
    EXPECT_EQ(value, 0.0F);
    EXPECT_TRUE(std::signbit(value));
}

TEST(Gelu, NaNPropagates) {
    EXPECT_TRUE(
        std::isnan(ops::gelu(Tensor::scalar(std::numeric_limits<float>::quiet_NaN())).item()));
}

TEST(GeluBackward, LimitsAtInfinityAreZeroAndOne) {
    const std::vector<float> gradient =
        ops::gelu_backward(vector_of({-infinity, infinity}), vector_of({3.0F, 3.0F})).to_host();
    EXPECT_EQ(gradient[0], 0.0F);
    EXPECT_EQ(gradient[1], 3.0F);
}

TEST(GeluBackward, MatchesTheAnalyticDerivativeTimesUpstream) {
    std::vector<float> x = testing::pseudo_random(1001, -6.0F, 6.0F, 8U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 10.0F, -10.0F, 30.0F, -30.0F});
    const std::vector<float> upstream = testing::pseudo_random(x.size(), -2.0F, 2.0F, 9U);
    const Tensor gradient = ops::gelu_backward(vector_of(x), vector_of(upstream));
    EXPECT_TRUE(
        testing::all_close(gradient, hadamard(upstream, map_double(x, gelu_derivative_reference))));
}

TEST(GeluBackward, HandValues) {
    // d/dx GELU at 0 is 0.5; at 1 it is Φ(1) + φ(1) = 0.8413447460685429 + 0.24197072451914337.
    const Tensor gradient = ops::gelu_backward(vector_of({0.0F, 1.0F}), vector_of({1.0F, 2.0F}));
    EXPECT_TRUE(testing::all_close(gradient, {0.5, 2.0 * 1.0833154705876864}));
}

TEST(GeluBackward, MatchesCentredFiniteDifferences) {
    const std::vector<float> x = testing::pseudo_random(64, -4.0F, 4.0F, 10U);
    const std::vector<float> w = testing::pseudo_random(64, -1.0F, 1.0F, 11U);
    const std::vector<double> numeric = testing::finite_difference_gradient(
        weighted_sum_of([](const Tensor& t) { return ops::gelu(t); }, w), x, 1e-2);
    EXPECT_TRUE(
        testing::all_close(ops::gelu_backward(vector_of(x), vector_of(w)), numeric, 5e-3, 5e-3));
}

TEST(GeluBackward, ShapeMismatchIsInvalidArgumentWithoutChangingInputs) {
    const Tensor x({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F});
    const Tensor upstream({4}, {1.0F, 1.0F, 1.0F, 1.0F});
    EXPECT_THROW(static_cast<void>(ops::gelu_backward(x, upstream)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::relu_backward(x, upstream)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(ops::silu_backward(x, upstream)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(x.to_host(), {1.0F, 2.0F, 3.0F, 4.0F}));
    EXPECT_TRUE(testing::bit_identical(upstream.to_host(), {1.0F, 1.0F, 1.0F, 1.0F}));
}

// ---------------------------------------------------------------------------------------------
// ReLU

TEST(Relu, ClampsNegativesToZero) {
    EXPECT_TRUE(testing::all_close(ops::relu(vector_of({-2.0F, -0.5F, 0.0F, 0.5F, 3.0F})),
                                   {0.0, 0.0, 0.0, 0.5, 3.0}));
    EXPECT_TRUE(testing::all_close(ops::relu(vector_of({-infinity, infinity})), {0.0, infinity}));
}

TEST(Relu, ZeroGivesZero) {
    EXPECT_EQ(ops::relu(Tensor::scalar(0.0F)).item(), 0.0F);
}

TEST(Relu, NaNPropagates) {
    const std::vector<float> out = ops::relu(vector_of({quiet_nan, -1.0F, 1.0F})).to_host();
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_EQ(out[1], 0.0F);
    EXPECT_EQ(out[2], 1.0F);
}

TEST(ReluBackward, PassesUpstreamOnlyWherePositive) {
    const Tensor gradient = ops::relu_backward(vector_of({-2.0F, 0.5F, 3.0F, -0.1F}),
                                               vector_of({7.0F, 8.0F, -9.0F, 10.0F}));
    EXPECT_TRUE(testing::all_close(gradient, {0.0, 8.0, -9.0, 0.0}));
}

TEST(ReluBackward, DerivativeAtExactlyZeroIsZero) {
    const std::vector<float> out =
        ops::relu_backward(vector_of({0.0F, -0.0F}), vector_of({5.0F, 5.0F})).to_host();
    EXPECT_EQ(out[0], 0.0F);
    EXPECT_EQ(out[1], 0.0F);
}

TEST(ReluBackward, NaNInputPropagates) {
    const std::vector<float> out =
        ops::relu_backward(vector_of({quiet_nan, 1.0F}), vector_of({1.0F, 2.0F})).to_host();
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_EQ(out[1], 2.0F);
}

TEST(ReluBackward, NaNUpstreamPropagatesWhereTheInputIsPositive) {
    const std::vector<float> out =
        ops::relu_backward(vector_of({1.0F}), vector_of({quiet_nan})).to_host();
    EXPECT_TRUE(std::isnan(out[0]));
}

TEST(ReluBackward, MatchesCentredFiniteDifferencesAwayFromZero) {
    std::vector<float> x = testing::pseudo_random(64, -2.0F, 2.0F, 12U);
    for (float& value : x) {
        if (std::fabs(value) < 0.05F)
            value = 0.5F;  // keep the kink out of the ε window
    }
    const std::vector<float> w = testing::pseudo_random(64, -1.0F, 1.0F, 13U);
    const std::vector<double> numeric = testing::finite_difference_gradient(
        weighted_sum_of([](const Tensor& t) { return ops::relu(t); }, w), x, 1e-2);
    EXPECT_TRUE(
        testing::all_close(ops::relu_backward(vector_of(x), vector_of(w)), numeric, 5e-3, 5e-3));
}

// ---------------------------------------------------------------------------------------------
// SiLU

TEST(Silu, MatchesXTimesSigmoid) {
    std::vector<float> x = testing::pseudo_random(2001, -20.0F, 20.0F, 14U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 50.0F, -50.0F, 88.0F, -88.0F});
    EXPECT_TRUE(testing::all_close(ops::silu(vector_of(x)), map_double(x, silu_reference)));
}

TEST(Silu, HandValues) {
    // silu(1) = 1/(1+e^-1) = 0.7310585786300049; silu(-1) = -0.2689414213699951.
    EXPECT_TRUE(testing::all_close(ops::silu(vector_of({0.0F, 1.0F, -1.0F})),
                                   {0.0, 0.7310585786300049, -0.2689414213699951}));
}

TEST(Silu, NegativeInfinityGivesNegativeZero) {
    const float value = ops::silu(Tensor::scalar(-infinity)).item();
    EXPECT_EQ(value, 0.0F);
    EXPECT_TRUE(std::signbit(value));
}

TEST(Silu, PositiveInfinityGivesPositiveInfinity) {
    EXPECT_EQ(ops::silu(Tensor::scalar(infinity)).item(), infinity);
}

TEST(Silu, LargeMagnitudesDoNotOverflow) {
    const std::vector<float> out = ops::silu(vector_of({-1e4F, 1e4F, -100.0F, 100.0F})).to_host();
    EXPECT_TRUE(testing::all_close(out, {0.0, 1e4, 0.0, 100.0}));
    for (const float value : out)
        EXPECT_FALSE(std::isnan(value));
}

TEST(SiluBackward, MatchesTheAnalyticDerivativeTimesUpstream) {
    std::vector<float> x = testing::pseudo_random(1001, -20.0F, 20.0F, 15U);
    x.insert(x.end(), {0.0F, 1.0F, -1.0F, 50.0F, -50.0F});
    const std::vector<float> upstream = testing::pseudo_random(x.size(), -2.0F, 2.0F, 16U);
    const Tensor gradient = ops::silu_backward(vector_of(x), vector_of(upstream));
    EXPECT_TRUE(
        testing::all_close(gradient, hadamard(upstream, map_double(x, silu_derivative_reference))));
}

TEST(SiluBackward, HandValues) {
    // silu'(0) = 0.5; silu'(1) = σ(1)(1 + 1 − σ(1)) = 0.7310585786300049·1.2689414213699951.
    const Tensor gradient = ops::silu_backward(vector_of({0.0F, 1.0F}), vector_of({2.0F, 1.0F}));
    EXPECT_TRUE(testing::all_close(gradient, {1.0, 0.9276705118714869}));
}

TEST(SiluBackward, GradientAtNegativeInfinityIsZero) {
    const float value = ops::silu_backward(Tensor::scalar(-infinity), Tensor::scalar(3.0F)).item();
    EXPECT_EQ(value, 0.0F);
}

TEST(SiluBackward, GradientAtPositiveInfinityIsTheUpstream) {
    const std::vector<float> out =
        ops::silu_backward(vector_of({infinity, infinity}), vector_of({3.0F, -0.25F})).to_host();
    EXPECT_EQ(out[0], 3.0F);
    EXPECT_EQ(out[1], -0.25F);
}

TEST(SiluBackward, MatchesCentredFiniteDifferences) {
    const std::vector<float> x = testing::pseudo_random(64, -6.0F, 6.0F, 17U);
    const std::vector<float> w = testing::pseudo_random(64, -1.0F, 1.0F, 18U);
    const std::vector<double> numeric = testing::finite_difference_gradient(
        weighted_sum_of([](const Tensor& t) { return ops::silu(t); }, w), x, 1e-2);
    EXPECT_TRUE(
        testing::all_close(ops::silu_backward(vector_of(x), vector_of(w)), numeric, 5e-3, 5e-3));
}

// ---------------------------------------------------------------------------------------------
// Unary operations keep shapes and do not touch their input

TEST(UnaryElementwise, KeepShapeAndLeaveTheInputUnchanged) {
    const std::vector<float> values = testing::pseudo_random(24, 0.1F, 2.0F, 19U);
    const Tensor x({2, 3, 4}, std::span<const float>(values));
    for (const Tensor& out :
         {ops::negate(x), ops::exp(x), ops::log(x), ops::sqrt(x), ops::erf(x), ops::gelu(x),
          ops::relu(x), ops::silu(x), ops::scale(x, 2.0F), ops::add_scalar(x, 1.0F)}) {
        EXPECT_EQ(out.shape(), (Shape{2, 3, 4}));
    }
    EXPECT_TRUE(testing::bit_identical(x.to_host(), values));
}

TEST(UnaryElementwise, LargeInputsMatchTheDoubleOracle) {
    const std::size_t count = 200003;
    const std::vector<float> x = testing::pseudo_random(count, -5.0F, 5.0F, 20U);
    const Tensor input = vector_of(x);
    const auto exp_reference = [](double v) { return std::exp(v); };
    const auto erf_reference = [](double v) { return std::erf(v); };
    EXPECT_TRUE(testing::all_close(ops::exp(input), map_double(x, exp_reference)));
    EXPECT_TRUE(testing::all_close(ops::erf(input), map_double(x, erf_reference)));
    EXPECT_TRUE(testing::all_close(ops::gelu(input), map_double(x, gelu_reference)));
    EXPECT_TRUE(testing::all_close(ops::silu(input), map_double(x, silu_reference)));
    EXPECT_TRUE(testing::all_close(ops::scale(input, -1.5F),
                                   map_double(x, [](double v) { return -1.5 * v; })));
}

}  // namespace riftco_transformer
