// GGUF's Q/K row permutation and our split-half RoPE: llama.cpp's converter stores each head's
// query/key rows permuted for the interleaved (adjacent-pair) rotation. Rotating adjacent pairs
// of the stored projection and undoing the permutation (unpermute_rotary_rows) must give what
// the split-half rotation gives on the original rows: the two formulations are one.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "riftco_transformer/interchange/llama_gguf.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {
namespace {

constexpr std::size_t heads = 3;
constexpr std::size_t head_width = 8;
constexpr std::size_t columns = 5;
constexpr double theta = 10000.0;

// The converter's permutation, written from its definition: for each head, rows reshaped
// [2, d/2] and transposed to [d/2, 2] (stored row h·d + 2i + s is original row h·d + s·d/2 + i).
std::vector<float> permute_like_the_converter(const std::vector<float>& original) {
    std::vector<float> stored(original.size());
    for (std::size_t h = 0; h < heads; ++h) {
        for (std::size_t i = 0; i < head_width / 2; ++i) {
            for (std::size_t s = 0; s < 2; ++s) {
                const std::size_t from = h * head_width + s * (head_width / 2) + i;
                const std::size_t to = h * head_width + 2 * i + s;
                for (std::size_t c = 0; c < columns; ++c)
                    stored[to * columns + c] = original[from * columns + c];
            }
        }
    }
    return stored;
}

std::vector<double> project(const std::vector<float>& weight, const std::vector<float>& x) {
    std::vector<double> y(weight.size() / columns, 0.0);
    for (std::size_t r = 0; r < y.size(); ++r) {
        for (std::size_t c = 0; c < columns; ++c)
            y[r] += static_cast<double>(weight[r * columns + c]) * x[c];
    }
    return y;
}

}  // namespace

TEST(LlamaGgufRotary, InterleavedRotationOfStoredRowsEqualsSplitHalfRotationOfOriginalRows) {
    std::mt19937 generator(3);
    std::uniform_real_distribution<float> value(-1.0F, 1.0F);
    std::vector<float> original(heads * head_width * columns);
    for (float& w : original)
        w = value(generator);
    std::vector<float> x(columns);
    for (float& v : x)
        v = value(generator);
    const std::vector<float> stored = permute_like_the_converter(original);
    EXPECT_EQ(unpermute_rotary_rows(stored, heads, columns), original);

    for (const std::size_t position : {std::size_t{0}, std::size_t{1}, std::size_t{37}}) {
        // llama.cpp's form: rotate adjacent pairs (2i, 2i+1) of the stored projection.
        std::vector<double> interleaved = project(stored, x);
        for (std::size_t h = 0; h < heads; ++h) {
            for (std::size_t i = 0; i < head_width / 2; ++i) {
                const double angle = static_cast<double>(position) *
                                     std::pow(theta, -2.0 * static_cast<double>(i) / head_width);
                const double c = static_cast<float>(std::cos(angle));
                const double s = static_cast<float>(std::sin(angle));
                double& a = interleaved[h * head_width + 2 * i];
                double& b = interleaved[h * head_width + 2 * i + 1];
                const double first = a * c - b * s;
                b = b * c + a * s;
                a = first;
            }
        }
        // Ours: split-half RoPE (the library's) of the projection by the original rows.
        const std::vector<double> projected = project(original, x);
        const std::vector<float> as_float(projected.begin(), projected.end());
        const std::vector<std::size_t> positions = {position};
        const RotaryTables tables =
            rotary_tables(positions, head_width, theta, ExecutionBackend::Cpu);
        const Variable rotated = apply_rotary_embedding(
            Variable(Tensor({1, heads, 1, head_width}, as_float), false), tables);
        const std::vector<float> ours = rotated.value().to_host();
        // Undo the permutation on the interleaved result and compare row by row.
        const std::vector<float> interleaved_float(interleaved.begin(), interleaved.end());
        const std::vector<float> back = unpermute_rotary_rows(interleaved_float, heads, 1);
        for (std::size_t i = 0; i < ours.size(); ++i)
            EXPECT_NEAR(ours[i], back[i], 1e-5) << "position " << position << " row " << i;
    }
}

TEST(LlamaGgufRotary, UnpermuteRejectsRowsThatAreNotWholeEvenHeads) {
    const std::vector<float> values(3 * 5);
    EXPECT_THROW((void)unpermute_rotary_rows(values, 3, 5), std::invalid_argument);  // d = 1
    EXPECT_THROW((void)unpermute_rotary_rows(values, 2, 5), std::invalid_argument);
    EXPECT_THROW((void)unpermute_rotary_rows(values, 0, 5), std::invalid_argument);
}

}  // namespace riftco_transformer
