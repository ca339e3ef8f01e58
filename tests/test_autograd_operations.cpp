// Specification tests of every differentiable operation (docs/ARCHITECTURE.md, 'Autograd';
// operations.hpp).
//
// For each operation: the forward value is bit-identical to the raw tensor_ops result, and the
// gradient of the weighted objective L = Σ w ⊙ f(inputs) (backward seeded with a fixed random
// w, so every output element matters) matches centred finite differences of the same
// objective computed with raw tensor_ops, for every input that requires a gradient
// (docs/ARCHITECTURE.md, 'Numeric parity': ε = 1e-3, tolerance 2e-3). Inputs that do not require a
// gradient get none. Where a VJP has a closed form (operations.hpp), it is also checked against
// that formula evaluated in double; normalisation, softmax and cross-entropy are additionally
// checked against finite differences of an independent double-precision oracle.
// Then the graph rules: detached results, constants, shared inputs, diamonds, domain errors
// and raw-op errors that propagate without creating anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {
namespace ops = tensor_ops;

// ---------------------------------------------------------------------------------------------
// The operation checker

// One input of an operation under test.
struct Operand {
    Shape shape;
    std::vector<float> values;
    bool requires_gradient = true;
};

std::size_t element_count(const Shape& shape) {
    return checked_element_count(shape);
}

Operand random_operand(Shape shape, float lo, float hi, std::uint32_t seed,
                       bool requires_gradient = true) {
    std::vector<float> values = testing::pseudo_random(element_count(shape), lo, hi, seed);
    return {std::move(shape), std::move(values), requires_gradient};
}

// |values| pushed to at least `margin` (denominators, relu inputs away from its kink).
Operand away_from_zero(Operand operand, float margin) {
    for (float& value : operand.values)
        value = value >= 0.0F ? value + margin : value - margin;
    return operand;
}

Operand constant(Operand operand) {
    operand.requires_gradient = false;
    return operand;
}

Tensor tensor_of(const Operand& operand) {
    return Tensor(operand.shape, std::span<const float>(operand.values));
}

using DifferentiableOperation = std::function<Variable(const std::vector<Variable>&)>;
using RawOperation = std::function<Tensor(const std::vector<Tensor>&)>;

struct FiniteDifference {
    double epsilon = 1e-3;
    double tolerance = 2e-3;
};

struct CheckedOperation {
    std::vector<Variable> inputs;
    Variable output;
    std::vector<float> weights;  // w: the objective is Σ w ⊙ output
};

// Runs `differentiable` on leaves holding `operands`, checks its forward value against `raw`,
// seeds backward with w and checks each input's gradient against centred finite differences
// of Σ w ⊙ raw(...). Returns the graph's pieces for further, operation-specific checks.
CheckedOperation check_operation(const std::vector<Operand>& operands,
                                 const DifferentiableOperation& differentiable,
                                 const RawOperation& raw, FiniteDifference difference = {},
                                 std::uint32_t weight_seed = 777U) {
    std::vector<Tensor> values;
    CheckedOperation checked;
    for (const Operand& operand : operands) {
        values.push_back(tensor_of(operand));
        checked.inputs.emplace_back(values.back(), operand.requires_gradient);
    }
    checked.output = differentiable(checked.inputs);
    const Tensor expected = raw(values);
    EXPECT_TRUE(checked.output.requires_gradient());
    EXPECT_FALSE(checked.output.is_leaf());
    EXPECT_EQ(checked.output.shape(), expected.shape());
    if (checked.output.shape() != expected.shape())
        return checked;
    EXPECT_TRUE(testing::bit_identical(checked.output.value().to_host(), expected.to_host()))
        << "the forward value differs from the raw operation";

    checked.weights = testing::pseudo_random(expected.numel(), -1.5F, 1.5F, weight_seed);
    checked.output.backward(Tensor(expected.shape(), std::span<const float>(checked.weights)));

    for (std::size_t i = 0; i < operands.size(); ++i) {
        SCOPED_TRACE("input " + std::to_string(i));
        if (!operands[i].requires_gradient) {
            EXPECT_THROW(static_cast<void>(checked.inputs[i].gradient()), std::logic_error);
            continue;
        }
        EXPECT_TRUE(checked.inputs[i].has_gradient());
        const auto objective = [&](const std::vector<float>& perturbed) {
            std::vector<Tensor> shifted = values;
            shifted[i] = Tensor(operands[i].shape, std::span<const float>(perturbed));
            return testing::inner_product(raw(shifted).to_host(), checked.weights);
        };
        EXPECT_TRUE(testing::all_close(
            checked.inputs[i].gradient(),
            testing::finite_difference_gradient(objective, operands[i].values, difference.epsilon),
            difference.tolerance, 0.0));
    }
    return checked;
}

// Centred finite differences of a function evaluated entirely in double (independent oracle).
std::vector<double> double_finite_difference(
    const std::function<double(const std::vector<double>&)>& f, const std::vector<float>& at,
    double epsilon = 1e-3) {
    std::vector<double> x(at.begin(), at.end());
    std::vector<double> gradient(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double original = x[i];
        x[i] = original + epsilon;
        const double plus = f(x);
        x[i] = original - epsilon;
        const double minus = f(x);
        x[i] = original;
        gradient[i] = (plus - minus) / (2.0 * epsilon);
    }
    return gradient;
}

std::vector<double> as_double(const std::vector<float>& values) {
    return {values.begin(), values.end()};
}

// A closed-form expected gradient, elementwise over (x, w) in double.
std::vector<double> elementwise(const std::vector<float>& x, const std::vector<float>& w,
                                const std::function<double(double, double)>& rule) {
    std::vector<double> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        out[i] = rule(x[i], w[i]);
    return out;
}

constexpr double hand_atol = 1e-6;  // closed forms evaluated in double vs float kernels
constexpr double hand_rtol = 1e-5;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Arithmetic: Variable ⊕ Variable

TEST(AutogradArithmetic, AddPassesTheUpstreamToBothOperands) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 1U), random_operand({2, 3}, -1.0F, 1.0F, 2U)},
        [](const auto& v) { return v[0] + v[1]; },
        [](const auto& t) { return ops::add(t[0], t[1]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), as_double(checked.weights)));
    EXPECT_TRUE(testing::all_close(checked.inputs[1].gradient(), as_double(checked.weights)));
}

TEST(AutogradArithmetic, SubtractPassesTheUpstreamAndItsNegation) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 3U), random_operand({2, 3}, -1.0F, 1.0F, 4U)},
        [](const auto& v) { return v[0] - v[1]; },
        [](const auto& t) { return ops::subtract(t[0], t[1]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), as_double(checked.weights)));
    EXPECT_TRUE(testing::all_close(
        checked.inputs[1].gradient(),
        elementwise(checked.weights, checked.weights, [](double w, double) { return -w; })));
}

TEST(AutogradArithmetic, MultiplyScalesTheUpstreamByTheOtherOperand) {
    const Operand a = random_operand({2, 3}, -2.0F, 2.0F, 5U);
    const Operand b = random_operand({2, 3}, -2.0F, 2.0F, 6U);
    const auto checked = check_operation(
        {a, b}, [](const auto& v) { return v[0] * v[1]; },
        [](const auto& t) { return ops::multiply(t[0], t[1]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(b.values, checked.weights, [](double y, double w) { return w * y; }), hand_atol,
        hand_rtol));
    EXPECT_TRUE(testing::all_close(
        checked.inputs[1].gradient(),
        elementwise(a.values, checked.weights, [](double x, double w) { return w * x; }), hand_atol,
        hand_rtol));
}

TEST(AutogradArithmetic, DivideGivesUpstreamOverBAndMinusUpstreamTimesAOverBSquared) {
    const Operand a = random_operand({2, 3}, -2.0F, 2.0F, 7U);
    const Operand b = away_from_zero(random_operand({2, 3}, -1.0F, 1.0F, 8U), 0.5F);
    const auto checked = check_operation(
        {a, b}, [](const auto& v) { return v[0] / v[1]; },
        [](const auto& t) { return ops::divide(t[0], t[1]); });
    std::vector<double> expected_a(a.values.size());
    std::vector<double> expected_b(a.values.size());
    for (std::size_t i = 0; i < a.values.size(); ++i) {
        const double w = checked.weights[i];
        const double numerator = a.values[i];
        const double denominator = b.values[i];
        expected_a[i] = w / denominator;
        expected_b[i] = -w * numerator / (denominator * denominator);
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected_a, hand_atol, hand_rtol));
    EXPECT_TRUE(testing::all_close(checked.inputs[1].gradient(), expected_b, hand_atol, hand_rtol));
}

namespace {

// add, subtract, multiply and divide of `left` and `right`, each checked by check_operation.
void check_every_binary_operation(const Operand& left, const Operand& right) {
    {
        SCOPED_TRACE("add");
        check_operation(
            {left, right}, [](const auto& v) { return v[0] + v[1]; },
            [](const auto& t) { return ops::add(t[0], t[1]); });
    }
    {
        SCOPED_TRACE("subtract");
        check_operation(
            {left, right}, [](const auto& v) { return v[0] - v[1]; },
            [](const auto& t) { return ops::subtract(t[0], t[1]); });
    }
    {
        SCOPED_TRACE("multiply");
        check_operation(
            {left, right}, [](const auto& v) { return v[0] * v[1]; },
            [](const auto& t) { return ops::multiply(t[0], t[1]); });
    }
    {
        SCOPED_TRACE("divide");
        check_operation(
            {left, right}, [](const auto& v) { return v[0] / v[1]; },
            [](const auto& t) { return ops::divide(t[0], t[1]); });
    }
}

}  // namespace

TEST(AutogradArithmetic, ConstantLeftOperandGetsNoGradientAndTheRightOneDoes) {
    const Operand left = constant(random_operand({3, 2}, -1.0F, 1.0F, 9U));
    const Operand right = away_from_zero(random_operand({3, 2}, -1.0F, 1.0F, 10U), 0.5F);
    check_every_binary_operation(left, right);
}

TEST(AutogradArithmetic, ConstantRightOperandGetsNoGradientAndTheLeftOneDoes) {
    const Operand left = random_operand({3, 2}, -1.0F, 1.0F, 11U);
    const Operand right = constant(away_from_zero(random_operand({3, 2}, -1.0F, 1.0F, 12U), 0.5F));
    check_every_binary_operation(left, right);
}

TEST(AutogradArithmetic, NegateNegatesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 2, 2}, -1.0F, 1.0F, 13U)}, [](const auto& v) { return -v[0]; },
        [](const auto& t) { return ops::negate(t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(checked.weights, checked.weights, [](double w, double) { return -w; })));
}

// ---------------------------------------------------------------------------------------------
// Arithmetic with a float scalar: the constant is the scalar filled like the operand

namespace {
constexpr float scalar_term = -1.75F;
constexpr float scalar_divisor = 3.0F;  // 1/3 is not a float: x/3 and x·(1/3) can differ

Tensor filled_like(const Tensor& x, float value) {
    return Tensor::full(x.shape(), value, x.backend());
}
}  // namespace

TEST(AutogradScalarArithmetic, VariablePlusScalarPassesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 14U)},
        [](const auto& v) { return v[0] + scalar_term; },
        [](const auto& t) { return ops::add(t[0], filled_like(t[0], scalar_term)); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), as_double(checked.weights)));
}

TEST(AutogradScalarArithmetic, ScalarPlusVariablePassesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 15U)},
        [](const auto& v) { return scalar_term + v[0]; },
        [](const auto& t) { return ops::add(filled_like(t[0], scalar_term), t[0]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), as_double(checked.weights)));
}

TEST(AutogradScalarArithmetic, VariableMinusScalarPassesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 16U)},
        [](const auto& v) { return v[0] - scalar_term; },
        [](const auto& t) { return ops::subtract(t[0], filled_like(t[0], scalar_term)); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), as_double(checked.weights)));
}

TEST(AutogradScalarArithmetic, ScalarMinusVariableNegatesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 17U)},
        [](const auto& v) { return scalar_term - v[0]; },
        [](const auto& t) { return ops::subtract(filled_like(t[0], scalar_term), t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(checked.weights, checked.weights, [](double w, double) { return -w; })));
}

TEST(AutogradScalarArithmetic, VariableTimesScalarScalesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 18U)},
        [](const auto& v) { return v[0] * scalar_term; },
        [](const auto& t) { return ops::multiply(t[0], filled_like(t[0], scalar_term)); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   elementwise(checked.weights, checked.weights,
                                               [](double w, double) { return w * scalar_term; })));
}

TEST(AutogradScalarArithmetic, ScalarTimesVariableScalesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 19U)},
        [](const auto& v) { return scalar_term * v[0]; },
        [](const auto& t) { return ops::multiply(filled_like(t[0], scalar_term), t[0]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   elementwise(checked.weights, checked.weights,
                                               [](double w, double) { return w * scalar_term; })));
}

TEST(AutogradScalarArithmetic, VariableOverScalarEqualsElementwiseDivisionAndDividesTheUpstream) {
    const auto checked = check_operation(
        {random_operand({4, 5}, -2.0F, 2.0F, 20U)},
        [](const auto& v) { return v[0] / scalar_divisor; },
        [](const auto& t) { return ops::divide(t[0], filled_like(t[0], scalar_divisor)); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   elementwise(checked.weights, checked.weights,
                                               [](double w, double) { return w / scalar_divisor; }),
                                   hand_atol, hand_rtol));
}

TEST(AutogradScalarArithmetic, VariableOverATinyFiniteScalarIsAccepted) {
    // 1e-39 is finite and non-zero (a subnormal): the contract accepts it; x/1e-39 is finite.
    constexpr float tiny = 1e-39F;
    Variable x(Tensor({2}, {1e-3F, -2e-3F}));
    Variable y;
    ASSERT_NO_THROW(y = x / tiny);
    const Tensor expected = ops::divide(x.value(), filled_like(x.value(), tiny));
    EXPECT_TRUE(testing::all_close(y.value(), as_double(expected.to_host()), 0.0, 1e-6));
}

TEST(AutogradScalarArithmetic, ScalarOverVariableGivesMinusUpstreamTimesScalarOverXSquared) {
    const Operand x = away_from_zero(random_operand({2, 3}, -1.0F, 1.0F, 21U), 0.5F);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return scalar_term / v[0]; },
        [](const auto& t) { return ops::divide(filled_like(t[0], scalar_term), t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights,
                    [](double value, double w) { return -w * scalar_term / (value * value); }),
        hand_atol, hand_rtol));
}

// ---------------------------------------------------------------------------------------------
// Matmul

namespace {
const RawOperation raw_matmul = [](const auto& t) { return ops::matmul(t[0], t[1]); };
const DifferentiableOperation differentiable_matmul = [](const auto& v) {
    return matmul(v[0], v[1]);
};
}  // namespace

TEST(AutogradMatmul, TwoDimensionalGradientsAreUpstreamTimesTransposes) {
    const Operand a = random_operand({3, 4}, -1.0F, 1.0F, 22U);
    const Operand b = random_operand({4, 2}, -1.0F, 1.0F, 23U);
    const auto checked = check_operation({a, b}, differentiable_matmul, raw_matmul);
    // dA = W·Bᵀ, dB = Aᵀ·W in double.
    std::vector<double> expected_a(12, 0.0);
    std::vector<double> expected_b(8, 0.0);
    for (std::size_t m = 0; m < 3; ++m) {
        for (std::size_t k = 0; k < 4; ++k) {
            for (std::size_t n = 0; n < 2; ++n) {
                const double w = checked.weights[m * 2 + n];
                expected_a[m * 4 + k] += w * b.values[k * 2 + n];
                expected_b[k * 2 + n] += a.values[m * 4 + k] * w;
            }
        }
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected_a, hand_atol, hand_rtol));
    EXPECT_TRUE(testing::all_close(checked.inputs[1].gradient(), expected_b, hand_atol, hand_rtol));
}

TEST(AutogradMatmul, BatchedRank3GradientsMatchFiniteDifferences) {
    check_operation(
        {random_operand({2, 3, 4}, -1.0F, 1.0F, 24U), random_operand({2, 4, 5}, -1.0F, 1.0F, 25U)},
        differentiable_matmul, raw_matmul);
}

TEST(AutogradMatmul, BatchedRank4GradientsMatchFiniteDifferences) {
    check_operation({random_operand({2, 2, 3, 4}, -1.0F, 1.0F, 26U),
                     random_operand({2, 2, 4, 3}, -1.0F, 1.0F, 27U)},
                    differentiable_matmul, raw_matmul);
}

TEST(AutogradMatmul, OnlyTheLeftOperandRequiringGradientsGetsOne) {
    {
        SCOPED_TRACE("rank 3");
        check_operation({random_operand({2, 3, 4}, -1.0F, 1.0F, 28U),
                         constant(random_operand({2, 4, 2}, -1.0F, 1.0F, 29U))},
                        differentiable_matmul, raw_matmul);
    }
    {
        SCOPED_TRACE("rank 4");
        check_operation({random_operand({2, 2, 3, 4}, -1.0F, 1.0F, 30U),
                         constant(random_operand({2, 2, 4, 2}, -1.0F, 1.0F, 31U))},
                        differentiable_matmul, raw_matmul);
    }
}

TEST(AutogradMatmul, OnlyTheRightOperandRequiringGradientsGetsOne) {
    {
        SCOPED_TRACE("rank 2");
        check_operation({constant(random_operand({3, 4}, -1.0F, 1.0F, 32U)),
                         random_operand({4, 2}, -1.0F, 1.0F, 33U)},
                        differentiable_matmul, raw_matmul);
    }
    {
        SCOPED_TRACE("rank 3");
        check_operation({constant(random_operand({2, 3, 4}, -1.0F, 1.0F, 34U)),
                         random_operand({2, 4, 2}, -1.0F, 1.0F, 35U)},
                        differentiable_matmul, raw_matmul);
    }
    {
        SCOPED_TRACE("rank 4");
        check_operation({constant(random_operand({2, 2, 3, 4}, -1.0F, 1.0F, 36U)),
                         random_operand({2, 2, 4, 2}, -1.0F, 1.0F, 37U)},
                        differentiable_matmul, raw_matmul);
    }
}

// ---------------------------------------------------------------------------------------------
// Layout

TEST(AutogradLayout, PermuteRank3GradientIsTheInversePermutation) {
    // {2,0,1} is a 3-cycle: applying it again instead of its inverse would be caught.
    const auto checked = check_operation(
        {random_operand({2, 3, 4}, -1.0F, 1.0F, 38U)},
        [](const auto& v) {
            return permute(v[0], {2, 0, 1});
        },
        [](const auto& t) {
            return ops::permute(t[0], {2, 0, 1});
        });
    // out [4,2,3]: out[k,i,j] = x[i,j,k], so dx[i,j,k] = w[k,i,j].
    std::vector<double> expected(24);
    for (std::size_t i = 0; i < 2; ++i) {
        for (std::size_t j = 0; j < 3; ++j) {
            for (std::size_t k = 0; k < 4; ++k) {
                expected[(i * 3 + j) * 4 + k] = checked.weights[(k * 2 + i) * 3 + j];
            }
        }
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected));
}

TEST(AutogradLayout, PermuteRank4GradientIsTheInversePermutation) {
    const std::vector<std::size_t> axes = {1, 3, 0, 2};  // not an involution
    check_operation(
        {random_operand({2, 3, 4, 5}, -1.0F, 1.0F, 39U)},
        [&](const auto& v) { return permute(v[0], std::span<const std::size_t>(axes)); },
        [&](const auto& t) { return ops::permute(t[0], std::span<const std::size_t>(axes)); });
}

TEST(AutogradLayout, Transpose2dGradientIsTheTransposedUpstream) {
    const auto checked = check_operation(
        {random_operand({3, 4}, -1.0F, 1.0F, 40U)},
        [](const auto& v) { return transpose_2d(v[0]); },
        [](const auto& t) { return ops::transpose_2d(t[0]); });
    std::vector<double> expected(12);
    for (std::size_t r = 0; r < 3; ++r) {
        for (std::size_t c = 0; c < 4; ++c)
            expected[r * 4 + c] = checked.weights[c * 3 + r];
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected));
}

TEST(AutogradLayout, ReshapeGradientIsTheUpstreamInTheInputShape) {
    for (const Shape& target : {Shape{4, 6}, Shape{24}, Shape{3, 2, 4}, Shape{1, 24, 1}}) {
        SCOPED_TRACE(shape_to_string(target));
        const auto checked = check_operation(
            {random_operand({2, 3, 4}, -1.0F, 1.0F, 41U)},
            [&](const auto& v) { return reshape(v[0], target); },
            [&](const auto& t) { return ops::reshape(t[0], target); });
        EXPECT_EQ(checked.inputs[0].gradient().shape(), (Shape{2, 3, 4}));
        EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), as_double(checked.weights)));
    }
}

TEST(AutogradLayout, BroadcastToGradientSumsOverTheBroadcastDimensions) {
    const std::vector<std::pair<Shape, Shape>> cases = {
        {{3}, {2, 3}}, {{2, 1}, {2, 3}}, {{}, {2, 3}}, {{1, 3}, {4, 2, 3}}};
    std::uint32_t seed = 42U;
    for (const auto& [from, to] : cases) {
        SCOPED_TRACE(shape_to_string(from) + " -> " + shape_to_string(to));
        const auto checked = check_operation(
            {random_operand(from, -1.0F, 1.0F, seed++)},
            [&](const auto& v) { return broadcast_to(v[0], to); },
            [&](const auto& t) { return ops::broadcast_to(t[0], to); });
        EXPECT_EQ(checked.inputs[0].gradient().shape(), from);
    }
}

TEST(AutogradLayout, BroadcastRowGradientIsTheColumnSumOfTheUpstream) {
    const auto checked = check_operation(
        {random_operand({3}, -1.0F, 1.0F, 46U)},
        [](const auto& v) {
            return broadcast_to(v[0], {2, 3});
        },
        [](const auto& t) {
            return ops::broadcast_to(t[0], {2, 3});
        });
    const std::vector<float>& w = checked.weights;
    EXPECT_TRUE(
        testing::all_close(checked.inputs[0].gradient(),
                           {double{w[0]} + w[3], double{w[1]} + w[4], double{w[2]} + w[5]}));
}

TEST(AutogradLayout, SumToShapeGradientBroadcastsTheUpstreamBack) {
    const std::vector<std::pair<Shape, Shape>> cases = {
        {{2, 3}, {3}}, {{2, 3}, {2, 1}}, {{2, 3}, {}}, {{4, 2, 3}, {1, 3}}, {{4, 2, 3}, {2, 3}}};
    std::uint32_t seed = 47U;
    for (const auto& [from, to] : cases) {
        SCOPED_TRACE(shape_to_string(from) + " -> " + shape_to_string(to));
        check_operation(
            {random_operand(from, -1.0F, 1.0F, seed++)},
            [&](const auto& v) { return sum_to_shape(v[0], to); },
            [&](const auto& t) { return ops::sum_to_shape(t[0], to); });
    }
}

TEST(AutogradLayout, ConcatenateTwoInputsSplitsTheUpstreamByWidth) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 52U), random_operand({2, 2}, -1.0F, 1.0F, 53U)},
        [](const auto& v) { return concatenate_last_axis(v[0], v[1]); },
        [](const auto& t) { return ops::concatenate_last_axis(t[0], t[1]); });
    const std::vector<float>& w = checked.weights;  // [2,5]
    EXPECT_TRUE(
        testing::all_close(checked.inputs[0].gradient(), {w[0], w[1], w[2], w[5], w[6], w[7]}));
    EXPECT_TRUE(testing::all_close(checked.inputs[1].gradient(), {w[3], w[4], w[8], w[9]}));
}

TEST(AutogradLayout, ConcatenateThreeInputsGivesGradientsOnlyToThoseThatRequireThem) {
    check_operation(
        {random_operand({2, 1, 2}, -1.0F, 1.0F, 54U),
         constant(random_operand({2, 1, 3}, -1.0F, 1.0F, 55U)),
         random_operand({2, 1, 1}, -1.0F, 1.0F, 56U)},
        [](const auto& v) { return concatenate_last_axis(std::span<const Variable>(v)); },
        [](const auto& t) { return ops::concatenate_last_axis(std::span<const Tensor>(t)); });
}

TEST(AutogradLayout, SliceOnEveryAxisPlacesTheUpstreamInTheWindowAndZeroElsewhere) {
    struct Window {
        std::size_t axis, start, length;
    };
    const Shape shape = {3, 4, 5};
    for (const Window window :
         {Window{0, 1, 2}, Window{1, 1, 2}, Window{2, 2, 3}, Window{2, 0, 5}}) {
        SCOPED_TRACE("axis " + std::to_string(window.axis) + " start " +
                     std::to_string(window.start) + " length " + std::to_string(window.length));
        const auto checked = check_operation(
            {random_operand(shape, -1.0F, 1.0F, 57U)},
            [&](const auto& v) { return slice(v[0], window.axis, window.start, window.length); },
            [&](const auto& t) {
                return ops::slice(t[0], window.axis, window.start, window.length);
            });
        // By hand: the upstream element of the window coordinate, zero outside the window.
        Shape out_shape = shape;
        out_shape[window.axis] = window.length;
        std::vector<double> expected(60, 0.0);
        for (std::size_t i = 0; i < 3; ++i) {
            for (std::size_t j = 0; j < 4; ++j) {
                for (std::size_t k = 0; k < 5; ++k) {
                    std::size_t index[3] = {i, j, k};
                    const std::size_t at = index[window.axis];
                    if (at < window.start || at >= window.start + window.length)
                        continue;
                    index[window.axis] = at - window.start;
                    const std::size_t flat =
                        (index[0] * out_shape[1] + index[1]) * out_shape[2] + index[2];
                    expected[(i * 4 + j) * 5 + k] = checked.weights[flat];
                }
            }
        }
        EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected));
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions

TEST(AutogradReductions, SumOverEverythingSpreadsTheUpstreamToEveryElement) {
    const auto checked = check_operation(
        {random_operand({2, 3, 4}, -1.0F, 1.0F, 58U)}, [](const auto& v) { return sum(v[0]); },
        [](const auto& t) { return ops::sum(t[0]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   std::vector<double>(24, checked.weights[0])));
}

TEST(AutogradReductions, MeanOverEverythingSpreadsTheUpstreamDividedByTheCount) {
    const auto checked = check_operation(
        {random_operand({2, 3, 4}, -1.0F, 1.0F, 59U)}, [](const auto& v) { return mean(v[0]); },
        [](const auto& t) { return ops::mean(t[0]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   std::vector<double>(24, checked.weights[0] / 24.0)));
}

TEST(AutogradReductions, SumOverEachAxisSpreadsTheUpstreamAlongThatAxis) {
    for (std::size_t axis = 0; axis < 3; ++axis) {
        for (const bool keep_dims : {false, true}) {
            SCOPED_TRACE("axis " + std::to_string(axis) + (keep_dims ? " keep_dims" : ""));
            const auto checked = check_operation(
                {random_operand({2, 3, 4}, -1.0F, 1.0F, 60U)},
                [&](const auto& v) { return sum(v[0], axis, keep_dims); },
                [&](const auto& t) { return ops::sum(t[0], axis, keep_dims); });
            // dx[i] = w[i with the reduced coordinate removed].
            const std::size_t extents[3] = {2, 3, 4};
            std::vector<double> expected(24);
            for (std::size_t i = 0; i < 2; ++i) {
                for (std::size_t j = 0; j < 3; ++j) {
                    for (std::size_t k = 0; k < 4; ++k) {
                        std::size_t index[3] = {i, j, k};
                        index[axis] = 0;
                        std::size_t flat = 0;
                        for (std::size_t d = 0; d < 3; ++d) {
                            if (d == axis)
                                continue;
                            flat = flat * extents[d] + index[d];
                        }
                        expected[(i * 3 + j) * 4 + k] = checked.weights[flat];
                    }
                }
            }
            EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected));
        }
    }
}

TEST(AutogradReductions, MeanOverEachAxisSpreadsTheUpstreamDividedByTheAxisLength) {
    for (std::size_t axis = 0; axis < 3; ++axis) {
        for (const bool keep_dims : {false, true}) {
            SCOPED_TRACE("axis " + std::to_string(axis) + (keep_dims ? " keep_dims" : ""));
            check_operation(
                {random_operand({2, 3, 4}, -1.0F, 1.0F, 61U)},
                [&](const auto& v) { return mean(v[0], axis, keep_dims); },
                [&](const auto& t) { return ops::mean(t[0], axis, keep_dims); });
        }
    }
}

TEST(AutogradReductions, ReducingTheOnlyAxisOfAVectorGivesAScalarWithTheSameGradients) {
    for (const bool keep_dims : {false, true}) {
        SCOPED_TRACE(keep_dims ? "keep_dims" : "dropped");
        check_operation(
            {random_operand({5}, -1.0F, 1.0F, 62U)},
            [&](const auto& v) { return sum(v[0], 0, keep_dims); },
            [&](const auto& t) { return ops::sum(t[0], 0, keep_dims); });
        check_operation(
            {random_operand({5}, -1.0F, 1.0F, 63U)},
            [&](const auto& v) { return mean(v[0], 0, keep_dims); },
            [&](const auto& t) { return ops::mean(t[0], 0, keep_dims); });
    }
}

// ---------------------------------------------------------------------------------------------
// Unary functions

TEST(AutogradUnary, ExpGradientIsUpstreamTimesExp) {
    const Operand x = random_operand({2, 3, 2}, -1.5F, 1.5F, 64U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return exp(v[0]); }, [](const auto& t) { return ops::exp(t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights, [](double v, double w) { return w * std::exp(v); }),
        hand_atol, hand_rtol));
}

TEST(AutogradUnary, LogOfPositiveInputsGradientIsUpstreamOverX) {
    const Operand x = random_operand({2, 3, 2}, 0.3F, 2.5F, 65U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return log(v[0]); }, [](const auto& t) { return ops::log(t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights, [](double v, double w) { return w / v; }), hand_atol,
        hand_rtol));
}

TEST(AutogradUnary, SqrtOfPositiveInputsGradientIsUpstreamOverTwiceTheRoot) {
    const Operand x = random_operand({2, 3, 2}, 0.3F, 2.5F, 66U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return sqrt(v[0]); },
        [](const auto& t) { return ops::sqrt(t[0]); });
    EXPECT_TRUE(
        testing::all_close(checked.inputs[0].gradient(),
                           elementwise(x.values, checked.weights,
                                       [](double v, double w) { return w / (2.0 * std::sqrt(v)); }),
                           hand_atol, hand_rtol));
}

TEST(AutogradUnary, ErfGradientIsUpstreamTimesTheGaussianDensityScaled) {
    const Operand x = random_operand({2, 3, 2}, -2.0F, 2.0F, 67U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return erf(v[0]); }, [](const auto& t) { return ops::erf(t[0]); });
    const double two_over_sqrt_pi = 2.0 / std::sqrt(std::acos(-1.0));
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights,
                    [&](double v, double w) { return w * two_over_sqrt_pi * std::exp(-v * v); }),
        hand_atol, hand_rtol));
}

TEST(AutogradUnary, GeluGradientIsTheExactErfDerivative) {
    const Operand x = random_operand({3, 5}, -3.0F, 3.0F, 68U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return gelu(v[0]); },
        [](const auto& t) { return ops::gelu(t[0]); });
    // d/dx 0.5·x·(1 + erf(x/√2)) = 0.5·(1 + erf(x/√2)) + x·φ(x).
    const double inverse_sqrt_two_pi = 1.0 / std::sqrt(2.0 * std::acos(-1.0));
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights,
                    [&](double v, double w) {
                        return w * (0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
                                    v * inverse_sqrt_two_pi * std::exp(-0.5 * v * v));
                    }),
        hand_atol, hand_rtol));
}

TEST(AutogradUnary, ReluAwayFromZeroPassesTheUpstreamOnlyWherePositive) {
    const Operand x = away_from_zero(random_operand({3, 4}, -1.0F, 1.0F, 69U), 0.1F);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return relu(v[0]); },
        [](const auto& t) { return ops::relu(t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights, [](double v, double w) { return v > 0 ? w : 0.0; }),
        0.0, 0.0));
}

TEST(AutogradUnary, ReluAtExactlyZeroPassesNoGradient) {
    Variable x(Tensor({4}, {-1.0F, 0.0F, -0.0F, 2.0F}));
    Variable y = relu(x);
    y.backward(Tensor({4}, {1.0F, 1.0F, 1.0F, 1.0F}));
    EXPECT_TRUE(testing::bit_identical(x.gradient().to_host(), {0.0F, 0.0F, 0.0F, 1.0F}));
}

TEST(AutogradUnary, SiluGradientIsSigmoidTimesOnePlusXTimesOneMinusSigmoid) {
    const Operand x = random_operand({3, 5}, -4.0F, 4.0F, 70U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return silu(v[0]); },
        [](const auto& t) { return ops::silu(t[0]); });
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   elementwise(x.values, checked.weights,
                                               [](double v, double w) {
                                                   const double sigmoid =
                                                       1.0 / (1.0 + std::exp(-v));
                                                   return w * sigmoid * (1.0 + v * (1.0 - sigmoid));
                                               }),
                                   hand_atol, hand_rtol));
}

// ---------------------------------------------------------------------------------------------
// Indexing

TEST(AutogradIndexing, GatherRowsGradientScatterAddsRepeatedRows) {
    // table [5,3]; indices [2,3] with row 1 three times, row 2 never.
    const std::vector<std::size_t> indices = {1, 3, 1, 4, 1, 0};
    const Shape index_shape = {2, 3};
    const auto checked = check_operation(
        {random_operand({5, 3}, -1.0F, 1.0F, 71U)},
        [&](const auto& v) { return gather_rows(v[0], indices, index_shape); },
        [&](const auto& t) { return ops::gather_rows(t[0], indices, index_shape); });
    ASSERT_EQ(checked.output.shape(), (Shape{2, 3, 3}));
    std::vector<double> expected(15, 0.0);
    for (std::size_t position = 0; position < indices.size(); ++position) {
        for (std::size_t c = 0; c < 3; ++c) {
            expected[indices[position] * 3 + c] += checked.weights[position * 3 + c];
        }
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected));
    const std::vector<float> gradient = checked.inputs[0].gradient().to_host();
    EXPECT_TRUE(testing::bit_identical({gradient[6], gradient[7], gradient[8]}, {0.0F, 0.0F, 0.0F}))
        << "a row that was never gathered gets exactly zero";
}

// ---------------------------------------------------------------------------------------------
// Softmax, normalisation, cross-entropy

namespace {

// Σ w ⊙ softmax(x, axis) for x [2,3,4], in double.
double softmax_objective(const std::vector<double>& x, const std::vector<float>& w,
                         std::size_t axis) {
    const std::size_t extents[3] = {2, 3, 4};
    const std::size_t strides[3] = {12, 4, 1};
    double total = 0.0;
    for (std::size_t base = 0; base < 24; ++base) {
        if ((base / strides[axis]) % extents[axis] != 0)
            continue;  // one slice per start
        double peak = -std::numeric_limits<double>::infinity();
        for (std::size_t e = 0; e < extents[axis]; ++e) {
            peak = std::max(peak, x[base + e * strides[axis]]);
        }
        double denominator = 0.0;
        for (std::size_t e = 0; e < extents[axis]; ++e) {
            denominator += std::exp(x[base + e * strides[axis]] - peak);
        }
        for (std::size_t e = 0; e < extents[axis]; ++e) {
            const std::size_t at = base + e * strides[axis];
            total += w[at] * std::exp(x[at] - peak) / denominator;
        }
    }
    return total;
}

// Σ w ⊙ layer_norm(x)·scale + bias over rows of width `width`, in double.
double layer_norm_objective(const std::vector<double>& x, const std::vector<double>& scale,
                            const std::vector<double>& bias, const std::vector<float>& w,
                            std::size_t width, double epsilon) {
    double total = 0.0;
    for (std::size_t row = 0; row < x.size() / width; ++row) {
        double mu = 0.0;
        for (std::size_t c = 0; c < width; ++c)
            mu += x[row * width + c];
        mu /= static_cast<double>(width);
        double variance = 0.0;
        for (std::size_t c = 0; c < width; ++c) {
            const double d = x[row * width + c] - mu;
            variance += d * d;
        }
        variance /= static_cast<double>(width);
        const double inverse = 1.0 / std::sqrt(variance + epsilon);
        for (std::size_t c = 0; c < width; ++c) {
            const double y = (x[row * width + c] - mu) * inverse * scale[c] + bias[c];
            total += w[row * width + c] * y;
        }
    }
    return total;
}

// Σ w ⊙ x·scale/√(mean(x²) + eps), in double.
double rms_norm_objective(const std::vector<double>& x, const std::vector<double>& scale,
                          const std::vector<float>& w, std::size_t width, double epsilon) {
    double total = 0.0;
    for (std::size_t row = 0; row < x.size() / width; ++row) {
        double square_mean = 0.0;
        for (std::size_t c = 0; c < width; ++c)
            square_mean += x[row * width + c] * x[row * width + c];
        square_mean /= static_cast<double>(width);
        const double inverse = 1.0 / std::sqrt(square_mean + epsilon);
        for (std::size_t c = 0; c < width; ++c) {
            total += w[row * width + c] * x[row * width + c] * inverse * scale[c];
        }
    }
    return total;
}

// Mean over positions of −log softmax(z)[target], in double.
double cross_entropy_objective(const std::vector<double>& logits,
                               const std::vector<std::uint32_t>& targets, std::size_t vocabulary) {
    double total = 0.0;
    for (std::size_t n = 0; n < targets.size(); ++n) {
        double peak = -std::numeric_limits<double>::infinity();
        for (std::size_t v = 0; v < vocabulary; ++v)
            peak = std::max(peak, logits[n * vocabulary + v]);
        double denominator = 0.0;
        for (std::size_t v = 0; v < vocabulary; ++v) {
            denominator += std::exp(logits[n * vocabulary + v] - peak);
        }
        total -= logits[n * vocabulary + targets[n]] - peak - std::log(denominator);
    }
    return total / static_cast<double>(targets.size());
}

std::vector<double> to_double_vector(const std::vector<float>& values) {
    return {values.begin(), values.end()};
}

constexpr double epsilon_double = static_cast<double>(ops::default_normalization_epsilon);

}  // namespace

TEST(AutogradSoftmax, GradientOnEachAxisMatchesFiniteDifferences) {
    const Operand x = random_operand({2, 3, 4}, -2.0F, 2.0F, 72U);
    for (std::size_t axis = 0; axis < 3; ++axis) {
        SCOPED_TRACE("axis " + std::to_string(axis));
        const auto checked = check_operation(
            {x}, [&](const auto& v) { return softmax(v[0], axis); },
            [&](const auto& t) { return ops::softmax(t[0], axis); });
        const auto oracle = [&](const std::vector<double>& values) {
            return softmax_objective(values, checked.weights, axis);
        };
        EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                       double_finite_difference(oracle, x.values), 2e-3, 0.0))
            << "against the double oracle";
    }
}

TEST(AutogradNormalization, LayerNormGradientsOfInputScaleAndBiasMatchFiniteDifferences) {
    const Operand x = random_operand({2, 3, 4}, -2.0F, 2.0F, 73U);
    const Operand scale = random_operand({4}, 0.5F, 1.5F, 74U);
    const Operand bias = random_operand({4}, -0.5F, 0.5F, 75U);
    const auto checked = check_operation(
        {x, scale, bias}, [](const auto& v) { return layer_norm(v[0], v[1], v[2]); },
        [](const auto& t) { return ops::layer_norm(t[0], t[1], t[2]).output; });
    const auto x_d = to_double_vector(x.values);
    const auto scale_d = to_double_vector(scale.values);
    const auto bias_d = to_double_vector(bias.values);
    const auto& w = checked.weights;
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   double_finite_difference(
                                       [&](const auto& v) {
                                           return layer_norm_objective(v, scale_d, bias_d, w, 4,
                                                                       epsilon_double);
                                       },
                                       x.values),
                                   2e-3, 0.0));
    EXPECT_TRUE(testing::all_close(checked.inputs[1].gradient(),
                                   double_finite_difference(
                                       [&](const auto& v) {
                                           return layer_norm_objective(x_d, v, bias_d, w, 4,
                                                                       epsilon_double);
                                       },
                                       scale.values),
                                   2e-3, 0.0));
    EXPECT_TRUE(testing::all_close(checked.inputs[2].gradient(),
                                   double_finite_difference(
                                       [&](const auto& v) {
                                           return layer_norm_objective(x_d, scale_d, v, w, 4,
                                                                       epsilon_double);
                                       },
                                       bias.values),
                                   2e-3, 0.0));
}

TEST(AutogradNormalization, LayerNormWithAnExplicitEpsilonUsesIt) {
    constexpr float epsilon = 0.5F;  // large enough to change every gradient visibly
    check_operation(
        {random_operand({3, 4}, -1.0F, 1.0F, 76U), random_operand({4}, 0.5F, 1.5F, 77U),
         random_operand({4}, -0.5F, 0.5F, 78U)},
        [](const auto& v) { return layer_norm(v[0], v[1], v[2], epsilon); },
        [](const auto& t) { return ops::layer_norm(t[0], t[1], t[2], epsilon).output; });
}

TEST(AutogradNormalization, RmsNormGradientsOfInputAndScaleMatchFiniteDifferences) {
    const Operand x = random_operand({2, 3, 4}, -2.0F, 2.0F, 79U);
    const Operand scale = random_operand({4}, 0.5F, 1.5F, 80U);
    const auto checked = check_operation(
        {x, scale}, [](const auto& v) { return rms_norm(v[0], v[1]); },
        [](const auto& t) { return ops::rms_norm(t[0], t[1]).output; });
    const auto x_d = to_double_vector(x.values);
    const auto scale_d = to_double_vector(scale.values);
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   double_finite_difference(
                                       [&](const auto& v) {
                                           return rms_norm_objective(v, scale_d, checked.weights, 4,
                                                                     epsilon_double);
                                       },
                                       x.values),
                                   2e-3, 0.0));
    EXPECT_TRUE(testing::all_close(checked.inputs[1].gradient(),
                                   double_finite_difference(
                                       [&](const auto& v) {
                                           return rms_norm_objective(x_d, v, checked.weights, 4,
                                                                     epsilon_double);
                                       },
                                       scale.values),
                                   2e-3, 0.0));
}

TEST(AutogradNormalization, NormalisationWithAConstantScaleDifferentiatesOnlyTheInput) {
    check_operation(
        {random_operand({2, 4}, -1.0F, 1.0F, 81U), constant(random_operand({4}, 0.5F, 1.5F, 82U)),
         constant(random_operand({4}, -0.5F, 0.5F, 83U))},
        [](const auto& v) { return layer_norm(v[0], v[1], v[2]); },
        [](const auto& t) { return ops::layer_norm(t[0], t[1], t[2]).output; });
    check_operation(
        {constant(random_operand({2, 4}, -1.0F, 1.0F, 84U)), random_operand({4}, 0.5F, 1.5F, 85U)},
        [](const auto& v) { return rms_norm(v[0], v[1]); },
        [](const auto& t) { return ops::rms_norm(t[0], t[1]).output; });
}

namespace {

void check_cross_entropy(const Shape& shape, const std::vector<std::uint32_t>& targets,
                         std::uint32_t seed) {
    const Operand logits = random_operand(shape, -2.0F, 2.0F, seed);
    const auto checked = check_operation(
        {logits}, [&](const auto& v) { return cross_entropy(v[0], targets); },
        [&](const auto& t) { return ops::cross_entropy(t[0], targets).loss; });
    ASSERT_EQ(checked.output.shape(), Shape{});
    const std::size_t vocabulary = shape.back();
    const double upstream = checked.weights[0];
    // Closed form: w·(softmax(z) − onehot(y))/N, in double.
    std::vector<double> expected(logits.values.size());
    for (std::size_t n = 0; n < targets.size(); ++n) {
        double peak = -std::numeric_limits<double>::infinity();
        for (std::size_t v = 0; v < vocabulary; ++v) {
            peak = std::max(peak, double{logits.values[n * vocabulary + v]});
        }
        double denominator = 0.0;
        for (std::size_t v = 0; v < vocabulary; ++v) {
            denominator += std::exp(logits.values[n * vocabulary + v] - peak);
        }
        for (std::size_t v = 0; v < vocabulary; ++v) {
            const double probability =
                std::exp(logits.values[n * vocabulary + v] - peak) / denominator;
            expected[n * vocabulary + v] = upstream *
                                           (probability - (v == targets[n] ? 1.0 : 0.0)) /
                                           static_cast<double>(targets.size());
        }
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected, hand_atol, hand_rtol));
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(),
                                   double_finite_difference(
                                       [&](const std::vector<double>& v) {
                                           return upstream *
                                                  cross_entropy_objective(v, targets, vocabulary);
                                       },
                                       logits.values),
                                   2e-3, 0.0))
        << "against the double oracle";
}

}  // namespace

TEST(AutogradLoss, CrossEntropyOnRank2LogitsScalesTheBaseGradientByTheUpstream) {
    check_cross_entropy({4, 5}, {0, 4, 2, 3}, 86U);
}

TEST(AutogradLoss, CrossEntropyOnRank3LogitsScalesTheBaseGradientByTheUpstream) {
    check_cross_entropy({2, 3, 5}, {1, 0, 4, 4, 2, 3}, 87U);
}

TEST(AutogradLoss, CrossEntropyWithTheImplicitSeedGivesTheBaseGradient) {
    const std::vector<float> values = testing::pseudo_random(8, -2.0F, 2.0F, 88U);
    const std::vector<std::uint32_t> targets = {2, 1};
    Variable logits(Tensor({2, 4}, values));
    Variable loss = cross_entropy(logits, targets);
    loss.backward();
    const ops::CrossEntropyResult raw = ops::cross_entropy(Tensor({2, 4}, values), targets);
    EXPECT_TRUE(testing::all_close(logits.gradient(), as_double(raw.gradient.to_host())));
}

// ---------------------------------------------------------------------------------------------
// Graph rules

TEST(AutogradGraph, OperationsOnConstantsGiveDetachedLeaves) {
    const auto c = [](Shape shape, std::uint32_t seed, float lo = -1.0F, float hi = 1.0F) {
        return Variable(tensor_of(random_operand(std::move(shape), lo, hi, seed)), false);
    };
    const Variable a = c({2, 3}, 90U);
    const Variable b = c({2, 3}, 91U, 0.5F, 1.5F);
    const Variable square = c({3, 3}, 92U);
    const Variable positive = c({2, 3}, 93U, 0.5F, 2.0F);
    const Variable scale = c({3}, 94U);
    const Variable bias = c({3}, 95U);
    const std::vector<std::size_t> indices = {0, 1, 1};
    const std::vector<std::uint32_t> targets = {0, 2};
    const std::vector<std::pair<std::string, std::function<Variable()>>> operations = {
        {"add", [&] { return a + b; }},
        {"subtract", [&] { return a - b; }},
        {"multiply", [&] { return a * b; }},
        {"divide", [&] { return a / b; }},
        {"negate", [&] { return -a; }},
        {"add scalar", [&] { return a + 1.0F; }},
        {"scalar add", [&] { return 1.0F + a; }},
        {"subtract scalar", [&] { return a - 1.0F; }},
        {"scalar subtract", [&] { return 1.0F - a; }},
        {"scale", [&] { return a * 2.0F; }},
        {"scalar scale", [&] { return 2.0F * a; }},
        {"divide by scalar", [&] { return a / 2.0F; }},
        {"scalar divide", [&] { return 2.0F / b; }},
        {"matmul", [&] { return matmul(square, square); }},
        {"permute",
         [&] {
             return permute(a, {1, 0});
         }},
        {"transpose_2d", [&] { return transpose_2d(a); }},
        {"reshape", [&] { return reshape(a, {6}); }},
        {"broadcast_to",
         [&] {
             return broadcast_to(scale, {2, 3});
         }},
        {"sum_to_shape", [&] { return sum_to_shape(a, {3}); }},
        {"concatenate", [&] { return concatenate_last_axis(a, b); }},
        {"slice", [&] { return slice(a, 1, 1, 2); }},
        {"sum", [&] { return sum(a); }},
        {"sum axis", [&] { return sum(a, 1, true); }},
        {"mean", [&] { return mean(a); }},
        {"mean axis", [&] { return mean(a, 0); }},
        {"exp", [&] { return exp(a); }},
        {"log", [&] { return log(positive); }},
        {"sqrt", [&] { return sqrt(positive); }},
        {"erf", [&] { return erf(a); }},
        {"gelu", [&] { return gelu(a); }},
        {"gelu_tanh", [&] { return gelu_tanh(a); }},
        {"relu", [&] { return relu(a); }},
        {"silu", [&] { return silu(a); }},
        {"gather_rows", [&] { return gather_rows(square, indices, {3}); }},
        {"softmax", [&] { return softmax(a, 1); }},
        {"layer_norm", [&] { return layer_norm(a, scale, bias); }},
        {"rms_norm", [&] { return rms_norm(a, scale); }},
        {"cross_entropy", [&] { return cross_entropy(a, targets); }},
    };
    for (const auto& [name, operation] : operations) {
        SCOPED_TRACE(name);
        reset_autograd_counters();
        Variable result = operation();
        EXPECT_EQ(autograd_counters().nodes_created, 0U) << "a constant is not an interior node";
        EXPECT_TRUE(result.is_leaf());
        EXPECT_FALSE(result.requires_gradient());
        EXPECT_EQ(result.graph_statistics().node_count, 1U) << "a detached result keeps no parents";
        EXPECT_THROW(result.backward(Tensor::full(result.shape(), 1.0F)), std::logic_error);
        if (result.value().numel() == 1) {
            EXPECT_THROW(result.backward(), std::logic_error);
        }
        EXPECT_THROW(static_cast<void>(result.gradient()), std::logic_error);
    }
}

TEST(AutogradGraph, MixingAConstantAndAVariableGivesAGradientOnlyToTheVariable) {
    const std::vector<float> c_values = {2.0F, -3.0F, 0.5F, 4.0F};
    const std::vector<float> x_values = {1.0F, 2.0F, -1.0F, 0.25F};
    Variable c(Tensor({2, 2}, c_values), false);
    Variable x(Tensor({2, 2}, x_values));
    // L = Σ (c ⊙ x + c) ⊙ x + Σ matmul(c, x): dL/dx = 2·c ⊙ x + c + cᵀ·1.
    Variable loss = sum((c * x + c) * x) + sum(matmul(c, x));
    loss.backward();
    EXPECT_TRUE(testing::all_close(
        x.gradient(),
        {2.0 * 2.0 * 1.0 + 2.0 + (2.0 + 0.5), 2.0 * -3.0 * 2.0 - 3.0 + (2.0 + 0.5),
         2.0 * 0.5 * -1.0 + 0.5 + (-3.0 + 4.0), 2.0 * 4.0 * 0.25 + 4.0 + (-3.0 + 4.0)}));
    EXPECT_THROW(static_cast<void>(c.gradient()), std::logic_error);
    EXPECT_THROW(static_cast<void>(c.has_gradient()), std::logic_error);
    EXPECT_TRUE(testing::bit_identical(c.value().to_host(), c_values));
}

TEST(AutogradGraph, UsingOneVariableTwiceInMultiplyAccumulatesBothPaths) {
    const Operand x = random_operand({2, 3}, -2.0F, 2.0F, 96U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return v[0] * v[0]; },
        [](const auto& t) { return ops::multiply(t[0], t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights, [](double v, double w) { return 2.0 * v * w; }),
        hand_atol, hand_rtol));
}

TEST(AutogradGraph, UsingOneVariableTwiceInAddAccumulatesBothPaths) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -2.0F, 2.0F, 97U)}, [](const auto& v) { return v[0] + v[0]; },
        [](const auto& t) { return ops::add(t[0], t[0]); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(checked.weights, checked.weights, [](double w, double) { return 2.0 * w; })));
}

TEST(AutogradGraph, UsingOneVariableTwiceInSubtractAndDivideCancels) {
    const Operand x = away_from_zero(random_operand({2, 3}, -1.0F, 1.0F, 98U), 0.5F);
    const auto difference = check_operation(
        {x}, [](const auto& v) { return v[0] - v[0]; },
        [](const auto& t) { return ops::subtract(t[0], t[0]); });
    EXPECT_TRUE(testing::all_close(difference.inputs[0].gradient(), std::vector<double>(6, 0.0)));
    const auto ratio = check_operation(
        {x}, [](const auto& v) { return v[0] / v[0]; },
        [](const auto& t) { return ops::divide(t[0], t[0]); });
    EXPECT_TRUE(
        testing::all_close(ratio.inputs[0].gradient(), std::vector<double>(6, 0.0), 1e-6, 0.0));
}

TEST(AutogradGraph, MatmulOfASquareVariableWithItselfAccumulatesBothProducts) {
    const Operand x = random_operand({3, 3}, -1.0F, 1.0F, 99U);
    const auto checked = check_operation(
        {x}, [](const auto& v) { return matmul(v[0], v[0]); },
        [](const auto& t) { return ops::matmul(t[0], t[0]); });
    // d<W, X·X>/dX = W·Xᵀ + Xᵀ·W.
    std::vector<double> expected(9, 0.0);
    for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 3; ++j) {
            for (std::size_t k = 0; k < 3; ++k) {
                expected[i * 3 + j] += double{checked.weights[i * 3 + k]} * x.values[j * 3 + k] +
                                       double{x.values[k * 3 + i]} * checked.weights[k * 3 + j];
            }
        }
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected, hand_atol, hand_rtol));
}

TEST(AutogradGraph, ConcatenatingAVariableWithItselfAddsBothSlices) {
    const auto checked = check_operation(
        {random_operand({2, 3}, -1.0F, 1.0F, 102U)},
        [](const auto& v) { return concatenate_last_axis(v[0], v[0]); },
        [](const auto& t) { return ops::concatenate_last_axis(t[0], t[0]); });
    const std::vector<float>& w = checked.weights;  // [2,6]
    std::vector<double> expected(6);
    for (std::size_t r = 0; r < 2; ++r) {
        for (std::size_t c = 0; c < 3; ++c) {
            expected[r * 3 + c] = double{w[r * 6 + c]} + w[r * 6 + 3 + c];
        }
    }
    EXPECT_TRUE(testing::all_close(checked.inputs[0].gradient(), expected));
}

TEST(AutogradGraph, AVariableUsedAsLayerNormScaleAndBiasGetsBothGradients) {
    // layer_norm(x, s, s): ds = Σ_rows w ⊙ x̂ + Σ_rows w.
    check_operation(
        {random_operand({3, 4}, -1.0F, 1.0F, 103U), random_operand({4}, 0.5F, 1.5F, 104U)},
        [](const auto& v) { return layer_norm(v[0], v[1], v[1]); },
        [](const auto& t) { return ops::layer_norm(t[0], t[1], t[1]).output; });
}

TEST(AutogradGraph, TwoGathersFromOneTableAccumulateIntoTheSameRows) {
    const std::vector<std::size_t> first = {0, 2};
    const std::vector<std::size_t> second = {2, 2, 1};
    check_operation(
        {random_operand({4, 2}, -1.0F, 1.0F, 105U)},
        [&](const auto& v) {
            return concatenate_last_axis(reshape(gather_rows(v[0], first, {2}), {1, 4}),
                                         reshape(gather_rows(v[0], second, {3}), {1, 6}));
        },
        [&](const auto& t) {
            return ops::concatenate_last_axis(
                ops::reshape(ops::gather_rows(t[0], first, {2}), {1, 4}),
                ops::reshape(ops::gather_rows(t[0], second, {3}), {1, 6}));
        });
}

TEST(AutogradGraph, DiamondGraphCountsEveryPathExactlyOnce) {
    // a = exp(x), b = x ⊙ x, L = Σ w ⊙ (a ⊙ b): dL/dx = w ⊙ eˣ ⊙ (x² + 2x).
    const Operand x = random_operand({2, 3}, -1.0F, 1.0F, 100U);
    const auto checked = check_operation(
        {x},
        [](const auto& v) {
            const Variable a = exp(v[0]);
            const Variable b = v[0] * v[0];
            return a * b;
        },
        [](const auto& t) { return ops::multiply(ops::exp(t[0]), ops::multiply(t[0], t[0])); });
    EXPECT_TRUE(testing::all_close(
        checked.inputs[0].gradient(),
        elementwise(x.values, checked.weights,
                    [](double v, double w) { return w * std::exp(v) * (v * v + 2.0 * v); }),
        hand_atol, hand_rtol));
}

TEST(AutogradGraph, SharedIntermediateReceivesAllItsContributionsBeforeItsRuleRuns) {
    // s = 2x; u = s + 1; v = 3s; L = Σ w ⊙ u ⊙ v = Σ w ⊙ (6s² + 3s) -> dL/dx = w ⊙ (24x + 6).
    const Operand x = random_operand({4}, -0.5F, 0.5F, 101U);
    const auto checked = check_operation(
        {x},
        [](const auto& v) {
            const Variable s = v[0] * 2.0F;
            const Variable u = s + 1.0F;
            const Variable three_s = s * 3.0F;
            return u * three_s;
        },
        [](const auto& t) {
            const Tensor s = ops::scale(t[0], 2.0F);
            return ops::multiply(ops::add_scalar(s, 1.0F), ops::scale(s, 3.0F));
        });
    EXPECT_TRUE(
        testing::all_close(checked.inputs[0].gradient(),
                           elementwise(x.values, checked.weights,
                                       [](double v, double w) { return w * (24.0 * v + 6.0); }),
                           hand_atol, hand_rtol));
}

// ---------------------------------------------------------------------------------------------
// Domain errors

namespace {

// Runs `operation`, which must throw Error, and checks that it created no node and changed no
// input (value, version, gradient state).
template <typename Error>
void expect_throws_creating_nothing(const std::function<Variable()>& operation,
                                    std::vector<Variable> inputs) {
    std::vector<std::vector<float>> values;
    std::vector<std::uint64_t> versions;
    for (const Variable& input : inputs) {
        values.push_back(input.value().to_host());
        versions.push_back(input.version());
    }
    const std::uint64_t nodes_before = autograd_counters().nodes_created;
    EXPECT_THROW(static_cast<void>(operation()), Error);
    EXPECT_EQ(autograd_counters().nodes_created, nodes_before);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(inputs[i].value().to_host(), values[i]))
            << "input " << i;
        EXPECT_EQ(inputs[i].version(), versions[i]) << "input " << i;
        if (inputs[i].is_leaf() && inputs[i].requires_gradient()) {
            EXPECT_FALSE(inputs[i].has_gradient()) << "input " << i;
        }
    }
}

}  // namespace

TEST(AutogradDomain, DifferentiableSqrtAtExactlyZeroIsDomainErrorWhereRawSqrtIsZero) {
    const Tensor values({3}, {4.0F, 0.0F, 1.0F});
    EXPECT_TRUE(testing::bit_identical(ops::sqrt(values).to_host(), {2.0F, 0.0F, 1.0F}));
    Variable x(values);
    expect_throws_creating_nothing<std::domain_error>([&] { return sqrt(x); }, {x});
    Variable negative_zero(Tensor({1}, {-0.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return sqrt(negative_zero); },
                                                      {negative_zero});
    Variable negative(Tensor({2}, {1.0F, -1.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return sqrt(negative); }, {negative});
}

TEST(AutogradDomain, DifferentiableSqrtRejectsZeroEvenForAConstantInput) {
    Variable x(Tensor({2}, {0.0F, 1.0F}), false);
    expect_throws_creating_nothing<std::domain_error>([&] { return sqrt(x); }, {x});
}

TEST(AutogradDomain, LogOfZeroOrNegativeIsDomainError) {
    Variable zero(Tensor({3}, {1.0F, 0.0F, 2.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return log(zero); }, {zero});
    Variable negative(Tensor({2}, {1.0F, -2.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return log(negative); }, {negative});
}

TEST(AutogradDomain, DividingByAVariableContainingZeroIsDomainError) {
    Variable numerator(Tensor({3}, {1.0F, 2.0F, 3.0F}));
    Variable denominator(Tensor({3}, {1.0F, 0.0F, 2.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return numerator / denominator; },
                                                      {numerator, denominator});
    Variable constant_numerator(Tensor({3}, {1.0F, 2.0F, 3.0F}), false);
    expect_throws_creating_nothing<std::domain_error>(
        [&] { return constant_numerator / denominator; }, {constant_numerator, denominator});
}

TEST(AutogradDomain, ScalarOverAVariableWithAZeroElementIsDomainError) {
    Variable x(Tensor({2, 2}, {1.0F, 2.0F, 0.0F, 4.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return 1.0F / x; }, {x});
    expect_throws_creating_nothing<std::domain_error>([&] { return 0.0F / x; }, {x});
}

TEST(AutogradDomain, VariableOverTheScalarZeroIsDomainError) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    expect_throws_creating_nothing<std::domain_error>([&] { return x / 0.0F; }, {x});
    expect_throws_creating_nothing<std::domain_error>([&] { return x / -0.0F; }, {x});
}

TEST(AutogradDomain, NonFiniteScalarsAreInvalidArgument) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    constexpr float infinity = std::numeric_limits<float>::infinity();
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    for (const float bad : {infinity, -infinity, nan}) {
        SCOPED_TRACE(bad);
        expect_throws_creating_nothing<std::invalid_argument>([&] { return x + bad; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return bad + x; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return x - bad; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return bad - x; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return x * bad; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return bad * x; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return x / bad; }, {x});
        expect_throws_creating_nothing<std::invalid_argument>([&] { return bad / x; }, {x});
    }
}

// ---------------------------------------------------------------------------------------------
// Raw-operation errors propagate with their category and create nothing

TEST(AutogradErrors, ElementwiseShapeMismatchIsInvalidArgument) {
    Variable a(Tensor({2, 3}, 1.0F));
    Variable b(Tensor({3, 2}, 1.0F));
    expect_throws_creating_nothing<std::invalid_argument>([&] { return a + b; }, {a, b});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return a - b; }, {a, b});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return a * b; }, {a, b});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return a / b; }, {a, b});
}

TEST(AutogradErrors, MatmulShapeErrorsAreInvalidArgument) {
    Variable a(Tensor({2, 3}, 1.0F));
    Variable inner_mismatch(Tensor({2, 3}, 1.0F));
    Variable rank_mismatch(Tensor({1, 3, 2}, 1.0F));
    Variable batch_a(Tensor({2, 2, 3}, 1.0F));
    Variable batch_b(Tensor({3, 3, 2}, 1.0F));
    expect_throws_creating_nothing<std::invalid_argument>([&] { return matmul(a, inner_mismatch); },
                                                          {a, inner_mismatch});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return matmul(a, rank_mismatch); },
                                                          {a, rank_mismatch});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return matmul(batch_a, batch_b); },
                                                          {batch_a, batch_b});
}

TEST(AutogradErrors, LayoutErrorsKeepTheirCategories) {
    Variable x(Tensor({2, 3, 4}, 1.0F));
    Variable matrix(Tensor({2, 3}, 1.0F));
    Variable other(Tensor({3, 3}, 1.0F));
    expect_throws_creating_nothing<std::out_of_range>([&] { return permute(x, {0, 1, 3}); }, {x});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return permute(x, {0, 1}); }, {x});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] {
            return permute(x, {0, 1, 1});
        },
        {x});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return transpose_2d(x); }, {x});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return reshape(x, {5, 5}); }, {x});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] {
            return broadcast_to(matrix, {3, 3});
        },
        {matrix});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return sum_to_shape(matrix, {4}); },
                                                          {matrix});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return concatenate_last_axis(matrix, other); }, {matrix, other});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return concatenate_last_axis(std::span<const Variable>()); }, {});
    expect_throws_creating_nothing<std::out_of_range>([&] { return slice(x, 3, 0, 1); }, {x});
    expect_throws_creating_nothing<std::out_of_range>([&] { return slice(x, 1, 2, 2); }, {x});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return slice(x, 1, 0, 0); }, {x});
}

TEST(AutogradErrors, ReductionAndSoftmaxAxisErrorsAreOutOfRange) {
    Variable x(Tensor({2, 3, 4}, 1.0F));
    expect_throws_creating_nothing<std::out_of_range>([&] { return sum(x, 3); }, {x});
    expect_throws_creating_nothing<std::out_of_range>([&] { return sum(x, 3, true); }, {x});
    expect_throws_creating_nothing<std::out_of_range>([&] { return mean(x, 3); }, {x});
    expect_throws_creating_nothing<std::out_of_range>([&] { return mean(x, 7, true); }, {x});
    expect_throws_creating_nothing<std::out_of_range>([&] { return softmax(x, 3); }, {x});
}

TEST(AutogradErrors, GatherRowsErrorsKeepTheirCategories) {
    Variable table(Tensor({4, 2}, 1.0F));
    Variable cube(Tensor({2, 2, 2}, 1.0F));
    const std::vector<std::size_t> out_of_range_indices = {0, 4};
    const std::vector<std::size_t> two_indices = {0, 1};
    expect_throws_creating_nothing<std::out_of_range>(
        [&] { return gather_rows(table, out_of_range_indices, {2}); }, {table});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return gather_rows(table, two_indices, {3}); }, {table});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return gather_rows(cube, two_indices, {2}); }, {cube});
}

TEST(AutogradErrors, NormalisationArgumentErrorsAreInvalidArgument) {
    Variable x(Tensor({2, 4}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F, 7.0F, 9.0F}));
    Variable scale(Tensor({4}, 1.0F));
    Variable bias(Tensor({4}, 0.0F));
    Variable wrong(Tensor({3}, 1.0F));
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return layer_norm(x, wrong, bias); }, {x, wrong, bias});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return layer_norm(x, scale, wrong); }, {x, scale, wrong});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return layer_norm(x, scale, bias, 0.0F); }, {x, scale, bias});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return rms_norm(x, wrong); },
                                                          {x, wrong});
    expect_throws_creating_nothing<std::invalid_argument>([&] { return rms_norm(x, scale, -1.0F); },
                                                          {x, scale});
}

TEST(AutogradErrors, CrossEntropyTargetErrorsKeepTheirCategories) {
    Variable logits(Tensor({2, 3}, 0.5F));
    const std::vector<std::uint32_t> too_large = {0, 3};
    const std::vector<std::uint32_t> too_few = {0};
    expect_throws_creating_nothing<std::out_of_range>(
        [&] { return cross_entropy(logits, too_large); }, {logits});
    expect_throws_creating_nothing<std::invalid_argument>(
        [&] { return cross_entropy(logits, too_few); }, {logits});
}

TEST(AutogradErrors, AnEmptyVariableAsAnInputIsLogicError) {
    Variable x(Tensor({2}, 1.0F));
    const Variable empty;
    expect_throws_creating_nothing<std::logic_error>([&] { return x + empty; }, {x});
    expect_throws_creating_nothing<std::logic_error>([&] { return empty * 2.0F; }, {});
    expect_throws_creating_nothing<std::logic_error>([&] { return exp(empty); }, {});
    expect_throws_creating_nothing<std::logic_error>([&] { return sum(empty); }, {});
}

TEST(AutogradErrors, InputsStayUsableAfterAFailedOperation) {
    Variable a(Tensor({2}, {1.0F, 2.0F}));
    Variable b(Tensor({3}, 1.0F));
    EXPECT_THROW(static_cast<void>(a + b), std::invalid_argument);
    Variable loss = sum(a * a);
    loss.backward();
    EXPECT_TRUE(testing::all_close(a.gradient(), {2.0, 4.0}));
    EXPECT_FALSE(b.has_gradient());
}

}  // namespace riftco_transformer
