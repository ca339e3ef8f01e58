// Backend identities, availability, the thread-local construction default and the fixed
// registry (docs/ARCHITECTURE.md, 'The backend seam'), in the shipped build where only the CPU
// runs: Metal, CUDA, TPU and PJRT are unavailable stubs. Rules that need a second available backend
// live in test_emulated_backend.cpp.
//
// A cuda build on a machine with a visible device is the exception: there CUDA is available,
// so the unavailable-stub assertions use the other stubs (saying so), and the CUDA-specific
// ones check the available behaviour instead. Without the adapter, or without a device, every
// assertion is the unavailable contract as before.
#include <gtest/gtest.h>

#include <array>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "support/cuda_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr auto unknown_backend = static_cast<ExecutionBackend>(99);

// The first value past the last identity (Pjrt = 4).
constexpr auto first_unassigned_backend = static_cast<ExecutionBackend>(5);

constexpr std::array<ExecutionBackend, 4> accelerators = {
    ExecutionBackend::Metal, ExecutionBackend::Cuda, ExecutionBackend::Tpu, ExecutionBackend::Pjrt};

// True in a cuda build where a device is visible (the only build in which an accelerator of
// this suite is available).
bool cuda_device_visible() {
    return execution_backend_available(ExecutionBackend::Cuda);
}

// The accelerators that are unavailable stubs here: all four, less CUDA where a device is
// visible (its available behaviour is CudaDevice.* below and the test_cuda_* suites).
std::vector<ExecutionBackend> stub_backends() {
    std::vector<ExecutionBackend> stubs;
    for (const ExecutionBackend backend : accelerators) {
        if (backend == ExecutionBackend::Cuda && cuda_device_visible()) {
            std::cout << "[   NOTE   ] a CUDA device is visible: cuda's unavailable-stub "
                         "assertions are skipped in this test\n";
            continue;
        }
        stubs.push_back(backend);
    }
    return stubs;
}

// An accelerator that is unavailable here: CUDA, as always, unless a device is visible
// (then Metal, never available in the shipped library).
ExecutionBackend unavailable_accelerator() {
    if (cuda_device_visible()) {
        std::cout << "[   NOTE   ] a CUDA device is visible: this test uses the metal stub "
                     "instead of cuda\n";
        return ExecutionBackend::Metal;
    }
    return ExecutionBackend::Cuda;
}

// Leaves every test on the process's normal selection even when an assertion fails midway.
class BackendSelection : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_EQ(current_execution_backend(), ExecutionBackend::Cpu); }
    void TearDown() override { set_execution_backend(ExecutionBackend::Cpu); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Stable identities

TEST(BackendIdentity, NumericValuesAreStable) {
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Cpu), 0U);
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Metal), 1U);
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Cuda), 2U);
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Tpu), 3U);
    EXPECT_EQ(static_cast<std::uint32_t>(ExecutionBackend::Pjrt), 4U);
}

TEST(BackendIdentity, NamesAreStableLowerCase) {
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Cpu), "cpu");
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Metal), "metal");
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Cuda), "cuda");
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Tpu), "tpu");
    EXPECT_EQ(execution_backend_name(ExecutionBackend::Pjrt), "pjrt");
}

TEST(BackendIdentity, NameOfUnknownValueIsInvalidArgument) {
    EXPECT_THROW(static_cast<void>(execution_backend_name(unknown_backend)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(execution_backend_name(first_unassigned_backend)),
                 std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Availability

TEST(BackendAvailability, CpuIsAvailableWithEmptyReason) {
    EXPECT_TRUE(execution_backend_available(ExecutionBackend::Cpu));
    EXPECT_TRUE(execution_backend_unavailability_reason(ExecutionBackend::Cpu).empty());
}

TEST(BackendAvailability, StubsAreUnavailableWithANonEmptyReason) {
    for (const ExecutionBackend backend : stub_backends()) {
        SCOPED_TRACE(std::string(execution_backend_name(backend)));
        EXPECT_FALSE(execution_backend_available(backend));
        EXPECT_FALSE(execution_backend_unavailability_reason(backend).empty());
    }
}

// Without the PJRT adapter (RIFTCO_TRANSFORMER_ENABLE_TPU=OFF) the reason names the build
// option; a build with it and no plugin named names the plugin variable. The build's option
// is compiled in (tests/CMakeLists.txt), so this holds however the suite is run.
constexpr std::string_view pjrt_reason_fragment = RIFTCO_TRANSFORMER_HAVE_PJRT
                                                      ? "RIFTCO_TRANSFORMER_PJRT_PLUGIN"
                                                      : "RIFTCO_TRANSFORMER_ENABLE_TPU";

TEST(BackendAvailability, PjrtIsUnavailableInTheDefaultBuildNamingItsBuildOption) {
    if (execution_backend_available(ExecutionBackend::Pjrt))
        GTEST_SKIP() << "a PJRT plugin is loaded here";
    const std::string reason(execution_backend_unavailability_reason(ExecutionBackend::Pjrt));
    EXPECT_NE(reason.find("PJRT"), std::string::npos) << reason;
    EXPECT_NE(reason.find(pjrt_reason_fragment), std::string::npos) << reason;
}

TEST(BackendAvailability, UnknownValueIsUnavailableWithEmptyReason) {
    for (const ExecutionBackend backend : {unknown_backend, first_unassigned_backend}) {
        EXPECT_FALSE(execution_backend_available(backend));
        EXPECT_TRUE(execution_backend_unavailability_reason(backend).empty());
    }
}

TEST(BackendAvailability, ReasonIsProcessLifetimeText) {
    // Two queries return the same characters at the same address (no temporaries).
    const ExecutionBackend backend = unavailable_accelerator();
    const std::string_view first = execution_backend_unavailability_reason(backend);
    const std::string_view second = execution_backend_unavailability_reason(backend);
    EXPECT_FALSE(first.empty());
    EXPECT_EQ(first.data(), second.data());
    EXPECT_EQ(first, second);
}

// ---------------------------------------------------------------------------------------------
// The thread-local construction default

TEST_F(BackendSelection, EveryThreadStartsOnCpu) {
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    ExecutionBackend seen = ExecutionBackend::Tpu;
    std::thread worker([&] { seen = current_execution_backend(); });
    worker.join();
    EXPECT_EQ(seen, ExecutionBackend::Cpu);
}

TEST_F(BackendSelection, SelectingCpuSucceeds) {
    set_execution_backend(ExecutionBackend::Cpu);
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
}

TEST_F(BackendSelection, SelectingAnUnavailableBackendIsBackendUnavailableErrorWithTheReason) {
    for (const ExecutionBackend backend : stub_backends()) {
        SCOPED_TRACE(std::string(execution_backend_name(backend)));
        try {
            set_execution_backend(backend);
            ADD_FAILURE() << "set_execution_backend did not throw";
        } catch (const BackendUnavailableError& error) {
            static_assert(std::is_base_of_v<std::runtime_error, BackendUnavailableError>);
            EXPECT_EQ(error.backend(), backend);
            const std::string reason(execution_backend_unavailability_reason(backend));
            EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << error.what();
        }
        EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    }
}

TEST_F(BackendSelection, SelectingPjrtIsBackendUnavailableErrorAndKeepsTheSelection) {
    if (execution_backend_available(ExecutionBackend::Pjrt))
        GTEST_SKIP() << "a PJRT plugin is loaded here";
    try {
        set_execution_backend(ExecutionBackend::Pjrt);
        ADD_FAILURE() << "set_execution_backend(Pjrt) did not throw";
    } catch (const BackendUnavailableError& error) {
        EXPECT_EQ(error.backend(), ExecutionBackend::Pjrt);
        const std::string message = error.what();
        EXPECT_NE(message.find("'pjrt'"), std::string::npos) << message;
        EXPECT_NE(message.find(pjrt_reason_fragment), std::string::npos) << message;
    }
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    EXPECT_THROW(ScopedExecutionBackend guard(ExecutionBackend::Pjrt), BackendUnavailableError);
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
}

TEST_F(BackendSelection, SelectingAnUnknownValueIsInvalidArgumentAndKeepsTheSelection) {
    for (const ExecutionBackend backend : {unknown_backend, first_unassigned_backend}) {
        EXPECT_THROW(set_execution_backend(backend), std::invalid_argument);
        EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    }
}

TEST_F(BackendSelection, ScopedGuardForAnUnavailableBackendThrowsAndKeepsTheSelection) {
    EXPECT_THROW(ScopedExecutionBackend guard(unavailable_accelerator()), std::runtime_error);
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    EXPECT_THROW(ScopedExecutionBackend guard(unknown_backend), std::invalid_argument);
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    // A failed guard left no trace: a properly nested guard still works afterwards.
    { const ScopedExecutionBackend guard(ExecutionBackend::Cpu); }
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
}

TEST_F(BackendSelection, NestedScopedGuardsRestoreInReverseOrder) {
    {
        const ScopedExecutionBackend outer(ExecutionBackend::Cpu);
        EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
        {
            const ScopedExecutionBackend inner(ExecutionBackend::Cpu);
            EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
            EXPECT_THROW(ScopedExecutionBackend failing(ExecutionBackend::Tpu), std::runtime_error);
        }
        EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    }
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
}

TEST(BackendSelectionDeathTest, GuardDestroyedOutOfOrderAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            auto outer = std::make_unique<ScopedExecutionBackend>(ExecutionBackend::Cpu);
            auto inner = std::make_unique<ScopedExecutionBackend>(ExecutionBackend::Cpu);
            outer.reset();  // inner is still alive: not reverse order
            inner.reset();
        },
        "reverse order");
}

TEST(BackendSelectionDeathTest, GuardDestroyedOnAnotherThreadAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            auto guard = std::make_unique<ScopedExecutionBackend>(ExecutionBackend::Cpu);
            std::thread other([&] { guard.reset(); });
            other.join();
        },
        "thread other than");
}

// ---------------------------------------------------------------------------------------------
// Tensors and operations on unavailable backends

TEST(BackendTensors, CreatingATensorOnAnUnavailableBackendIsBackendUnavailableError) {
    for (const ExecutionBackend backend : stub_backends()) {
        SCOPED_TRACE(std::string(execution_backend_name(backend)));
        EXPECT_THROW(Tensor(Shape{2, 2}, backend), BackendUnavailableError);
        EXPECT_THROW(Tensor(Shape{2}, {1.0F, 2.0F}, backend), BackendUnavailableError);
        EXPECT_THROW(static_cast<void>(Tensor::full({2}, 1.0F, backend)), BackendUnavailableError);
    }
}

TEST(BackendTensors, TransferToAnUnavailableBackendIsBackendUnavailableErrorAndKeepsTheSource) {
    const Tensor source(Shape{2}, {1.0F, 2.0F});
    for (const ExecutionBackend backend : stub_backends()) {
        EXPECT_THROW(static_cast<void>(source.to(backend)), BackendUnavailableError);
    }
    EXPECT_EQ(source.backend(), ExecutionBackend::Cpu);
    EXPECT_TRUE(testing::bit_identical(source.to_host(), {1.0F, 2.0F}));
}

TEST(BackendTensors, OperationResultsStayOnCpu) {
    const Tensor x(Shape{2, 2}, {1.0F, 2.0F, 3.0F, 4.0F});
    EXPECT_EQ(tensor_ops::add(x, x).backend(), ExecutionBackend::Cpu);
    EXPECT_EQ(tensor_ops::sum(x).backend(), ExecutionBackend::Cpu);
    EXPECT_EQ(tensor_ops::matmul(x, x).backend(), ExecutionBackend::Cpu);
    EXPECT_EQ(tensor_ops::transpose_2d(x).backend(), ExecutionBackend::Cpu);
}

TEST(BackendTensors, ExplicitMatmulOnAnUnavailableBackendIsRuntimeError) {
    const Tensor x(Shape{2, 2}, {1.0F, 2.0F, 3.0F, 4.0F});
    for (const ExecutionBackend backend : stub_backends()) {
        EXPECT_THROW(static_cast<void>(tensor_ops::matmul(x, x, backend)), std::runtime_error);
    }
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(x, x, unknown_backend)),
                 std::invalid_argument);
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
}

TEST(CudaDevice, CudaDeviceSmoke) {
    if (!execution_backend_available(ExecutionBackend::Cuda)) {
#if RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA
        FAIL() << "RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA is set but CUDA is unavailable: "
               << execution_backend_unavailability_reason(ExecutionBackend::Cuda);
#else
        GTEST_SKIP() << "CUDA unavailable: "
                     << execution_backend_unavailability_reason(ExecutionBackend::Cuda);
#endif
    }
    // A round trip and one matmul on the device, returned on the device.
    const Tensor left(Shape{2, 3}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F}, ExecutionBackend::Cuda);
    const Tensor right(Shape{3, 2}, {7.0F, 8.0F, 9.0F, 10.0F, 11.0F, 12.0F},
                       ExecutionBackend::Cuda);
    EXPECT_EQ(left.backend(), ExecutionBackend::Cuda);
    EXPECT_TRUE(testing::bit_identical(left.to_host(), {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F}));
    const Tensor product = tensor_ops::matmul(left, right);
    EXPECT_EQ(product.backend(), ExecutionBackend::Cuda);
    EXPECT_TRUE(testing::all_close(product, {58.0, 64.0, 139.0, 154.0}, 3e-4, 3e-4));
}

TEST(CudaDevice, CudaAdapterProvidesTheCapabilitiesWhereADeviceIsVisible) {
    RIFTCO_REQUIRE_CUDA_DEVICE();
    const detail::BackendAdapter* cuda = detail::find_backend_adapter(ExecutionBackend::Cuda);
    ASSERT_NE(cuda, nullptr);
    EXPECT_TRUE(cuda->is_available());
    EXPECT_TRUE(cuda->unavailability_reason().empty());
    EXPECT_NE(cuda->storage(), nullptr);
    EXPECT_NE(cuda->layout(), nullptr);
    EXPECT_NE(cuda->elementwise(), nullptr);
    EXPECT_NE(cuda->reduction(), nullptr);
    EXPECT_NE(cuda->matmul(), nullptr);
    EXPECT_NE(cuda->softmax(), nullptr);
    EXPECT_NE(cuda->indexing(), nullptr);
    EXPECT_NE(cuda->normalization(), nullptr);
    EXPECT_NE(cuda->loss(), nullptr);
    EXPECT_NE(cuda->attention(), nullptr);
    EXPECT_NE(cuda->paged_attention(), nullptr);
    EXPECT_NE(cuda->quantized_linear(), nullptr);
    EXPECT_NE(cuda->adam(), nullptr);
    // Selecting it works like selecting the CPU, and a guard restores the CPU.
    {
        const ScopedExecutionBackend guard(ExecutionBackend::Cuda);
        EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cuda);
        EXPECT_EQ(Tensor(Shape{2}).backend(), ExecutionBackend::Cuda);
    }
    EXPECT_EQ(current_execution_backend(), ExecutionBackend::Cpu);
    // A transfer keeps the source and brings the values back bit for bit.
    const Tensor source(Shape{2}, {1.0F, 2.0F});
    const Tensor moved = source.to(ExecutionBackend::Cuda);
    EXPECT_EQ(moved.backend(), ExecutionBackend::Cuda);
    EXPECT_EQ(source.backend(), ExecutionBackend::Cpu);
    EXPECT_TRUE(testing::bit_identical(moved.to_host(), {1.0F, 2.0F}));
}

TEST(TpuDevice, TpuDeviceSmoke) {
    if (!execution_backend_available(ExecutionBackend::Tpu)) {
#if RIFTCO_TRANSFORMER_TEST_REQUIRE_TPU
        FAIL() << "RIFTCO_TRANSFORMER_TEST_REQUIRE_TPU is set but the TPU is unavailable: "
               << execution_backend_unavailability_reason(ExecutionBackend::Tpu);
#else
        GTEST_SKIP() << "TPU unavailable: "
                     << execution_backend_unavailability_reason(ExecutionBackend::Tpu);
#endif
    }
    const Tensor x(Shape{2}, {1.0F, 2.0F}, ExecutionBackend::Tpu);
    EXPECT_EQ(x.backend(), ExecutionBackend::Tpu);
    EXPECT_TRUE(testing::all_close(tensor_ops::add(x, x), {2.0, 4.0}, 1e-3, 1e-3));
}

// ---------------------------------------------------------------------------------------------
// The registry (private adapter table)

TEST(BackendRegistry, OneAdapterPerValueReportingItsOwnIdentity) {
    const std::array<ExecutionBackend, 5> all = {ExecutionBackend::Cpu, ExecutionBackend::Metal,
                                                 ExecutionBackend::Cuda, ExecutionBackend::Tpu,
                                                 ExecutionBackend::Pjrt};
    std::vector<const detail::BackendAdapter*> seen;
    for (const ExecutionBackend backend : all) {
        const detail::BackendAdapter* adapter = detail::find_backend_adapter(backend);
        ASSERT_NE(adapter, nullptr);
        EXPECT_EQ(adapter->backend(), backend);
        EXPECT_EQ(adapter->name(), execution_backend_name(backend));
        EXPECT_EQ(adapter->is_available(), execution_backend_available(backend));
        EXPECT_EQ(adapter->unavailability_reason(),
                  execution_backend_unavailability_reason(backend));
        // Deterministic: the same adapter every time.
        EXPECT_EQ(detail::find_backend_adapter(backend), adapter);
        for (const detail::BackendAdapter* other : seen)
            EXPECT_NE(other, adapter);
        seen.push_back(adapter);
    }
}

TEST(BackendRegistry, UnknownValueHasNoAdapter) {
    EXPECT_EQ(detail::find_backend_adapter(unknown_backend), nullptr);
    EXPECT_EQ(detail::find_backend_adapter(first_unassigned_backend), nullptr);
}

TEST(BackendRegistry, CpuAdapterProvidesTheCoreCapabilities) {
    const detail::BackendAdapter* cpu = detail::find_backend_adapter(ExecutionBackend::Cpu);
    ASSERT_NE(cpu, nullptr);
    EXPECT_TRUE(cpu->is_available());
    EXPECT_TRUE(cpu->unavailability_reason().empty());
    EXPECT_NE(cpu->storage(), nullptr);
    EXPECT_NE(cpu->layout(), nullptr);
    EXPECT_NE(cpu->elementwise(), nullptr);
    EXPECT_NE(cpu->reduction(), nullptr);
    EXPECT_NE(cpu->matmul(), nullptr);
    EXPECT_NE(cpu->softmax(), nullptr);
    EXPECT_NE(cpu->indexing(), nullptr);
    EXPECT_NE(cpu->normalization(), nullptr);
    EXPECT_NE(cpu->loss(), nullptr);
}

TEST(BackendRegistry, StubAdaptersProvideNoCapability) {
    for (const ExecutionBackend backend : stub_backends()) {
        SCOPED_TRACE(std::string(execution_backend_name(backend)));
        const detail::BackendAdapter* stub = detail::find_backend_adapter(backend);
        ASSERT_NE(stub, nullptr);
        EXPECT_FALSE(stub->is_available());
        EXPECT_FALSE(stub->unavailability_reason().empty());
        EXPECT_EQ(stub->storage(), nullptr);
        EXPECT_EQ(stub->layout(), nullptr);
        EXPECT_EQ(stub->elementwise(), nullptr);
        EXPECT_EQ(stub->reduction(), nullptr);
        EXPECT_EQ(stub->matmul(), nullptr);
        EXPECT_EQ(stub->softmax(), nullptr);
        EXPECT_EQ(stub->indexing(), nullptr);
        EXPECT_EQ(stub->normalization(), nullptr);
        EXPECT_EQ(stub->loss(), nullptr);
        EXPECT_EQ(stub->attention(), nullptr);
        EXPECT_EQ(stub->quantized_linear(), nullptr);
        EXPECT_EQ(stub->adam(), nullptr);
    }
}

TEST(BackendRegistry, RequireAvailableAdapterReportsTheCategoryAndReason) {
    EXPECT_EQ(&detail::require_available_adapter(ExecutionBackend::Cpu, "test"),
              detail::find_backend_adapter(ExecutionBackend::Cpu));
    EXPECT_THROW(static_cast<void>(detail::require_available_adapter(unknown_backend, "test")),
                 std::invalid_argument);
    try {
        static_cast<void>(detail::require_available_adapter(ExecutionBackend::Tpu, "test"));
        ADD_FAILURE() << "require_available_adapter(Tpu) did not throw";
    } catch (const std::runtime_error& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("tpu"), std::string::npos) << message;
        EXPECT_NE(message.find(
                      std::string(execution_backend_unavailability_reason(ExecutionBackend::Tpu))),
                  std::string::npos)
            << message;
    }
}

TEST(BackendRegistry, MissingCapabilityIsRuntimeError) {
    const detail::BackendAdapter* stub = detail::find_backend_adapter(unavailable_accelerator());
    ASSERT_NE(stub, nullptr);
    EXPECT_THROW(
        static_cast<void>(detail::require_capability(stub->matmul(), *stub, "matmul", "matmul")),
        std::runtime_error);
}

// ---------------------------------------------------------------------------------------------
// CPU thread pool (RIFTCO_TRANSFORMER_NUM_THREADS is read once per process, so only the
// explicit override is exercised here)

TEST(CpuThreads, ThreadCountIsAtLeastOne) {
    EXPECT_GE(cpu_thread_count(), 1U);
}

TEST(CpuThreads, ZeroThreadsIsInvalidArgumentAndKeepsTheCount) {
    const std::size_t before = cpu_thread_count();
    EXPECT_THROW(set_cpu_thread_count(0), std::invalid_argument);
    EXPECT_EQ(cpu_thread_count(), before);
}

TEST(CpuThreads, ExplicitCountIsReportedBack) {
    const std::size_t before = cpu_thread_count();
    set_cpu_thread_count(1);
    EXPECT_EQ(cpu_thread_count(), 1U);
    set_cpu_thread_count(3);
    EXPECT_EQ(cpu_thread_count(), 3U);
    set_cpu_thread_count(before);
    EXPECT_EQ(cpu_thread_count(), before);
}

}  // namespace riftco_transformer
