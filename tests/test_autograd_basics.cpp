// First checks of the autograd engine: a small MLP's gradients against finite differences,
// consumption, staleness and accumulation. (The per-operation suites go deeper.)
#include <gtest/gtest.h>

#include <thread>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

// loss(x, W1, b1, W2) = CE(gelu(x·W1 + b1)·W2, targets)
Variable mlp_loss(const Variable& x, const Variable& w1, const Variable& b1, const Variable& w2,
                  std::span<const std::uint32_t> targets) {
    const Variable hidden = gelu(matmul(x, w1) + broadcast_to(b1, {x.shape()[0], w1.shape()[1]}));
    return cross_entropy(matmul(hidden, w2), targets);
}

}  // namespace

TEST(AutogradBasics, MlpGradientsMatchFiniteDifferences) {
    const std::vector<float> x_values = testing::pseudo_random(4 * 3, -1.0F, 1.0F, 1U);
    const std::vector<float> w1_values = testing::pseudo_random(3 * 5, -1.0F, 1.0F, 2U);
    const std::vector<float> b1_values = testing::pseudo_random(5, -0.5F, 0.5F, 3U);
    const std::vector<float> w2_values = testing::pseudo_random(5 * 6, -1.0F, 1.0F, 4U);
    const std::vector<std::uint32_t> targets = {0, 5, 2, 3};
    Variable x(Tensor({4, 3}, x_values));
    Variable w1(Tensor({3, 5}, w1_values));
    Variable b1(Tensor({5}, b1_values));
    Variable w2(Tensor({5, 6}, w2_values));
    mlp_loss(x, w1, b1, w2, targets).backward();

    const auto loss_with = [&](int which) {
        return [&, which](const std::vector<float>& values) {
            const auto as = [&](int index, const std::vector<float>& original, Shape shape) {
                return Variable(Tensor(std::move(shape), index == which ? values : original),
                                false);
            };
            return static_cast<double>(mlp_loss(as(0, x_values, {4, 3}), as(1, w1_values, {3, 5}),
                                                as(2, b1_values, {5}), as(3, w2_values, {5, 6}),
                                                targets)
                                           .value()
                                           .item());
        };
    };
    EXPECT_TRUE(testing::all_close(
        x.gradient(), testing::finite_difference_gradient(loss_with(0), x_values, 1e-3), 2e-3, 0));
    EXPECT_TRUE(testing::all_close(
        w1.gradient(), testing::finite_difference_gradient(loss_with(1), w1_values, 1e-3), 2e-3,
        0));
    EXPECT_TRUE(testing::all_close(
        b1.gradient(), testing::finite_difference_gradient(loss_with(2), b1_values, 1e-3), 2e-3,
        0));
    EXPECT_TRUE(testing::all_close(
        w2.gradient(), testing::finite_difference_gradient(loss_with(3), w2_values, 1e-3), 2e-3,
        0));
}

TEST(AutogradBasics, SuccessfulBackwardConsumesTheGraph) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable square = x * x;
    Variable y = sum(square);
    EXPECT_FALSE(x.holds_graph());  // a leaf
    EXPECT_TRUE(square.holds_graph() && y.holds_graph());
    y.backward();
    // Every node the pass went through is consumed, the intermediate one included.
    EXPECT_FALSE(y.holds_graph() || square.holds_graph());
    EXPECT_FALSE(Variable().holds_graph());
    EXPECT_TRUE(testing::all_close(x.gradient(), {2.0, 4.0}));
    EXPECT_THROW(y.backward(), std::logic_error);
    EXPECT_TRUE(testing::all_close(x.gradient(), {2.0, 4.0}));
}

TEST(AutogradBasics, RetainedGraphCanBeDifferentiatedAgainAndAccumulate) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable y = sum(x * x);
    y.backward({.accumulate = false, .retain_graph = true});
    y.backward({.accumulate = true, .retain_graph = true});
    EXPECT_TRUE(y.holds_graph());
    EXPECT_TRUE(testing::all_close(x.gradient(), {4.0, 8.0}));
    y.backward({.accumulate = false, .retain_graph = false});
    EXPECT_TRUE(testing::all_close(x.gradient(), {2.0, 4.0}));
}

TEST(AutogradBasics, GradientReadyHookSeesEachLeafOnceWhenItsGradientIsFinal) {
    Variable a(Tensor({2}, {0.5F, -1.0F}));
    Variable b(Tensor({2}, {3.0F, 4.0F}));
    // b feeds only the last product; a feeds the tanh below it and, through b·a, nothing else.
    Variable y = sum(tanh(a * a) * b);
    std::vector<const void*> order;
    std::vector<std::vector<float>> seen;
    y.backward(
        {.retain_graph = true, .gradient_ready = [&](const Variable& leaf, const Tensor& gradient) {
             order.push_back(leaf.node().get());
             seen.push_back(gradient.to_host());
         }});
    ASSERT_EQ(order.size(), 2U);
    EXPECT_EQ(order[0], b.node().get());  // ready right after the product, before tanh's rule
    EXPECT_EQ(order[1], a.node().get());
    EXPECT_TRUE(testing::bit_identical(seen[0], b.gradient().to_host()));
    EXPECT_TRUE(testing::bit_identical(seen[1], a.gradient().to_host()));
    // Under accumulate the hook sees the sum the leaf will hold.
    const std::vector<float> first = a.gradient().to_host();
    seen.clear();
    y.backward({.accumulate = true,
                .retain_graph = true,
                .gradient_ready = [&](const Variable& leaf, const Tensor& gradient) {
                    if (leaf.node() == a.node())
                        seen.push_back(gradient.to_host());
                }});
    ASSERT_EQ(seen.size(), 1U);
    EXPECT_TRUE(testing::bit_identical(seen[0], a.gradient().to_host()));
    EXPECT_FLOAT_EQ(seen[0][0], 2.0F * first[0]);
    // A hook that throws fails the pass: nothing is published.
    const std::vector<float> before = a.gradient().to_host();
    EXPECT_THROW(y.backward({.gradient_ready =
                                 [](const Variable&, const Tensor&) {
                                     throw std::runtime_error("hook failed");
                                 }}),
                 std::runtime_error);
    EXPECT_TRUE(testing::bit_identical(a.gradient().to_host(), before));
    // The hook may change the gradient it is given; what it leaves is published, and a
    // gradient of another shape fails the pass with nothing published.
    Variable c(Tensor({2}, {1.0F, 2.0F}));
    Variable z = sum(c * c);
    z.backward({.retain_graph = true, .gradient_ready = [](const Variable&, Tensor& gradient) {
                    gradient = tensor_ops::add(gradient, gradient);
                }});
    EXPECT_TRUE(testing::all_close(c.gradient(), {4.0, 8.0}));
    EXPECT_THROW(z.backward({.gradient_ready =
                                 [](const Variable&, Tensor& gradient) {
                                     gradient = Tensor({3}, {1.0F, 1.0F, 1.0F});
                                 }}),
                 std::invalid_argument);
    EXPECT_TRUE(testing::all_close(c.gradient(), {4.0, 8.0}));
}

TEST(AutogradBasics, StaleInputIsLogicErrorAndGradientsStayUnchanged) {
    Variable x(Tensor({2}, {1.0F, 2.0F}));
    Variable w(Tensor({2}, {3.0F, 4.0F}));
    sum(x * w).backward();
    Variable y = sum(x * w);
    w.set_value(Tensor({2}, {5.0F, 6.0F}));
    EXPECT_THROW(y.backward(), std::logic_error);
    EXPECT_TRUE(testing::all_close(x.gradient(), {3.0, 4.0}));
    EXPECT_FALSE(w.has_gradient());  // set_value cleared it, the failed pass published nothing
}

TEST(AutogradBasics, FrozenWeightGetsNoGradientProduct) {
    Variable x(Tensor({2, 3}, 1.0F));
    Variable w(Tensor({3, 4}, 0.5F));
    w.set_requires_gradient(false);
    reset_autograd_counters();
    sum(matmul(x, w)).backward();
    EXPECT_EQ(autograd_counters().matmul_right_gradients, 0U);
    EXPECT_EQ(autograd_counters().matmul_left_gradients, 1U);
    EXPECT_THROW(static_cast<void>(w.gradient()), std::logic_error);
}

TEST(AutogradBasics, DeepChainDoesNotOverflowTheStack) {
    Variable x(Tensor({1}, {1.0F}));
    Variable y = x;
    for (int i = 0; i < 10000; ++i)
        y = y * 1.0F + 0.0F;
    sum(y).backward();
    EXPECT_TRUE(testing::all_close(x.gradient(), {1.0}));
    Variable z = x;
    for (int i = 0; i < 100000; ++i)
        z = -z;
    z = Variable();  // freeing a 100,000-node chain must not recurse
}

TEST(AutogradBasics, CheckpointMatchesPlainGradients) {
    const std::vector<float> w_values = testing::pseudo_random(9, -1.0F, 1.0F, 5U);
    const std::vector<float> x_values = testing::pseudo_random(6, -1.0F, 1.0F, 6U);
    Variable w(Tensor({3, 3}, w_values));
    Variable x(Tensor({2, 3}, x_values));
    const auto block = [&w](const Variable& input) { return gelu(matmul(input, w)) + input; };
    sum(block(block(x))).backward();
    const std::vector<float> plain_w = w.gradient().to_host();
    const std::vector<float> plain_x = x.gradient().to_host();
    const Variable deps[] = {w};
    sum(checkpoint(checkpoint(x, deps, block), deps, block)).backward();
    EXPECT_TRUE(testing::all_close(w.gradient(), testing::to_double(plain_w), 1e-6, 1e-5));
    EXPECT_TRUE(testing::all_close(x.gradient(), testing::to_double(plain_x), 1e-6, 1e-5));
}

}  // namespace riftco_transformer

namespace riftco_transformer {

TEST(AutogradBasics, NoGradientGuardRecordsNoGraphAndNests) {
    Variable w(Tensor({2}, {1.0F, 2.0F}));
    EXPECT_FALSE(gradient_recording_disabled());
    {
        const NoGradientGuard outer;
        {
            const NoGradientGuard inner;
            EXPECT_TRUE(gradient_recording_disabled());
        }
        EXPECT_TRUE(gradient_recording_disabled());
        const Variable y = sum(w * w);
        EXPECT_TRUE(y.is_leaf());
        EXPECT_FALSE(y.requires_gradient());
        EXPECT_EQ(y.value().item(), 5.0F);
        EXPECT_THROW(Variable(y).backward(), std::logic_error);
    }
    EXPECT_FALSE(gradient_recording_disabled());
    sum(w * w).backward();
    EXPECT_TRUE(testing::all_close(w.gradient(), {2.0, 4.0}));
}

TEST(AutogradBasics, NoGradientGuardIsPerThread) {
    const NoGradientGuard guard;
    bool other_thread_disabled = true;
    std::thread([&] { other_thread_disabled = gradient_recording_disabled(); }).join();
    EXPECT_FALSE(other_thread_disabled);
}

}  // namespace riftco_transformer
