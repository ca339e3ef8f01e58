// CUDA quantized linear, paged attention and Adam against the CPU reference:
// - packed NF4 linear forward and input backward for both scale encodings (float32 block
//   scales and double-quantized 8-bit scale codes), an odd element count (a half-used last
//   byte) and row counts on both sides of a row tile, within form B 3e-5
//   (docs/ARCHITECTURE.md, 'Numeric parity'); the payload round trip exact and the resident
//   bytes exactly the payload's;
// - batched paged decode with Hq != Hkv (grouped query heads), scattered pages, requests of
//   different lengths, with and without a window, within form B 3e-4; the paged key/value
//   write bit-exact and unobserved by a copy of the pool; a NaN score raised at the sync point
//   with the CPU's category and message;
// - multi-step Adam with weight decay and active clipping in contiguous and paged moment
//   layouts: parameters and moments within 5e-5 (abs + rel), ‖g‖ and the clip factor within
//   1e-12 relative; without clipping, bit-identical (both sides evaluate the same double
//   formula without contraction); a non-finite gradient refused like the CPU.
// They skip without a device (fail under RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"
#include "riftco_transformer/core/tensor_ops/quantized_linear.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/cuda_support.hpp"

namespace riftco_transformer {
namespace {

using test::matches_product;
using test::matches_reference;
using test::uniform_values;

constexpr ExecutionBackend cuda = ExecutionBackend::Cuda;
constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr double nf4_tolerance = 3e-5;        // form B (docs/ARCHITECTURE.md, 'Numeric parity')
constexpr double attention_tolerance = 3e-4;  // form B (docs/ARCHITECTURE.md, 'Numeric parity')
constexpr double adam_tolerance = 5e-5;       // abs + rel (docs/ARCHITECTURE.md, 'Numeric parity')
constexpr double norm_tolerance = 1e-12;      // relative

class CudaAttentionNf4Adam : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_CUDA_DEVICE(); }
};

// ---- NF4 -------------------------------------------------------------------------------------

void expect_nf4_parity(const Nf4Options& options, std::size_t out, std::size_t in, unsigned seed) {
    const std::vector<float> w = uniform_values(out * in, -1.5F, 1.5F, seed);
    const QuantizedWeight reference = QuantizedWeight::quantize(Tensor({out, in}, w, cpu), options);
    const PackedNf4Payload payload = reference.copy_payload_to_host();
    const QuantizedWeight device = QuantizedWeight::from_packed_nf4(payload, cuda);
    ASSERT_EQ(device.backend(), cuda);
    EXPECT_EQ(device.uses_double_quantized_scales(), options.double_quantization);
    const QuantizedMemoryUsage usage = device.memory_usage();
    EXPECT_EQ(usage.resident_payload_bytes, usage.logical_payload_bytes);

    const PackedNf4Payload back = device.copy_payload_to_host();
    EXPECT_EQ(back.codes, payload.codes);
    EXPECT_EQ(back.scales, payload.scales);
    EXPECT_EQ(back.scale_codes, payload.scale_codes);
    EXPECT_EQ(back.scale_ranges, payload.scale_ranges);
    EXPECT_EQ(std::memcmp(&back.scale_offset, &payload.scale_offset, sizeof(float)), 0);

    for (const std::size_t rows : {std::size_t{1}, std::size_t{3}, std::size_t{37}}) {
        const std::vector<float> x = uniform_values(rows * in, -1.0F, 1.0F, seed + 1);
        EXPECT_TRUE(matches_reference(
            tensor_ops::quantized_linear(Tensor({rows, in}, x, cuda), device).to_host(),
            tensor_ops::quantized_linear(Tensor({rows, in}, x, cpu), reference).to_host(),
            nf4_tolerance))
            << "forward, rows " << rows;
        const std::vector<float> g = uniform_values(rows * out, -1.0F, 1.0F, seed + 2);
        EXPECT_TRUE(matches_reference(
            tensor_ops::quantized_linear_input_backward(Tensor({rows, out}, g, cuda), device)
                .to_host(),
            tensor_ops::quantized_linear_input_backward(Tensor({rows, out}, g, cpu), reference)
                .to_host(),
            nf4_tolerance))
            << "input backward, rows " << rows;
    }
}

TEST_F(CudaAttentionNf4Adam, Nf4WithFloatScalesMatchesTheCpu) {
    Nf4Options options;
    options.double_quantization = false;
    options.block_size = 64;
    expect_nf4_parity(options, 67, 129, 1);  // odd element count: a half-used last byte
    options.block_size = 32;
    expect_nf4_parity(options, 256, 96, 2);
}

TEST_F(CudaAttentionNf4Adam, Nf4WithDoubleQuantizedScalesMatchesTheCpu) {
    Nf4Options options;
    options.double_quantization = true;
    options.block_size = 64;
    options.scale_block_size = 256;
    expect_nf4_parity(options, 67, 129, 3);
    options.block_size = 16;
    options.scale_block_size = 4;  // many second-level groups
    expect_nf4_parity(options, 100, 200, 4);
}

// ---- paged attention -------------------------------------------------------------------------

constexpr std::size_t pages = 9;
constexpr std::size_t kv_heads = 2;
constexpr std::size_t query_heads = 8;
constexpr std::size_t page_size = 4;
constexpr std::size_t head_width = 40;

struct PagedCase {
    std::vector<std::vector<std::uint32_t>> tables = {{5, 0, 7}, {2, 8}, {1, 3, 4, 6}};
    std::vector<std::size_t> lengths = {9, 6, 15};

    [[nodiscard]] std::vector<tensor_ops::PagedAttentionRequest> requests() const {
        std::vector<tensor_ops::PagedAttentionRequest> result;
        for (std::size_t r = 0; r < tables.size(); ++r) {
            result.push_back({tables[r], lengths[r]});
        }
        return result;
    }
};

Tensor pool_on(ExecutionBackend backend, unsigned seed) {
    const Shape shape = {pages, kv_heads, page_size, head_width};
    return Tensor(shape,
                  uniform_values(pages * kv_heads * page_size * head_width, -1.0F, 1.0F, seed),
                  backend);
}

TEST_F(CudaAttentionNf4Adam, PagedDecodeWithGroupedHeadsAndAWindowMatchesTheCpu) {
    const PagedCase paged;
    const auto requests = paged.requests();
    const Shape query_shape = {requests.size(), query_heads, 1, head_width};
    const std::vector<float> q =
        uniform_values(requests.size() * query_heads * head_width, -1.0F, 1.0F, 7);
    for (const std::size_t window : {std::size_t{0}, std::size_t{5}, std::size_t{100}}) {
        for (const float softcap : {0.0F, 0.5F}) {  // Gemma 2's soft cap bites at 0.5
            tensor_ops::PagedAttentionOptions options;
            options.window = window;
            options.softcap = softcap;
            const Tensor device =
                tensor_ops::paged_decode_attention(Tensor(query_shape, q, cuda), pool_on(cuda, 8),
                                                   pool_on(cuda, 9), requests, 0.0F, options);
            const Tensor reference =
                tensor_ops::paged_decode_attention(Tensor(query_shape, q, cpu), pool_on(cpu, 8),
                                                   pool_on(cpu, 9), requests, 0.0F, options);
            EXPECT_EQ(device.shape(), reference.shape());
            EXPECT_TRUE(
                matches_reference(device.to_host(), reference.to_host(), attention_tolerance))
                << "window " << window << " cap " << softcap;
        }
    }
}

TEST_F(CudaAttentionNf4Adam, PagedWriteIsExactAndUnobservedByACopy) {
    Tensor keys = pool_on(cuda, 10);
    Tensor values = pool_on(cuda, 11);
    Tensor cpu_keys = pool_on(cpu, 10);
    Tensor cpu_values = pool_on(cpu, 11);
    const Tensor before = keys;  // shares the storage until the write
    const std::vector<float> untouched = before.to_host();
    const Shape row_shape = {3, kv_heads, 1, head_width};
    const std::vector<float> k = uniform_values(3 * kv_heads * head_width, -2.0F, 2.0F, 12);
    const std::vector<float> v = uniform_values(3 * kv_heads * head_width, -2.0F, 2.0F, 13);
    const std::vector<tensor_ops::PagedSlot> slots = {{4, 3}, {0, 0}, {8, 1}};
    tensor_ops::write_paged_key_value(keys, values, Tensor(row_shape, k, cuda),
                                      Tensor(row_shape, v, cuda), slots);
    tensor_ops::write_paged_key_value(cpu_keys, cpu_values, Tensor(row_shape, k, cpu),
                                      Tensor(row_shape, v, cpu), slots);
    const std::vector<float> device_keys = keys.to_host();
    const std::vector<float> device_values = values.to_host();
    const std::vector<float> reference_keys = cpu_keys.to_host();
    const std::vector<float> reference_values = cpu_values.to_host();
    EXPECT_EQ(
        std::memcmp(device_keys.data(), reference_keys.data(), device_keys.size() * sizeof(float)),
        0);
    EXPECT_EQ(std::memcmp(device_values.data(), reference_values.data(),
                          device_values.size() * sizeof(float)),
              0);
    EXPECT_EQ(before.to_host(), untouched);
}

std::string message_before_value(const std::string& message) {
    return message.substr(0, message.rfind(" is "));
}

TEST_F(CudaAttentionNf4Adam, ANanScoreIsRaisedAtTheSyncPointLikeTheCpu) {
    const PagedCase paged;
    const auto requests = paged.requests();
    const Shape query_shape = {requests.size(), query_heads, 1, head_width};
    std::vector<float> q =
        uniform_values(requests.size() * query_heads * head_width, -1.0F, 1.0F, 14);
    q[(1 * query_heads + 5) * head_width + 3] = std::numeric_limits<float>::quiet_NaN();
    tensor_ops::PagedAttentionOptions options;
    options.window = 4;
    std::string reference;
    try {
        static_cast<void>(tensor_ops::paged_decode_attention(Tensor(query_shape, q, cpu),
                                                             pool_on(cpu, 8), pool_on(cpu, 9),
                                                             requests, 0.0F, options));
    } catch (const std::domain_error& error) {
        reference = error.what();
    }
    ASSERT_FALSE(reference.empty());
    std::string device;
    try {
        const Tensor context =
            tensor_ops::paged_decode_attention(Tensor(query_shape, q, cuda), pool_on(cuda, 8),
                                               pool_on(cuda, 9), requests, 0.0F, options);
        static_cast<void>(context.to_host());
    } catch (const std::domain_error& error) {
        device = error.what();
    }
    ASSERT_FALSE(device.empty()) << "no domain_error at the sync point";
    EXPECT_EQ(message_before_value(device), message_before_value(reference));
    EXPECT_NE(device.find(" is nan (NaN and +inf are rejected)"), std::string::npos) << device;
}

// ---- Adam ------------------------------------------------------------------------------------

// Two norm blocks and five pages of 1000; three norm blocks; tiny tensors.
const std::vector<Shape> model_shapes = {{37, 129}, {9000}, {7}, {3, 4}};
const std::vector<std::string> model_names = {"embedding", "projection", "bias", "scale"};

ParameterList make_parameters(ExecutionBackend backend) {
    ParameterList parameters;
    unsigned seed = 1;
    for (std::size_t i = 0; i < model_shapes.size(); ++i) {
        const Shape& shape = model_shapes[i];
        const std::vector<float> values =
            uniform_values(checked_element_count(shape), -1.0F, 1.0F, seed++);
        parameters.push_back({model_names[i], Variable(Tensor(shape, values, backend))});
    }
    return parameters;
}

void set_gradients(const ParameterList& parameters, unsigned step, float amplitude) {
    unsigned seed = 100 * (step + 1);
    for (const NamedParameter& entry : parameters) {
        Variable parameter = entry.parameter;  // a handle: the gradient lands on the parameter
        parameter.set_gradient(
            Tensor(parameter.shape(),
                   uniform_values(parameter.value().numel(), -amplitude, amplitude, seed++),
                   parameter.backend()));
    }
}

struct TrainingRun {
    std::vector<AdamStepStats> steps;
    std::vector<float> values;
    AdamState state;
};

AdamOptions clipped_decayed(AdamStateStorage storage) {
    AdamOptions options;
    options.learning_rate = 0.01;
    options.weight_decay = 0.1;
    options.maximum_gradient_norm = 1.0;
    options.state_storage = storage;
    options.page_size = 1000;
    return options;
}

TrainingRun train(ExecutionBackend backend, const AdamOptions& options, unsigned steps) {
    const ParameterList parameters = make_parameters(backend);
    Adam adam(parameters, options);
    TrainingRun run;
    for (unsigned step = 0; step < steps; ++step) {
        set_gradients(parameters, step, 2.0F);
        run.steps.push_back(adam.step());
    }
    for (const NamedParameter& entry : parameters) {
        EXPECT_EQ(entry.parameter.backend(), backend);
        const std::vector<float> values = entry.parameter.value().to_host();
        run.values.insert(run.values.end(), values.begin(), values.end());
    }
    run.state = adam.state();
    return run;
}

TEST_F(CudaAttentionNf4Adam, ClippedDecayedAdamMatchesTheCpuInBothMomentLayouts) {
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        const AdamOptions options = clipped_decayed(storage);
        const TrainingRun device = train(cuda, options, 5);
        const TrainingRun reference = train(cpu, options, 5);
        ASSERT_EQ(device.steps.size(), reference.steps.size());
        for (std::size_t i = 0; i < device.steps.size(); ++i) {
            EXPECT_LT(reference.steps[i].clip_scale, 1.0) << "clipping is active at step " << i;
            EXPECT_NEAR(device.steps[i].gradient_norm, reference.steps[i].gradient_norm,
                        norm_tolerance * reference.steps[i].gradient_norm);
            EXPECT_NEAR(device.steps[i].clip_scale, reference.steps[i].clip_scale,
                        norm_tolerance * reference.steps[i].clip_scale);
            EXPECT_EQ(device.steps[i].step, reference.steps[i].step);
        }
        EXPECT_TRUE(
            matches_product(device.values, reference.values, adam_tolerance, adam_tolerance));
        EXPECT_TRUE(matches_product(device.state.first_moments, reference.state.first_moments,
                                    adam_tolerance, adam_tolerance));
        EXPECT_TRUE(matches_product(device.state.second_moments, reference.state.second_moments,
                                    adam_tolerance, adam_tolerance));
        EXPECT_EQ(device.state.step_count, reference.state.step_count);
    }
}

TEST_F(CudaAttentionNf4Adam, UnclippedAdamIsBitIdenticalToTheCpuInBothMomentLayouts) {
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        AdamOptions options = clipped_decayed(storage);
        options.maximum_gradient_norm = std::numeric_limits<double>::infinity();
        const TrainingRun device = train(cuda, options, 4);
        const TrainingRun reference = train(cpu, options, 4);
        for (const AdamStepStats& step : device.steps) {
            EXPECT_EQ(step.clip_scale, 1.0);
        }
        EXPECT_EQ(device.values, reference.values);
        EXPECT_EQ(device.state.first_moments, reference.state.first_moments);
        EXPECT_EQ(device.state.second_moments, reference.state.second_moments);
    }
}

TEST_F(CudaAttentionNf4Adam, ANonFiniteGradientIsRefusedLikeTheCpuChangingNothing) {
    for (const AdamStateStorage storage : {AdamStateStorage::Contiguous, AdamStateStorage::Paged}) {
        std::string messages[2];
        std::vector<float> unchanged[2];
        std::vector<float> after[2];
        int side = 0;
        for (const ExecutionBackend backend : {cuda, cpu}) {
            const ParameterList parameters = make_parameters(backend);
            Adam adam(parameters, clipped_decayed(storage));
            set_gradients(parameters, 0, 2.0F);
            std::vector<float> gradient = parameters[1].parameter.gradient().to_host();
            gradient[8999] = -std::numeric_limits<float>::infinity();
            Variable projection = parameters[1].parameter;
            projection.set_gradient(Tensor({9000}, gradient, backend));
            unchanged[side] = parameters[0].parameter.value().to_host();
            try {
                static_cast<void>(adam.step());
            } catch (const std::domain_error& error) {
                messages[side] = error.what();
            }
            after[side] = parameters[0].parameter.value().to_host();
            ++side;
        }
        EXPECT_FALSE(messages[1].empty());
        EXPECT_EQ(messages[0], messages[1]);
        EXPECT_EQ(after[0], unchanged[0]);
    }
}

}  // namespace
}  // namespace riftco_transformer
