// quantized_linear and its input backward (tensor_ops and autograd) against a
// dequantize-then-matmul oracle in double (form B, tol 3e-5:
// docs/ARCHITECTURE.md, 'Numeric parity'), on every kernel set the CPU has (AVX-512, AVX2 + FMA,
// portable; the others are skipped), both scale encodings, and shapes covering the direct (few
// rows) and panel (many rows) kernels.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/node.hpp"
#include "core/backend/cpu/nf4_kernels.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/kernel_choice.hpp"
#include "support/nf4_reference.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::close_form_b;
using testing::KernelChoiceGuard;
using testing::pseudo_random;

constexpr double tolerance = 3e-5;

struct ProductCase {
    std::size_t rows;
    std::size_t in;
    std::size_t out;
    std::size_t block_size;
    bool double_quantized;
    std::size_t scale_block_size;
};

std::string describe(const ProductCase& c) {
    return "rows=" + std::to_string(c.rows) + " in=" + std::to_string(c.in) +
           " out=" + std::to_string(c.out) + " B=" + std::to_string(c.block_size) +
           (c.double_quantized ? " DQ C=" + std::to_string(c.scale_block_size) : " legacy");
}

const ProductCase product_cases[] = {
    // Direct kernels (rows <= 8): rows = 1, groups of 4 plus a remainder, odd sizes.
    {1, 256, 64, 64, true, 256},  // in % 128 == 0 (stride-8 decode GEMVs)
    {2, 64, 7, 32, true, 32},     // in % 64 == 0 only (AVX2 stride-8 GEMV, two blocks a chunk)
    {1, 192, 5, 128, false, 0},   // in % 64 == 0, blocks spanning rows
    {1, 4096, 24, 64, true, 256},
    {1, 384, 10, 32, true, 32},   // B=32: four blocks per 128-element chunk
    {2, 128, 9, 512, true, 32},   // blocks spanning four rows
    {3, 256, 5, 4096, false, 0},  // one block for everything
    {1, 100, 37, 64, false, 0},   // in not a multiple of B, blocks spanning rows
    {3, 33, 5, 32, true, 32},     // odd in, odd N: rows start on a high nibble
    {5, 96, 33, 64, true, 64},
    {6, 256, 12, 64, false, 0},  // stride-8 GEMV with a group of 4 rows and one of 2
    {8, 200, 17, 128, false, 0},
    {1, 1, 1, 32, true, 32},
    // Panel kernels (rows > 8).
    {9, 160, 70, 64, true, 256},
    {12, 4096, 150, 64, true, 256},  // several row panels, a partial last one
    {37, 201, 130, 32, false, 0},    // odd in
    {16, 64, 3000, 64, true, 32},    // several column panels in the input backward
    {64, 384, 96, 256, true, 64},
};

struct Fixture {
    QuantizedWeight weight;
    std::vector<double> dense;  // the oracle's decoded matrix
};

Fixture make_weight(const ProductCase& c) {
    const Tensor source({c.out, c.in}, pseudo_random(c.out * c.in, -0.8F, 0.8F, 11U));
    QuantizedWeight weight = QuantizedWeight::quantize(
        source, Nf4Options{c.block_size, c.double_quantized,
                           c.double_quantized ? c.scale_block_size : nf4_default_scale_block_size});
    std::vector<double> dense = testing::reference_dequantize(weight.copy_payload_to_host());
    return {std::move(weight), std::move(dense)};
}

void check_products(detail::Nf4KernelChoice choice) {
    const KernelChoiceGuard guard(choice);
    for (const ProductCase& c : product_cases) {
        SCOPED_TRACE(describe(c));
        const Fixture fixture = make_weight(c);
        // Inputs of unit size: the float GEMM's own rounding over K terms stays well inside
        // the tolerance (K = 4096 here).
        const std::vector<float> x = pseudo_random(c.rows * c.in, -1.0F, 1.0F, 21U);
        const Tensor y = tensor_ops::quantized_linear(Tensor({c.rows, c.in}, x), fixture.weight);
        ASSERT_EQ(y.shape(), (Shape{c.rows, c.out}));
        EXPECT_TRUE(close_form_b(
            y.to_host(), testing::reference_forward(fixture.dense, c.out, c.in, x), tolerance));

        const std::vector<float> g = pseudo_random(c.rows * c.out, -1.0F, 1.0F, 31U);
        const Tensor dx =
            tensor_ops::quantized_linear_input_backward(Tensor({c.rows, c.out}, g), fixture.weight);
        ASSERT_EQ(dx.shape(), (Shape{c.rows, c.in}));
        EXPECT_TRUE(close_form_b(dx.to_host(),
                                 testing::reference_input_backward(fixture.dense, c.out, c.in, g),
                                 tolerance));
    }
}

bool supported(detail::Nf4KernelChoice choice) {
    return detail::nf4_kernel_set_if_supported(choice) != nullptr;
}

TEST(QuantizedLinear, MatchesTheDequantizedOracleOnTheDefaultKernels) {
    check_products(detail::Nf4KernelChoice::Automatic);
}

TEST(QuantizedLinear, MatchesTheDequantizedOracleOnTheAvx512Kernels) {
    if (!supported(detail::Nf4KernelChoice::Avx512)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX-512 NF4 kernels";
    }
    check_products(detail::Nf4KernelChoice::Avx512);
}

TEST(QuantizedLinear, MatchesTheDequantizedOracleOnTheAvx2Kernels) {
    if (!supported(detail::Nf4KernelChoice::Avx2)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX2 + FMA NF4 kernels";
    }
    check_products(detail::Nf4KernelChoice::Avx2);
}

TEST(QuantizedLinear, MatchesTheDequantizedOracleOnThePortableKernels) {
    check_products(detail::Nf4KernelChoice::Portable);
}

TEST(QuantizedLinear, ReportsWhichKernelSetRuns) {
    // Automatic prefers AVX-512, then AVX2; a forced set the CPU lacks falls to the next one down.
    const detail::Nf4KernelSet* avx512 = detail::avx512_nf4_kernels();
    const detail::Nf4KernelSet* avx2 = detail::avx2_nf4_kernels();
    const char* best = avx512 != nullptr ? "avx512" : avx2 != nullptr ? "avx2" : "portable";
    const char* unforced = detail::active_nf4_kernels().name;
    EXPECT_STREQ(detail::nf4_kernel_set_for(detail::Nf4KernelChoice::Automatic).name, best);
    EXPECT_STREQ(detail::nf4_kernel_set_for(detail::Nf4KernelChoice::Avx512).name, best);
    EXPECT_STREQ(detail::nf4_kernel_set_for(detail::Nf4KernelChoice::Avx2).name,
                 avx2 != nullptr ? "avx2" : "portable");
    const std::pair<detail::Nf4KernelChoice, const char*> forced[] = {
        {detail::Nf4KernelChoice::Portable, "portable"},
        {detail::Nf4KernelChoice::Avx2, avx2 != nullptr ? "avx2" : "portable"},
        {detail::Nf4KernelChoice::Avx512, best},
    };
    for (const auto& [choice, name] : forced) {
        const KernelChoiceGuard guard(choice);
        EXPECT_STREQ(detail::active_nf4_kernels().name, name);
        const std::string description = detail::nf4_kernel_description(
            detail::PackedLayout{4096, 4096, 64, true, 256}, 1, false);
        EXPECT_EQ(description.rfind(name, 0), 0U) << description;
    }
    // The guards reset the hook (what then runs may still be forced by the environment).
    EXPECT_STREQ(detail::active_nf4_kernels().name, unforced);
}

// The panel decoder at every offset parity and length, against the oracle's elements.
void check_decode_range(detail::Nf4KernelChoice choice) {
    const ProductCase c{5, 77, 9, 32, true, 32};
    const Fixture fixture = make_weight(c);
    const PackedNf4Payload payload = fixture.weight.copy_payload_to_host();
    const detail::Nf4View view = detail::view_of(payload);
    const detail::Nf4KernelSet& set = detail::nf4_kernel_set_for(choice);
    for (std::size_t begin : {0UL, 1UL, 15UL, 16UL, 31UL, 32UL, 77UL, 100UL}) {
        for (std::size_t count : {1UL, 15UL, 17UL, 31UL, 64UL, 150UL}) {
            if (begin + count > c.in * c.out) {
                continue;
            }
            std::vector<float> decoded(count);
            set.decode_range(view, begin, count, decoded.data());
            for (std::size_t j = 0; j < count; ++j) {
                ASSERT_EQ(static_cast<double>(decoded[j]), fixture.dense[begin + j])
                    << set.name << " begin " << begin << " element " << j;
            }
        }
    }
}

TEST(QuantizedLinear, DecodeRangeOfTheAvx512KernelsEqualsTheOracleBitForBit) {
    if (!supported(detail::Nf4KernelChoice::Avx512)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX-512 NF4 kernels";
    }
    check_decode_range(detail::Nf4KernelChoice::Avx512);
}

TEST(QuantizedLinear, DecodeRangeOfTheAvx2KernelsEqualsTheOracleBitForBit) {
    if (!supported(detail::Nf4KernelChoice::Avx2)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX2 + FMA NF4 kernels";
    }
    check_decode_range(detail::Nf4KernelChoice::Avx2);
}

TEST(QuantizedLinear, DecodeRangeOfThePortableKernelsEqualsTheOracleBitForBit) {
    check_decode_range(detail::Nf4KernelChoice::Portable);
}

// The direct input-backward kernel on a column segment that starts half-way through a 64-column
// chunk and ends on a 32-column piece (what a thread of the driver gets), against the oracle;
// the columns outside the segment stay untouched.
void check_backward_segment(detail::Nf4KernelChoice choice) {
    const detail::Nf4KernelSet& set = detail::nf4_kernel_set_for(choice);
    for (const ProductCase& c :
         {ProductCase{3, 256, 5, 64, true, 32}, ProductCase{2, 192, 4, 32, false, 0},
          ProductCase{1, 128, 3, 128, true, 256}}) {
        SCOPED_TRACE(describe(c));
        const Fixture fixture = make_weight(c);
        const PackedNf4Payload payload = fixture.weight.copy_payload_to_host();
        const detail::Nf4View view = detail::view_of(payload);
        const std::vector<float> g = pseudo_random(c.rows * c.out, -1.0F, 1.0F, 41U);
        const std::vector<double> expected =
            testing::reference_input_backward(fixture.dense, c.out, c.in, g);
        const std::size_t c_begin = 32;
        const std::size_t c_end = c.in - 32;  // 64·k + 32 columns
        std::vector<float> dx(c.rows * c.in, -7.0F);
        set.gemv_backward(view, g.data(), c.rows, c_begin, c_end, dx.data());
        for (std::size_t r = 0; r < c.rows; ++r) {
            for (std::size_t column = 0; column < c.in; ++column) {
                const std::size_t k = r * c.in + column;
                if (column < c_begin || column >= c_end) {
                    ASSERT_EQ(dx[k], -7.0F) << set.name << " wrote outside the segment at " << k;
                } else {
                    ASSERT_NEAR(dx[k], expected[k],
                                tolerance * std::max(1.0, std::abs(expected[k])))
                        << set.name << " row " << r << " column " << column;
                }
            }
        }
    }
}

TEST(QuantizedLinear, BackwardSegmentOfTheAvx512KernelsMatchesTheOracle) {
    if (!supported(detail::Nf4KernelChoice::Avx512)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX-512 NF4 kernels";
    }
    check_backward_segment(detail::Nf4KernelChoice::Avx512);
}

TEST(QuantizedLinear, BackwardSegmentOfTheAvx2KernelsMatchesTheOracle) {
    if (!supported(detail::Nf4KernelChoice::Avx2)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX2 + FMA NF4 kernels";
    }
    check_backward_segment(detail::Nf4KernelChoice::Avx2);
}

TEST(QuantizedLinear, BackwardSegmentOfThePortableKernelsMatchesTheOracle) {
    check_backward_segment(detail::Nf4KernelChoice::Portable);
}

TEST(QuantizedLinear, KeepsLeadingDimensions) {
    const ProductCase c{6, 64, 7, 32, true, 32};
    const Fixture fixture = make_weight(c);
    const std::vector<float> x = pseudo_random(6 * 64, -1.0F, 1.0F, 3U);
    const Tensor y = tensor_ops::quantized_linear(Tensor({2, 3, 64}, x), fixture.weight);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 7}));
    EXPECT_TRUE(
        close_form_b(y.to_host(), testing::reference_forward(fixture.dense, 7, 64, x), tolerance));
    const Tensor dx =
        tensor_ops::quantized_linear_input_backward(Tensor({2, 3, 7}, 1.0F), fixture.weight);
    EXPECT_EQ(dx.shape(), (Shape{2, 3, 64}));
}

TEST(QuantizedLinear, RejectsShapeErrorsNamingTheArguments) {
    const Fixture fixture = make_weight({1, 64, 7, 32, false, 0});
    try {
        static_cast<void>(tensor_ops::quantized_linear(Tensor::zeros({2, 63}), fixture.weight));
        ADD_FAILURE() << "expected invalid_argument";
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("x [2,63]"), std::string::npos) << message;
        EXPECT_NE(message.find("in_features 64"), std::string::npos) << message;
    }
    try {
        static_cast<void>(
            tensor_ops::quantized_linear_input_backward(Tensor::zeros({2, 64}), fixture.weight));
        ADD_FAILURE() << "expected invalid_argument";
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("upstream [2,64]"), std::string::npos) << message;
        EXPECT_NE(message.find("out_features 7"), std::string::npos) << message;
    }
    EXPECT_THROW(
        static_cast<void>(tensor_ops::quantized_linear(Tensor::scalar(1.0F), fixture.weight)),
        std::invalid_argument);
    EXPECT_THROW(
        static_cast<void>(tensor_ops::quantized_linear(Tensor::zeros({2, 64}), QuantizedWeight())),
        std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::quantized_linear(Tensor(), fixture.weight)),
                 std::logic_error);
}

// ---- autograd ------------------------------------------------------------------------------

TEST(QuantizedLinearAutograd, HasExactlyOneParentAndMatchesTheOracleGradient) {
    const ProductCase c{3, 96, 20, 32, true, 32};
    const Fixture fixture = make_weight(c);
    const std::vector<float> x_values = pseudo_random(c.rows * c.in, -1.0F, 1.0F, 8U);
    const Variable x(Tensor({c.rows, c.in}, x_values));
    Variable y = quantized_linear(x, fixture.weight);
    ASSERT_NE(y.node(), nullptr);
    EXPECT_EQ(y.node()->parents.size(), 1U);
    EXPECT_TRUE(close_form_b(y.value().to_host(),
                             testing::reference_forward(fixture.dense, c.out, c.in, x_values),
                             tolerance));
    const std::vector<float> seed = pseudo_random(c.rows * c.out, -1.0F, 1.0F, 9U);
    y.backward(Tensor({c.rows, c.out}, seed));
    EXPECT_TRUE(close_form_b(x.gradient().to_host(),
                             testing::reference_input_backward(fixture.dense, c.out, c.in, seed),
                             tolerance));
}

TEST(QuantizedLinearAutograd, GradientMatchesFiniteDifferences) {
    const ProductCase c{2, 40, 6, 32, false, 0};
    const Fixture fixture = make_weight(c);
    const std::vector<float> x_values = pseudo_random(c.rows * c.in, -1.0F, 1.0F, 4U);
    const std::vector<float> weights = pseudo_random(c.rows * c.out, -1.0F, 1.0F, 5U);
    const Variable x(Tensor({c.rows, c.in}, x_values));
    quantized_linear(x, fixture.weight).backward(Tensor({c.rows, c.out}, weights));
    const auto objective = [&](const std::vector<float>& values) {
        const Tensor y =
            tensor_ops::quantized_linear(Tensor({c.rows, c.in}, values), fixture.weight);
        return testing::inner_product(y.to_host(), weights);
    };
    EXPECT_TRUE(testing::all_close(
        x.gradient(), testing::finite_difference_gradient(objective, x_values), 5e-3, 5e-3));
}

TEST(QuantizedLinearAutograd, AConstantInputRecordsNoGraph) {
    const Fixture fixture = make_weight({1, 64, 4, 64, true, 256});
    const Variable x(Tensor::zeros({1, 64}), false);
    const Variable y = quantized_linear(x, fixture.weight);
    EXPECT_FALSE(y.requires_gradient());
    EXPECT_THROW(static_cast<void>(quantized_linear(Variable(), fixture.weight)), std::logic_error);
    EXPECT_THROW(
        static_cast<void>(quantized_linear(Variable(Tensor::zeros({1, 63})), fixture.weight)),
        std::invalid_argument);
}

}  // namespace
}  // namespace riftco_transformer
