// LayerNorm and RMSNorm over the last axis with the statistics their backward passes use:
// hand-computed values, double oracles over awkward widths and a large case, centred finite
// differences for every gradient, thread-count independence, and every documented error rule
// (docs/ARCHITECTURE.md, 'Tensor operations').
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
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

// ---- double oracles (rows of width W) ----

struct LayerNormOracle {
    std::vector<double> output;
    std::vector<double> mean;
    std::vector<double> inverse_deviation;
};

LayerNormOracle layer_norm_oracle(const std::vector<float>& x, const std::vector<float>& scale,
                                  const std::vector<float>& bias, double epsilon) {
    const std::size_t width = scale.size();
    const std::size_t rows = x.size() / width;
    LayerNormOracle oracle{std::vector<double>(x.size()), std::vector<double>(rows),
                           std::vector<double>(rows)};
    for (std::size_t r = 0; r < rows; ++r) {
        double mean = 0.0;
        for (std::size_t j = 0; j < width; ++j)
            mean += x[r * width + j];
        mean /= static_cast<double>(width);
        double variance = 0.0;
        for (std::size_t j = 0; j < width; ++j) {
            const double d = x[r * width + j] - mean;
            variance += d * d;
        }
        variance /= static_cast<double>(width);  // population variance
        const double inverse = 1.0 / std::sqrt(variance + epsilon);
        oracle.mean[r] = mean;
        oracle.inverse_deviation[r] = inverse;
        for (std::size_t j = 0; j < width; ++j) {
            oracle.output[r * width + j] = (x[r * width + j] - mean) * inverse * scale[j] + bias[j];
        }
    }
    return oracle;
}

struct LayerNormGradientOracle {
    std::vector<double> input;
    std::vector<double> scale;
    std::vector<double> bias;
};

// dx = inv·(ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)), dγ = Σ_rows g ⊙ x̂, dβ = Σ_rows g; statistics
// recomputed in double from x.
LayerNormGradientOracle layer_norm_backward_oracle(const std::vector<float>& x,
                                                   const std::vector<float>& scale,
                                                   const std::vector<float>& upstream,
                                                   double epsilon) {
    const std::size_t width = scale.size();
    const std::size_t rows = x.size() / width;
    const std::vector<float> zero_bias(width, 0.0F);
    const LayerNormOracle forward = layer_norm_oracle(x, scale, zero_bias, epsilon);
    LayerNormGradientOracle oracle{std::vector<double>(x.size()), std::vector<double>(width, 0.0),
                                   std::vector<double>(width, 0.0)};
    std::vector<double> x_hat(width);
    std::vector<double> g_hat(width);
    for (std::size_t r = 0; r < rows; ++r) {
        double mean_g_hat = 0.0;
        double mean_g_hat_x_hat = 0.0;
        for (std::size_t j = 0; j < width; ++j) {
            const std::size_t k = r * width + j;
            x_hat[j] = (x[k] - forward.mean[r]) * forward.inverse_deviation[r];
            g_hat[j] = static_cast<double>(upstream[k]) * scale[j];
            mean_g_hat += g_hat[j];
            mean_g_hat_x_hat += g_hat[j] * x_hat[j];
            oracle.scale[j] += upstream[k] * x_hat[j];
            oracle.bias[j] += upstream[k];
        }
        mean_g_hat /= static_cast<double>(width);
        mean_g_hat_x_hat /= static_cast<double>(width);
        for (std::size_t j = 0; j < width; ++j) {
            oracle.input[r * width + j] = forward.inverse_deviation[r] *
                                          (g_hat[j] - mean_g_hat - x_hat[j] * mean_g_hat_x_hat);
        }
    }
    return oracle;
}

struct RmsNormOracle {
    std::vector<double> output;
    std::vector<double> inverse_rms;
};

RmsNormOracle rms_norm_oracle(const std::vector<float>& x, const std::vector<float>& scale,
                              double epsilon) {
    const std::size_t width = scale.size();
    const std::size_t rows = x.size() / width;
    RmsNormOracle oracle{std::vector<double>(x.size()), std::vector<double>(rows)};
    for (std::size_t r = 0; r < rows; ++r) {
        double mean_square = 0.0;
        for (std::size_t j = 0; j < width; ++j) {
            mean_square += static_cast<double>(x[r * width + j]) * x[r * width + j];
        }
        mean_square /= static_cast<double>(width);
        const double inverse = 1.0 / std::sqrt(mean_square + epsilon);
        oracle.inverse_rms[r] = inverse;
        for (std::size_t j = 0; j < width; ++j) {
            oracle.output[r * width + j] = x[r * width + j] * inverse * scale[j];
        }
    }
    return oracle;
}

struct RmsNormGradientOracle {
    std::vector<double> input;
    std::vector<double> scale;
};

// dx = r·(g ⊙ γ) − x·r³·mean(g ⊙ γ ⊙ x); dγ = Σ_rows g ⊙ x·r.
RmsNormGradientOracle rms_norm_backward_oracle(const std::vector<float>& x,
                                               const std::vector<float>& scale,
                                               const std::vector<float>& upstream, double epsilon) {
    const std::size_t width = scale.size();
    const std::size_t rows = x.size() / width;
    const RmsNormOracle forward = rms_norm_oracle(x, scale, epsilon);
    RmsNormGradientOracle oracle{std::vector<double>(x.size()), std::vector<double>(width, 0.0)};
    for (std::size_t r = 0; r < rows; ++r) {
        const double inverse = forward.inverse_rms[r];
        double weighted = 0.0;
        for (std::size_t j = 0; j < width; ++j) {
            const std::size_t k = r * width + j;
            weighted += static_cast<double>(upstream[k]) * scale[j] * x[k];
            oracle.scale[j] += static_cast<double>(upstream[k]) * x[k] * inverse;
        }
        weighted /= static_cast<double>(width);
        for (std::size_t j = 0; j < width; ++j) {
            const std::size_t k = r * width + j;
            oracle.input[k] =
                inverse * upstream[k] * scale[j] - x[k] * inverse * inverse * inverse * weighted;
        }
    }
    return oracle;
}

constexpr double default_epsilon = static_cast<double>(tensor_ops::default_normalization_epsilon);

}  // namespace

// ---------------------------------------------------------------------------------------------
// layer_norm forward

TEST(LayerNorm, MatchesHandComputedExample) {
    // eps 2.75 makes σ² + eps a perfect square:
    // row 0 [1,2,3,4]:        μ 2.5, σ² 1.25 -> inv 1/√4 = 1/2, x̂ = [−3/4, −1/4, 1/4, 3/4]
    // row 1 [−2.5,2.5,−2.5,2.5]: μ 0, σ² 6.25 -> inv 1/√9 = 1/3, x̂ = [−5/6, 5/6, −5/6, 5/6]
    // γ = [1, 2, −1, 0.5], β = [0.5, 0, 1, −2].
    const Tensor x({2, 4}, {1.0F, 2.0F, 3.0F, 4.0F, -2.5F, 2.5F, -2.5F, 2.5F});
    const Tensor scale({4}, {1.0F, 2.0F, -1.0F, 0.5F});
    const Tensor bias({4}, {0.5F, 0.0F, 1.0F, -2.0F});
    const tensor_ops::LayerNormResult result = tensor_ops::layer_norm(x, scale, bias, 2.75F);
    EXPECT_EQ(result.output.shape(), (Shape{2, 4}));
    EXPECT_TRUE(all_close(result.output, {-0.25, -0.5, 0.75, -1.625, -1.0 / 3.0, 5.0 / 3.0,
                                          11.0 / 6.0, -19.0 / 12.0}));
    EXPECT_EQ(result.mean.shape(), (Shape{2}));
    EXPECT_TRUE(all_close(result.mean, {2.5, 0.0}));
    EXPECT_EQ(result.inverse_deviation.shape(), (Shape{2}));
    EXPECT_TRUE(all_close(result.inverse_deviation, {0.5, 1.0 / 3.0}));
}

TEST(LayerNorm, EpsilonGoesInsideTheSquareRoot) {
    // x = [−d, d] with d = 1e-3: σ² = d², so y = ∓d/√(d² + 1e-5) ≈ ∓0.3015 (not ∓1, which a
    // missing eps, or one added outside the root, would give).
    const float d = 1e-3F;
    const Tensor x({1, 2}, {-d, d});
    const tensor_ops::LayerNormResult result =
        tensor_ops::layer_norm(x, Tensor({2}, 1.0F), Tensor({2}, 0.0F));
    const double dd = d;
    const double y = dd / std::sqrt(dd * dd + default_epsilon);
    EXPECT_TRUE(all_close(result.output, {-y, y}));
    EXPECT_TRUE(all_close(result.inverse_deviation, {1.0 / std::sqrt(dd * dd + default_epsilon)},
                          1e-6, 1e-6));
}

TEST(LayerNorm, StatisticsHaveOneEntryPerRowOfHigherRankInput) {
    const Shape shape{2, 3, 5};
    const std::vector<float> x = pseudo_random(30, -2.0F, 2.0F, 3U);
    const std::vector<float> scale = pseudo_random(5, 0.5F, 1.5F, 4U);
    const std::vector<float> bias = pseudo_random(5, -1.0F, 1.0F, 5U);
    const tensor_ops::LayerNormResult result =
        tensor_ops::layer_norm(Tensor(shape, x), Tensor({5}, scale), Tensor({5}, bias));
    const LayerNormOracle oracle = layer_norm_oracle(x, scale, bias, default_epsilon);
    EXPECT_EQ(result.output.shape(), shape);
    EXPECT_EQ(result.mean.shape(), (Shape{6}));
    EXPECT_EQ(result.inverse_deviation.shape(), (Shape{6}));
    EXPECT_TRUE(all_close(result.output, oracle.output, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(result.mean, oracle.mean, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(result.inverse_deviation, oracle.inverse_deviation, 1e-6, 1e-6));
}

TEST(LayerNorm, RankOneInputIsOneRow) {
    const std::vector<float> x = {1.0F, -3.0F, 0.5F};
    const std::vector<float> scale = {1.0F, 1.0F, 2.0F};
    const std::vector<float> bias = {0.0F, 0.25F, 0.0F};
    const tensor_ops::LayerNormResult result =
        tensor_ops::layer_norm(Tensor({3}, x), Tensor({3}, scale), Tensor({3}, bias));
    EXPECT_EQ(result.mean.shape(), (Shape{1}));
    EXPECT_TRUE(all_close(result.output, layer_norm_oracle(x, scale, bias, default_epsilon).output,
                          1e-5, 1e-5));
}

TEST(LayerNorm, ConstantRowGivesExactlyBias) {
    for (const std::size_t width : {1U, 7U, 33U}) {
        for (const float constant : {0.0F, 7.25F, -3.0F, 1e6F}) {
            const std::vector<float> bias = pseudo_random(width, -2.0F, 2.0F, 7U);
            const Tensor x({3, width}, constant);
            const tensor_ops::LayerNormResult result = tensor_ops::layer_norm(
                x, Tensor({width}, pseudo_random(width, -3.0F, 3.0F, 8U)), Tensor({width}, bias));
            const std::vector<float> y = result.output.to_host();
            for (std::size_t r = 0; r < 3; ++r) {
                const auto row_begin = y.begin() + static_cast<std::ptrdiff_t>(r * width);
                EXPECT_TRUE(bit_identical(
                    std::vector<float>(row_begin, row_begin + static_cast<std::ptrdiff_t>(width)),
                    bias))
                    << "width " << width << ", constant " << constant << ", row " << r;
            }
            EXPECT_TRUE(all_close(result.mean, std::vector<double>(3, constant)));
            for (const float inverse : result.inverse_deviation.to_host()) {
                EXPECT_TRUE(std::isfinite(inverse));
                EXPECT_NEAR(inverse, 1.0 / std::sqrt(default_epsilon),
                            1e-6 / std::sqrt(default_epsilon));
            }
        }
    }
}

TEST(LayerNorm, MatchesDoubleOracleForWidthsThatAreNotMultiplesOf16) {
    for (const std::size_t width : {1U, 7U, 15U, 17U, 33U, 100U}) {
        constexpr std::size_t rows = 5;
        const auto seed = static_cast<std::uint32_t>(width);
        const std::vector<float> x = pseudo_random(rows * width, -3.0F, 5.0F, seed);
        const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, seed + 1);
        const std::vector<float> bias = pseudo_random(width, -1.0F, 1.0F, seed + 2);
        const tensor_ops::LayerNormResult result = tensor_ops::layer_norm(
            Tensor({rows, width}, x), Tensor({width}, scale), Tensor({width}, bias));
        const LayerNormOracle oracle = layer_norm_oracle(x, scale, bias, default_epsilon);
        EXPECT_TRUE(all_close(result.output, oracle.output, 1e-5, 1e-5)) << "width " << width;
        EXPECT_TRUE(all_close(result.mean, oracle.mean, 1e-6, 1e-6)) << "width " << width;
        EXPECT_TRUE(all_close(result.inverse_deviation, oracle.inverse_deviation, 1e-6, 1e-6))
            << "width " << width;
    }
}

TEST(LayerNorm, LargeCaseMatchesDoubleOracle) {
    constexpr std::size_t rows = 512;
    constexpr std::size_t width = 768;
    const std::vector<float> x = pseudo_random(rows * width, -4.0F, 4.0F, 101U);
    const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, 102U);
    const std::vector<float> bias = pseudo_random(width, -1.0F, 1.0F, 103U);
    const tensor_ops::LayerNormResult result = tensor_ops::layer_norm(
        Tensor({rows, width}, x), Tensor({width}, scale), Tensor({width}, bias));
    const LayerNormOracle oracle = layer_norm_oracle(x, scale, bias, default_epsilon);
    EXPECT_TRUE(all_close(result.output, oracle.output, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(result.mean, oracle.mean, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(result.inverse_deviation, oracle.inverse_deviation, 1e-6, 1e-6));
}

TEST(LayerNorm, AccurateWhenRowMeanIsModestRelativeToSpread) {
    // Rows centred near 100 with a spread of ±1: centring must not lose the small deviations.
    constexpr std::size_t rows = 4;
    constexpr std::size_t width = 64;
    const std::vector<float> x = pseudo_random(rows * width, 99.0F, 101.0F, 111U);
    const std::vector<float> scale(width, 1.0F);
    const std::vector<float> bias(width, 0.0F);
    const tensor_ops::LayerNormResult result = tensor_ops::layer_norm(
        Tensor({rows, width}, x), Tensor({width}, scale), Tensor({width}, bias));
    EXPECT_TRUE(all_close(result.output, layer_norm_oracle(x, scale, bias, default_epsilon).output,
                          1e-5, 1e-5));
}

TEST(LayerNorm, AccurateWhenRowMeanIsLargeRelativeToSpread) {
    // Rows centred near 1e4 with a spread of ±1. The statistics are exact in double, and
    // (x − μ) is exactly representable in double, so the output can be as accurate as for
    // centred data; the double oracle at the large case's 1e-5 must hold. (Rounding μ to float
    // before centring costs up to ulp(1e4)/2 ≈ 4.9e-4 per element, i.e. ~8e-4 in x̂.)
    constexpr std::size_t rows = 4;
    constexpr std::size_t width = 64;
    const std::vector<float> x = pseudo_random(rows * width, 9999.0F, 10001.0F, 112U);
    const std::vector<float> scale(width, 1.0F);
    const std::vector<float> bias(width, 0.0F);
    const tensor_ops::LayerNormResult result = tensor_ops::layer_norm(
        Tensor({rows, width}, x), Tensor({width}, scale), Tensor({width}, bias));
    const LayerNormOracle oracle = layer_norm_oracle(x, scale, bias, default_epsilon);
    EXPECT_TRUE(all_close(result.output, oracle.output, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(result.mean, oracle.mean, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(result.inverse_deviation, oracle.inverse_deviation, 1e-6, 1e-6));
}

TEST(LayerNorm, LeavesInputsUnchanged) {
    const std::vector<float> x = pseudo_random(12);
    const Tensor xt({3, 4}, x);
    const Tensor scale({4}, {1.0F, 2.0F, 3.0F, 4.0F});
    const Tensor bias({4}, {0.5F, 0.5F, 0.5F, 0.5F});
    static_cast<void>(tensor_ops::layer_norm(xt, scale, bias));
    EXPECT_TRUE(bit_identical(xt.to_host(), x));
    EXPECT_TRUE(bit_identical(scale.to_host(), {1.0F, 2.0F, 3.0F, 4.0F}));
    EXPECT_TRUE(bit_identical(bias.to_host(), {0.5F, 0.5F, 0.5F, 0.5F}));
}

TEST(LayerNorm, RejectsScalarInput) {
    EXPECT_THROW(static_cast<void>(tensor_ops::layer_norm(Tensor::scalar(1.0F), Tensor({1}, 1.0F),
                                                          Tensor({1}, 0.0F))),
                 std::invalid_argument);
}

TEST(LayerNorm, RejectsScaleOrBiasThatIsNotWidthVector) {
    const Tensor x({2, 4}, 1.0F);
    const Tensor good({4}, 1.0F);
    for (const Shape& bad : {Shape{5}, Shape{3}, Shape{1, 4}, Shape{4, 1}, Shape{}, Shape{2, 4}}) {
        const Tensor wrong(bad, 1.0F);
        EXPECT_THROW(static_cast<void>(tensor_ops::layer_norm(x, wrong, good)),
                     std::invalid_argument)
            << "scale " << shape_to_string(bad);
        EXPECT_THROW(static_cast<void>(tensor_ops::layer_norm(x, good, wrong)),
                     std::invalid_argument)
            << "bias " << shape_to_string(bad);
    }
}

TEST(LayerNorm, RejectsEpsilonThatIsNotFiniteAndPositive) {
    const Tensor x({2, 4}, pseudo_random(8));
    const Tensor scale({4}, 1.0F);
    const Tensor bias({4}, 0.0F);
    for (const float epsilon : {0.0F, -0.0F, -1e-5F, infinity, -infinity, quiet_nan}) {
        EXPECT_THROW(static_cast<void>(tensor_ops::layer_norm(x, scale, bias, epsilon)),
                     std::invalid_argument)
            << "eps " << epsilon;
    }
}

TEST(LayerNorm, RejectsSingularInput) {
    const Tensor singular;
    const Tensor parameter({4}, 1.0F);
    EXPECT_THROW(static_cast<void>(tensor_ops::layer_norm(singular, parameter, parameter)),
                 std::logic_error);
}

// ---------------------------------------------------------------------------------------------
// layer_norm_backward

TEST(LayerNormBackward, HandComputedExample) {
    // One row x = [1,2,3,4], eps 2.75 (inv = 1/2, x̂ = [−3/4, −1/4, 1/4, 3/4]), γ = [1,1,1,1],
    // g = [1,0,0,0]: mean(ĝ) = 1/4, mean(ĝ x̂) = −3/16,
    // dx = ½·(g − ¼ + x̂·3/16) = ½·[0.609375, −0.296875, −0.203125, −0.109375];
    // dγ = g ⊙ x̂ = [−0.75, 0, 0, 0]; dβ = g.
    const Tensor x({1, 4}, {1.0F, 2.0F, 3.0F, 4.0F});
    const Tensor scale({4}, 1.0F);
    const tensor_ops::LayerNormResult forward =
        tensor_ops::layer_norm(x, scale, Tensor({4}, 0.0F), 2.75F);
    const tensor_ops::LayerNormGradients gradients =
        tensor_ops::layer_norm_backward(x, scale, forward.mean, forward.inverse_deviation,
                                        Tensor({1, 4}, {1.0F, 0.0F, 0.0F, 0.0F}));
    EXPECT_EQ(gradients.input.shape(), (Shape{1, 4}));
    EXPECT_EQ(gradients.scale.shape(), (Shape{4}));
    EXPECT_EQ(gradients.bias.shape(), (Shape{4}));
    EXPECT_TRUE(all_close(gradients.input, {0.3046875, -0.1484375, -0.1015625, -0.0546875}));
    EXPECT_TRUE(all_close(gradients.scale, {-0.75, 0.0, 0.0, 0.0}));
    EXPECT_TRUE(all_close(gradients.bias, {1.0, 0.0, 0.0, 0.0}));
}

TEST(LayerNormBackward, MatchesFiniteDifferencesForInputScaleAndBias) {
    // Objective f(x, γ, β) = Σ w ⊙ layer_norm(x, γ, β) on a rank-3 input [2,3,8].
    const Shape shape{2, 3, 8};
    constexpr std::size_t width = 8;
    const std::vector<float> x = pseudo_random(48, -2.0F, 2.0F, 201U);
    const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, 202U);
    const std::vector<float> bias = pseudo_random(width, -1.0F, 1.0F, 203U);
    const std::vector<float> w = pseudo_random(48, -1.0F, 1.0F, 204U);
    const auto objective = [&](const std::vector<float>& xs, const std::vector<float>& gammas,
                               const std::vector<float>& betas) {
        return testing::inner_product(
            tensor_ops::layer_norm(Tensor(shape, xs), Tensor({width}, gammas),
                                   Tensor({width}, betas))
                .output.to_host(),
            w);
    };
    const tensor_ops::LayerNormResult forward =
        tensor_ops::layer_norm(Tensor(shape, x), Tensor({width}, scale), Tensor({width}, bias));
    const tensor_ops::LayerNormGradients gradients =
        tensor_ops::layer_norm_backward(Tensor(shape, x), Tensor({width}, scale), forward.mean,
                                        forward.inverse_deviation, Tensor(shape, w));
    for (const double epsilon : {1e-2, 1e-3}) {
        const double tolerance = epsilon == 1e-2 ? 5e-3 : 3e-3;
        const auto dx = finite_difference_gradient(
            [&](const std::vector<float>& v) { return objective(v, scale, bias); }, x, epsilon);
        const auto dscale = finite_difference_gradient(
            [&](const std::vector<float>& v) { return objective(x, v, bias); }, scale, epsilon);
        const auto dbias = finite_difference_gradient(
            [&](const std::vector<float>& v) { return objective(x, scale, v); }, bias, epsilon);
        EXPECT_TRUE(all_close(gradients.input, dx, tolerance, tolerance)) << "eps " << epsilon;
        EXPECT_TRUE(all_close(gradients.scale, dscale, tolerance, tolerance)) << "eps " << epsilon;
        EXPECT_TRUE(all_close(gradients.bias, dbias, tolerance, tolerance)) << "eps " << epsilon;
    }
}

TEST(LayerNormBackward, MatchesDoubleOracleForWidthsThatAreNotMultiplesOf16) {
    for (const std::size_t width : {1U, 7U, 33U, 100U}) {
        constexpr std::size_t rows = 5;
        const auto seed = static_cast<std::uint32_t>(300 + width);
        const std::vector<float> x = pseudo_random(rows * width, -3.0F, 3.0F, seed);
        const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, seed + 1);
        const std::vector<float> upstream = pseudo_random(rows * width, -1.0F, 1.0F, seed + 2);
        const Tensor xt({rows, width}, x);
        const Tensor st({width}, scale);
        const tensor_ops::LayerNormResult forward =
            tensor_ops::layer_norm(xt, st, Tensor({width}, 0.0F));
        const tensor_ops::LayerNormGradients gradients = tensor_ops::layer_norm_backward(
            xt, st, forward.mean, forward.inverse_deviation, Tensor({rows, width}, upstream));
        const LayerNormGradientOracle oracle =
            layer_norm_backward_oracle(x, scale, upstream, default_epsilon);
        EXPECT_TRUE(all_close(gradients.input, oracle.input, 1e-5, 1e-5)) << "width " << width;
        EXPECT_TRUE(all_close(gradients.scale, oracle.scale, 1e-5, 1e-5)) << "width " << width;
        EXPECT_TRUE(all_close(gradients.bias, oracle.bias, 1e-5, 1e-5)) << "width " << width;
    }
}

TEST(LayerNormBackward, LargeCaseMatchesDoubleOracle) {
    constexpr std::size_t rows = 512;
    constexpr std::size_t width = 768;
    const std::vector<float> x = pseudo_random(rows * width, -4.0F, 4.0F, 401U);
    const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, 402U);
    const std::vector<float> upstream = pseudo_random(rows * width, -1.0F, 1.0F, 403U);
    const Tensor xt({rows, width}, x);
    const Tensor st({width}, scale);
    const tensor_ops::LayerNormResult forward =
        tensor_ops::layer_norm(xt, st, Tensor({width}, 0.0F));
    const tensor_ops::LayerNormGradients gradients = tensor_ops::layer_norm_backward(
        xt, st, forward.mean, forward.inverse_deviation, Tensor({rows, width}, upstream));
    const LayerNormGradientOracle oracle =
        layer_norm_backward_oracle(x, scale, upstream, default_epsilon);
    EXPECT_TRUE(all_close(gradients.input, oracle.input, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(gradients.scale, oracle.scale, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(gradients.bias, oracle.bias, 1e-5, 1e-5));
}

TEST(LayerNormBackward, ConstantRowHasZeroInputGradient) {
    // x̂ = 0 on a constant row, so dx = inv·(ĝ − mean(ĝ)), dγ = 0 and dβ = g.
    const Tensor x({1, 4}, 2.0F);
    const Tensor scale({4}, 1.0F);
    const std::vector<float> g = {1.0F, 1.0F, 1.0F, 1.0F};
    const tensor_ops::LayerNormResult forward = tensor_ops::layer_norm(x, scale, Tensor({4}, 0.0F));
    const tensor_ops::LayerNormGradients gradients = tensor_ops::layer_norm_backward(
        x, scale, forward.mean, forward.inverse_deviation, Tensor({1, 4}, g));
    EXPECT_TRUE(all_close(gradients.input, {0.0, 0.0, 0.0, 0.0}));
    EXPECT_TRUE(all_close(gradients.scale, {0.0, 0.0, 0.0, 0.0}));
    EXPECT_TRUE(all_close(gradients.bias, {1.0, 1.0, 1.0, 1.0}));
}

TEST(LayerNormBackward, RejectsMismatchedShapes) {
    const Tensor x({2, 4}, pseudo_random(8));
    const Tensor scale({4}, 1.0F);
    const Tensor stat({2}, 1.0F);
    const Tensor upstream({2, 4}, 1.0F);
    const auto call = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d,
                         const Tensor& e) {
        static_cast<void>(tensor_ops::layer_norm_backward(a, b, c, d, e));
    };
    EXPECT_NO_THROW(call(x, scale, stat, stat, upstream));
    EXPECT_THROW(call(x, Tensor({5}, 1.0F), stat, stat, upstream), std::invalid_argument);
    EXPECT_THROW(call(x, Tensor({1, 4}, 1.0F), stat, stat, upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, Tensor({3}, 0.0F), stat, upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, Tensor({2, 1}, 0.0F), stat, upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, stat, Tensor({1}, 1.0F), upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, stat, Tensor::scalar(1.0F), upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, stat, stat, Tensor({4, 2}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(call(x, scale, stat, stat, Tensor({8}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(call(Tensor::scalar(1.0F), Tensor({1}, 1.0F), Tensor({1}, 0.0F), Tensor({1}, 1.0F),
                      Tensor::scalar(1.0F)),
                 std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// rms_norm

TEST(RmsNorm, MatchesHandComputedExample) {
    // eps 3.5: row [3,4] has mean(x²) 12.5 -> r = 1/√16 = 1/4; row [0,−1] has 0.5 -> r = 1/2.
    // γ = [2, −0.5]: y = [[1.5, −0.5], [0, 0.25]].
    const Tensor x({2, 2}, {3.0F, 4.0F, 0.0F, -1.0F});
    const tensor_ops::RmsNormResult result =
        tensor_ops::rms_norm(x, Tensor({2}, {2.0F, -0.5F}), 3.5F);
    EXPECT_EQ(result.output.shape(), (Shape{2, 2}));
    EXPECT_TRUE(all_close(result.output, {1.5, -0.5, 0.0, 0.25}));
    EXPECT_EQ(result.inverse_rms.shape(), (Shape{2}));
    EXPECT_TRUE(all_close(result.inverse_rms, {0.25, 0.5}));
}

TEST(RmsNorm, DoesNotSubtractTheMean) {
    // A constant row c of any width: y = c·γ/√(c² + eps), not 0.
    const Tensor x({1, 3}, 2.0F);
    const tensor_ops::RmsNormResult result = tensor_ops::rms_norm(x, Tensor({3}, 1.0F));
    const double y = 2.0 / std::sqrt(4.0 + default_epsilon);
    EXPECT_TRUE(all_close(result.output, {y, y, y}));
}

TEST(RmsNorm, ZeroRowGivesZeroNotNaN) {
    const tensor_ops::RmsNormResult result =
        tensor_ops::rms_norm(Tensor({2, 5}, 0.0F), Tensor({5}, 3.0F));
    EXPECT_TRUE(all_close(result.output, std::vector<double>(10, 0.0), 0.0, 0.0));
    EXPECT_TRUE(all_close(result.inverse_rms,
                          std::vector<double>(2, 1.0 / std::sqrt(default_epsilon)), 0.0, 1e-6));
}

TEST(RmsNorm, MatchesDoubleOracleForWidthsThatAreNotMultiplesOf16) {
    for (const std::size_t width : {1U, 7U, 15U, 17U, 33U, 100U}) {
        constexpr std::size_t rows = 5;
        const auto seed = static_cast<std::uint32_t>(500 + width);
        const std::vector<float> x = pseudo_random(rows * width, -3.0F, 5.0F, seed);
        const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, seed + 1);
        const tensor_ops::RmsNormResult result =
            tensor_ops::rms_norm(Tensor({rows, width}, x), Tensor({width}, scale));
        const RmsNormOracle oracle = rms_norm_oracle(x, scale, default_epsilon);
        EXPECT_TRUE(all_close(result.output, oracle.output, 1e-5, 1e-5)) << "width " << width;
        EXPECT_TRUE(all_close(result.inverse_rms, oracle.inverse_rms, 1e-6, 1e-6))
            << "width " << width;
    }
}

TEST(RmsNorm, LargeCaseMatchesDoubleOracle) {
    constexpr std::size_t rows = 512;
    constexpr std::size_t width = 768;
    const std::vector<float> x = pseudo_random(rows * width, -4.0F, 4.0F, 601U);
    const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, 602U);
    const tensor_ops::RmsNormResult result =
        tensor_ops::rms_norm(Tensor({rows, width}, x), Tensor({width}, scale));
    const RmsNormOracle oracle = rms_norm_oracle(x, scale, default_epsilon);
    EXPECT_TRUE(all_close(result.output, oracle.output, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(result.inverse_rms, oracle.inverse_rms, 1e-6, 1e-6));
}

TEST(RmsNorm, RejectsScalarInput) {
    EXPECT_THROW(static_cast<void>(tensor_ops::rms_norm(Tensor::scalar(1.0F), Tensor({1}, 1.0F))),
                 std::invalid_argument);
}

TEST(RmsNorm, RejectsScaleThatIsNotWidthVector) {
    const Tensor x({2, 4}, 1.0F);
    for (const Shape& bad : {Shape{5}, Shape{1, 4}, Shape{}, Shape{2, 4}}) {
        EXPECT_THROW(static_cast<void>(tensor_ops::rms_norm(x, Tensor(bad, 1.0F))),
                     std::invalid_argument)
            << shape_to_string(bad);
    }
}

TEST(RmsNorm, RejectsEpsilonThatIsNotFiniteAndPositive) {
    const Tensor x({2, 4}, pseudo_random(8));
    const Tensor scale({4}, 1.0F);
    for (const float epsilon : {0.0F, -0.0F, -1e-5F, infinity, -infinity, quiet_nan}) {
        EXPECT_THROW(static_cast<void>(tensor_ops::rms_norm(x, scale, epsilon)),
                     std::invalid_argument)
            << "eps " << epsilon;
    }
}

// ---------------------------------------------------------------------------------------------
// rms_norm_backward

TEST(RmsNormBackward, HandComputedExample) {
    // Row [3,4], eps 3.5 -> r = 1/4, γ = [1,1], g = [1,0]: mean(g γ x) = 3/2,
    // dx = r·g − x·r³·3/2 = [1/4 − 3·(3/128), −4·(3/128)] = [0.1796875, −0.09375];
    // dγ = g ⊙ x·r = [0.75, 0].
    const Tensor x({1, 2}, {3.0F, 4.0F});
    const Tensor scale({2}, 1.0F);
    const tensor_ops::RmsNormResult forward = tensor_ops::rms_norm(x, scale, 3.5F);
    const tensor_ops::RmsNormGradients gradients =
        tensor_ops::rms_norm_backward(x, scale, forward.inverse_rms, Tensor({1, 2}, {1.0F, 0.0F}));
    EXPECT_EQ(gradients.input.shape(), (Shape{1, 2}));
    EXPECT_EQ(gradients.scale.shape(), (Shape{2}));
    EXPECT_TRUE(all_close(gradients.input, {0.1796875, -0.09375}));
    EXPECT_TRUE(all_close(gradients.scale, {0.75, 0.0}));
}

TEST(RmsNormBackward, MatchesFiniteDifferencesForInputAndScale) {
    const Shape shape{2, 3, 8};
    constexpr std::size_t width = 8;
    const std::vector<float> x = pseudo_random(48, -2.0F, 2.0F, 701U);
    const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, 702U);
    const std::vector<float> w = pseudo_random(48, -1.0F, 1.0F, 703U);
    const auto objective = [&](const std::vector<float>& xs, const std::vector<float>& gammas) {
        return testing::inner_product(
            tensor_ops::rms_norm(Tensor(shape, xs), Tensor({width}, gammas)).output.to_host(), w);
    };
    const tensor_ops::RmsNormResult forward =
        tensor_ops::rms_norm(Tensor(shape, x), Tensor({width}, scale));
    const tensor_ops::RmsNormGradients gradients = tensor_ops::rms_norm_backward(
        Tensor(shape, x), Tensor({width}, scale), forward.inverse_rms, Tensor(shape, w));
    for (const double epsilon : {1e-2, 1e-3}) {
        const double tolerance = epsilon == 1e-2 ? 5e-3 : 3e-3;
        const auto dx = finite_difference_gradient(
            [&](const std::vector<float>& v) { return objective(v, scale); }, x, epsilon);
        const auto dscale = finite_difference_gradient(
            [&](const std::vector<float>& v) { return objective(x, v); }, scale, epsilon);
        EXPECT_TRUE(all_close(gradients.input, dx, tolerance, tolerance)) << "eps " << epsilon;
        EXPECT_TRUE(all_close(gradients.scale, dscale, tolerance, tolerance)) << "eps " << epsilon;
    }
}

TEST(RmsNormBackward, MatchesDoubleOracleForAwkwardWidthsAndLargeCase) {
    const std::vector<std::pair<std::size_t, std::size_t>> cases = {
        {5, 1}, {5, 7}, {5, 33}, {5, 100}, {512, 768}};
    for (const auto& [rows, width] : cases) {
        const auto seed = static_cast<std::uint32_t>(800 + width);
        const std::vector<float> x = pseudo_random(rows * width, -3.0F, 3.0F, seed);
        const std::vector<float> scale = pseudo_random(width, 0.5F, 1.5F, seed + 1);
        const std::vector<float> upstream = pseudo_random(rows * width, -1.0F, 1.0F, seed + 2);
        const Tensor xt({rows, width}, x);
        const Tensor st({width}, scale);
        const tensor_ops::RmsNormResult forward = tensor_ops::rms_norm(xt, st);
        const tensor_ops::RmsNormGradients gradients = tensor_ops::rms_norm_backward(
            xt, st, forward.inverse_rms, Tensor({rows, width}, upstream));
        const RmsNormGradientOracle oracle =
            rms_norm_backward_oracle(x, scale, upstream, default_epsilon);
        EXPECT_TRUE(all_close(gradients.input, oracle.input, 1e-5, 1e-5)) << rows << "x" << width;
        EXPECT_TRUE(all_close(gradients.scale, oracle.scale, 1e-5, 1e-5)) << rows << "x" << width;
    }
}

TEST(RmsNormBackward, RejectsMismatchedShapes) {
    const Tensor x({2, 4}, pseudo_random(8));
    const Tensor scale({4}, 1.0F);
    const Tensor inverse({2}, 1.0F);
    const Tensor upstream({2, 4}, 1.0F);
    const auto call = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) {
        static_cast<void>(tensor_ops::rms_norm_backward(a, b, c, d));
    };
    EXPECT_NO_THROW(call(x, scale, inverse, upstream));
    EXPECT_THROW(call(x, Tensor({3}, 1.0F), inverse, upstream), std::invalid_argument);
    EXPECT_THROW(call(x, Tensor({4, 1}, 1.0F), inverse, upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, Tensor({4}, 1.0F), upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, Tensor({2, 1}, 1.0F), upstream), std::invalid_argument);
    EXPECT_THROW(call(x, scale, inverse, Tensor({2, 5}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(call(x, scale, inverse, Tensor({1, 2, 4}, 1.0F)), std::invalid_argument);
    EXPECT_THROW(
        call(Tensor::scalar(1.0F), Tensor({1}, 1.0F), Tensor({1}, 1.0F), Tensor::scalar(1.0F)),
        std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Determinism across thread counts

TEST(Normalization, ResultsAreBitIdenticalForAnyThreadCount) {
    // Rows are independent and the parameter-gradient sums are folded per fixed block of rows,
    // so every output is the same bit pattern whatever the pool size.
    const testing::ThreadCountGuard guard;
    constexpr std::size_t rows = 512;
    constexpr std::size_t width = 768;
    const Tensor x({rows, width}, pseudo_random(rows * width, -4.0F, 4.0F, 901U));
    const Tensor scale({width}, pseudo_random(width, 0.5F, 1.5F, 902U));
    const Tensor bias({width}, pseudo_random(width, -1.0F, 1.0F, 903U));
    const Tensor upstream({rows, width}, pseudo_random(rows * width, -1.0F, 1.0F, 904U));

    const auto run_all = [&] {
        std::vector<std::vector<float>> outputs;
        const tensor_ops::LayerNormResult layer = tensor_ops::layer_norm(x, scale, bias);
        const tensor_ops::LayerNormGradients layer_gradients = tensor_ops::layer_norm_backward(
            x, scale, layer.mean, layer.inverse_deviation, upstream);
        const tensor_ops::RmsNormResult rms = tensor_ops::rms_norm(x, scale);
        const tensor_ops::RmsNormGradients rms_gradients =
            tensor_ops::rms_norm_backward(x, scale, rms.inverse_rms, upstream);
        for (const Tensor* t :
             {&layer.output, &layer.mean, &layer.inverse_deviation, &layer_gradients.input,
              &layer_gradients.scale, &layer_gradients.bias, &rms.output, &rms.inverse_rms,
              &rms_gradients.input, &rms_gradients.scale}) {
            outputs.push_back(t->to_host());
        }
        return outputs;
    };
    set_cpu_thread_count(1);
    const auto serial = run_all();
    for (const std::size_t threads : {2U, 3U}) {
        set_cpu_thread_count(threads);
        const auto threaded = run_all();
        for (std::size_t i = 0; i < serial.size(); ++i) {
            EXPECT_TRUE(bit_identical(serial[i], threaded[i]))
                << "output " << i << " with " << threads << " threads";
        }
    }
}

}  // namespace riftco_transformer
