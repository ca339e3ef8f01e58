// Packed NF4 weights on a second backend: the test build in which ExecutionBackend::Metal is
// an emulated device (host memory, CPU kernels, its own storage identity, replaced outputs).

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/autograd/node.hpp"
#include "core/backend/quantized_storage.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/emulated_device.hpp"
#include "support/nf4_reference.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend metal = ExecutionBackend::Metal;
using testing::pseudo_random;

QuantizedWeight cpu_weight(bool double_quantized) {
    return QuantizedWeight::quantize(Tensor({20, 96}, pseudo_random(20 * 96, -1.0F, 1.0F, 3U)),
                                     Nf4Options{32, double_quantized, 32});
}

TEST(EmulatedQuantizedLinear, QuantizeOnTheDevicePlacesTheWeightThere) {
    const Tensor source({20, 96}, pseudo_random(20 * 96, -1.0F, 1.0F, 3U), metal);
    const QuantizedWeight weight = QuantizedWeight::quantize(source);
    EXPECT_EQ(weight.backend(), metal);
    EXPECT_EQ(weight.storage().backend(), metal);
    EXPECT_EQ(weight.dequantize().backend(), metal);
    // Same payload as quantizing on the CPU.
    const PackedNf4Payload here = weight.copy_payload_to_host();
    const PackedNf4Payload there =
        QuantizedWeight::quantize(source.to(ExecutionBackend::Cpu)).copy_payload_to_host();
    EXPECT_EQ(here.codes, there.codes);
    EXPECT_EQ(here.scale_codes, there.scale_codes);
}

TEST(EmulatedQuantizedLinear, ToMovesTheExactPayloadBothWays) {
    for (const bool double_quantized : {false, true}) {
        const QuantizedWeight cpu = cpu_weight(double_quantized);
        const QuantizedWeight device = cpu.to(metal);
        EXPECT_EQ(device.backend(), metal);
        EXPECT_NE(&device.storage(), &cpu.storage());
        const PackedNf4Payload a = cpu.copy_payload_to_host();
        const PackedNf4Payload b = device.copy_payload_to_host();
        EXPECT_EQ(a.codes, b.codes);
        EXPECT_TRUE(testing::bit_identical(a.scales, b.scales));
        EXPECT_EQ(a.scale_codes, b.scale_codes);
        EXPECT_TRUE(testing::bit_identical(a.scale_ranges, b.scale_ranges));
        EXPECT_EQ(a.scale_offset, b.scale_offset);
        const QuantizedMemoryUsage usage = device.memory_usage();
        EXPECT_EQ(usage.resident_payload_bytes, usage.logical_payload_bytes);
        EXPECT_EQ(device.to(ExecutionBackend::Cpu).backend(), ExecutionBackend::Cpu);
        EXPECT_EQ(&device.to(metal).storage(), &device.storage());
    }
}

TEST(EmulatedQuantizedLinear, ProductsMatchTheCpuAndArriveInNewBuffers) {
    const QuantizedWeight cpu = cpu_weight(true);
    const QuantizedWeight device = cpu.to(metal);
    const std::vector<float> x = pseudo_random(3 * 96, -1.0F, 1.0F, 5U);
    const std::vector<float> g = pseudo_random(3 * 20, -1.0F, 1.0F, 6U);
    const std::size_t replaced_before = test::emulated_replaced_outputs();
    const Tensor y = tensor_ops::quantized_linear(Tensor({3, 96}, x, metal), device);
    const Tensor dx =
        tensor_ops::quantized_linear_input_backward(Tensor({3, 20}, g, metal), device);
    EXPECT_EQ(test::emulated_replaced_outputs(), replaced_before + 2);
    EXPECT_EQ(y.backend(), metal);
    EXPECT_EQ(dx.backend(), metal);
    const std::vector<double> dense = testing::reference_dequantize(cpu.copy_payload_to_host());
    EXPECT_TRUE(
        testing::close_form_b(y.to_host(), testing::reference_forward(dense, 20, 96, x), 3e-5));
    EXPECT_TRUE(testing::close_form_b(dx.to_host(),
                                      testing::reference_input_backward(dense, 20, 96, g), 3e-5));
}

TEST(EmulatedQuantizedLinear, MixedBackendsAreRejectedNamingBoth) {
    const QuantizedWeight device = cpu_weight(false).to(metal);
    try {
        static_cast<void>(tensor_ops::quantized_linear(Tensor::zeros({2, 96}), device));
        ADD_FAILURE() << "expected invalid_argument";
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("x on cpu"), std::string::npos) << message;
        EXPECT_NE(message.find("weight on metal"), std::string::npos) << message;
    }
    try {
        static_cast<void>(tensor_ops::quantized_linear_input_backward(Tensor::zeros({2, 20}, metal),
                                                                      cpu_weight(false)));
        ADD_FAILURE() << "expected invalid_argument";
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("upstream on metal"), std::string::npos) << message;
        EXPECT_NE(message.find("weight on cpu"), std::string::npos) << message;
    }
    EXPECT_THROW(static_cast<void>(quantized_linear(Variable(Tensor::zeros({2, 96})), device)),
                 std::invalid_argument);
}

TEST(EmulatedQuantizedLinear, AutogradOnTheDeviceKeepsTheGradientThere) {
    const QuantizedWeight device = cpu_weight(true).to(metal);
    const Variable x(Tensor({2, 96}, pseudo_random(2 * 96, -1.0F, 1.0F, 7U), metal));
    Variable y = quantized_linear(x, device);
    EXPECT_EQ(y.node()->parents.size(), 1U);
    y.backward(Tensor({2, 20}, 1.0F, metal));
    EXPECT_EQ(x.gradient().backend(), metal);
    const std::vector<double> dense = testing::reference_dequantize(device.copy_payload_to_host());
    EXPECT_TRUE(testing::close_form_b(
        x.gradient().to_host(),
        testing::reference_input_backward(dense, 20, 96, std::vector<float>(40, 1.0F)), 3e-5));
}

}  // namespace
}  // namespace riftco_transformer
