// CUDA softmax, normalization, loss and indexing capabilities against the CPU reference:
// softmax over every axis and causal softmax, forward and VJP; LayerNorm and RMSNorm forward
// and backward with the parameter gradients; the fused cross-entropy with its time window and
// mask; all within form B of docs/ARCHITECTURE.md, 'Numeric parity' (3e-4), on odd sizes, single
// rows and rows longer than a block. gather_rows and the deterministic scatter-add (repeated ids
// summed in index order) are bit-identical to the reference. The deferred value checks (softmax
// slices, non-finite target logits, a non-finite mean loss, ids out of range) are not raised by the
// call but at the next sync point, with the CPU's category and message. Skipped without a device
// (failed under RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/adapter.hpp"
#include "core/tensor/tensor_access.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/core/tensor_ops/loss.hpp"
#include "riftco_transformer/core/tensor_ops/normalization.hpp"
#include "riftco_transformer/core/tensor_ops/softmax.hpp"
#include "support/cuda_support.hpp"

namespace riftco_transformer {
namespace {

using test::matches_reference;
using test::uniform_values;

constexpr ExecutionBackend cuda = ExecutionBackend::Cuda;
constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr double nn_tolerance = 3e-4;  // form B of docs/ARCHITECTURE.md, 'Numeric parity'
constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

std::size_t count_of(const Shape& shape) {
    std::size_t count = 1;
    for (const std::size_t extent : shape) {
        count *= extent;
    }
    return count;
}

template <typename Error, typename Operation>
std::string message_of(Operation&& operation) {
    try {
        operation();
    } catch (const Error& error) {
        return error.what();
    }
    return {};
}

::testing::AssertionResult bit_identical(const Tensor& device, const Tensor& reference) {
    if (device.shape() != reference.shape()) {
        return ::testing::AssertionFailure() << "shapes differ";
    }
    const std::vector<float> d = device.to_host();
    const std::vector<float> r = reference.to_host();
    if (std::memcmp(d.data(), r.data(), d.size() * sizeof(float)) != 0) {
        return ::testing::AssertionFailure() << "values differ";
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult close(const Tensor& device, const Tensor& reference) {
    if (device.shape() != reference.shape()) {
        return ::testing::AssertionFailure() << "shapes differ";
    }
    return matches_reference(device.to_host(), reference.to_host(), nn_tolerance);
}

class CudaRowOperations : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_CUDA_DEVICE(); }

    // The same values on both backends.
    static std::pair<Tensor, Tensor> pair_of(const Shape& shape, unsigned seed, float low = -3.0F,
                                             float high = 3.0F) {
        return pair_from(shape, uniform_values(count_of(shape), low, high, seed));
    }
    static std::pair<Tensor, Tensor> pair_from(const Shape& shape,
                                               const std::vector<float>& values) {
        return {Tensor(shape, values, cpu), Tensor(shape, values, cuda)};
    }
};

// ---- softmax ---------------------------------------------------------------------------------

TEST_F(CudaRowOperations, SoftmaxAndItsVjpMatchTheReferenceOnEveryAxis) {
    const std::vector<Shape> shapes = {{1},       {1, 1},    {3, 7},    {5, 33},
                                       {2, 1000}, {3, 2049}, {4, 5, 6}, {2, 3, 257}};
    unsigned seed = 100;
    for (const Shape& shape : shapes) {
        std::vector<float> values = uniform_values(count_of(shape), -6.0F, 6.0F, seed++);
        values[0] = negative_infinity;  // exact zeros, the slice stays valid
        if (values.size() > 1) {
            values[values.size() - 1] = 80.0F;  // a large logit, still stable
        }
        if (count_of(shape) == 1) {
            values[0] = 0.5F;
        }
        const auto [x_cpu, x] = pair_from(shape, values);
        const auto [g_cpu, g] = pair_of(shape, seed++);
        for (std::size_t axis = 0; axis < shape.size(); ++axis) {
            SCOPED_TRACE(::testing::Message()
                         << "shape " << shape_to_string(shape) << " axis " << axis);
            const Tensor p_cpu = tensor_ops::softmax(x_cpu, axis);
            const Tensor p = tensor_ops::softmax(x, axis);
            EXPECT_TRUE(close(p, p_cpu));
            EXPECT_TRUE(close(tensor_ops::softmax_backward(p, g, axis),
                              tensor_ops::softmax_backward(p_cpu, g_cpu, axis)));
        }
    }
}

TEST_F(CudaRowOperations, CausalSoftmaxAndItsVjpMatchTheReference) {
    const std::vector<Shape> shapes = {
        {1, 1, 1, 1}, {2, 3, 7, 7}, {1, 2, 33, 33}, {1, 1, 300, 300}};
    unsigned seed = 200;
    for (const Shape& shape : shapes) {
        for (const float scale : {1.0F, 0.37F}) {
            SCOPED_TRACE(::testing::Message()
                         << "shape " << shape_to_string(shape) << " scale " << scale);
            const auto [s_cpu, s] = pair_of(shape, seed++, -8.0F, 8.0F);
            const auto [g_cpu, g] = pair_of(shape, seed++);
            const Tensor p_cpu = tensor_ops::causal_softmax(s_cpu, scale);
            const Tensor p = tensor_ops::causal_softmax(s, scale);
            EXPECT_TRUE(close(p, p_cpu));
            const Tensor dx = tensor_ops::causal_softmax_backward(p, g, scale);
            EXPECT_TRUE(close(dx, tensor_ops::causal_softmax_backward(p_cpu, g_cpu, scale)));
            // Keys after the query: exactly 0 in both directions.
            const std::size_t t_count = shape[3];
            const std::vector<float> probabilities = p.to_host();
            const std::vector<float> gradient = dx.to_host();
            for (std::size_t i = 0; i < probabilities.size(); ++i) {
                const std::size_t query = i / t_count % t_count;
                if (i % t_count > query) {
                    ASSERT_EQ(probabilities[i], 0.0F) << i;
                    ASSERT_EQ(gradient[i], 0.0F) << i;
                }
            }
        }
    }
}

TEST_F(CudaRowOperations, RejectedSoftmaxSlicesAreRaisedAtTheSyncPointWithTheCpuMessage) {
    std::vector<float> values = uniform_values(4 * 9, -1.0F, 1.0F, 300);
    values[2 * 9 + 4] = std::numeric_limits<float>::quiet_NaN();  // slice 2
    for (std::size_t j = 0; j < 9; ++j) {
        values[3 * 9 + j] = negative_infinity;  // slice 3: no finite value
    }
    const std::string expected = message_of<std::domain_error>([&] {
        static_cast<void>(tensor_ops::softmax(Tensor({4, 9}, values, cpu), 1));
    });
    ASSERT_FALSE(expected.empty());
    Tensor p;
    EXPECT_NO_THROW(p = tensor_ops::softmax(Tensor({4, 9}, values, cuda), 1));
    EXPECT_EQ(message_of<std::domain_error>([&] { static_cast<void>(p.to_host()); }), expected);

    // Causal: query 1 of head 0 sees keys 0 and 1 only, both -inf.
    std::vector<float> scores = uniform_values(2 * 5 * 5, -1.0F, 1.0F, 301);
    scores[5 + 0] = negative_infinity;
    scores[5 + 1] = negative_infinity;
    scores[2 * 5 * 5 - 1] = std::numeric_limits<float>::infinity();  // slice 9, later
    const std::string causal_expected = message_of<std::domain_error>([&] {
        static_cast<void>(tensor_ops::causal_softmax(Tensor({1, 2, 5, 5}, scores, cpu), 0.5F));
    });
    ASSERT_FALSE(causal_expected.empty());
    Tensor causal;
    EXPECT_NO_THROW(causal = tensor_ops::causal_softmax(Tensor({1, 2, 5, 5}, scores, cuda), 0.5F));
    EXPECT_EQ(message_of<std::domain_error>([&] { static_cast<void>(causal.to_host()); }),
              causal_expected);
    // Raised once: the backend is usable afterwards.
    EXPECT_NO_THROW(static_cast<void>(tensor_ops::softmax(Tensor({2}, 1.0F, cuda), 0).to_host()));
}

// ---- normalization ---------------------------------------------------------------------------

const std::vector<Shape>& normalization_shapes() {
    static const std::vector<Shape> shapes = {{1, 1},    {3, 5},       {7, 129},
                                              {130, 17}, {2, 3, 1000}, {65, 2051}};
    return shapes;
}

TEST_F(CudaRowOperations, LayerNormAndItsGradientsMatchTheReference) {
    unsigned seed = 400;
    for (const Shape& shape : normalization_shapes()) {
        for (const float epsilon : {tensor_ops::default_normalization_epsilon, 1e-3F}) {
            SCOPED_TRACE(::testing::Message()
                         << "shape " << shape_to_string(shape) << " eps " << epsilon);
            const Shape parameter_shape{shape.back()};
            // An offset mean: centring must happen in double on both sides.
            const auto [x_cpu, x] = pair_of(shape, seed++, 40.0F, 46.0F);
            const auto [gamma_cpu, gamma] = pair_of(parameter_shape, seed++, 0.5F, 1.5F);
            const auto [beta_cpu, beta] = pair_of(parameter_shape, seed++);
            const auto [g_cpu, g] = pair_of(shape, seed++);
            const auto reference = tensor_ops::layer_norm(x_cpu, gamma_cpu, beta_cpu, epsilon);
            const auto result = tensor_ops::layer_norm(x, gamma, beta, epsilon);
            EXPECT_TRUE(close(result.output, reference.output));
            EXPECT_TRUE(close(result.mean, reference.mean));
            EXPECT_TRUE(close(result.inverse_deviation, reference.inverse_deviation));
            const auto reference_gradients = tensor_ops::layer_norm_backward(
                x_cpu, gamma_cpu, reference.mean, reference.inverse_deviation, g_cpu);
            const auto gradients =
                tensor_ops::layer_norm_backward(x, gamma, result.mean, result.inverse_deviation, g);
            EXPECT_TRUE(close(gradients.input, reference_gradients.input));
            EXPECT_TRUE(close(gradients.scale, reference_gradients.scale));
            EXPECT_TRUE(close(gradients.bias, reference_gradients.bias));
        }
    }
}

TEST_F(CudaRowOperations, RmsNormAndItsGradientsMatchTheReference) {
    unsigned seed = 500;
    for (const Shape& shape : normalization_shapes()) {
        for (const float epsilon : {tensor_ops::default_normalization_epsilon, 1e-2F}) {
            SCOPED_TRACE(::testing::Message()
                         << "shape " << shape_to_string(shape) << " eps " << epsilon);
            const Shape parameter_shape{shape.back()};
            const auto [x_cpu, x] = pair_of(shape, seed++);
            const auto [gamma_cpu, gamma] = pair_of(parameter_shape, seed++, 0.5F, 1.5F);
            const auto [g_cpu, g] = pair_of(shape, seed++);
            const auto reference = tensor_ops::rms_norm(x_cpu, gamma_cpu, epsilon);
            const auto result = tensor_ops::rms_norm(x, gamma, epsilon);
            EXPECT_TRUE(close(result.output, reference.output));
            EXPECT_TRUE(close(result.inverse_rms, reference.inverse_rms));
            const auto reference_gradients =
                tensor_ops::rms_norm_backward(x_cpu, gamma_cpu, reference.inverse_rms, g_cpu);
            const auto gradients = tensor_ops::rms_norm_backward(x, gamma, result.inverse_rms, g);
            EXPECT_TRUE(close(gradients.input, reference_gradients.input));
            EXPECT_TRUE(close(gradients.scale, reference_gradients.scale));
        }
    }
}

// ---- loss ------------------------------------------------------------------------------------

std::vector<std::uint32_t> targets_for(std::size_t rows, std::size_t vocabulary, unsigned seed) {
    const std::vector<float> draws = uniform_values(rows, 0.0F, 1.0F, seed);
    std::vector<std::uint32_t> targets(rows);
    for (std::size_t r = 0; r < rows; ++r) {
        targets[r] = static_cast<std::uint32_t>(std::min<std::size_t>(
            vocabulary - 1, static_cast<std::size_t>(static_cast<double>(draws[r]) *
                                                     static_cast<double>(vocabulary))));
    }
    return targets;
}

void expect_same_loss(const tensor_ops::CrossEntropyResult& device,
                      const tensor_ops::CrossEntropyResult& reference) {
    EXPECT_TRUE(close(device.loss, reference.loss));
    EXPECT_TRUE(close(device.gradient, reference.gradient));
    // Rows the loss does not count: exactly 0 on both sides.
    const std::vector<float> d = device.gradient.to_host();
    const std::vector<float> r = reference.gradient.to_host();
    for (std::size_t i = 0; i < d.size(); ++i) {
        if (r[i] == 0.0F) {
            ASSERT_EQ(d[i], 0.0F) << i;
        }
    }
}

TEST_F(CudaRowOperations, CrossEntropyMatchesTheReferenceWithWindowsAndMasks) {
    const std::vector<Shape> shapes = {
        {1, 1, 1}, {2, 3, 5}, {1, 7, 1001}, {3, 70, 33}, {2, 4, 4099}};
    unsigned seed = 600;
    for (const Shape& shape : shapes) {
        SCOPED_TRACE(::testing::Message() << "shape " << shape_to_string(shape));
        const std::size_t vocabulary = shape[2];
        const std::size_t rows = shape[0] * shape[1];
        const auto [z_cpu, z] = pair_of(shape, seed++, -10.0F, 10.0F);
        const std::vector<std::uint32_t> targets = targets_for(rows, vocabulary, seed++);
        expect_same_loss(tensor_ops::cross_entropy(z, targets),
                         tensor_ops::cross_entropy(z_cpu, targets));
        // The same targets as a device index tensor.
        expect_same_loss(tensor_ops::cross_entropy(z, IndexTensor({rows}, targets, cuda)),
                         tensor_ops::cross_entropy(z_cpu, IndexTensor({rows}, targets, cpu)));
        const std::size_t time = shape[1];
        const std::size_t offset = time / 3;
        const std::size_t count = time - offset - (time > 2 ? 1 : 0);
        expect_same_loss(tensor_ops::cross_entropy_time_range(z, targets, offset, count),
                         tensor_ops::cross_entropy_time_range(z_cpu, targets, offset, count));
        std::vector<std::uint8_t> mask(rows, 0);
        for (std::size_t r = 0; r < rows; r += 2) {
            mask[r] = 1;
        }
        expect_same_loss(tensor_ops::cross_entropy_masked(z, targets, mask),
                         tensor_ops::cross_entropy_masked(z_cpu, targets, mask));
    }
}

TEST_F(CudaRowOperations, CrossEntropyValueErrorsAreRaisedAtTheSyncPointWithTheCpuMessages) {
    const Shape shape{2, 3, 7};
    const std::vector<std::uint32_t> targets = {1, 6, 0, 3, 2, 5};
    std::vector<float> values = uniform_values(count_of(shape), -2.0F, 2.0F, 700);
    values[4 * 7 + 2] = std::numeric_limits<float>::infinity();   // row 4's target
    values[1 * 7 + 6] = std::numeric_limits<float>::quiet_NaN();  // row 1's target, first
    const auto run = [&](ExecutionBackend backend) {
        const auto result = tensor_ops::cross_entropy(Tensor(shape, values, backend), targets);
        static_cast<void>(result.loss.to_host());
    };
    const std::string expected = message_of<std::domain_error>([&] { run(cpu); });
    ASSERT_FALSE(expected.empty());
    tensor_ops::CrossEntropyResult pending;
    EXPECT_NO_THROW(pending = tensor_ops::cross_entropy(Tensor(shape, values, cuda), targets));
    EXPECT_EQ(message_of<std::domain_error>([&] { static_cast<void>(pending.loss.to_host()); }),
              expected);

    // A NaN away from the targets: the mean is NaN, an overflow_error.
    std::vector<float> poisoned = uniform_values(count_of(shape), -2.0F, 2.0F, 701);
    poisoned[2 * 7 + 4] = std::numeric_limits<float>::quiet_NaN();
    const auto run_poisoned = [&](ExecutionBackend backend) {
        const auto result = tensor_ops::cross_entropy(Tensor(shape, poisoned, backend), targets);
        static_cast<void>(result.loss.to_host());
    };
    const std::string overflow = message_of<std::overflow_error>([&] { run_poisoned(cpu); });
    ASSERT_FALSE(overflow.empty());
    EXPECT_EQ(message_of<std::overflow_error>([&] { run_poisoned(cuda); }), overflow);

    // Outside the window the same NaN is never read.
    EXPECT_NO_THROW(static_cast<void>(
        tensor_ops::cross_entropy_time_range(Tensor(shape, poisoned, cuda), targets, 0, 2)
            .loss.to_host()));
}

// ---- indexing --------------------------------------------------------------------------------

TEST_F(CudaRowOperations, GatherAndScatterAddAreBitIdenticalToTheReference) {
    struct Case {
        std::size_t rows;
        std::size_t width;
        std::size_t count;
    };
    const Case cases[] = {{1, 1, 1}, {37, 13, 10}, {5, 1, 64}, {1000, 64, 4096}, {3, 300, 7}};
    unsigned seed = 800;
    for (const Case& c : cases) {
        SCOPED_TRACE(::testing::Message()
                     << c.rows << " rows of " << c.width << ", " << c.count << " ids");
        // Many repeats (ids drawn from a quarter of the rows) and the largest id present.
        std::vector<std::uint32_t> ids = targets_for(c.count, (c.rows + 3) / 4, seed++);
        ids[c.count - 1] = static_cast<std::uint32_t>(c.rows - 1);
        const auto [table_cpu, table] = pair_of({c.rows, c.width}, seed++);
        const IndexTensor ids_cpu({c.count}, ids, cpu);
        const IndexTensor ids_cuda({c.count}, ids, cuda);
        EXPECT_TRUE(bit_identical(tensor_ops::gather_rows(table, ids_cuda),
                                  tensor_ops::gather_rows(table_cpu, ids_cpu)));
        const auto [up_cpu, up] = pair_of({c.count, c.width}, seed++);
        EXPECT_TRUE(bit_identical(tensor_ops::scatter_add_rows(up, ids_cuda, c.rows),
                                  tensor_ops::scatter_add_rows(up_cpu, ids_cpu, c.rows)));
    }
    // A shaped index tensor gathers [.., W] rows.
    const auto [table_cpu, table] = pair_of({9, 4}, 850);
    const std::vector<std::uint32_t> ids = {8, 0, 3, 3, 8, 1};
    EXPECT_TRUE(bit_identical(tensor_ops::gather_rows(table, IndexTensor({2, 3}, ids, cuda)),
                              tensor_ops::gather_rows(table_cpu, IndexTensor({2, 3}, ids, cpu))));
}

TEST_F(CudaRowOperations, IdsOutOfRangeAreRaisedAtTheSyncPointWithTheTensorOpsMessage) {
    // tensor_ops refuses them before any adapter call; the adapter checks them again on the
    // device (an adapter called directly), raising tensor_ops' category and message.
    const std::vector<std::uint32_t> ids = {0, 5, 9, 2, 9};
    const auto [table_cpu, table] = pair_of({4, 3}, 900);
    const std::string gather_expected = message_of<std::out_of_range>(
        [&] { static_cast<void>(tensor_ops::gather_rows(table_cpu, IndexTensor({5}, ids, cpu))); });
    ASSERT_FALSE(gather_expected.empty());
    const detail::IndexingCapability* indexing = detail::find_backend_adapter(cuda)->indexing();
    ASSERT_NE(indexing, nullptr);
    const IndexTensor device_ids({5}, ids, cuda);
    Tensor gathered = detail::allocate_uninitialized({5, 3}, cuda);
    EXPECT_NO_THROW(indexing->gather_rows(table, device_ids, gathered));
    EXPECT_EQ(message_of<std::out_of_range>([&] { static_cast<void>(gathered.to_host()); }),
              gather_expected);

    const auto [up_cpu, up] = pair_of({5, 3}, 901);
    const std::string scatter_expected = message_of<std::out_of_range>([&] {
        static_cast<void>(tensor_ops::scatter_add_rows(up_cpu, IndexTensor({5}, ids, cpu), 4));
    });
    ASSERT_FALSE(scatter_expected.empty());
    Tensor scattered = detail::allocate_uninitialized({4, 3}, cuda);
    EXPECT_NO_THROW(indexing->scatter_add_rows(up, device_ids, scattered));
    EXPECT_EQ(message_of<std::out_of_range>([&] { static_cast<void>(scattered.to_host()); }),
              scatter_expected);
    EXPECT_NO_THROW(static_cast<void>(scattered.to_host()));
}

}  // namespace
}  // namespace riftco_transformer
