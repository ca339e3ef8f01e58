// The PJRT softmax, normalisation, loss and indexing programs against the CPU reference, on a
// real plugin (XLA's CPU plugin in CI): every operation and its backward on several shapes
// (rows of length 1, −inf masked entries, large magnitudes, a vocabulary of 1000), the loss
// windows (time range, mask), gather/scatter with repeated ids, each deferred value-domain
// error (raised at the next sync point with the CPU's category and message, inputs unchanged)
// and the autograd path gather -> layer_norm -> cross_entropy.
//
// Tolerances (|device − reference| <= absolute + relative·|reference|), all far inside the
// 1e-3 of docs/ARCHITECTURE.md, 'Numeric parity':
// - softmax: 1e-6 relative + 1e-7 absolute. Both sides are float32 with a float exp (XLA's
//   and our fast_exp, each within ~2 ulp); the row sums differ in order (XLA's reduction vs
//   our double lanes), a few ulp of a probability (observed <= 1.3e-7 relative).
// - softmax backward: 1e-6 relative + 5e-7 absolute. dx = p·(g − Σ g·p) cancels in g − Σ g·p,
//   so the float rounding of the dot product (double on the CPU, then rounded) is an absolute
//   error of about one ulp of |g| <= 2 (2.4e-7), times p <= 1.
// - LayerNorm/RMSNorm outputs and statistics: 2e-6 relative + 2e-6 absolute. The reference
//   accumulates row statistics in double, the programs in float with the row scaled by a
//   power of two and a two-pass (corrected) mean, so σ and 1/σ agree to a few ulp even
//   when |μ| >> σ; x̂ lies in about ±√W, so its ulps set the absolute term.
// - their backward: 1e-5 relative + 1e-5 absolute for dx and for the parameter gradients
//   (Σ over rows of g·x̂ with terms of both signs, summed in float here and in double there:
//   the absolute term is ~√rows·ulp(max |g·x̂|) for the row counts used).
// - cross-entropy loss: 1e-6 relative. Float terms (each within a few ulp: no cancellation,
//   log s >= 0 and m − z_y >= 0) and a float sum of at most 64 same-sign terms (64·2^-24 =
//   3.8e-6 in the worst case; observed <= 1.1e-7 against the reference's double sum). Its
//   gradient: 1e-6 relative + 1e-9 absolute (entries are softmax/N, each a few ulp apart;
//   observed <= 3e-7 relative).
// - gather is a copy (exact); scatter_add sums the same floats in index order (exact on
//   dyadic values, 1e-6 relative on random ones).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/core/tensor_ops/loss.hpp"
#include "riftco_transformer/core/tensor_ops/normalization.hpp"
#include "riftco_transformer/core/tensor_ops/softmax.hpp"
#include "support/pjrt_support.hpp"

namespace riftco_transformer {
namespace {

using test::close_to;
using test::pjrt_test_backend;
using test::uniform_values;

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr float nan = std::numeric_limits<float>::quiet_NaN();
constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;

constexpr double softmax_relative = 1e-6;
constexpr double softmax_absolute = 1e-7;
constexpr double softmax_backward_absolute = 5e-7;
// Row statistics that the reference holds as float subnormals (1/σ of rows near FLT_MAX):
// XLA's CPU flushes subnormal results to zero.
constexpr double statistic_absolute = std::numeric_limits<float>::min();
constexpr double norm_relative = 2e-6;
constexpr double norm_absolute = 2e-6;
constexpr double norm_backward_tolerance = 1e-5;
constexpr double loss_relative = 1e-6;
constexpr double loss_gradient_absolute = 1e-9;

class PjrtSoftmaxNormLoss : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }
    ExecutionBackend device = pjrt_test_backend();
};

std::vector<float> host(const Tensor& tensor) {
    return tensor.to_host();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The reference's error (category Exception) and the device's: the device call does not throw,
// the output's first sync point does, with the same message; the input is unchanged and the
// next sync point is clean.
template <typename Exception, typename Operation>
void expect_same_deferred_error(ExecutionBackend device, const Shape& shape,
                                const std::vector<float>& values, Operation operation) {
    std::string reference_message;
    try {
        static_cast<void>(operation(Tensor(shape, values, cpu)));
        FAIL() << "the CPU reference accepted the input";
    } catch (const Exception& error) {
        reference_message = error.what();
    }
    const Tensor input(shape, values, device);
    Tensor output;
    ASSERT_NO_THROW(output = operation(input));
    try {
        static_cast<void>(output.to_host());
        FAIL() << "the sync point did not raise the deferred error (" << reference_message << ")";
    } catch (const Exception& error) {
        EXPECT_EQ(std::string(error.what()), reference_message);
    }
    EXPECT_TRUE(same_bits(input.to_host(), values));
}

// ---- softmax ---------------------------------------------------------------------------------

struct AxisCase {
    Shape shape;
    std::size_t axis;
};

const AxisCase axis_cases[] = {{{1}, 0},       {{6}, 0},       {{3, 1}, 1},    {{3, 1}, 0},
                               {{4, 7}, 1},    {{4, 7}, 0},    {{2, 3, 5}, 0}, {{2, 3, 5}, 1},
                               {{2, 3, 5}, 2}, {{8, 1000}, 1}, {{2, 33, 3}, 1}};

// Values in [-8, 8) of `shape` with some −inf entries (never a whole slice along `axis`) and
// a few large ones.
std::vector<float> softmax_inputs(const Shape& shape, std::size_t axis, unsigned seed) {
    const std::size_t count = checked_element_count(shape);
    std::vector<float> values = uniform_values(count, -8.0F, 8.0F, seed);
    for (std::size_t i = 3; i < count; i += 7) {
        values[i] = -infinity;
    }
    for (std::size_t i = 5; i < count; i += 11) {
        values[i] = values[i] * 4000.0F;
    }
    std::size_t inner = 1;
    for (std::size_t d = axis + 1; d < shape.size(); ++d) {
        inner *= shape[d];
    }
    const std::size_t extent = shape[axis];
    for (std::size_t o = 0; o < count / (extent * inner); ++o) {
        for (std::size_t i = 0; i < inner; ++i) {
            float& first = values[o * extent * inner + i];
            if (std::isinf(first)) {
                first = 1.0F;  // entry 0 of every slice is finite
            }
        }
    }
    return values;
}

TEST_F(PjrtSoftmaxNormLoss, SoftmaxMatchesTheReferenceOnEveryAxis) {
    unsigned seed = 1;
    for (const AxisCase& c : axis_cases) {
        const std::vector<float> values = softmax_inputs(c.shape, c.axis, seed++);
        const Tensor reference = tensor_ops::softmax(Tensor(c.shape, values, cpu), c.axis);
        const Tensor result = tensor_ops::softmax(Tensor(c.shape, values, device), c.axis);
        EXPECT_EQ(result.backend(), device);
        EXPECT_TRUE(close_to(host(result), host(reference), softmax_absolute, softmax_relative))
            << shape_to_string(c.shape) << " axis " << c.axis;
    }
}

TEST_F(PjrtSoftmaxNormLoss, SoftmaxOfLargeMagnitudesIsStable) {
    // exp(x) alone would overflow; the max shift keeps both sides exact at the peak.
    const std::vector<float> values = {3e4F, 3e4F - 1.0F, -3e4F, 1e30F, 1e30F, -1e30F};
    const Tensor reference = tensor_ops::softmax(Tensor({2, 3}, values, cpu), 1);
    const Tensor result = tensor_ops::softmax(Tensor({2, 3}, values, device), 1);
    EXPECT_TRUE(close_to(host(result), host(reference), softmax_absolute, softmax_relative));
}

TEST_F(PjrtSoftmaxNormLoss, SoftmaxBackwardMatchesTheReference) {
    unsigned seed = 40;
    for (const AxisCase& c : axis_cases) {
        const std::size_t count = checked_element_count(c.shape);
        const std::vector<float> logits = uniform_values(count, -4.0F, 4.0F, seed++);
        const std::vector<float> upstream = uniform_values(count, -2.0F, 2.0F, seed++);
        const Tensor p_cpu = tensor_ops::softmax(Tensor(c.shape, logits, cpu), c.axis);
        const std::vector<float> p = host(p_cpu);
        const Tensor reference =
            tensor_ops::softmax_backward(p_cpu, Tensor(c.shape, upstream, cpu), c.axis);
        const Tensor result = tensor_ops::softmax_backward(
            Tensor(c.shape, p, device), Tensor(c.shape, upstream, device), c.axis);
        EXPECT_TRUE(
            close_to(host(result), host(reference), softmax_backward_absolute, softmax_relative))
            << shape_to_string(c.shape) << " axis " << c.axis;
    }
}

const Shape causal_shapes[] = {{1, 1, 1, 1}, {2, 3, 5, 5}, {1, 2, 17, 17}, {2, 1, 64, 64}};

TEST_F(PjrtSoftmaxNormLoss, CausalSoftmaxMatchesTheReference) {
    unsigned seed = 80;
    for (const Shape& shape : causal_shapes) {
        const std::size_t count = checked_element_count(shape);
        const std::size_t t_count = shape[3];
        std::vector<float> scores = uniform_values(count, -30.0F, 30.0F, seed++);
        for (std::size_t i = 0; i < count; ++i) {
            const std::size_t query = (i / t_count) % t_count;
            const std::size_t key = i % t_count;
            if (key > 0 && key <= query && i % 5 == 0) {
                scores[i] = -infinity;  // a visible masked key (key 0 stays finite)
            }
            if (key > query && i % 3 == 0) {
                scores[i] = nan;  // invisible entries are never read
            }
        }
        for (const float scale : {1.0F, 0.125F, 3.5F}) {
            const Tensor reference = tensor_ops::causal_softmax(Tensor(shape, scores, cpu), scale);
            const Tensor result = tensor_ops::causal_softmax(Tensor(shape, scores, device), scale);
            EXPECT_TRUE(close_to(host(result), host(reference), softmax_absolute, softmax_relative))
                << shape_to_string(shape) << " scale " << scale;
        }
    }
}

TEST_F(PjrtSoftmaxNormLoss, CausalSoftmaxBackwardMatchesTheReference) {
    unsigned seed = 120;
    for (const Shape& shape : causal_shapes) {
        const std::size_t count = checked_element_count(shape);
        const std::vector<float> scores = uniform_values(count, -3.0F, 3.0F, seed++);
        const std::vector<float> upstream = uniform_values(count, -1.0F, 1.0F, seed++);
        const float scale = 0.3F;
        const Tensor p_cpu = tensor_ops::causal_softmax(Tensor(shape, scores, cpu), scale);
        // Invisible probabilities that are not 0 must not leak into the visible gradient.
        std::vector<float> p = host(p_cpu);
        if (shape[3] > 1) {
            p[1] = 0.5F;  // query 0, key 1
        }
        const Tensor reference = tensor_ops::causal_softmax_backward(
            Tensor(shape, p, cpu), Tensor(shape, upstream, cpu), scale);
        const Tensor result = tensor_ops::causal_softmax_backward(
            Tensor(shape, p, device), Tensor(shape, upstream, device), scale);
        EXPECT_TRUE(
            close_to(host(result), host(reference), softmax_backward_absolute, softmax_relative))
            << shape_to_string(shape);
    }
}

TEST_F(PjrtSoftmaxNormLoss, CausalSoftmaxCompilesOncePerShapeWhateverTheScale) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const Shape shape = {1, 2, 6, 6};
    const Tensor scores(shape, uniform_values(72, -1.0F, 1.0F, 150), device);
    static_cast<void>(tensor_ops::causal_softmax(scores, 0.5F));
    const auto before = test::pjrt_statistics();
    static_cast<void>(tensor_ops::causal_softmax(scores, 0.25F));
    static_cast<void>(tensor_ops::causal_softmax(scores, 2.0F));
    EXPECT_EQ(test::pjrt_statistics().compiles, before.compiles);
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

TEST_F(PjrtSoftmaxNormLoss, SoftmaxDomainErrorsAreDeferredWithTheReferenceMessage) {
    // [2,3,2] over axis 1: slices are numbered o·2 + i.
    std::vector<float> base = uniform_values(12, -1.0F, 1.0F, 160);
    const auto softmax_axis_1 = [](const Tensor& x) { return tensor_ops::softmax(x, 1); };
    std::vector<float> values = base;
    values[2 * 1 + 1] = nan;  // o 0, e 1, i 1 -> slice 1
    expect_same_deferred_error<std::domain_error>(device, {2, 3, 2}, values, softmax_axis_1);
    values = base;
    values[6 + 4 + 0] = infinity;  // o 1, e 2, i 0 -> slice 2
    expect_same_deferred_error<std::domain_error>(device, {2, 3, 2}, values, softmax_axis_1);
    values = base;
    for (std::size_t e = 0; e < 3; ++e) {
        values[6 + e * 2 + 1] = -infinity;  // slice 3 holds only −inf
    }
    values[0] = nan;  // slice 0 as well: the first is named
    expect_same_deferred_error<std::domain_error>(device, {2, 3, 2}, values, softmax_axis_1);
    values = base;
    for (std::size_t e = 0; e < 3; ++e) {
        values[6 + e * 2 + 1] = -infinity;
    }
    expect_same_deferred_error<std::domain_error>(device, {2, 3, 2}, values, softmax_axis_1);
}

TEST_F(PjrtSoftmaxNormLoss, CausalSoftmaxDomainErrorsLookOnlyAtVisibleKeys) {
    const Shape shape = {1, 2, 4, 4};
    const std::vector<float> base = uniform_values(32, -1.0F, 1.0F, 170);
    const auto causal = [](const Tensor& x) { return tensor_ops::causal_softmax(x, 0.5F); };
    std::vector<float> values = base;
    values[16 + 2 * 4 + 1] = nan;  // head 1, query 2, key 1 (visible) -> row 6
    expect_same_deferred_error<std::domain_error>(device, shape, values, causal);
    values = base;
    values[4 + 0] = -infinity;  // query 1 sees keys 0 and 1, both −inf -> row 1
    values[4 + 1] = -infinity;
    expect_same_deferred_error<std::domain_error>(device, shape, values, causal);
    values = base;
    values[3 * 4 + 3] = infinity;  // +inf on the diagonal of query 3 -> row 3
    expect_same_deferred_error<std::domain_error>(device, shape, values, causal);
    // NaN and +inf above the diagonal are invisible: accepted on both sides.
    values = base;
    values[1] = nan;
    values[2] = infinity;
    const Tensor reference = tensor_ops::causal_softmax(Tensor(shape, values, cpu), 0.5F);
    const Tensor result = tensor_ops::causal_softmax(Tensor(shape, values, device), 0.5F);
    EXPECT_TRUE(close_to(host(result), host(reference), softmax_absolute, softmax_relative));
}

// ---- normalisation ---------------------------------------------------------------------------

struct NormCase {
    Shape shape;
    float offset;     // added to every value (|μ| >> σ when large)
    float magnitude;  // the spread of the values
};

const NormCase norm_cases[] = {{{1, 1}, 0.0F, 1.0F},     {{5, 1}, 2.0F, 3.0F},
                               {{4, 8}, 0.0F, 1.0F},     {{2, 3, 64}, 0.5F, 2.0F},
                               {{6, 33}, 1e4F, 1.0F},    {{3, 16}, -3e5F, 0.01F},
                               {{2, 40}, 0.0F, 1e30F},   {{2, 24}, 0.0F, 1e-30F},
                               {{3, 128}, 1e20F, 1e18F}, {{1, 96}, 0.0F, 3e37F}};

std::vector<float> norm_inputs(const NormCase& c, unsigned seed) {
    std::vector<float> values = uniform_values(checked_element_count(c.shape), -1.0F, 1.0F, seed);
    for (float& value : values) {
        value = c.offset + value * c.magnitude;
    }
    return values;
}

std::vector<float> norm_parameters(std::size_t width, float low, float high, unsigned seed) {
    return uniform_values(width, low, high, seed);
}

TEST_F(PjrtSoftmaxNormLoss, LayerNormMatchesTheReferenceIncludingItsStatistics) {
    unsigned seed = 200;
    for (const NormCase& c : norm_cases) {
        const std::size_t width = c.shape.back();
        const std::vector<float> values = norm_inputs(c, seed++);
        const std::vector<float> gamma = norm_parameters(width, 0.5F, 1.5F, seed++);
        const std::vector<float> beta = norm_parameters(width, -0.5F, 0.5F, seed++);
        const auto reference = tensor_ops::layer_norm(
            Tensor(c.shape, values, cpu), Tensor({width}, gamma, cpu), Tensor({width}, beta, cpu));
        const auto result =
            tensor_ops::layer_norm(Tensor(c.shape, values, device), Tensor({width}, gamma, device),
                                   Tensor({width}, beta, device));
        const std::string name = shape_to_string(c.shape) + " offset " + std::to_string(c.offset) +
                                 " magnitude " + std::to_string(c.magnitude);
        EXPECT_TRUE(
            close_to(host(result.output), host(reference.output), norm_absolute, norm_relative))
            << name;
        EXPECT_TRUE(close_to(host(result.mean), host(reference.mean), 0.0, norm_relative)) << name;
        EXPECT_TRUE(close_to(host(result.inverse_deviation), host(reference.inverse_deviation),
                             statistic_absolute, norm_relative))
            << name;
    }
}

TEST_F(PjrtSoftmaxNormLoss, LayerNormOfConstantAndNonFiniteRowsMatchesTheReference) {
    const float big = 3e38F;
    const std::vector<float> values = {
        7.0F, 7.0F,     7.0F, 7.0F,   // constant: σ = 0, inv = 1/√eps
        big,  big,      big,  big,    // constant near FLT_MAX
        0.0F, 0.0F,     0.0F, 0.0F,   // zeros
        1.0F, infinity, 2.0F, 3.0F,   // +inf: μ = inf, everything else NaN
        1.0F, nan,      2.0F, 3.0F,   // NaN
        big,  -big,     big,  -big};  // σ beyond the float range
    const Shape shape = {6, 4};
    const std::vector<float> gamma = {1.0F, 0.5F, 2.0F, -1.0F};
    const std::vector<float> beta = {0.0F, 0.25F, -0.5F, 1.0F};
    const auto reference = tensor_ops::layer_norm(Tensor(shape, values, cpu),
                                                  Tensor({4}, gamma, cpu), Tensor({4}, beta, cpu));
    const auto result = tensor_ops::layer_norm(
        Tensor(shape, values, device), Tensor({4}, gamma, device), Tensor({4}, beta, device));
    EXPECT_TRUE(
        close_to(host(result.output), host(reference.output), norm_absolute, norm_relative));
    EXPECT_TRUE(close_to(host(result.mean), host(reference.mean), 0.0, norm_relative));
    EXPECT_TRUE(close_to(host(result.inverse_deviation), host(reference.inverse_deviation),
                         statistic_absolute, norm_relative));
}

TEST_F(PjrtSoftmaxNormLoss, LayerNormBackwardMatchesTheReference) {
    unsigned seed = 300;
    for (const NormCase& c : norm_cases) {
        if (c.magnitude > 1e10F || c.magnitude < 1e-10F) {
            continue;  // gradients of such rows are below/above every float product
        }
        const std::size_t width = c.shape.back();
        const std::vector<float> values = norm_inputs(c, seed++);
        const std::vector<float> gamma = norm_parameters(width, 0.5F, 1.5F, seed++);
        const std::vector<float> upstream =
            uniform_values(checked_element_count(c.shape), -1.0F, 1.0F, seed++);
        const Tensor gamma_cpu({width}, gamma, cpu);
        const Tensor x_cpu(c.shape, values, cpu);
        const auto forward = tensor_ops::layer_norm(x_cpu, gamma_cpu, Tensor({width}, 0.0F, cpu));
        const auto reference = tensor_ops::layer_norm_backward(x_cpu, gamma_cpu, forward.mean,
                                                               forward.inverse_deviation,
                                                               Tensor(c.shape, upstream, cpu));
        // The same saved statistics on both sides, so only the backward is compared.
        const auto result = tensor_ops::layer_norm_backward(
            Tensor(c.shape, values, device), Tensor({width}, gamma, device),
            Tensor({host(forward.mean).size()}, host(forward.mean), device),
            Tensor({host(forward.inverse_deviation).size()}, host(forward.inverse_deviation),
                   device),
            Tensor(c.shape, upstream, device));
        const std::string name = shape_to_string(c.shape) + " offset " + std::to_string(c.offset);
        EXPECT_TRUE(close_to(host(result.input), host(reference.input), norm_backward_tolerance,
                             norm_backward_tolerance))
            << name;
        EXPECT_TRUE(close_to(host(result.scale), host(reference.scale), norm_backward_tolerance,
                             norm_backward_tolerance))
            << name;
        EXPECT_TRUE(close_to(host(result.bias), host(reference.bias), norm_backward_tolerance,
                             norm_backward_tolerance))
            << name;
    }
}

TEST_F(PjrtSoftmaxNormLoss, RmsNormMatchesTheReferenceIncludingItsStatistic) {
    unsigned seed = 400;
    for (const NormCase& c : norm_cases) {
        const std::size_t width = c.shape.back();
        const std::vector<float> values = norm_inputs(c, seed++);
        const std::vector<float> gamma = norm_parameters(width, 0.5F, 1.5F, seed++);
        const auto reference =
            tensor_ops::rms_norm(Tensor(c.shape, values, cpu), Tensor({width}, gamma, cpu));
        const auto result =
            tensor_ops::rms_norm(Tensor(c.shape, values, device), Tensor({width}, gamma, device));
        const std::string name = shape_to_string(c.shape) + " offset " + std::to_string(c.offset) +
                                 " magnitude " + std::to_string(c.magnitude);
        EXPECT_TRUE(
            close_to(host(result.output), host(reference.output), norm_absolute, norm_relative))
            << name;
        EXPECT_TRUE(close_to(host(result.inverse_rms), host(reference.inverse_rms),
                             statistic_absolute, norm_relative))
            << name;
    }
}

TEST_F(PjrtSoftmaxNormLoss, RmsNormOfZeroHugeAndNonFiniteRowsMatchesTheReference) {
    const float big = 3e38F;
    const std::vector<float> values = {0.0F, 0.0F,     0.0F, 1e-40F,  // zeros and a subnormal
                                       big,  -big,     big,  big,     // mean square beyond float
                                       1.0F, infinity, 2.0F, -3.0F,   // +inf: r = 0, y NaN/±0
                                       1.0F, nan,      2.0F, 3.0F};
    const Shape shape = {4, 4};
    const std::vector<float> gamma = {1.0F, 0.5F, 2.0F, -1.0F};
    const auto reference =
        tensor_ops::rms_norm(Tensor(shape, values, cpu), Tensor({4}, gamma, cpu));
    const auto result =
        tensor_ops::rms_norm(Tensor(shape, values, device), Tensor({4}, gamma, device));
    EXPECT_TRUE(
        close_to(host(result.output), host(reference.output), norm_absolute, norm_relative));
    EXPECT_TRUE(close_to(host(result.inverse_rms), host(reference.inverse_rms), statistic_absolute,
                         norm_relative));
}

TEST_F(PjrtSoftmaxNormLoss, RmsNormBackwardMatchesTheReference) {
    unsigned seed = 500;
    for (const NormCase& c : norm_cases) {
        if (c.magnitude > 1e10F || c.magnitude < 1e-10F || std::abs(c.offset) > 1e10F) {
            continue;
        }
        const std::size_t width = c.shape.back();
        const std::vector<float> values = norm_inputs(c, seed++);
        const std::vector<float> gamma = norm_parameters(width, 0.5F, 1.5F, seed++);
        const std::vector<float> upstream =
            uniform_values(checked_element_count(c.shape), -1.0F, 1.0F, seed++);
        const Tensor x_cpu(c.shape, values, cpu);
        const Tensor gamma_cpu({width}, gamma, cpu);
        const auto forward = tensor_ops::rms_norm(x_cpu, gamma_cpu);
        const std::vector<float> inverse = host(forward.inverse_rms);
        const auto reference = tensor_ops::rms_norm_backward(x_cpu, gamma_cpu, forward.inverse_rms,
                                                             Tensor(c.shape, upstream, cpu));
        const auto result = tensor_ops::rms_norm_backward(
            Tensor(c.shape, values, device), Tensor({width}, gamma, device),
            Tensor({inverse.size()}, inverse, device), Tensor(c.shape, upstream, device));
        const std::string name = shape_to_string(c.shape) + " offset " + std::to_string(c.offset);
        EXPECT_TRUE(close_to(host(result.input), host(reference.input), norm_backward_tolerance,
                             norm_backward_tolerance))
            << name;
        EXPECT_TRUE(close_to(host(result.scale), host(reference.scale), norm_backward_tolerance,
                             norm_backward_tolerance))
            << name;
    }
}

// ---- cross-entropy ---------------------------------------------------------------------------

std::vector<std::uint32_t> random_targets(std::size_t count, std::size_t vocabulary,
                                          unsigned seed) {
    const std::vector<float> draws = uniform_values(count, 0.0F, 1.0F, seed);
    std::vector<std::uint32_t> targets(count);
    for (std::size_t i = 0; i < count; ++i) {
        targets[i] = static_cast<std::uint32_t>(std::min<std::size_t>(
            vocabulary - 1, static_cast<std::size_t>(draws[i] * static_cast<float>(vocabulary))));
    }
    return targets;
}

void expect_same_loss(const tensor_ops::CrossEntropyResult& result,
                      const tensor_ops::CrossEntropyResult& reference, const std::string& name) {
    EXPECT_TRUE(close_to(host(result.loss), host(reference.loss), 0.0, loss_relative)) << name;
    EXPECT_TRUE(close_to(host(result.gradient), host(reference.gradient), loss_gradient_absolute,
                         loss_relative))
        << name;
}

struct LossCase {
    Shape shape;
    float spread;
};

TEST_F(PjrtSoftmaxNormLoss, CrossEntropyMatchesTheReference) {
    const LossCase cases[] = {{{5, 1}, 1.0F},    {{1, 2}, 3.0F},     {{4, 1000}, 6.0F},
                              {{2, 3, 7}, 2.0F}, {{16, 1000}, 1e4F}, {{3, 50}, 1e30F},
                              {{64, 33}, 0.5F}};
    unsigned seed = 600;
    for (const LossCase& c : cases) {
        const std::size_t vocabulary = c.shape.back();
        const std::size_t count = checked_element_count(c.shape);
        std::vector<float> logits = uniform_values(count, -1.0F, 1.0F, seed++);
        for (float& value : logits) {
            value *= c.spread;
        }
        const std::vector<std::uint32_t> targets =
            random_targets(count / vocabulary, vocabulary, seed++);
        // −inf on non-target entries (masked vocabulary).
        for (std::size_t i = 2; i < count; i += 9) {
            if (i % vocabulary != targets[i / vocabulary]) {
                logits[i] = -infinity;
            }
        }
        expect_same_loss(tensor_ops::cross_entropy(Tensor(c.shape, logits, device), targets),
                         tensor_ops::cross_entropy(Tensor(c.shape, logits, cpu), targets),
                         shape_to_string(c.shape) + " spread " + std::to_string(c.spread));
    }
}

TEST_F(PjrtSoftmaxNormLoss, CrossEntropyTimeRangeMatchesTheReferenceAndZeroesOtherRows) {
    const Shape shape = {3, 6, 40};
    const std::vector<float> logits = uniform_values(720, -5.0F, 5.0F, 700);
    const std::vector<std::uint32_t> targets = random_targets(18, 40, 701);
    const std::pair<std::size_t, std::size_t> windows[] = {{0, 6}, {0, 1}, {2, 3}, {5, 1}, {1, 5}};
    for (const auto& [offset, count] : windows) {
        const auto reference = tensor_ops::cross_entropy_time_range(Tensor(shape, logits, cpu),
                                                                    targets, offset, count);
        const auto result = tensor_ops::cross_entropy_time_range(Tensor(shape, logits, device),
                                                                 targets, offset, count);
        expect_same_loss(result, reference,
                         "offset " + std::to_string(offset) + " count " + std::to_string(count));
        // Rows outside the window are exactly zero (positive zero).
        const std::vector<float> gradient = host(result.gradient);
        for (std::size_t row = 0; row < 18; ++row) {
            const std::size_t t = row % 6;
            if (t >= offset && t < offset + count) {
                continue;
            }
            for (std::size_t v = 0; v < 40; ++v) {
                const float value = gradient[row * 40 + v];
                ASSERT_TRUE(value == 0.0F && !std::signbit(value)) << row << "," << v;
            }
        }
    }
}

TEST_F(PjrtSoftmaxNormLoss, MaskedCrossEntropyMatchesTheReferenceAndIgnoresUnselectedRows) {
    const Shape shape = {2, 5, 30};
    std::vector<float> logits = uniform_values(300, -4.0F, 4.0F, 710);
    const std::vector<std::uint32_t> targets = random_targets(10, 30, 711);
    const std::vector<std::uint8_t> mask = {0, 1, 1, 0, 1, 1, 0, 0, 1, 0};
    // Unselected rows may hold anything, even a non-finite target logit or NaN.
    logits[0 * 30 + targets[0]] = infinity;
    logits[3 * 30 + 7] = nan;
    const auto reference =
        tensor_ops::cross_entropy_masked(Tensor(shape, logits, cpu), targets, mask);
    const auto result =
        tensor_ops::cross_entropy_masked(Tensor(shape, logits, device), targets, mask);
    expect_same_loss(result, reference, "masked");
    const std::vector<float> gradient = host(result.gradient);
    for (std::size_t row = 0; row < 10; ++row) {
        if (mask[row] == 0) {
            for (std::size_t v = 0; v < 30; ++v) {
                const float value = gradient[row * 30 + v];
                ASSERT_TRUE(value == 0.0F && !std::signbit(value)) << row << "," << v;
            }
        }
    }
    // Another mask over the same shape reuses the program (N is a parameter).
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const auto before = test::pjrt_statistics();
    const std::vector<std::uint8_t> other = {1, 1, 1, 1, 1, 1, 1, 0, 1, 1};
    logits[0 * 30 + targets[0]] = 1.0F;
    logits[3 * 30 + 7] = 1.0F;
    expect_same_loss(
        tensor_ops::cross_entropy_masked(Tensor(shape, logits, device), targets, other),
        tensor_ops::cross_entropy_masked(Tensor(shape, logits, cpu), targets, other),
        "second mask");
    EXPECT_EQ(test::pjrt_statistics().compiles, before.compiles);
#endif
}

TEST_F(PjrtSoftmaxNormLoss, CrossEntropyValueErrorsAreDeferredWithTheReferenceMessages) {
    const Shape shape = {2, 3, 5};
    const std::vector<float> base = uniform_values(30, -2.0F, 2.0F, 720);
    const std::vector<std::uint32_t> targets = {1, 4, 0, 2, 2, 3};
    const auto whole = [&targets](const Tensor& logits) {
        return tensor_ops::cross_entropy(logits, targets).loss;
    };
    const auto whole_gradient = [&targets](const Tensor& logits) {
        return tensor_ops::cross_entropy(logits, targets).gradient;
    };
    // A non-finite target logit: the first such row is named, with its target and value.
    for (const float bad : {infinity, -infinity, nan}) {
        std::vector<float> values = base;
        values[4 * 5 + targets[4]] = bad;
        values[5 * 5 + targets[5]] = infinity;
        expect_same_deferred_error<std::domain_error>(device, shape, values, whole);
        expect_same_deferred_error<std::domain_error>(device, shape, values, whole_gradient);
    }
    // Inside a time window only the window's rows count: row 4 is (b 1, t 1).
    std::vector<float> values = base;
    values[4 * 5 + targets[4]] = -infinity;
    values[0 * 5 + targets[0]] = nan;  // t 0, outside the window
    expect_same_deferred_error<std::domain_error>(device, shape, values, [&](const Tensor& x) {
        return tensor_ops::cross_entropy_time_range(x, targets, 1, 2).loss;
    });
    // A non-finite mean: NaN or +inf elsewhere in a row (the reference's "nan" / "-nan"),
    // or a finite mean beyond FLT_MAX.
    values = base;
    values[1 * 5 + 0] = nan;  // target of row 1 is 4
    expect_same_deferred_error<std::overflow_error>(device, shape, values, whole);
    values = base;
    values[2 * 5 + 3] = infinity;  // target of row 2 is 0
    expect_same_deferred_error<std::overflow_error>(device, shape, values, whole);
    values = base;
    for (std::size_t row = 0; row < 4; ++row) {  // 4 terms of 6e38 over N = 6
        values[row * 5 + (targets[row] + 1) % 5] = 3e38F;
        values[row * 5 + targets[row]] = -3e38F;
    }
    expect_same_deferred_error<std::overflow_error>(device, shape, values, whole);
    values = base;
    values[3 * 5 + 0] = nan;  // row 3 = (b 1, t 0): masked out below, so no error at all
    const std::vector<std::uint8_t> mask = {1, 1, 1, 0, 1, 1};
    const auto reference =
        tensor_ops::cross_entropy_masked(Tensor(shape, values, cpu), targets, mask);
    const auto result =
        tensor_ops::cross_entropy_masked(Tensor(shape, values, device), targets, mask);
    expect_same_loss(result, reference, "masked-out NaN");
}

TEST_F(PjrtSoftmaxNormLoss, CrossEntropyOverflowOfTheFloatRangeIsRaisedNotRounded) {
    // m − z_y = 6e38 overflows a float, yet the mean over 8 rows is 7.5e37: no error.
    const Shape shape = {8, 2};
    std::vector<float> values(16, 0.0F);
    values[0] = 3e38F;
    values[1] = -3e38F;
    const std::vector<std::uint32_t> targets = {1, 0, 0, 0, 0, 0, 0, 0};
    expect_same_loss(tensor_ops::cross_entropy(Tensor(shape, values, device), targets),
                     tensor_ops::cross_entropy(Tensor(shape, values, cpu), targets),
                     "large finite mean");
}

// ---- gather / scatter ------------------------------------------------------------------------

TEST_F(PjrtSoftmaxNormLoss, GatherRowsCopiesRowsExactlyWithRepeatedIds) {
    const std::vector<float> table = uniform_values(7 * 5, -3.0F, 3.0F, 800);
    const std::vector<std::size_t> ids = {3, 0, 3, 6, 6, 6};
    for (const Shape& index_shape : {Shape{6}, Shape{2, 3}}) {
        const Tensor reference =
            tensor_ops::gather_rows(Tensor({7, 5}, table, cpu), ids, index_shape);
        const Tensor result =
            tensor_ops::gather_rows(Tensor({7, 5}, table, device), ids, index_shape);
        EXPECT_EQ(result.shape(), reference.shape());
        EXPECT_TRUE(same_bits(host(result), host(reference)));
    }
    const std::vector<std::size_t> one = {4};
    const std::vector<float> single =
        host(tensor_ops::gather_rows(Tensor({7, 5}, table, device), one, Shape{1}));
    EXPECT_TRUE(same_bits(single, std::vector<float>(table.begin() + 20, table.begin() + 25)));
}

TEST_F(PjrtSoftmaxNormLoss, ScatterAddRowsAccumulatesRepeatedIds) {
    // Dyadic values: every sum is exact, so any order gives the reference's bits.
    const std::vector<float> upstream = {1.0F,  2.0F,   0.5F, -4.0F, 0.25F, 8.0F,
                                         -1.0F, 0.125F, 3.0F, 16.0F, -2.0F, 0.75F};
    const std::vector<std::size_t> ids = {2, 0, 2, 2, 4, 0};
    const Tensor reference = tensor_ops::scatter_add_rows(Tensor({6, 2}, upstream, cpu), ids, 5);
    const Tensor result = tensor_ops::scatter_add_rows(Tensor({6, 2}, upstream, device), ids, 5);
    EXPECT_EQ(result.shape(), (Shape{5, 2}));
    EXPECT_TRUE(same_bits(host(result), host(reference)));
    // Random values over a wider table, ids repeated many times.
    const std::vector<float> wide = uniform_values(40 * 24, -1.0F, 1.0F, 810);
    std::vector<std::size_t> many(40);
    for (std::size_t i = 0; i < many.size(); ++i) {
        many[i] = (i * 7) % 9;
    }
    EXPECT_TRUE(close_to(
        host(tensor_ops::scatter_add_rows(Tensor({40, 24}, wide, device), many, 11)),
        host(tensor_ops::scatter_add_rows(Tensor({40, 24}, wide, cpu), many, 11)), 0.0, 1e-6));
}

// ---- autograd ------------------------------------------------------------------------------

struct EmbeddingModelGradients {
    float loss;
    std::vector<float> table;
    std::vector<float> gamma;
    std::vector<float> beta;
};

// embedding gather [2,4] ids -> [2,4,W] -> layer_norm -> (used as logits, W = V) cross-entropy.
EmbeddingModelGradients embedding_model(ExecutionBackend backend) {
    constexpr std::size_t rows = 11;
    constexpr std::size_t width = 24;
    Variable table(Tensor({rows, width}, uniform_values(rows * width, -1.0F, 1.0F, 900), backend));
    Variable gamma(Tensor({width}, uniform_values(width, 0.5F, 1.5F, 901), backend));
    Variable beta(Tensor({width}, uniform_values(width, -0.2F, 0.2F, 902), backend));
    const std::vector<std::size_t> ids = {1, 7, 7, 3, 0, 10, 1, 1};
    const std::vector<std::uint32_t> targets = {5, 0, 23, 5, 9, 9, 12, 1};
    const Variable embedded = gather_rows(table, ids, Shape{2, 4});
    const Variable normalised = layer_norm(embedded, gamma, beta);
    Variable loss = cross_entropy(normalised * 3.0F, targets);
    loss.backward();
    return {loss.value().item(), host(table.gradient()), host(gamma.gradient()),
            host(beta.gradient())};
}

TEST_F(PjrtSoftmaxNormLoss, AutogradThroughGatherLayerNormAndCrossEntropyMatchesTheReference) {
    const EmbeddingModelGradients reference = embedding_model(cpu);
    const EmbeddingModelGradients result = embedding_model(device);
    EXPECT_TRUE(close_to({result.loss}, {reference.loss}, 0.0, loss_relative));
    EXPECT_TRUE(
        close_to(result.table, reference.table, norm_backward_tolerance, norm_backward_tolerance));
    EXPECT_TRUE(
        close_to(result.gamma, reference.gamma, norm_backward_tolerance, norm_backward_tolerance));
    EXPECT_TRUE(
        close_to(result.beta, reference.beta, norm_backward_tolerance, norm_backward_tolerance));
    // Rows of the table no id reached get exactly zero gradient on both sides.
    for (const std::size_t row : {2U, 4U, 5U, 6U, 8U, 9U}) {
        for (std::size_t j = 0; j < 24; ++j) {
            EXPECT_EQ(result.table[row * 24 + j], 0.0F) << row;
        }
    }
}

TEST_F(PjrtSoftmaxNormLoss, AutogradThroughRmsNormAndSoftmaxMatchesTheReference) {
    const auto gradients = [](ExecutionBackend backend) {
        Variable x(Tensor({3, 16}, uniform_values(48, -2.0F, 2.0F, 910), backend));
        Variable gamma(Tensor({16}, uniform_values(16, 0.5F, 1.5F, 911), backend));
        const Variable probabilities = softmax(rms_norm(x, gamma), 1);
        const Tensor seed({3, 16}, uniform_values(48, -1.0F, 1.0F, 912), backend);
        Variable(probabilities).backward(seed);
        return std::make_pair(host(x.gradient()), host(gamma.gradient()));
    };
    const auto reference = gradients(cpu);
    const auto result = gradients(device);
    EXPECT_TRUE(
        close_to(result.first, reference.first, norm_backward_tolerance, norm_backward_tolerance));
    EXPECT_TRUE(close_to(result.second, reference.second, norm_backward_tolerance,
                         norm_backward_tolerance));
}

}  // namespace
}  // namespace riftco_transformer
