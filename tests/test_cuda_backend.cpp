// The CUDA backend's core contract. Everywhere: the no-device contract (availability false,
// the reason "no CUDA device visible" in a build with the adapter, every request refused with
// BackendUnavailableError naming the backend and the reason, nothing changed). With a device:
// device-resident storage and transfers both ways (bit-exact), hand-off between host threads,
// mixed-backend rejection, deferred value-domain errors raised at the sync point with the CPU's
// category and message, elementwise parity with the CPU reference (form B, 3e-4:
// docs/ARCHITECTURE.md, 'Numeric parity'), and every capability family provided.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "riftco_transformer/core/tensor_ops/softmax.hpp"
#include "support/cuda_support.hpp"

namespace riftco_transformer {
namespace {

using test::matches_reference;
using test::uniform_values;

constexpr ExecutionBackend cuda = ExecutionBackend::Cuda;
constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr double nn_tolerance = 3e-4;  // form B of docs/ARCHITECTURE.md, 'Numeric parity'

class CudaBackend : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_CUDA_DEVICE(); }
};

// The message of what `operation` throws as `Error`, or "" when it throws nothing.
template <typename Error, typename Operation>
std::string message_of(Operation&& operation) {
    try {
        operation();
    } catch (const Error& error) {
        return error.what();
    }
    return {};
}

// ---- the no-device contract ------------------------------------------------------------------

class CudaWithoutDevice : public ::testing::Test {
  protected:
    void SetUp() override {
        if (execution_backend_available(cuda)) {
            GTEST_SKIP() << "a CUDA device is visible: the no-device contract does not apply";
        }
        reason = std::string(execution_backend_unavailability_reason(cuda));
    }
    std::string reason;
};

TEST_F(CudaWithoutDevice, ReasonSaysNoDeviceIsVisibleOrThatCudaIsNotCompiledIn) {
    if (RIFTCO_TRANSFORMER_HAVE_CUDA) {
        EXPECT_EQ(reason, test::no_device_reason);
    } else {
        EXPECT_NE(reason.find("RIFTCO_TRANSFORMER_ENABLE_CUDA=OFF"), std::string::npos) << reason;
    }
    // Process-lifetime text: the same characters at the same address every time.
    EXPECT_EQ(execution_backend_unavailability_reason(cuda).data(),
              execution_backend_unavailability_reason(cuda).data());
}

TEST_F(CudaWithoutDevice, SelectionIsRefusedAndThePreviousSelectionStays) {
    const ExecutionBackend before = current_execution_backend();
    try {
        set_execution_backend(cuda);
        ADD_FAILURE() << "set_execution_backend(Cuda) did not throw";
    } catch (const BackendUnavailableError& error) {
        EXPECT_EQ(error.backend(), cuda);
        EXPECT_NE(std::string(error.what()).find("'cuda'"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << error.what();
    }
    EXPECT_EQ(current_execution_backend(), before);
}

TEST_F(CudaWithoutDevice, TensorsOnCudaAreRefusedNamingTheBackendAndTheReason) {
    const auto check = [&](const BackendUnavailableError& error) {
        EXPECT_EQ(error.backend(), cuda);
        EXPECT_NE(std::string(error.what()).find("'cuda'"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << error.what();
    };
    try {
        const Tensor made({2}, std::vector<float>{1.0F, 2.0F}, cuda);
        ADD_FAILURE() << "a tensor was made on cuda";
    } catch (const BackendUnavailableError& error) {
        check(error);
    }
    const Tensor on_cpu({2}, std::vector<float>{1.0F, 2.0F}, cpu);
    try {
        static_cast<void>(on_cpu.to(cuda));
        ADD_FAILURE() << "Tensor::to(Cuda) did not throw";
    } catch (const BackendUnavailableError& error) {
        check(error);
    }
    EXPECT_EQ(on_cpu.backend(), cpu);
    EXPECT_EQ(on_cpu.to_host(), (std::vector<float>{1.0F, 2.0F}));
    try {
        const std::uint32_t ids[] = {0U, 1U};
        const IndexTensor indices({2}, ids, cuda);
        ADD_FAILURE() << "an index tensor was made on cuda";
    } catch (const BackendUnavailableError& error) {
        check(error);
    }
    // Staging a CPU product through cuda is refused too, and changes no selection.
    const Tensor square({1, 1}, std::vector<float>{3.0F}, cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(square, square, cuda)),
                 BackendUnavailableError);
    EXPECT_EQ(current_execution_backend(), cpu);
}

TEST_F(CudaWithoutDevice, TheAdapterProvidesNoCapability) {
    const detail::BackendAdapter* adapter = detail::find_backend_adapter(cuda);
    ASSERT_NE(adapter, nullptr);
    EXPECT_EQ(adapter->name(), "cuda");
    EXPECT_FALSE(adapter->is_available());
    EXPECT_EQ(adapter->unavailability_reason(), reason);
    EXPECT_EQ(adapter->storage(), nullptr);
    EXPECT_EQ(adapter->matmul(), nullptr);
    EXPECT_EQ(adapter->elementwise(), nullptr);
    // A sync point of an unavailable backend has nothing to collect.
    EXPECT_NO_THROW(adapter->collect_deferred_errors());
}

// ---- storage and transfers ---------------------------------------------------------------------

TEST_F(CudaBackend, TransfersRoundTripBitExactly) {
    std::vector<float> values = uniform_values(100003, -5.0F, 5.0F, 1);
    values[3] = std::numeric_limits<float>::infinity();
    values[4] = -0.0F;
    values[5] = std::numeric_limits<float>::quiet_NaN();
    values[6] = std::numeric_limits<float>::denorm_min();
    const Tensor on_device({100003}, values, cuda);
    EXPECT_EQ(on_device.backend(), cuda);
    const std::vector<float> back = on_device.to_host();
    ASSERT_EQ(back.size(), values.size());
    EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * sizeof(float)), 0);
    // Device -> CPU -> device keeps every bit, and a device copy is independent.
    const Tensor on_cpu = on_device.to(cpu);
    EXPECT_EQ(on_cpu.backend(), cpu);
    const Tensor again = on_cpu.to(cuda);
    const Tensor copy = again.to(cuda);
    const std::vector<float> twice = copy.to_host();
    EXPECT_EQ(std::memcmp(twice.data(), values.data(), values.size() * sizeof(float)), 0);
    EXPECT_EQ(on_device.flat(102), values[102]);
}

TEST_F(CudaBackend, IndexTensorsRoundTripAndFillsAreExact) {
    const std::vector<std::uint32_t> ids = {0U, 7U, 4294967295U, 42U};
    const IndexTensor indices({2, 2}, ids, cuda);
    EXPECT_EQ(indices.to_host(), ids);
    EXPECT_EQ(indices.to(cpu).to_host(), ids);
    const Tensor filled({3, 5}, 2.5F, cuda);
    EXPECT_EQ(filled.to_host(), std::vector<float>(15, 2.5F));
}

TEST_F(CudaBackend, WritesToACopyLeaveTheOriginalUnchanged) {
    const Tensor original({4}, std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}, cuda);
    Tensor changed = original;
    const std::vector<float> patch = {9.0F, 8.0F};
    detail::require_storage(cuda, "test").write_range(changed, 1, patch);
    EXPECT_EQ(changed.to_host(), (std::vector<float>{1.0F, 9.0F, 8.0F, 4.0F}));
    EXPECT_EQ(original.to_host(), (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
}

TEST_F(CudaBackend, TensorsMadeOnOneThreadAreReadCorrectlyOnAnother) {
    // Each thread has its own stream: the consumer's stream waits for the producer's work.
    const std::vector<float> values = uniform_values(1 << 20, -1.0F, 1.0F, 2);
    Tensor produced;
    std::thread producer([&] {
        const Tensor x({1 << 20}, values, cuda);
        produced = tensor_ops::scale(tensor_ops::add(x, x), 0.5F);
    });
    producer.join();
    std::vector<float> doubled;
    std::thread consumer([&] { doubled = tensor_ops::add(produced, produced).to_host(); });
    consumer.join();
    for (std::size_t i = 0; i < values.size(); i += 4099) {
        EXPECT_EQ(doubled[i], 2.0F * values[i]) << i;
    }
}

TEST_F(CudaBackend, MixedBackendsAreRejectedLikeEveryAdapter) {
    const Tensor on_device({2}, std::vector<float>{1.0F, 2.0F}, cuda);
    const Tensor on_host({2}, std::vector<float>{1.0F, 2.0F}, cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::add(on_device, on_host)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::divide(on_host, on_device)), std::invalid_argument);
    const Tensor square_device({2, 2}, 1.0F, cuda);
    const Tensor square_host({2, 2}, 1.0F, cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(square_device, square_host)),
                 std::invalid_argument);
}

// ---- deferred value-domain errors ------------------------------------------------------------

TEST_F(CudaBackend, DivideByZeroIsRaisedAtTheSyncPointWithTheCpuMessage) {
    const std::vector<float> numerator = {1.0F, 2.0F, 3.0F, 4.0F};
    const std::vector<float> denominator = {1.0F, 0.0F, 2.0F, -0.0F};
    const std::string expected = message_of<std::domain_error>([&] {
        static_cast<void>(
            tensor_ops::divide(Tensor({4}, numerator, cpu), Tensor({4}, denominator, cpu)));
    });
    ASSERT_FALSE(expected.empty());
    Tensor quotient;
    // Enqueued, not raised: the check is on the device until the next sync point.
    EXPECT_NO_THROW(quotient = tensor_ops::divide(Tensor({4}, numerator, cuda),
                                                  Tensor({4}, denominator, cuda)));
    EXPECT_EQ(message_of<std::domain_error>([&] { static_cast<void>(quotient.to_host()); }),
              expected);
    // Raised once: the backend is usable afterwards.
    const Tensor fine = tensor_ops::divide(Tensor({1}, 6.0F, cuda), Tensor({1}, 3.0F, cuda));
    EXPECT_EQ(fine.to_host(), std::vector<float>{2.0F});
}

TEST_F(CudaBackend, LogAndSqrtDomainErrorsCarryTheCpuMessages) {
    const std::vector<float> values = {4.0F, 1.0F, -2.0F, std::nanf(""), 0.0F};
    for (const bool log : {true, false}) {
        const auto run = [&](ExecutionBackend backend) {
            const Tensor x({5}, values, backend);
            static_cast<void>((log ? tensor_ops::log(x) : tensor_ops::sqrt(x)).to_host());
        };
        const std::string expected = message_of<std::domain_error>([&] { run(cpu); });
        ASSERT_FALSE(expected.empty());
        EXPECT_EQ(message_of<std::domain_error>([&] { run(cuda); }), expected);
    }
}

TEST_F(CudaBackend, OnlyTheFirstDeferredErrorIsRaised) {
    const Tensor zero({1}, 0.0F, cuda);
    const Tensor negative({1}, -1.0F, cuda);
    const std::string expected = message_of<std::domain_error>([&] {
        static_cast<void>(tensor_ops::divide(Tensor({1}, 1.0F, cpu), Tensor({1}, 0.0F, cpu)));
    });
    static_cast<void>(tensor_ops::divide(negative, zero));  // first
    static_cast<void>(tensor_ops::log(negative));           // second, dropped
    EXPECT_EQ(message_of<std::domain_error>([&] { static_cast<void>(zero.to_host()); }), expected);
    EXPECT_NO_THROW(static_cast<void>(zero.to_host()));
}

// ---- elementwise parity ----------------------------------------------------------------------

// Values covering both signs, zeros and the special values every kernel must handle.
std::vector<float> elementwise_inputs() {
    std::vector<float> values = uniform_values(4096, -9.0F, 9.0F, 3);
    const float specials[] = {0.0F,
                              -0.0F,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::nanf(""),
                              1e-30F,
                              -1e-30F,
                              30.0F,
                              -30.0F,
                              88.0F,
                              -88.0F};
    std::copy(std::begin(specials), std::end(specials), values.begin());
    return values;
}

TEST_F(CudaBackend, UnaryOperationsMatchTheCpuReference) {
    const std::vector<float> values = elementwise_inputs();
    using Unary = Tensor (*)(const Tensor&);
    const std::pair<const char*, Unary> operations[] = {{"negate", tensor_ops::negate},
                                                        {"exp", tensor_ops::exp},
                                                        {"erf", tensor_ops::erf},
                                                        {"gelu", tensor_ops::gelu},
                                                        {"gelu_tanh", tensor_ops::gelu_tanh},
                                                        {"relu", tensor_ops::relu},
                                                        {"silu", tensor_ops::silu}};
    const Tensor on_cpu({64, 64}, values, cpu);
    const Tensor on_device({64, 64}, values, cuda);
    for (const auto& [name, operation] : operations) {
        SCOPED_TRACE(name);
        EXPECT_TRUE(matches_reference(operation(on_device).to_host(), operation(on_cpu).to_host(),
                                      nn_tolerance));
    }
    // Log and sqrt on their domain.
    std::vector<float> positive = uniform_values(4096, 1e-3F, 50.0F, 4);
    const Tensor positive_cpu({4096}, positive, cpu);
    const Tensor positive_device({4096}, positive, cuda);
    EXPECT_TRUE(matches_reference(tensor_ops::log(positive_device).to_host(),
                                  tensor_ops::log(positive_cpu).to_host(), nn_tolerance));
    EXPECT_TRUE(matches_reference(tensor_ops::sqrt(positive_device).to_host(),
                                  tensor_ops::sqrt(positive_cpu).to_host(), nn_tolerance));
}

TEST_F(CudaBackend, BinaryAffineAndDerivativesMatchTheCpuReference) {
    const std::vector<float> left = uniform_values(5000, -4.0F, 4.0F, 5);
    std::vector<float> right = uniform_values(5000, 0.5F, 3.0F, 6);
    for (std::size_t i = 0; i < right.size(); i += 2) {
        right[i] = -right[i];
    }
    const Tensor a_cpu({50, 100}, left, cpu);
    const Tensor b_cpu({50, 100}, right, cpu);
    const Tensor a({50, 100}, left, cuda);
    const Tensor b({50, 100}, right, cuda);
    using Binary = Tensor (*)(const Tensor&, const Tensor&);
    const std::pair<const char*, Binary> operations[] = {
        {"add", tensor_ops::add},
        {"subtract", tensor_ops::subtract},
        {"multiply", tensor_ops::multiply},
        {"divide", tensor_ops::divide},
        {"gelu_backward", tensor_ops::gelu_backward},
        {"gelu_tanh_backward", tensor_ops::gelu_tanh_backward},
        {"relu_backward", tensor_ops::relu_backward},
        {"silu_backward", tensor_ops::silu_backward}};
    for (const auto& [name, operation] : operations) {
        SCOPED_TRACE(name);
        EXPECT_TRUE(matches_reference(operation(a, b).to_host(), operation(a_cpu, b_cpu).to_host(),
                                      nn_tolerance));
    }
    EXPECT_TRUE(matches_reference(tensor_ops::scale(a, -1.75F).to_host(),
                                  tensor_ops::scale(a_cpu, -1.75F).to_host(), nn_tolerance));
    EXPECT_TRUE(matches_reference(tensor_ops::add_scalar(a, 0.25F).to_host(),
                                  tensor_ops::add_scalar(a_cpu, 0.25F).to_host(), nn_tolerance));
}

// ---- every capability provided --------------------------------------------------------------

// Every required capability family runs on the device (the optional RotaryCapability may be
// absent: tensor_ops composes RoPE from other capabilities then).
TEST_F(CudaBackend, EveryCapabilityIsProvided) {
    const detail::BackendAdapter* adapter = detail::find_backend_adapter(cuda);
    ASSERT_NE(adapter, nullptr);
    EXPECT_NE(adapter->storage(), nullptr);
    EXPECT_NE(adapter->layout(), nullptr);
    EXPECT_NE(adapter->elementwise(), nullptr);
    EXPECT_NE(adapter->reduction(), nullptr);
    EXPECT_NE(adapter->matmul(), nullptr);
    EXPECT_NE(adapter->softmax(), nullptr);
    EXPECT_NE(adapter->indexing(), nullptr);
    EXPECT_NE(adapter->normalization(), nullptr);
    EXPECT_NE(adapter->loss(), nullptr);
    EXPECT_NE(adapter->attention(), nullptr);
    EXPECT_NE(adapter->paged_attention(), nullptr);
    EXPECT_NE(adapter->quantized_linear(), nullptr);
    EXPECT_NE(adapter->adam(), nullptr);
    const Tensor heads({1, 1, 2, 2}, 1.0F, cuda);
    const auto result = tensor_ops::flash_attention(heads, heads, heads);
    EXPECT_EQ(result.context.backend(), cuda);
    EXPECT_EQ(result.context.to_host(), std::vector<float>(4, 1.0F));
}

}  // namespace
}  // namespace riftco_transformer
