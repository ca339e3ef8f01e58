// RoPE's one-pass form (tensor_ops::rotary_embedding, the CPU's fused kernel) against the
// graph apply_rotary_embedding records for training, and both against hand values and a
// double-precision rotation. The fused pass runs wherever nothing is differentiated
// (decoding, evaluation), the graph when x needs a gradient: the two must give the same bits,
// or a decode session would drift from the full forward.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/nn/rotary_embedding.hpp"

namespace riftco_transformer {
namespace {

std::vector<float> random_values(std::size_t count, unsigned seed) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> value(-3.0F, 3.0F);
    std::vector<float> values(count);
    for (float& v : values)
        v = value(generator);
    return values;
}

TEST(RotaryEmbedding, HandValuesOfOnePair) {
    // d = 2: (x0, x1) -> (x0·c − x1·s, x1·c + x0·s), rotated by position·θ^0 = position.
    const std::vector<std::size_t> positions = {0, 1};
    const RotaryTables tables = rotary_tables(positions, 2, 10000.0, ExecutionBackend::Cpu);
    const Tensor x({2, 1, 1, 2}, std::vector<float>{1.0F, 2.0F, 1.0F, 2.0F});
    const std::vector<float> out =
        tensor_ops::rotary_embedding(x, tables.cosine, tables.sine, 0).to_host();
    const float c = std::cos(1.0F);
    const float s = std::sin(1.0F);
    EXPECT_EQ(out[0], 1.0F);  // position 0: identity
    EXPECT_EQ(out[1], 2.0F);
    EXPECT_NEAR(out[2], c - 2.0F * s, 1e-6);
    EXPECT_NEAR(out[3], 2.0F * c + s, 1e-6);
}

TEST(RotaryEmbedding, TheFusedPassEqualsTheRecordedGraphBitForBitInBothForms) {
    const std::size_t heads = 3;
    const std::size_t d = 10;  // h = 5: no vector width divides it
    // Sequence form: x [B,H,T,d] with tables [T,d/2].
    {
        const std::size_t batch = 2;
        const std::size_t time = 7;
        std::vector<std::size_t> positions(time);
        for (std::size_t t = 0; t < time; ++t)
            positions[t] = 3 * t + 1;
        const RotaryTables tables = rotary_tables(positions, d, 500.0, ExecutionBackend::Cpu);
        const Shape shape{batch, heads, time, d};
        const std::vector<float> values = random_values(batch * heads * time * d, 1);
        const Variable graph_input(Tensor(shape, values), true);
        const Variable recorded = apply_rotary_embedding(graph_input, tables);
        EXPECT_TRUE(recorded.requires_gradient());  // the graph path ran
        const Variable constant(Tensor(shape, values), false);
        const Variable fused = apply_rotary_embedding(constant, tables);
        EXPECT_EQ(fused.value().to_host(), recorded.value().to_host());
        // And the double-precision rotation.
        const std::vector<float> got = fused.value().to_host();
        for (std::size_t b = 0; b < batch; ++b)
            for (std::size_t h = 0; h < heads; ++h)
                for (std::size_t t = 0; t < time; ++t)
                    for (std::size_t i = 0; i < d / 2; ++i) {
                        const std::size_t row = ((b * heads + h) * time + t) * d;
                        const double angle =
                            static_cast<double>(positions[t]) *
                            std::pow(500.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
                        const double first = values[row + i];
                        const double second = values[row + i + d / 2];
                        EXPECT_NEAR(got[row + i],
                                    first * std::cos(angle) - second * std::sin(angle), 2e-5);
                        EXPECT_NEAR(got[row + i + d / 2],
                                    second * std::cos(angle) + first * std::sin(angle), 2e-5);
                    }
    }
    // Row form (decoding): x [R,H,1,d] with one table row per row.
    {
        const std::vector<std::size_t> positions = {5, 0, 17};
        const RotaryTables tables = rotary_tables(positions, d, 10000.0, ExecutionBackend::Cpu);
        const Shape shape{positions.size(), heads, 1, d};
        const std::vector<float> values = random_values(positions.size() * heads * d, 2);
        const Variable recorded =
            apply_rotary_embedding(Variable(Tensor(shape, values), true), tables);
        Variable fused;
        {
            const NoGradientGuard no_graph;
            fused = apply_rotary_embedding(Variable(Tensor(shape, values), true), tables);
        }
        EXPECT_FALSE(fused.requires_gradient());
        EXPECT_EQ(fused.value().to_host(), recorded.value().to_host());
    }
}

TEST(RotaryEmbedding, ShapesThatDoNotFitAreNamed) {
    const std::vector<std::size_t> positions = {0, 1};
    const RotaryTables tables = rotary_tables(positions, 4, 100.0, ExecutionBackend::Cpu);
    const auto expect_rejected = [&](const Tensor& x, std::size_t axis) {
        try {
            (void)tensor_ops::rotary_embedding(x, tables.cosine, tables.sine, axis);
            ADD_FAILURE() << "accepted x " << shape_to_string(x.shape()) << " axis " << axis;
        } catch (const std::invalid_argument& error) {
            const std::string what = error.what();
            EXPECT_NE(what.find("rotary_embedding: x " + shape_to_string(x.shape())),
                      std::string::npos)
                << what;
            EXPECT_NE(what.find("tables [2,2]"), std::string::npos) << what;
        }
    };
    expect_rejected(Tensor::zeros({2, 1, 1, 6}), 0);  // d/2 != 2
    expect_rejected(Tensor::zeros({3, 1, 1, 4}), 0);  // 3 rows, tables of 2
    expect_rejected(Tensor::zeros({2, 1, 1, 4}), 3);  // the table axis is the last one
    expect_rejected(Tensor::zeros({4}), 0);           // rank 1
    EXPECT_THROW((void)tensor_ops::rotary_embedding(Tensor::zeros({2, 4}), tables.cosine,
                                                    tables.cosine.reshape({4}), 0),
                 std::invalid_argument);
}

}  // namespace
}  // namespace riftco_transformer
