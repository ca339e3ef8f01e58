// Rules that need two available backends (docs/ARCHITECTURE.md, 'Tensors' and 'Tensor operations'),
// exercised against the test-only library variant in which ExecutionBackend::Metal is an emulated
// device: host memory and the CPU kernels, but its own storage identity. Covers transfers,
// mixed-backend rejection, results keeping the inputs' backend, explicit matmul execution backends,
// and the thread-local construction default when a non-CPU backend is selected.
//
// CUDA is the third, unavailable, backend of these rules, except in a cuda build where a device
// is visible: there the CUDA assertions check the available behaviour and the unavailable ones
// use the TPU stub (saying so). Elsewhere every assertion is exactly the unavailable contract.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

const std::vector<float> left_values = {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F};      // [2,3]
const std::vector<float> right_values = {7.0F, 8.0F, 9.0F, 10.0F, 11.0F, 12.0F};  // [3,2]
// [[1,2,3],[4,5,6]]·[[7,8],[9,10],[11,12]] by hand.
const std::vector<double> product_values = {58.0, 64.0, 139.0, 154.0};

Tensor left_on(ExecutionBackend backend) {
    return Tensor({2, 3}, std::span<const float>(left_values), backend);
}
Tensor right_on(ExecutionBackend backend) {
    return Tensor({3, 2}, std::span<const float>(right_values), backend);
}

// True only in a cuda build where a device is visible (see the file comment).
bool cuda_device_visible() {
    const bool visible = execution_backend_available(ExecutionBackend::Cuda);
    if (visible) {
        std::cout << "[   NOTE   ] a CUDA device is visible: cuda is checked as available and "
                     "the tpu stub stands in for an unavailable backend\n";
    }
    return visible;
}

// Every test starts and ends with the thread on the CPU, even after a failed assertion.
class EmulatedBackend : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_EQ(current_execution_backend(), cpu); }
    void TearDown() override { set_execution_backend(cpu); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The emulated device is a real second backend

TEST_F(EmulatedBackend, MetalIsAvailableWithEmptyReason) {
    EXPECT_TRUE(execution_backend_available(metal));
    EXPECT_TRUE(execution_backend_unavailability_reason(metal).empty());
    EXPECT_EQ(execution_backend_name(metal), "metal");
    // The other accelerators are still stubs in this variant (CUDA only without a device).
    if (cuda_device_visible()) {
        EXPECT_TRUE(execution_backend_unavailability_reason(ExecutionBackend::Cuda).empty());
    } else {
        EXPECT_FALSE(execution_backend_available(ExecutionBackend::Cuda));
    }
    EXPECT_FALSE(execution_backend_available(ExecutionBackend::Tpu));
    EXPECT_FALSE(execution_backend_available(ExecutionBackend::Pjrt));
}

TEST_F(EmulatedBackend, MetalAdapterIsDistinctFromTheCpuAdapter) {
    const detail::BackendAdapter* metal_adapter = detail::find_backend_adapter(metal);
    const detail::BackendAdapter* cpu_adapter = detail::find_backend_adapter(cpu);
    ASSERT_NE(metal_adapter, nullptr);
    ASSERT_NE(cpu_adapter, nullptr);
    EXPECT_NE(metal_adapter, cpu_adapter);
    EXPECT_EQ(metal_adapter->backend(), metal);
    EXPECT_EQ(metal_adapter->name(), "metal");
    EXPECT_NE(metal_adapter->storage(), nullptr);
    EXPECT_NE(metal_adapter->matmul(), nullptr);
}

TEST_F(EmulatedBackend, TensorsCreatedOnMetalReportMetal) {
    EXPECT_EQ(Tensor(Shape{2}, metal).backend(), metal);
    EXPECT_EQ(Tensor(Shape{2}, 1.0F, metal).backend(), metal);
    EXPECT_EQ(left_on(metal).backend(), metal);
    EXPECT_EQ(Tensor::zeros({2}, metal).backend(), metal);
    EXPECT_EQ(Tensor::full({2}, 3.0F, metal).backend(), metal);
    EXPECT_EQ(Tensor::scalar(3.0F, metal).backend(), metal);
    EXPECT_TRUE(testing::bit_identical(left_on(metal).to_host(), left_values));
    EXPECT_TRUE(testing::bit_identical(Tensor::full({2}, 3.0F, metal).to_host(), {3.0F, 3.0F}));
}

// ---------------------------------------------------------------------------------------------
// Transfers

TEST_F(EmulatedBackend, ToMetalIsADeepCopyWithEqualValues) {
    Tensor source = left_on(cpu);
    Tensor moved = source.to(metal);
    EXPECT_EQ(moved.backend(), metal);
    EXPECT_EQ(source.backend(), cpu);
    EXPECT_EQ(moved.shape(), (Shape{2, 3}));
    EXPECT_TRUE(testing::bit_identical(moved.to_host(), left_values));

    source.set_flat(0, -1.0F);
    EXPECT_EQ(moved.flat(0), 1.0F);
    moved.set_flat(1, -2.0F);
    EXPECT_EQ(source.flat(1), 2.0F);
}

TEST_F(EmulatedBackend, ToCpuFromMetalIsADeepCopyWithEqualValues) {
    Tensor source = left_on(metal);
    Tensor moved = source.to(cpu);
    EXPECT_EQ(moved.backend(), cpu);
    EXPECT_EQ(source.backend(), metal);
    EXPECT_TRUE(testing::bit_identical(moved.to_host(), left_values));
    moved.copy_from_host(std::vector<float>(6, 0.0F));
    EXPECT_TRUE(testing::bit_identical(source.to_host(), left_values));
    source.set_flat(5, 60.0F);
    EXPECT_TRUE(testing::bit_identical(moved.to_host(), std::vector<float>(6, 0.0F)));
}

TEST_F(EmulatedBackend, RoundTripCpuMetalCpuKeepsValuesBitForBit) {
    const std::vector<float> values = testing::pseudo_random(97, -1e3F, 1e3F);
    const Tensor source({97}, std::span<const float>(values));
    const Tensor back = source.to(metal).to(cpu);
    EXPECT_EQ(back.backend(), cpu);
    EXPECT_TRUE(testing::bit_identical(back.to_host(), values));
}

TEST_F(EmulatedBackend, ToMetalFromMetalIsAnIndependentValue) {
    Tensor source = left_on(metal);
    Tensor copy = source.to(metal);
    EXPECT_EQ(copy.backend(), metal);
    copy.set_flat(0, 100.0F);
    EXPECT_EQ(source.flat(0), 1.0F);
    source.set_flat(2, 300.0F);
    EXPECT_EQ(copy.flat(2), 3.0F);
}

TEST_F(EmulatedBackend, CopiesOfMetalTensorsStayOnMetalAndAreIndependent) {
    Tensor source = left_on(metal);
    Tensor copy = source;
    EXPECT_EQ(copy.backend(), metal);
    copy.set_flat(0, 9.0F);
    EXPECT_EQ(copy.backend(), metal);
    EXPECT_EQ(source.flat(0), 1.0F);
    const Tensor reshaped = source.reshape({6});
    EXPECT_EQ(reshaped.backend(), metal);
}

// ---------------------------------------------------------------------------------------------
// Mixed backends are invalid_argument; inputs are unchanged

TEST_F(EmulatedBackend, BinaryElementwiseRejectsMixedBackendsWithoutChangingInputs) {
    const Tensor on_cpu = left_on(cpu);
    const Tensor on_metal = left_on(metal);
    EXPECT_THROW(static_cast<void>(tensor_ops::add(on_cpu, on_metal)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::subtract(on_metal, on_cpu)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::multiply(on_cpu, on_metal)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::divide(on_metal, on_cpu)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::gelu_backward(on_cpu, on_metal)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::relu_backward(on_metal, on_cpu)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::silu_backward(on_cpu, on_metal)),
                 std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(on_cpu.to_host(), left_values));
    EXPECT_TRUE(testing::bit_identical(on_metal.to_host(), left_values));
}

TEST_F(EmulatedBackend, MixedBackendsAreReportedBeforeShapeMismatch) {
    // Both rules are invalid_argument; the message must name the backends.
    const Tensor on_cpu(Shape{2}, 1.0F, cpu);
    const Tensor on_metal(Shape{3}, 1.0F, metal);
    try {
        static_cast<void>(tensor_ops::add(on_cpu, on_metal));
        ADD_FAILURE() << "add did not throw";
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("cpu"), std::string::npos) << message;
        EXPECT_NE(message.find("metal"), std::string::npos) << message;
    }
}

TEST_F(EmulatedBackend, MatmulRejectsMixedBackendsWithoutChangingInputs) {
    const Tensor left = left_on(cpu);
    const Tensor right = right_on(metal);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, right)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, right, false, false)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, right, cpu)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, right, metal)), std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(left.to_host(), left_values));
    EXPECT_TRUE(testing::bit_identical(right.to_host(), right_values));
    EXPECT_EQ(left.backend(), cpu);
    EXPECT_EQ(right.backend(), metal);
}

TEST_F(EmulatedBackend, ConcatenateRejectsMixedBackendsWithoutChangingInputs) {
    const Tensor first(Shape{2, 1}, {1.0F, 2.0F}, cpu);
    const Tensor second(Shape{2, 2}, {3.0F, 4.0F, 5.0F, 6.0F}, metal);
    const Tensor third(Shape{2, 1}, {7.0F, 8.0F}, cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::concatenate_last_axis(first, second)),
                 std::invalid_argument);
    const std::vector<Tensor> inputs = {first, third, second};
    EXPECT_THROW(static_cast<void>(tensor_ops::concatenate_last_axis(inputs)),
                 std::invalid_argument);
    EXPECT_TRUE(testing::bit_identical(first.to_host(), {1.0F, 2.0F}));
    EXPECT_TRUE(testing::bit_identical(second.to_host(), {3.0F, 4.0F, 5.0F, 6.0F}));
    EXPECT_TRUE(testing::bit_identical(third.to_host(), {7.0F, 8.0F}));
}

// ---------------------------------------------------------------------------------------------
// Results keep the inputs' backend

TEST_F(EmulatedBackend, ElementwiseResultsStayOnMetal) {
    const Tensor x = left_on(metal);
    const Tensor added = tensor_ops::add(x, x);
    EXPECT_EQ(added.backend(), metal);
    EXPECT_TRUE(testing::all_close(added, {2.0, 4.0, 6.0, 8.0, 10.0, 12.0}));
    EXPECT_EQ(tensor_ops::divide(x, x).backend(), metal);
    EXPECT_EQ(tensor_ops::scale(x, 2.0F).backend(), metal);
    EXPECT_EQ(tensor_ops::add_scalar(x, 2.0F).backend(), metal);
    EXPECT_EQ(tensor_ops::exp(x).backend(), metal);
    EXPECT_EQ(tensor_ops::gelu(x).backend(), metal);
    EXPECT_EQ(tensor_ops::relu_backward(x, x).backend(), metal);
    EXPECT_EQ(tensor_ops::silu(x).backend(), metal);
}

TEST_F(EmulatedBackend, LayoutResultsStayOnMetal) {
    const Tensor x = left_on(metal);
    const Tensor transposed = tensor_ops::transpose_2d(x);
    EXPECT_EQ(transposed.backend(), metal);
    EXPECT_TRUE(testing::all_close(transposed, {1.0, 4.0, 2.0, 5.0, 3.0, 6.0}));
    EXPECT_EQ(tensor_ops::permute(x, {1, 0}).backend(), metal);
    EXPECT_EQ(tensor_ops::reshape(x, {6}).backend(), metal);
    EXPECT_EQ(tensor_ops::broadcast_to(x, {4, 2, 3}).backend(), metal);
    EXPECT_EQ(tensor_ops::sum_to_shape(x, {3}).backend(), metal);
    EXPECT_EQ(tensor_ops::concatenate_last_axis(x, x).backend(), metal);
    EXPECT_EQ(tensor_ops::slice(x, 1, 1, 2).backend(), metal);
}

TEST_F(EmulatedBackend, ReductionResultsStayOnMetal) {
    const Tensor x = left_on(metal);
    const Tensor total = tensor_ops::sum(x);
    EXPECT_EQ(total.backend(), metal);
    EXPECT_EQ(total.item(), 21.0F);
    EXPECT_EQ(tensor_ops::sum(x, 1).backend(), metal);
    EXPECT_EQ(tensor_ops::mean(x).backend(), metal);
    EXPECT_EQ(tensor_ops::mean(x, 0, true).backend(), metal);
}

TEST_F(EmulatedBackend, MatmulResultStaysOnMetal) {
    const Tensor product = tensor_ops::matmul(left_on(metal), right_on(metal));
    EXPECT_EQ(product.backend(), metal);
    EXPECT_TRUE(testing::all_close(product, product_values));
    const Tensor transposed = tensor_ops::matmul(right_on(metal), right_on(metal), true, false);
    EXPECT_EQ(transposed.backend(), metal);
}

// ---------------------------------------------------------------------------------------------
// Explicit matmul execution backend

TEST_F(EmulatedBackend, ExplicitExecutionOnMetalReturnsOnTheInputsCpuBackend) {
    const Tensor left = left_on(cpu);
    const Tensor right = right_on(cpu);
    const Tensor product = tensor_ops::matmul(left, right, metal);
    EXPECT_EQ(product.backend(), cpu);
    EXPECT_EQ(product.shape(), (Shape{2, 2}));
    EXPECT_TRUE(testing::all_close(product, product_values));
    EXPECT_EQ(current_execution_backend(), cpu);
    EXPECT_TRUE(testing::bit_identical(left.to_host(), left_values));
    EXPECT_TRUE(testing::bit_identical(right.to_host(), right_values));
}

TEST_F(EmulatedBackend, ExplicitExecutionOnCpuReturnsOnTheInputsMetalBackend) {
    const Tensor product = tensor_ops::matmul(left_on(metal), right_on(metal), cpu);
    EXPECT_EQ(product.backend(), metal);
    EXPECT_TRUE(testing::all_close(product, product_values));
    EXPECT_EQ(current_execution_backend(), cpu);
}

TEST_F(EmulatedBackend, ExplicitExecutionOnTheInputsBackendMatchesPlainMatmul) {
    const std::vector<float> a = testing::pseudo_random(3 * 5 * 7, -1.0F, 1.0F, 1U);
    const std::vector<float> b = testing::pseudo_random(3 * 7 * 4, -1.0F, 1.0F, 2U);
    const Tensor left({3, 5, 7}, std::span<const float>(a));
    const Tensor right({3, 7, 4}, std::span<const float>(b));
    const Tensor plain = tensor_ops::matmul(left, right);
    const Tensor same = tensor_ops::matmul(left, right, cpu);
    const Tensor staged = tensor_ops::matmul(left, right, metal);
    EXPECT_EQ(same.backend(), cpu);
    EXPECT_EQ(staged.backend(), cpu);
    EXPECT_EQ(staged.shape(), (Shape{3, 5, 4}));
    // Same kernels on both identities, so the staged product equals the plain one.
    EXPECT_TRUE(testing::all_close(same, testing::to_double(plain.to_host()), 2e-4, 2e-4));
    EXPECT_TRUE(testing::all_close(staged, testing::to_double(plain.to_host()), 2e-4, 2e-4));
}

TEST_F(EmulatedBackend, ExplicitExecutionNeverChangesTheThreadSelection) {
    {
        const ScopedExecutionBackend scope(metal);
        const Tensor product = tensor_ops::matmul(left_on(metal), right_on(metal), cpu);
        EXPECT_EQ(product.backend(), metal);
        EXPECT_EQ(current_execution_backend(), metal);
    }
    EXPECT_EQ(current_execution_backend(), cpu);
    const Tensor product = tensor_ops::matmul(left_on(cpu), right_on(cpu), metal);
    EXPECT_EQ(product.backend(), cpu);
    EXPECT_EQ(current_execution_backend(), cpu);
}

TEST_F(EmulatedBackend, ExplicitExecutionValidatesShapesBeforeStaging) {
    const Tensor left = left_on(cpu);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, left, metal)), std::invalid_argument);
    EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, left, ExecutionBackend::Cuda)),
                 std::invalid_argument);
    if (cuda_device_visible()) {
        // Staged through the device, the product comes back on the inputs' backend.
        const Tensor product = tensor_ops::matmul(left, right_on(cpu), ExecutionBackend::Cuda);
        EXPECT_EQ(product.backend(), cpu);
        EXPECT_TRUE(testing::all_close(product, product_values, 3e-4, 3e-4));
        EXPECT_THROW(static_cast<void>(tensor_ops::matmul(left, left, ExecutionBackend::Tpu)),
                     std::invalid_argument);
        EXPECT_THROW(
            static_cast<void>(tensor_ops::matmul(left, right_on(cpu), ExecutionBackend::Tpu)),
            std::runtime_error);
    } else {
        EXPECT_THROW(
            static_cast<void>(tensor_ops::matmul(left, right_on(cpu), ExecutionBackend::Cuda)),
            std::runtime_error);
    }
    EXPECT_TRUE(testing::bit_identical(left.to_host(), left_values));
    EXPECT_EQ(current_execution_backend(), cpu);
}

// ---------------------------------------------------------------------------------------------
// Selecting a non-CPU construction default

TEST_F(EmulatedBackend, SetExecutionBackendToMetalSucceeds) {
    set_execution_backend(metal);
    EXPECT_EQ(current_execution_backend(), metal);
    EXPECT_EQ(Tensor(Shape{2}).backend(), metal);
    set_execution_backend(cpu);
    EXPECT_EQ(current_execution_backend(), cpu);
    EXPECT_EQ(Tensor(Shape{2}).backend(), cpu);
}

TEST_F(EmulatedBackend, FailedSelectionKeepsMetal) {
    set_execution_backend(metal);
    const ExecutionBackend unavailable =
        cuda_device_visible() ? ExecutionBackend::Tpu : ExecutionBackend::Cuda;
    EXPECT_THROW(set_execution_backend(unavailable), std::runtime_error);
    EXPECT_EQ(current_execution_backend(), metal);
    EXPECT_THROW(set_execution_backend(static_cast<ExecutionBackend>(99)), std::invalid_argument);
    EXPECT_EQ(current_execution_backend(), metal);
}

TEST_F(EmulatedBackend, ScopedMetalMakesNewTensorsDefaultToMetal) {
    {
        const ScopedExecutionBackend scope(metal);
        EXPECT_EQ(current_execution_backend(), metal);
        EXPECT_EQ(Tensor(Shape{2}).backend(), metal);
        EXPECT_EQ(Tensor(Shape{2}, 1.0F).backend(), metal);
        EXPECT_EQ(Tensor(Shape{2}, {1.0F, 2.0F}).backend(), metal);
        EXPECT_EQ(Tensor::zeros({2}).backend(), metal);
        EXPECT_EQ(Tensor::full({2}, 1.0F).backend(), metal);
        EXPECT_EQ(Tensor::scalar(1.0F).backend(), metal);
        // An explicit backend still wins over the default.
        EXPECT_EQ(Tensor(Shape{2}, cpu).backend(), cpu);
    }
    EXPECT_EQ(current_execution_backend(), cpu);
    EXPECT_EQ(Tensor(Shape{2}).backend(), cpu);
}

TEST_F(EmulatedBackend, ExistingTensorsKeepTheirBackendWhenTheDefaultChanges) {
    const Tensor on_cpu = left_on(cpu);
    const ScopedExecutionBackend scope(metal);
    EXPECT_EQ(on_cpu.backend(), cpu);
    EXPECT_EQ(tensor_ops::add(on_cpu, on_cpu).backend(), cpu);
    EXPECT_EQ(tensor_ops::matmul(on_cpu, right_on(cpu)).backend(), cpu);
    EXPECT_EQ(Tensor(on_cpu).backend(), cpu);
}

TEST_F(EmulatedBackend, NestedScopedGuardsRestoreEachPreviousSelection) {
    {
        const ScopedExecutionBackend outer(metal);
        EXPECT_EQ(current_execution_backend(), metal);
        {
            const ScopedExecutionBackend inner(cpu);
            EXPECT_EQ(current_execution_backend(), cpu);
            {
                const ScopedExecutionBackend innermost(metal);
                EXPECT_EQ(current_execution_backend(), metal);
            }
            EXPECT_EQ(current_execution_backend(), cpu);
        }
        EXPECT_EQ(current_execution_backend(), metal);
    }
    EXPECT_EQ(current_execution_backend(), cpu);
}

TEST_F(EmulatedBackend, GuardRestoresTheSelectionMadeBeforeIt) {
    set_execution_backend(metal);
    {
        const ScopedExecutionBackend scope(cpu);
        EXPECT_EQ(current_execution_backend(), cpu);
    }
    EXPECT_EQ(current_execution_backend(), metal);
}

TEST_F(EmulatedBackend, NewThreadStartsOnCpuWhileTheParentSelectedMetal) {
    const ScopedExecutionBackend scope(metal);
    ASSERT_EQ(current_execution_backend(), metal);
    ExecutionBackend seen_default = metal;
    ExecutionBackend seen_tensor = metal;
    std::thread worker([&] {
        seen_default = current_execution_backend();
        seen_tensor = Tensor(Shape{1}).backend();
    });
    worker.join();
    EXPECT_EQ(seen_default, cpu);
    EXPECT_EQ(seen_tensor, cpu);
    EXPECT_EQ(current_execution_backend(), metal);
}

TEST_F(EmulatedBackend, SelectionInAThreadDoesNotLeakToTheParent) {
    ExecutionBackend seen = cpu;
    std::thread worker([&] {
        set_execution_backend(metal);
        seen = Tensor(Shape{1}).backend();
    });
    worker.join();
    EXPECT_EQ(seen, metal);
    EXPECT_EQ(current_execution_backend(), cpu);
}

TEST(EmulatedBackendDeathTest, MetalGuardDestroyedOutOfOrderAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            auto outer = std::make_unique<ScopedExecutionBackend>(ExecutionBackend::Metal);
            auto inner = std::make_unique<ScopedExecutionBackend>(ExecutionBackend::Cpu);
            outer.reset();
            inner.reset();
        },
        "reverse order");
}

}  // namespace riftco_transformer
