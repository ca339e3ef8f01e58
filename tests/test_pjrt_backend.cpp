// The PJRT backend's core contract on a real plugin (XLA's CPU plugin in CI): device-resident
// storage and transfers both ways, the compile cache, deferred value-domain errors raised at
// the sync point with the CPU's category and message, mixed-backend rejection, and elementwise
// parity with the CPU reference. Tolerance for elementwise programs: 2e-6 absolute + 2e-6
// relative (XLA's exp/log/erf are within a few float ulps of ours;
// docs/ARCHITECTURE.md, 'Numeric parity', allows 1e-3).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "support/pjrt_support.hpp"

namespace riftco_transformer {
namespace {

using test::close_to;
using test::pjrt_test_backend;
using test::uniform_values;

constexpr double elementwise_tolerance = 2e-6;

class PjrtBackend : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }
    ExecutionBackend device = pjrt_test_backend();
};

TEST(PjrtIdentity, NamesAndValuesAreStable) {
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Tpu), 3U);
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Pjrt), 4U);
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Tpu), "tpu");
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Pjrt), "pjrt");
}

TEST(PjrtIdentity, UnavailableIdentityRefusesWorkAndSaysWhy) {
    for (const ExecutionBackend backend : {ExecutionBackend::Tpu, ExecutionBackend::Pjrt}) {
        if (execution_backend_available(backend)) {
            continue;
        }
        const std::string reason(execution_backend_unavailability_reason(backend));
        EXPECT_FALSE(reason.empty());
        const ExecutionBackend before = current_execution_backend();
        EXPECT_THROW(set_execution_backend(backend), BackendUnavailableError);
        EXPECT_EQ(current_execution_backend(), before);
        try {
            Tensor({2}, std::vector<float>{1.0F, 2.0F}, backend);
            ADD_FAILURE() << "a tensor was made on an unavailable backend";
        } catch (const BackendUnavailableError& error) {
            EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << error.what();
        }
    }
}

TEST_F(PjrtBackend, TransfersRoundTripExactly) {
    std::vector<float> values = uniform_values(1000, -5.0F, 5.0F, 1);
    values[3] = std::numeric_limits<float>::infinity();
    values[4] = -0.0F;
    values[5] = std::numeric_limits<float>::quiet_NaN();
    values[6] = std::numeric_limits<float>::denorm_min();
    const Tensor on_device({10, 100}, values, device);
    EXPECT_EQ(on_device.backend(), device);
    const std::vector<float> back = on_device.to_host();
    ASSERT_EQ(back.size(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        EXPECT_EQ(std::memcmp(&back[i], &values[i], sizeof(float)), 0) << i;
    }
    // Device -> CPU -> device keeps every bit as well.
    const Tensor on_cpu = on_device.to(ExecutionBackend::Cpu);
    EXPECT_EQ(on_cpu.backend(), ExecutionBackend::Cpu);
    const Tensor again = on_cpu.to(device);
    const std::vector<float> twice = again.to_host();
    EXPECT_EQ(std::memcmp(twice.data(), values.data(), values.size() * sizeof(float)), 0);
    EXPECT_FLOAT_EQ(on_device.at({1, 2}), values[102]);
}

TEST_F(PjrtBackend, FilledAndZeroTensorsLiveOnTheDevice) {
    const Tensor filled({3, 4}, 2.5F, device);
    EXPECT_EQ(filled.to_host(), std::vector<float>(12, 2.5F));
    const Tensor zeros = Tensor::zeros({5}, device);
    EXPECT_EQ(zeros.to_host(), std::vector<float>(5, 0.0F));
}

TEST_F(PjrtBackend, SingleElementWritesReplaceOnlyThatElementAndNotCopies) {
    Tensor tensor({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6}, device);
    const Tensor copy = tensor;
    tensor.set_flat(4, -7.0F);
    EXPECT_EQ(tensor.to_host(), (std::vector<float>{1, 2, 3, 4, -7, 6}));
    EXPECT_EQ(copy.to_host(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST_F(PjrtBackend, OperationsReadNoHostMemory) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const Tensor a({256}, uniform_values(256, -1.0F, 1.0F, 2), device);
    const Tensor b({256}, uniform_values(256, -1.0F, 1.0F, 3), device);
    const auto before = test::pjrt_statistics();
    Tensor c = tensor_ops::add(a, b);
    for (int i = 0; i < 10; ++i) {
        c = tensor_ops::multiply(tensor_ops::add(c, a), b);
    }
    const auto after = test::pjrt_statistics();
    EXPECT_EQ(after.bytes_to_host, before.bytes_to_host);
    EXPECT_EQ(after.bytes_to_device, before.bytes_to_device);
    EXPECT_EQ(after.executions - before.executions, 21U);
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

TEST_F(PjrtBackend, ProgramsCompileOncePerShapeAndOperation) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const Tensor a({7, 3}, uniform_values(21, -1.0F, 1.0F, 4), device);
    const Tensor b({7, 3}, uniform_values(21, -1.0F, 1.0F, 5), device);
    static_cast<void>(tensor_ops::subtract(a, b));  // compiled here, or earlier in this process
    const auto first = test::pjrt_statistics();
    static_cast<void>(tensor_ops::subtract(b, a));
    static_cast<void>(tensor_ops::subtract(a, a));
    const auto second = test::pjrt_statistics();
    EXPECT_EQ(second.compiles, first.compiles);
    EXPECT_EQ(second.cache_hits - first.cache_hits, 2U);
    // A new shape is a new program.
    const Tensor c({22}, uniform_values(22, -1.0F, 1.0F, 6), device);
    static_cast<void>(tensor_ops::subtract(c, c));
    EXPECT_EQ(test::pjrt_statistics().compiles, second.compiles + 1);
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

TEST_F(PjrtBackend, MixedBackendsAreRejected) {
    const Tensor on_device({3}, std::vector<float>{1, 2, 3}, device);
    const Tensor on_cpu({3}, std::vector<float>{1, 2, 3}, ExecutionBackend::Cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::add(on_device, on_cpu)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::multiply(on_cpu, on_device)), std::invalid_argument);
}

// ---- elementwise parity ---------------------------------------------------------------------

std::vector<float> elementwise_inputs() {
    std::vector<float> values = uniform_values(997, -12.0F, 12.0F, 7);
    const float specials[] = {0.0F,
                              -0.0F,
                              1e-30F,
                              -1e-30F,
                              30.0F,
                              -30.0F,
                              100.0F,
                              -100.0F,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
    values.insert(values.end(), std::begin(specials), std::end(specials));
    return values;
}

template <typename Operation>
void expect_unary_parity(ExecutionBackend device, Operation operation, const char* name,
                         const std::vector<float>& values) {
    const Shape shape = {values.size()};
    const Tensor on_cpu(shape, values, ExecutionBackend::Cpu);
    const Tensor on_device(shape, values, device);
    const Tensor reference = operation(on_cpu);
    const Tensor result = operation(on_device);
    EXPECT_EQ(result.backend(), device) << name;
    EXPECT_TRUE(close_to(result.to_host(), reference.to_host(), elementwise_tolerance,
                         elementwise_tolerance))
        << name;
}

TEST_F(PjrtBackend, UnaryOperationsMatchTheReference) {
    const std::vector<float> values = elementwise_inputs();
    std::vector<float> positive = uniform_values(500, 1e-6F, 50.0F, 8);
    positive.push_back(std::numeric_limits<float>::infinity());
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::negate(x); }, "negate", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::exp(x); }, "exp", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::log(x); }, "log", positive);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::sqrt(x); }, "sqrt", positive);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::erf(x); }, "erf", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::gelu(x); }, "gelu", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::gelu_tanh(x); }, "gelu_tanh", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::relu(x); }, "relu", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::silu(x); }, "silu", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::scale(x, -0.37F); }, "scale", values);
    expect_unary_parity(
        device, [](const Tensor& x) { return tensor_ops::add_scalar(x, 2.5F); }, "add_scalar",
        values);
}

TEST_F(PjrtBackend, DerivativesMatchTheReference) {
    const std::vector<float> values = elementwise_inputs();
    const std::vector<float> upstream_values = uniform_values(values.size(), -2.0F, 2.0F, 9);
    const Shape shape = {values.size()};
    const Tensor x_cpu(shape, values, ExecutionBackend::Cpu);
    const Tensor g_cpu(shape, upstream_values, ExecutionBackend::Cpu);
    const Tensor x_device(shape, values, device);
    const Tensor g_device(shape, upstream_values, device);
    using Backward = Tensor (*)(const Tensor&, const Tensor&);
    const std::pair<const char*, Backward> derivatives[] = {
        {"gelu", &tensor_ops::gelu_backward},
        {"gelu_tanh", &tensor_ops::gelu_tanh_backward},
        {"relu", &tensor_ops::relu_backward},
        {"silu", &tensor_ops::silu_backward},
    };
    for (const auto& [name, backward] : derivatives) {
        EXPECT_TRUE(close_to(backward(x_device, g_device).to_host(),
                             backward(x_cpu, g_cpu).to_host(), elementwise_tolerance,
                             elementwise_tolerance))
            << name;
    }
}

TEST_F(PjrtBackend, BinaryOperationsMatchTheReference) {
    const std::vector<float> left = elementwise_inputs();
    std::vector<float> right = uniform_values(left.size(), 0.5F, 3.0F, 10);
    const Shape shape = {left.size()};
    const Tensor a_cpu(shape, left, ExecutionBackend::Cpu);
    const Tensor b_cpu(shape, right, ExecutionBackend::Cpu);
    const Tensor a_device(shape, left, device);
    const Tensor b_device(shape, right, device);
    using Binary = Tensor (*)(const Tensor&, const Tensor&);
    const std::pair<const char*, Binary> operations[] = {
        {"add", &tensor_ops::add},
        {"subtract", &tensor_ops::subtract},
        {"multiply", &tensor_ops::multiply},
        {"divide", &tensor_ops::divide},
    };
    for (const auto& [name, operation] : operations) {
        EXPECT_TRUE(close_to(operation(a_device, b_device).to_host(),
                             operation(a_cpu, b_cpu).to_host(), 0.0, 0.0))
            << name << " (IEEE arithmetic is exact on both sides)";
    }
}

// ---- deferred value-domain errors -----------------------------------------------------------

template <typename Exception, typename Operation>
void expect_same_deferred_error(ExecutionBackend device, Operation operation,
                                const std::vector<float>& left, const std::vector<float>& right) {
    const Shape shape = {left.size()};
    std::string reference_message;
    try {
        static_cast<void>(operation(Tensor(shape, left, ExecutionBackend::Cpu),
                                    Tensor(shape, right, ExecutionBackend::Cpu)));
        FAIL() << "the CPU reference accepted the input";
    } catch (const Exception& error) {
        reference_message = error.what();
    }
    const Tensor a(shape, left, device);
    const Tensor b(shape, right, device);
    // The device does not stop: the error waits for the sync point.
    Tensor result;
    ASSERT_NO_THROW(result = operation(a, b));
    try {
        static_cast<void>(result.to_host());
        FAIL() << "the sync point did not raise the deferred error";
    } catch (const Exception& error) {
        EXPECT_EQ(std::string(error.what()), reference_message);
    }
    // Raised once: the next sync point is clean, and the inputs are unchanged (bit for bit,
    // NaN included).
    const std::vector<float> a_after = a.to_host();
    const std::vector<float> b_after = b.to_host();
    EXPECT_EQ(std::memcmp(a_after.data(), left.data(), left.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(b_after.data(), right.data(), right.size() * sizeof(float)), 0);
}

TEST_F(PjrtBackend, DivideByZeroIsRaisedAtTheSyncPointLikeTheReference) {
    expect_same_deferred_error<std::domain_error>(
        device, [](const Tensor& a, const Tensor& b) { return tensor_ops::divide(a, b); },
        {1, 2, 3, 4, 5}, {1, 2, 0, 4, 0});
}

TEST_F(PjrtBackend, LogAndSqrtDomainErrorsAreRaisedAtTheSyncPointLikeTheReference) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    expect_same_deferred_error<std::domain_error>(
        device, [](const Tensor& a, const Tensor&) { return tensor_ops::log(a); },
        {1, 2, 0.5F, -3, 0}, {0, 0, 0, 0, 0});
    expect_same_deferred_error<std::domain_error>(
        device, [](const Tensor& a, const Tensor&) { return tensor_ops::sqrt(a); },
        {1, nan, 0.5F, -3, 0}, {0, 0, 0, 0, 0});
}

TEST_F(PjrtBackend, OnlyTheFirstOfSeveralDeferredErrorsIsRaised) {
    const Tensor zero({2}, std::vector<float>{1.0F, 0.0F}, device);
    const Tensor negative({2}, std::vector<float>{-1.0F, 1.0F}, device);
    const Tensor one({2}, std::vector<float>{1.0F, 1.0F}, device);
    const Tensor quotient = tensor_ops::divide(one, zero);
    const Tensor logarithm = tensor_ops::log(negative);
    try {
        static_cast<void>(logarithm.to_host());
        FAIL() << "no error raised";
    } catch (const std::domain_error& error) {
        EXPECT_NE(std::string(error.what()).find("divide"), std::string::npos) << error.what();
    }
    EXPECT_NO_THROW(static_cast<void>(one.to_host()));
}

}  // namespace
}  // namespace riftco_transformer
