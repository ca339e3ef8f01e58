// GGUF block formats (q8_0, q4_0, q4_1, q5_0 and the K formats q4_k, q5_k, q6_k) as
// QuantizedWeight storage: binary16 conversion against a nearest-neighbour search, decoding
// against an oracle written from the layout in double, element by element, ggml's reference
// rounding on hand-computed blocks, the products and the input backward of every kernel set
// against the decoded matrix in double (form B, 3e-5), and every payload rule with its
// message. (The K formats have no quantizer here: their weights are random valid blocks.) (The gguf
// package's quantize and dequantize are the Python tests' oracle: test_block_formats.py.)

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/node.hpp"
#include "core/backend/cpu/block_kernels.hpp"
#include "core/quantized/block_format.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/interchange/gguf.hpp"
#include "support/kernel_choice.hpp"
#include "support/nf4_reference.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::close_form_b;
using testing::KernelChoiceGuard;
using testing::pseudo_random;

constexpr double tolerance = 3e-5;
// The formats quantize_blocks produces, and every block format.
constexpr WeightFormat block_formats[] = {WeightFormat::q8_0, WeightFormat::q4_0,
                                          WeightFormat::q4_1, WeightFormat::q5_0,
                                          WeightFormat::f16,  WeightFormat::bf16};
constexpr WeightFormat all_block_formats[] = {
    WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::q4_1,
    WeightFormat::q5_0, WeightFormat::q4_k, WeightFormat::q5_k,
    WeightFormat::q6_k, WeightFormat::f16,  WeightFormat::bf16};

// The value of binary16 `bits` from its fields, in double (the oracle of half_bits_to_float).
double half_value(std::uint16_t bits) {
    const int exponent = (bits >> 10) & 31;
    const int mantissa = bits & 1023;
    const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
    if (exponent == 31) {
        return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                             : std::numeric_limits<double>::quiet_NaN();
    }
    if (exponent == 0) {
        return sign * std::ldexp(mantissa, -24);
    }
    return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(BlockFormats, HalfToFloatIsExactForEveryBitPattern) {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const auto half = static_cast<std::uint16_t>(bits);
        const float value = detail::half_bits_to_float(half);
        const double expected = half_value(half);
        if (std::isnan(expected)) {
            ASSERT_TRUE(std::isnan(value)) << bits;
            continue;
        }
        ASSERT_EQ(static_cast<double>(value), expected) << bits;
        ASSERT_EQ(std::signbit(value), (bits & 0x8000U) != 0) << bits;
        // Every finite half and infinity survives the way back.
        ASSERT_EQ(detail::float_to_half_bits(value), half) << bits;
    }
}

TEST(BlockFormats, FloatToHalfRoundsToTheNearestEvenNeighbour) {
    // Ties, by hand: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 (odd): to 1.
    EXPECT_EQ(detail::float_to_half_bits(1.0F + std::ldexp(1.0F, -11)), 0x3C00);
    EXPECT_EQ(detail::float_to_half_bits(1.0F + 3 * std::ldexp(1.0F, -11)), 0x3C02);
    EXPECT_EQ(detail::float_to_half_bits(65504.0F), 0x7BFF);
    EXPECT_EQ(detail::float_to_half_bits(65519.996F), 0x7BFF);
    EXPECT_EQ(detail::float_to_half_bits(65520.0F), 0x7C00);  // the tie above 65504: infinity
    EXPECT_EQ(detail::float_to_half_bits(-1e30F), 0xFC00);
    EXPECT_EQ(detail::float_to_half_bits(std::ldexp(1.0F, -25)), 0x0000);  // tie to even 0
    EXPECT_EQ(detail::float_to_half_bits(std::ldexp(1.5F, -25)), 0x0001);
    EXPECT_EQ(detail::float_to_half_bits(std::ldexp(1.5F, -24)), 0x0002);     // tie: to even 2
    EXPECT_EQ(detail::float_to_half_bits(std::ldexp(1023.5F, -24)), 0x0400);  // carry to normal
    EXPECT_EQ(detail::float_to_half_bits(-0.0F), 0x8000);
    EXPECT_TRUE(std::isnan(detail::half_bits_to_float(
        detail::float_to_half_bits(std::numeric_limits<float>::quiet_NaN()))));
    // Random floats over the whole range: no other binary16 is nearer, and a tie is even.
    const std::vector<float> unit = pseudo_random(200000, 0.0F, 1.0F, 5U);
    for (std::size_t i = 0; i < unit.size(); ++i) {
        const float value =
            (i % 2 == 0 ? 1.0F : -1.0F) * std::ldexp(1.0F + unit[i], static_cast<int>(i % 43) - 27);
        if (std::fabs(value) >= 65520.0F) {
            continue;  // overflows to infinity (checked by hand above)
        }
        const std::uint16_t h = detail::float_to_half_bits(value);
        const double error = std::fabs(half_value(h) - value);
        for (const int step : {-1, 1}) {
            const auto neighbour = static_cast<std::uint16_t>(
                (((h & 0x7FFFU) + static_cast<unsigned>(step)) & 0x7FFFU) | (h & 0x8000U));
            if ((h & 0x7FFF) == 0 && step < 0) {
                continue;
            }
            const double other = std::fabs(half_value(neighbour) - value);
            ASSERT_TRUE(error < other || (error == other && (h & 1U) == 0))
                << value << " -> " << h << " but " << neighbour << " is as near";
        }
    }
}

double half_of(const std::uint8_t* bytes) {
    return half_value(static_cast<std::uint16_t>(bytes[0] | (bytes[1] << 8)));
}

// Element e of one block, in double, written from the layout (core/quantized_weight.hpp),
// rounded to float where the format rounds a sum (every product below is exact in float).
double reference_element(WeightFormat format, const std::uint8_t* block, std::size_t e) {
    switch (format) {
        case WeightFormat::q8_0:
            return half_of(block) * static_cast<std::int8_t>(block[2 + e]);
        case WeightFormat::q4_0:
        case WeightFormat::q4_1:
        case WeightFormat::q5_0: {
            const std::size_t codes =
                format == WeightFormat::q4_0 ? 2 : (format == WeightFormat::q4_1 ? 4 : 6);
            const int nibble = e < 16 ? block[codes + e] & 15 : block[codes + e - 16] >> 4;
            if (format == WeightFormat::q4_0) {
                return half_of(block) * (nibble - 8);
            }
            if (format == WeightFormat::q5_0) {
                const std::uint32_t qh = block[2] | (block[3] << 8U) | (block[4] << 16U) |
                                         (static_cast<std::uint32_t>(block[5]) << 24U);
                const int fifth = static_cast<int>((qh >> e) & 1U);
                return half_of(block) * (nibble + 16 * fifth - 16);
            }
            // d·n is exact in float (11 + 4 bits); the sum is rounded once, as in float.
            return static_cast<float>(half_of(block) * nibble + half_of(block + 2));
        }
        case WeightFormat::q4_k:
        case WeightFormat::q5_k: {
            const std::size_t j = e / 32;
            const std::size_t l = e % 32;
            const std::uint8_t* s = block + 4;
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            const bool five = format == WeightFormat::q5_k;
            const std::uint8_t byte = block[(five ? 48 : 16) + 32 * (j / 2) + l];
            int q = j % 2 == 0 ? byte & 15 : byte >> 4;
            if (five) {
                q += 16 * ((block[16 + l] >> j) & 1);
            }
            // (d·sc)·q and dmin·m are exact in float; their difference is rounded once.
            return static_cast<float>(half_of(block) * sc * q - half_of(block + 2) * m);
        }
        case WeightFormat::q6_k: {
            const std::size_t h = e / 128;
            const std::size_t t = (e % 128) / 32;
            const std::size_t l = e % 32;
            const int low = (block[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
            const int high = (block[128 + 32 * h + l] >> (2 * t)) & 3;
            const int sc = static_cast<std::int8_t>(block[192 + e / 16]);
            return half_of(block + 208) * sc * ((low | (high << 4)) - 32);
        }
        case WeightFormat::f16:
            return half_of(block + 2 * e);
        case WeightFormat::bf16: {
            // sign, 8 exponent bits, 7 mantissa bits: (−1)^s·2^(E−127)·(1 + m/128)
            const unsigned bits = block[2 * e] | (block[2 * e + 1] << 8U);
            const int exponent = static_cast<int>((bits >> 7U) & 255U);
            const double sign = (bits & 0x8000U) != 0 ? -1.0 : 1.0;
            const double mantissa = bits & 127U;
            if (exponent == 0) {
                return sign * std::ldexp(mantissa, -133);
            }
            return sign * std::ldexp(128.0 + mantissa, exponent - 134);
        }
        case WeightFormat::nf4:
            break;
    }
    return 0.0;
}

// The oracle's decoded matrix in double.
std::vector<double> reference_decode(const PackedBlockPayload& payload) {
    const std::size_t bytes = gguf_block_bytes(payload.format);
    const std::size_t elements = gguf_format_block_elements(payload.format);
    const std::size_t blocks = payload.blocks.size() / bytes;
    std::vector<double> values(blocks * elements);
    for (std::size_t b = 0; b < blocks; ++b) {
        for (std::size_t e = 0; e < elements; ++e) {
            values[b * elements + e] =
                reference_element(payload.format, payload.blocks.data() + b * bytes, e);
        }
    }
    return values;
}

// Random valid blocks: random code bytes and binary16 scales (d, and dmin or m) sized so that
// every weight stays within about ±1, as a real model's do: 2^-e .. 2^-(e-1) with
// 2^(e-1) ≈ the largest |code·sub-scale| (q4_k 63·15, q5_k 63·31, q6_k 128·32; 32 otherwise).
PackedBlockPayload random_blocks(WeightFormat format, std::size_t out, std::size_t in,
                                 std::uint32_t seed) {
    PackedBlockPayload payload;
    payload.format = format;
    payload.out_features = out;
    payload.in_features = in;
    const std::size_t bytes = gguf_block_bytes(format);
    const std::size_t count = out * in / gguf_format_block_elements(format);
    const std::vector<float> noise = pseudo_random(count * bytes, 0.0F, 1.0F, seed);
    payload.blocks.resize(count * bytes);
    for (std::size_t i = 0; i < payload.blocks.size(); ++i) {
        payload.blocks[i] =
            static_cast<std::uint8_t>(static_cast<unsigned>(noise[i] * 256.0F) & 255U);
    }
    std::vector<std::size_t> halves = {0};
    if (format == WeightFormat::q4_1 || format == WeightFormat::q4_k ||
        format == WeightFormat::q5_k) {
        halves.push_back(2);
    }
    if (format == WeightFormat::q6_k) {
        halves = {208};
    }
    const int exponent = format == WeightFormat::q4_k   ? -11
                         : format == WeightFormat::q5_k ? -12
                         : format == WeightFormat::q6_k ? -13
                                                        : -6;
    for (std::size_t b = 0; b < count; ++b) {
        for (const std::size_t offset : halves) {
            std::uint8_t* at = payload.blocks.data() + b * bytes + offset;
            const float magnitude = std::ldexp(1.0F + noise[b * bytes + offset], exponent);
            // q4_k/q5_k's d and dmin are non-negative in ggml's files; q6_k's d takes a sign.
            const bool negative = format == WeightFormat::q6_k && (at[0] & 1U) != 0;
            const std::uint16_t bits =
                detail::float_to_half_bits(negative ? -magnitude : magnitude);
            std::memcpy(at, &bits, sizeof(bits));
        }
    }
    return payload;
}

// quantize_blocks' weight of a format it produces; random valid blocks of a K format.
QuantizedWeight make_weight(WeightFormat format, std::size_t out, std::size_t in,
                            std::uint32_t seed = 11U) {
    if (gguf_format_block_elements(format) != gguf_block_elements) {
        return QuantizedWeight::from_packed_blocks(random_blocks(format, out, in, seed),
                                                   ExecutionBackend::Cpu);
    }
    return QuantizedWeight::quantize_blocks(
        Tensor({out, in}, pseudo_random(out * in, -0.8F, 0.8F, seed)), format);
}

TEST(BlockFormats, DequantizeEqualsTheLayoutOracleBitForBit) {
    for (const WeightFormat format : all_block_formats) {
        SCOPED_TRACE(std::string(weight_format_name(format)));
        const bool k_format = gguf_format_block_elements(format) == 256;
        const QuantizedWeight weight = make_weight(format, 7, k_format ? 512 : 96);
        const std::vector<double> expected = reference_decode(weight.copy_blocks_to_host());
        const std::vector<float> decoded = weight.dequantize().to_host();
        ASSERT_EQ(decoded.size(), expected.size());
        for (std::size_t i = 0; i < decoded.size(); ++i) {
            ASSERT_EQ(static_cast<double>(decoded[i]), expected[i]) << i;
        }
    }
}

std::vector<std::uint8_t> one_block(WeightFormat format, const std::vector<float>& x) {
    return QuantizedWeight::quantize_blocks(Tensor({1, 32}, x), format)
        .copy_blocks_to_host()
        .blocks;
}

std::uint16_t half_bits_at(const std::vector<std::uint8_t>& bytes, std::size_t offset) {
    return static_cast<std::uint16_t>(bytes[offset] | (bytes[offset + 1] << 8));
}

TEST(BlockFormats, QuantizeFollowsGgmlsReferenceRoundingOnHandComputedBlocks) {
    std::vector<float> x(32);
    for (std::size_t j = 0; j < 32; ++j) {
        x[j] = static_cast<float>(static_cast<int>(j) - 16) / 4.0F;  // -4 .. 3.75
    }
    // q8_0: d = 4/127; q_j = round(x_j·127/4), halves away from zero.
    const std::vector<std::uint8_t> q8 = one_block(WeightFormat::q8_0, x);
    EXPECT_EQ(half_bits_at(q8, 0), detail::float_to_half_bits(4.0F / 127.0F));
    for (std::size_t j = 0; j < 32; ++j) {
        const float id = 1.0F / (4.0F / 127.0F);
        EXPECT_EQ(static_cast<std::int8_t>(q8[2 + j]), static_cast<int>(std::round(x[j] * id)))
            << j;
    }
    EXPECT_EQ(static_cast<std::int8_t>(q8[2]), -127);
    // q4_0: the largest magnitude is -4, so d = -4/-8 = 0.5 and n_j = min(15, trunc(x_j/0.5 +
    // 8.5)): x = -4 -> 0, x = 3.75 -> trunc(16) = 16 -> 15.
    const std::vector<std::uint8_t> q4 = one_block(WeightFormat::q4_0, x);
    EXPECT_EQ(half_bits_at(q4, 0), 0x3800);  // 0.5
    EXPECT_EQ(q4[2] & 15, 0);                // x_0 = -4
    EXPECT_EQ(q4[2 + 15] >> 4, 15);          // x_31 = 3.75
    EXPECT_EQ(q4[2 + 8] & 15, 4);            // x_8 = -2: trunc(-4 + 8.5) = 4
    // q4_1: min -4, max 3.75, d = 7.75/15, m = -4; x_0 -> 0, x_31 -> 15.
    const std::vector<std::uint8_t> q41 = one_block(WeightFormat::q4_1, x);
    EXPECT_EQ(half_bits_at(q41, 0), detail::float_to_half_bits(7.75F / 15.0F));
    EXPECT_EQ(half_bits_at(q41, 2), detail::float_to_half_bits(-4.0F));
    EXPECT_EQ(q41[4] & 15, 0);
    EXPECT_EQ(q41[4 + 15] >> 4, 15);
    // An all-zero block: q8_0 d = +0, q4_0 d = -0 (0/-8 as in ggml), codes 0 / 8 / 0.
    const std::vector<float> zeros(32, 0.0F);
    EXPECT_EQ(half_bits_at(one_block(WeightFormat::q8_0, zeros), 0), 0x0000);
    const std::vector<std::uint8_t> zero4 = one_block(WeightFormat::q4_0, zeros);
    EXPECT_EQ(half_bits_at(zero4, 0), 0x8000);
    EXPECT_EQ(zero4[2], 0x88);
    EXPECT_EQ(half_bits_at(one_block(WeightFormat::q4_1, zeros), 0), 0x0000);
    // q5_0: the largest magnitude is -4, so d = -4/-16 = 0.25 and q_j = min(31, trunc(x_j/0.25
    // + 16.5)) = j: the low nibbles in qs, bit 4 of q_j (j >= 16) at bit j of qh.
    const std::vector<std::uint8_t> q5 = one_block(WeightFormat::q5_0, x);
    EXPECT_EQ(half_bits_at(q5, 0), 0x3400);  // 0.25
    std::uint32_t qh = 0;
    std::memcpy(&qh, q5.data() + 2, sizeof(qh));
    EXPECT_EQ(qh, 0xFFFF0000U);
    for (std::size_t j = 0; j < 16; ++j) {
        EXPECT_EQ(q5[6 + j], j | (j << 4U)) << j;  // q_j = j and q_{j+16} = j + 16
    }
    // f16 and bf16: each value rounded to the nearest, ties to even.
    std::vector<float> thirds(32, 1.0F / 3.0F);
    thirds[1] = 1.0F + std::ldexp(1.0F, -8);         // bf16 tie between 1 and 1 + 2^-7: to 1
    thirds[2] = 1.0F + 3.0F * std::ldexp(1.0F, -8);  // the other tie: up to 1 + 2^-6 (even)
    const std::vector<std::uint8_t> f16 = one_block(WeightFormat::f16, thirds);
    EXPECT_EQ(half_bits_at(f16, 0), 0x3555);
    const std::vector<std::uint8_t> bf16 = one_block(WeightFormat::bf16, thirds);
    EXPECT_EQ(half_bits_at(bf16, 0), 0x3EAB);  // 0x3EAAAAAB rounded up
    EXPECT_EQ(half_bits_at(bf16, 2), 0x3F80);
    EXPECT_EQ(half_bits_at(bf16, 4), 0x3F82);
    const std::vector<std::uint8_t> zero5 = one_block(WeightFormat::q5_0, zeros);
    EXPECT_EQ(half_bits_at(zero5, 0), 0x8000);  // -0, as q4_0
    EXPECT_EQ(zero5[6], 0x00);                  // q = 16: nibble 0 with its fifth bit set
    std::memcpy(&qh, zero5.data() + 2, sizeof(qh));
    EXPECT_EQ(qh, 0xFFFFFFFFU);
}

TEST(BlockFormats, QuantizationErrorStaysWithinHalfAStep) {
    for (const WeightFormat format : block_formats) {
        SCOPED_TRACE(std::string(weight_format_name(format)));
        const std::vector<float> x = pseudo_random(64 * 128, -3.0F, 3.0F, 7U);
        const QuantizedWeight weight =
            QuantizedWeight::quantize_blocks(Tensor({64, 128}, x), format);
        const std::vector<float> decoded = weight.dequantize().to_host();
        const PackedBlockPayload blocks = weight.copy_blocks_to_host();
        for (std::size_t i = 0; i < x.size(); ++i) {
            if (format == WeightFormat::f16 || format == WeightFormat::bf16) {
                // Half a unit in the last place: 2^-11 (f16) or 2^-8 (bf16) of |x| at most.
                const double unit =
                    format == WeightFormat::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
                ASSERT_LE(std::fabs(static_cast<double>(decoded[i]) - x[i]),
                          unit * std::fabs(x[i]) + 1e-30)
                    << i;
                continue;
            }
            const std::uint8_t* block = blocks.blocks.data() + (i / 32) * gguf_block_bytes(format);
            const double d =
                std::fabs(half_value(static_cast<std::uint16_t>(block[0] | (block[1] << 8))));
            // Rounding to a step of d (q4_0, q5_0: a whole step where the code above the
            // largest magnitude's opposite side is clamped), plus d's own binary16 rounding
            // over up to 16 (q4), 32 (q5) or 127 (q8) steps.
            const double steps = format == WeightFormat::q8_0   ? 127.0
                                 : format == WeightFormat::q5_0 ? 32.0
                                                                : 16.0;
            const double rounding =
                format == WeightFormat::q4_0 || format == WeightFormat::q5_0 ? 1.0 : 0.5;
            const double bound = rounding * d + steps * d * std::ldexp(1.0, -11) + 1e-6;
            ASSERT_LE(std::fabs(static_cast<double>(decoded[i]) - x[i]), bound) << i;
        }
    }
}

struct ProductCase {
    std::size_t rows;
    std::size_t in;
    std::size_t out;
};

const ProductCase product_cases[] = {
    {1, 32, 1},
    {1, 64, 7},
    {2, 96, 5},
    {3, 576, 33},
    {4, 128, 9},
    {5, 160, 17},
    {8, 4096, 12},
    {9, 192, 70},
    {12, 1536, 150},
    {37, 96, 130},
    {16, 64, 3000},
    {64, 576, 96},
    // widths for the K formats' 256-element blocks (the 32-element formats run them too)
    {1, 256, 3},
    {2, 768, 40},
    {4, 1536, 9},
    {7, 512, 130},
    {37, 256, 70},
    {64, 1536, 96},
};

void check_products(detail::Nf4KernelChoice choice) {
    const KernelChoiceGuard guard(choice);
    for (const WeightFormat format : all_block_formats) {
        for (const ProductCase& c : product_cases) {
            if (c.in % gguf_format_block_elements(format) != 0) {
                continue;
            }
            SCOPED_TRACE(std::string(weight_format_name(format)) +
                         " rows=" + std::to_string(c.rows) + " in=" + std::to_string(c.in) +
                         " out=" + std::to_string(c.out));
            const QuantizedWeight weight = make_weight(format, c.out, c.in);
            const std::vector<double> dense = reference_decode(weight.copy_blocks_to_host());
            const std::vector<float> x = pseudo_random(c.rows * c.in, -1.0F, 1.0F, 21U);
            const Tensor y = tensor_ops::quantized_linear(Tensor({c.rows, c.in}, x), weight);
            ASSERT_EQ(y.shape(), (Shape{c.rows, c.out}));
            EXPECT_TRUE(close_form_b(y.to_host(), testing::reference_forward(dense, c.out, c.in, x),
                                     tolerance));
            const std::vector<float> g = pseudo_random(c.rows * c.out, -1.0F, 1.0F, 31U);
            const Tensor dx =
                tensor_ops::quantized_linear_input_backward(Tensor({c.rows, c.out}, g), weight);
            ASSERT_EQ(dx.shape(), (Shape{c.rows, c.in}));
            EXPECT_TRUE(close_form_b(
                dx.to_host(), testing::reference_input_backward(dense, c.out, c.in, g), tolerance));
        }
    }
}

bool block_set_supported(detail::Nf4KernelChoice choice) {
    switch (choice) {
        case detail::Nf4KernelChoice::Avx512:
            return detail::avx512_block_kernels() != nullptr;
        case detail::Nf4KernelChoice::Avx2:
            return detail::avx2_block_kernels() != nullptr;
        default:
            return true;
    }
}

TEST(BlockFormats, ProductsMatchTheDecodedOracleOnTheDefaultKernels) {
    check_products(detail::Nf4KernelChoice::Automatic);
}

TEST(BlockFormats, ProductsMatchTheDecodedOracleOnTheAvx512Kernels) {
    if (!block_set_supported(detail::Nf4KernelChoice::Avx512)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX-512 block kernels";
    }
    check_products(detail::Nf4KernelChoice::Avx512);
}

TEST(BlockFormats, ProductsMatchTheDecodedOracleOnTheAvx2Kernels) {
    if (!block_set_supported(detail::Nf4KernelChoice::Avx2)) {
        GTEST_SKIP() << "this CPU (or build) has no AVX2 + FMA + F16C block kernels";
    }
    check_products(detail::Nf4KernelChoice::Avx2);
}

TEST(BlockFormats, ProductsMatchTheDecodedOracleOnThePortableKernels) {
    check_products(detail::Nf4KernelChoice::Portable);
}

TEST(BlockFormats, DecodeRangeOfEveryKernelSetEqualsTheOracleBitForBit) {
    for (const auto choice : {detail::Nf4KernelChoice::Avx512, detail::Nf4KernelChoice::Avx2,
                              detail::Nf4KernelChoice::Portable}) {
        if (!block_set_supported(choice)) {
            continue;
        }
        const detail::BlockKernelSet& set = detail::block_kernel_set_for(choice);
        for (const WeightFormat format : all_block_formats) {
            const bool k_format = gguf_format_block_elements(format) == 256;
            const QuantizedWeight weight = make_weight(format, 5, k_format ? 512 : 96);
            const PackedBlockPayload payload = weight.copy_blocks_to_host();
            const std::vector<double> dense = reference_decode(payload);
            const detail::BlockView view = detail::view_of(payload);
            for (const std::size_t begin :
                 {0UL, 1UL, 16UL, 31UL, 32UL, 95UL, 96UL, 200UL, 255UL, 480UL, 512UL, 1000UL}) {
                for (const std::size_t count : {1UL, 15UL, 32UL, 33UL, 64UL, 150UL}) {
                    if (begin + count > dense.size()) {
                        continue;
                    }
                    std::vector<float> decoded(count);
                    set.decode_range(view, begin, count, decoded.data());
                    for (std::size_t j = 0; j < count; ++j) {
                        ASSERT_EQ(static_cast<double>(decoded[j]), dense[begin + j])
                            << set.name << " " << weight_format_name(format) << " begin " << begin
                            << " element " << j;
                    }
                }
            }
        }
    }
}

TEST(BlockFormats, LayoutsAgreeWithTheGgufReadersTypeTable) {
    // Two tables of the same facts, written apart: ours (quantized_weight.hpp) and the GGUF
    // reader's (ggml_type_layout), which the loader relies on agreeing.
    const std::pair<GgmlType, WeightFormat> pairs[] = {
        {GgmlType::Q8_0, WeightFormat::q8_0}, {GgmlType::Q4_0, WeightFormat::q4_0},
        {GgmlType::Q4_1, WeightFormat::q4_1}, {GgmlType::Q5_0, WeightFormat::q5_0},
        {GgmlType::Q4_K, WeightFormat::q4_k}, {GgmlType::Q5_K, WeightFormat::q5_k},
        {GgmlType::Q6_K, WeightFormat::q6_k}, {GgmlType::F16, WeightFormat::f16},
        {GgmlType::BF16, WeightFormat::bf16}};
    for (const auto& [type, format] : pairs) {
        SCOPED_TRACE(std::string(weight_format_name(format)));
        const std::optional<GgmlTypeLayout> layout = ggml_type_layout(type);
        ASSERT_TRUE(layout.has_value());
        // F16/BF16 rows are any width in a file; ours group them 32 to a block of 64 bytes.
        const std::size_t group = gguf_format_block_elements(format) / layout->block_elements;
        EXPECT_EQ(layout->block_elements * group, gguf_format_block_elements(format));
        EXPECT_EQ(layout->block_bytes * group, gguf_block_bytes(format));
    }
}

TEST(BlockFormats, ReportsTheKernelAndFormatThatRun) {
    const char* best = detail::avx512_block_kernels() != nullptr ? "avx512"
                       : detail::avx2_block_kernels() != nullptr ? "avx2"
                                                                 : "portable";
    EXPECT_STREQ(detail::block_kernel_set_for(detail::Nf4KernelChoice::Automatic).name, best);
    const KernelChoiceGuard guard(detail::Nf4KernelChoice::Portable);
    detail::PackedLayout layout{1536, 576, 32, false, 0, WeightFormat::q4_1};
    EXPECT_EQ(detail::block_kernel_description(layout, 1, false),
              "portable q4_1 direct row-split gemv on packed codes");
    EXPECT_EQ(
        detail::block_kernel_description(layout, 64, false).rfind("portable q4_1 row-panel", 0),
        0U);
}

TEST(BlockFormats, AutogradGivesTheInputGradientAndNoWeightGradient) {
    const QuantizedWeight weight = make_weight(WeightFormat::q4_0, 6, 64);
    const std::vector<double> dense = reference_decode(weight.copy_blocks_to_host());
    const std::vector<float> x = pseudo_random(3 * 64, -1.0F, 1.0F, 4U);
    const Variable input(Tensor({3, 64}, x));
    Variable y = quantized_linear(input, weight);
    ASSERT_NE(y.node(), nullptr);
    EXPECT_EQ(y.node()->parents.size(), 1U);  // the input only: the weight is never a leaf
    const std::vector<float> seed = pseudo_random(3 * 6, -1.0F, 1.0F, 9U);
    y.backward(Tensor({3, 6}, seed));
    EXPECT_TRUE(close_form_b(input.gradient().to_host(),
                             testing::reference_input_backward(dense, 6, 64, seed), tolerance));
}

TEST(BlockFormats, AccountsEveryByteAndKeepsTheBlocksExactly) {
    const QuantizedWeight q8 = make_weight(WeightFormat::q8_0, 10, 64);
    const QuantizedMemoryUsage usage = q8.memory_usage();
    EXPECT_EQ(q8.format(), WeightFormat::q8_0);
    EXPECT_EQ(q8.block_size(), 32U);
    EXPECT_EQ(q8.block_count(), 20U);
    EXPECT_EQ(usage.packed_code_bytes, 640U);
    EXPECT_EQ(usage.half_scale_bytes, 40U);
    EXPECT_EQ(usage.scale_bytes, 40U);
    EXPECT_EQ(usage.logical_payload_bytes, 680U);
    EXPECT_EQ(usage.resident_payload_bytes, 680U);  // nothing but the blocks
    EXPECT_EQ(usage.fp32_equivalent_bytes, 2560U);
    EXPECT_EQ(usage.block_format_weight_count, 1U);
    const QuantizedMemoryUsage q41 = make_weight(WeightFormat::q4_1, 10, 64).memory_usage();
    EXPECT_EQ(q41.packed_code_bytes, 320U);
    EXPECT_EQ(q41.half_scale_bytes, 80U);
    EXPECT_EQ(q41.resident_payload_bytes, 400U);
    // A K format: 256-element blocks, d + dmin + 12 sub-block scale bytes per block.
    const QuantizedWeight q4k = make_weight(WeightFormat::q4_k, 3, 512);
    EXPECT_EQ(q4k.block_size(), 256U);
    EXPECT_EQ(q4k.block_count(), 6U);
    const QuantizedMemoryUsage k_usage = q4k.memory_usage();
    EXPECT_EQ(k_usage.packed_code_bytes, 6U * 128U);
    EXPECT_EQ(k_usage.half_scale_bytes, 6U * 16U);
    EXPECT_EQ(k_usage.resident_payload_bytes, 6U * 144U);
    EXPECT_EQ(make_weight(WeightFormat::q6_k, 1, 256).memory_usage().scale_bytes, 18U);
    EXPECT_EQ(make_weight(WeightFormat::q5_0, 1, 64).memory_usage().packed_code_bytes, 40U);
    const QuantizedMemoryUsage half = make_weight(WeightFormat::bf16, 3, 64).memory_usage();
    EXPECT_EQ(half.packed_code_bytes, 3U * 64U * 2U);  // two bytes a value, no scales
    EXPECT_EQ(half.scale_bytes, 0U);

    PackedBlockPayload payload = q8.copy_blocks_to_host();
    const QuantizedWeight copy =
        QuantizedWeight::from_packed_blocks(payload, ExecutionBackend::Cpu);
    EXPECT_EQ(copy.copy_blocks_to_host().blocks, payload.blocks);
    EXPECT_EQ(q8.to(ExecutionBackend::Cpu).copy_blocks_to_host().blocks, payload.blocks);
    EXPECT_THROW(
        {
            try {
                static_cast<void>(q8.copy_payload_to_host());
            } catch (const std::logic_error& error) {
                EXPECT_NE(std::string(error.what()).find("q8_0, not nf4"), std::string::npos);
                throw;
            }
        },
        std::logic_error);
    const QuantizedWeight nf4 = QuantizedWeight::quantize(Tensor({2, 64}, pseudo_random(128)));
    EXPECT_EQ(nf4.format(), WeightFormat::nf4);
    EXPECT_THROW(static_cast<void>(nf4.copy_blocks_to_host()), std::logic_error);
    EXPECT_EQ(weight_format_name(WeightFormat::q4_1), "q4_1");
    EXPECT_EQ(weight_format_from_name("q8_0"), WeightFormat::q8_0);
    EXPECT_EQ(weight_format_from_name("Q8_0"), std::nullopt);
    for (const WeightFormat format : all_block_formats) {
        EXPECT_EQ(weight_format_from_name(weight_format_name(format)), format);
    }
    EXPECT_EQ(weight_format_name(WeightFormat::q6_k), "q6_k");
}

TEST(BlockFormats, PackedRowLookupDecodesExactlyTheRowsAsked) {
    for (const WeightFormat format : all_block_formats) {
        const std::size_t width = gguf_format_block_elements(format) == 256 ? 512 : 64;
        const QuantizedWeight table = make_weight(format, 9, width);
        const std::vector<float> dense = table.dequantize().to_host();
        const std::vector<std::uint32_t> ids = {4, 0, 8, 4, 2, 7};
        const Tensor rows = tensor_ops::quantized_gather_rows(table, IndexTensor({2, 3}, ids));
        ASSERT_EQ(rows.shape(), (Shape{2, 3, width}));
        const std::vector<float> values = rows.to_host();
        for (std::size_t i = 0; i < ids.size(); ++i) {
            for (std::size_t c = 0; c < width; ++c) {
                ASSERT_EQ(values[i * width + c], dense[ids[i] * width + c]) << i << " " << c;
            }
        }
        EXPECT_THROW(static_cast<void>(tensor_ops::quantized_gather_rows(
                         table, IndexTensor({1}, std::vector<std::uint32_t>{9}))),
                     std::out_of_range);
    }
    // NF4 tables too (legacy scales; blocks spanning rows).
    const QuantizedWeight nf4 =
        QuantizedWeight::quantize(Tensor({5, 48}, pseudo_random(240)), Nf4Options{64, false, 0});
    const std::vector<float> dense = nf4.dequantize().to_host();
    const std::vector<float> row =
        tensor_ops::quantized_gather_rows(nf4, IndexTensor({1}, std::vector<std::uint32_t>{3}))
            .to_host();
    EXPECT_EQ(row, std::vector<float>(dense.begin() + 3 * 48, dense.begin() + 4 * 48));
}

template <typename Error>
void expect_error(const std::function<void()>& action, const std::string& fragment) {
    try {
        action();
        ADD_FAILURE() << "no error; expected one naming: " << fragment;
    } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
}

TEST(BlockFormats, RefusesBadPayloadsNamingTheFieldAndValue) {
    const PackedBlockPayload good = make_weight(WeightFormat::q4_1, 3, 64).copy_blocks_to_host();
    const auto load = [](PackedBlockPayload payload) {
        return [payload]() mutable {
            static_cast<void>(
                QuantizedWeight::from_packed_blocks(std::move(payload), ExecutionBackend::Cpu));
        };
    };
    PackedBlockPayload shorter = good;
    shorter.blocks.pop_back();
    expect_error<std::invalid_argument>(load(shorter),
                                        "blocks has 119 bytes, expected 120 (6 q4_1 blocks of 20 "
                                        "bytes for [3,64])");
    PackedBlockPayload ragged = good;
    ragged.in_features = 48;
    expect_error<std::invalid_argument>(load(ragged),
                                        "in_features 48 of a q4_1 weight is not a "
                                        "multiple of its 32-element block");
    PackedBlockPayload empty = good;
    empty.out_features = 0;
    expect_error<std::invalid_argument>(load(empty),
                                        "the weight shape [0,64] has a zero dimension");
    PackedBlockPayload nf4 = good;
    nf4.format = WeightFormat::nf4;
    expect_error<std::invalid_argument>(load(nf4), "format nf4 (id 0) is not a GGUF block format");
    PackedBlockPayload unknown = good;
    unknown.format = static_cast<WeightFormat>(10);
    expect_error<std::invalid_argument>(load(unknown), "format unknown (id 10)");
    PackedBlockPayload not_finite = good;
    const std::uint16_t infinity = 0x7C00;
    std::memcpy(not_finite.blocks.data() + 3 * 20 + 2, &infinity, 2);  // block 1 of row 1: m
    expect_error<std::invalid_argument>(
        load(not_finite), "the minimum m of block 1 of row 1 is inf (must be finite)");

    std::vector<float> values = pseudo_random(64);
    values[37] = std::numeric_limits<float>::quiet_NaN();
    expect_error<std::invalid_argument>(
        [&] {
            static_cast<void>(
                QuantizedWeight::quantize_blocks(Tensor({1, 64}, values), WeightFormat::q8_0));
        },
        "weight value at flat index 37 is not finite (nan)");
    std::vector<float> huge(64, 1.0F);
    huge[40] = 1e7F;  // q8_0: d = 1e7/127 > 65504
    expect_error<std::overflow_error>(
        [&] {
            static_cast<void>(
                QuantizedWeight::quantize_blocks(Tensor({1, 64}, huge), WeightFormat::q8_0));
        },
        "block 1 (flat indices from 32) needs a scale beyond binary16's range");
    expect_error<std::invalid_argument>(
        [&] {
            static_cast<void>(QuantizedWeight::quantize_blocks(
                Tensor({2, 2, 32}, pseudo_random(128)), WeightFormat::q4_0));
        },
        "weight must be rank 2");
    expect_error<std::invalid_argument>(
        [&] {
            static_cast<void>(QuantizedWeight::quantize_blocks(Tensor({2, 40}, pseudo_random(80)),
                                                               WeightFormat::q4_0));
        },
        "in_features 40 of a q4_0 weight");
    // The K formats: 256-element blocks, their own scale offsets, and no quantizer here.
    PackedBlockPayload k_ragged = random_blocks(WeightFormat::q4_k, 2, 256, 3U);
    k_ragged.in_features = 576;
    k_ragged.out_features = 1;
    expect_error<std::invalid_argument>(
        load(k_ragged),
        "in_features 576 of a q4_k weight is not a multiple of its 256-element block");
    PackedBlockPayload k_short = random_blocks(WeightFormat::q5_k, 2, 256, 3U);
    k_short.blocks.resize(351);
    expect_error<std::invalid_argument>(
        load(k_short),
        "blocks has 351 bytes, expected 352 (2 q5_k blocks of 176 bytes for [2,256])");
    PackedBlockPayload q6_nan = random_blocks(WeightFormat::q6_k, 2, 512, 3U);
    const std::uint16_t nan = 0x7E00;
    std::memcpy(q6_nan.blocks.data() + 3 * 210 + 208, &nan, 2);  // block 1 of row 1: d
    expect_error<std::invalid_argument>(load(q6_nan),
                                        "the scale d of block 1 of row 1 is nan (must be finite)");
    PackedBlockPayload q4k_inf = random_blocks(WeightFormat::q4_k, 1, 256, 3U);
    std::memcpy(q4k_inf.blocks.data() + 2, &infinity, 2);
    expect_error<std::invalid_argument>(
        load(q4k_inf), "the minimum scale dmin of block 0 of row 0 is inf (must be finite)");
    PackedBlockPayload q5_inf = make_weight(WeightFormat::q5_0, 1, 64).copy_blocks_to_host();
    std::memcpy(q5_inf.blocks.data() + 22, &infinity, 2);
    expect_error<std::invalid_argument>(load(q5_inf),
                                        "the scale d of block 1 of row 0 is inf (must be finite)");
    std::vector<float> large(64, 1.0F);
    large[45] = 70000.0F;  // beyond binary16's 65504
    expect_error<std::overflow_error>(
        [&] {
            static_cast<void>(
                QuantizedWeight::quantize_blocks(Tensor({1, 64}, large), WeightFormat::f16));
        },
        "weight value at flat index 45 (70000) is beyond f16's range");
    large[45] = 3.4e38F;  // rounds up past bfloat16's largest finite value
    expect_error<std::overflow_error>(
        [&] {
            static_cast<void>(
                QuantizedWeight::quantize_blocks(Tensor({1, 64}, large), WeightFormat::bf16));
        },
        "weight value at flat index 45");
    for (const WeightFormat format : {WeightFormat::q4_k, WeightFormat::q5_k, WeightFormat::q6_k}) {
        expect_error<std::invalid_argument>(
            [&] {
                static_cast<void>(
                    QuantizedWeight::quantize_blocks(Tensor({1, 256}, pseudo_random(256)), format));
            },
            "format " + std::string(weight_format_name(format)) +
                " cannot be produced here: K-format weights come from GGUF files");
    }
}

}  // namespace
}  // namespace riftco_transformer
