// Module, ParameterList and seeded initialisation
// (docs/ARCHITECTURE.md, 'Modules and initialisation'): registration rules, depth-first
// dot-qualified naming, shared parameter handles, backend moves that change nothing when they fail,
// and portable uniform draws checked against an independent replay of std::mt19937's raw 32-bit
// outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/initialization.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/module.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

// ---- Independent oracle of the documented float conversion -------------------------------
// u = (x >> 8)·2⁻²⁴ from one raw 32-bit output x; value = lo + (hi − lo)·u in double, rounded
// to float and kept strictly below hi.
double unit_from_raw(std::uint32_t raw) {
    return std::ldexp(static_cast<double>(raw >> 8U), -24);
}

std::uint32_t next_raw(std::mt19937& reference) {
    return static_cast<std::uint32_t>(reference());
}

std::vector<float> expected_uniform(std::mt19937& reference, std::size_t count, float lo,
                                    float hi) {
    std::vector<float> values(count);
    const double width = static_cast<double>(hi) - static_cast<double>(lo);
    for (float& value : values) {
        const double u = unit_from_raw(next_raw(reference));
        const auto drawn = static_cast<float>(static_cast<double>(lo) + width * u);
        value = drawn < hi ? drawn : std::nextafter(hi, lo);
    }
    return values;
}

float xavier_limit(std::size_t fan_in, std::size_t fan_out) {
    return static_cast<float>(
        std::sqrt(6.0 / (static_cast<double>(fan_in) + static_cast<double>(fan_out))));
}

float embedding_limit(std::size_t width) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(width)));
}

// ---- Small test modules ---------------------------------------------------------------------

// One parameter "value" [n]; forward: x ⊙ value.
class ScaleLeaf final : public Module {
  public:
    explicit ScaleLeaf(const std::vector<float>& values) {
        value_ = register_parameter("value", Tensor({values.size()}, values));
    }
    [[nodiscard]] Variable forward(const Variable& x) const { return x * value_; }
    [[nodiscard]] const Variable& value() const { return value_; }

  private:
    Variable value_;
};

// Registers a parameter, then a child, then a parameter: "weight" [2,3], "leaf", "bias" [3].
class Middle final : public Module {
  public:
    explicit Middle(float base) {
        static_cast<void>(register_parameter("weight", Tensor({2, 3}, base)));
        leaf_ = &register_module(
            "leaf", std::make_unique<ScaleLeaf>(std::vector<float>{base + 1.0F, base + 2.0F}));
        static_cast<void>(register_parameter("bias", Tensor({3}, base + 3.0F)));
    }
    [[nodiscard]] const ScaleLeaf& leaf() const { return *leaf_; }

  private:
    ScaleLeaf* leaf_;
};

// Three module levels below the root (root -> stack -> i -> leaf):
// "alpha" [1], "inner" Middle(10), "stack" ModuleList of Middle(20), Middle(30), Middle(40),
// "omega" [4].
class Root final : public Module {
  public:
    Root() {
        static_cast<void>(register_parameter("alpha", Tensor({1}, 1.0F)));
        inner_ = &register_module("inner", std::make_unique<Middle>(10.0F));
        auto& stack = register_module("stack", std::make_unique<ModuleList>());
        for (const float base : {20.0F, 30.0F, 40.0F}) {
            stack_.push_back(&stack.append(std::make_unique<Middle>(base)));
        }
        static_cast<void>(register_parameter("omega", Tensor({4}, {5.0F, 6.0F, 7.0F, 8.0F})));
    }
    [[nodiscard]] const Middle& inner() const { return *inner_; }
    [[nodiscard]] const Middle& stacked(std::size_t i) const { return *stack_.at(i); }

  private:
    Middle* inner_;
    std::vector<Middle*> stack_;
};

constexpr std::size_t root_scalar_count = 1 + 4 * (6 + 2 + 3) + 4;  // 49

enum class EntryKind { Parameter, Child };
struct Registration {
    EntryKind kind;
    std::string name;
};

// Registers the given entries in order (parameters [1], children ScaleLeaf).
class RegistrationProbe final : public Module {
  public:
    explicit RegistrationProbe(const std::vector<Registration>& registrations) {
        for (const Registration& entry : registrations) {
            if (entry.kind == EntryKind::Parameter) {
                static_cast<void>(register_parameter(entry.name, Tensor({1}, 0.5F)));
            } else {
                static_cast<void>(register_module(
                    entry.name, std::make_unique<ScaleLeaf>(std::vector<float>{2.0F})));
            }
        }
    }
};

void construct_probe(const std::vector<Registration>& registrations) {
    const RegistrationProbe probe(registrations);
    static_cast<void>(probe.parameters());
}

std::vector<std::string> names_of(const ParameterList& list) {
    std::vector<std::string> names;
    for (const NamedParameter& named : list)
        names.push_back(named.name);
    return names;
}

// Σ over every parameter of Σ its elements: backward gives every parameter a gradient of ones.
Variable sum_of_all(const ParameterList& list) {
    Variable total = sum(list.front().parameter);
    for (std::size_t i = 1; i < list.size(); ++i)
        total = total + sum(list[i].parameter);
    return total;
}

struct ParameterSnapshot {
    std::vector<std::vector<float>> values;
    std::vector<std::vector<float>> gradients;  // empty vector where there is none
    std::vector<std::uint64_t> versions;
    std::vector<ExecutionBackend> backends;
    std::vector<const void*> identities;
};

ParameterSnapshot snapshot(const Module& module) {
    ParameterSnapshot result;
    for (const NamedParameter& named : module.parameters()) {
        const Variable& p = named.parameter;
        result.values.push_back(p.value().to_host());
        result.gradients.push_back(p.has_gradient() ? p.gradient().to_host()
                                                    : std::vector<float>{});
        result.versions.push_back(p.version());
        result.backends.push_back(p.backend());
        result.identities.push_back(p.node().get());
    }
    return result;
}

void expect_unchanged(const ParameterSnapshot& before, const ParameterSnapshot& after) {
    ASSERT_EQ(before.values.size(), after.values.size());
    for (std::size_t i = 0; i < before.values.size(); ++i) {
        EXPECT_TRUE(testing::bit_identical(before.values[i], after.values[i])) << i;
        EXPECT_TRUE(testing::bit_identical(before.gradients[i], after.gradients[i])) << i;
        EXPECT_EQ(before.versions[i], after.versions[i]) << i;
        EXPECT_EQ(before.backends[i], after.backends[i]) << i;
        EXPECT_EQ(before.identities[i], after.identities[i]) << i;
    }
}

}  // namespace

// ---- Registration rules ---------------------------------------------------------------------

TEST(ModuleRegistration, RejectsEmptyNamesForParametersAndChildren) {
    EXPECT_THROW(construct_probe({{EntryKind::Parameter, ""}}), std::invalid_argument);
    EXPECT_THROW(construct_probe({{EntryKind::Child, ""}}), std::invalid_argument);
}

TEST(ModuleRegistration, RejectsNamesContainingADot) {
    for (const char* name : {"a.b", ".a", "a.", "."}) {
        EXPECT_THROW(construct_probe({{EntryKind::Parameter, name}}), std::invalid_argument)
            << name;
        EXPECT_THROW(construct_probe({{EntryKind::Child, name}}), std::invalid_argument) << name;
    }
}

TEST(ModuleRegistration, ParametersAndChildrenShareOneNamespace) {
    EXPECT_THROW(construct_probe({{EntryKind::Parameter, "x"}, {EntryKind::Parameter, "x"}}),
                 std::invalid_argument);
    EXPECT_THROW(construct_probe({{EntryKind::Child, "x"}, {EntryKind::Child, "x"}}),
                 std::invalid_argument);
    EXPECT_THROW(construct_probe({{EntryKind::Parameter, "x"}, {EntryKind::Child, "x"}}),
                 std::invalid_argument);
    EXPECT_THROW(construct_probe({{EntryKind::Child, "x"}, {EntryKind::Parameter, "x"}}),
                 std::invalid_argument);
    // A duplicate further down the list is caught too.
    EXPECT_THROW(construct_probe({{EntryKind::Parameter, "a"},
                                  {EntryKind::Child, "b"},
                                  {EntryKind::Parameter, "c"},
                                  {EntryKind::Child, "a"}}),
                 std::invalid_argument);
}

TEST(ModuleRegistration, DistinctNamesAndTheSameNameInDifferentModulesAreAccepted) {
    // The child "value" holds a parameter that is also named "value": one namespace per module.
    const RegistrationProbe probe({{EntryKind::Parameter, "value"},
                                   {EntryKind::Child, "child"},
                                   {EntryKind::Child, "0"},
                                   {EntryKind::Parameter, "snake_case_name"}});
    EXPECT_EQ(names_of(probe.parameters()),
              (std::vector<std::string>{"value", "child.value", "0.value", "snake_case_name"}));
}

// ---- Naming and order -------------------------------------------------------------------------

TEST(ModuleParameters, DepthFirstInRegistrationOrderWithDotQualifiedNames) {
    const Root root;
    const ParameterList list = root.parameters();
    std::vector<std::string> expected = {"alpha", "inner.weight", "inner.leaf.value", "inner.bias"};
    for (const char* index : {"0", "1", "2"}) {
        for (const char* name : {"weight", "leaf.value", "bias"}) {
            expected.push_back(std::string("stack.") + index + "." + name);
        }
    }
    expected.emplace_back("omega");
    EXPECT_EQ(names_of(list), expected);

    // The entries are the registered values, in the same order.
    ASSERT_EQ(list.size(), expected.size());
    EXPECT_TRUE(testing::all_close(list[0].parameter.value(), {1.0}));
    EXPECT_TRUE(testing::all_close(list[1].parameter.value(), std::vector<double>(6, 10.0)));
    EXPECT_TRUE(testing::all_close(list[2].parameter.value(), {11.0, 12.0}));
    EXPECT_TRUE(testing::all_close(list[3].parameter.value(), {13.0, 13.0, 13.0}));
    EXPECT_TRUE(testing::all_close(list[8].parameter.value(), {31.0, 32.0}));  // stack.1.leaf
    EXPECT_TRUE(testing::all_close(list[13].parameter.value(), {5.0, 6.0, 7.0, 8.0}));
    for (const NamedParameter& named : list) {
        EXPECT_TRUE(named.parameter.is_leaf()) << named.name;
        EXPECT_TRUE(named.parameter.requires_gradient()) << named.name;
    }
}

TEST(ModuleParameters, ListsHoldTheModulesOwnHandlesOnEveryCall) {
    const Root root;
    const ParameterList first = root.parameters();
    const ParameterList second = root.parameters();
    ASSERT_EQ(first.size(), second.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
        EXPECT_EQ(first[i].parameter.node().get(), second[i].parameter.node().get())
            << first[i].name;
    }
    EXPECT_EQ(first[2].parameter.node().get(), root.inner().leaf().value().node().get());
    EXPECT_EQ(first[8].parameter.node().get(), root.stacked(1).leaf().value().node().get());
}

TEST(ModuleList, NamesChildrenByTheirIndex) {
    ModuleList list;
    EXPECT_EQ(list.size(), 0U);
    EXPECT_TRUE(list.parameters().empty());
    const ScaleLeaf& first = list.append(std::make_unique<ScaleLeaf>(std::vector<float>{1.0F}));
    list.append(std::make_unique<ScaleLeaf>(std::vector<float>{2.0F, 3.0F}));
    list.append(std::make_unique<ScaleLeaf>(std::vector<float>{4.0F, 5.0F, 6.0F}));
    EXPECT_EQ(list.size(), 3U);
    const ParameterList parameters = list.parameters();
    EXPECT_EQ(names_of(parameters), (std::vector<std::string>{"0.value", "1.value", "2.value"}));
    EXPECT_EQ(parameters[0].parameter.node().get(), first.value().node().get());
    EXPECT_TRUE(testing::all_close(parameters[2].parameter.value(), {4.0, 5.0, 6.0}));
    EXPECT_EQ(list.parameter_count(), 6U);
}

TEST(ModuleParameters, ParameterCountIsTheNumberOfScalars) {
    const Root root;
    EXPECT_EQ(root.parameter_count(), root_scalar_count);
    EXPECT_EQ(root.inner().parameter_count(), 11U);
    EXPECT_EQ(root.inner().leaf().parameter_count(), 2U);
    const ModuleList empty;
    EXPECT_EQ(empty.parameter_count(), 0U);
}

// ---- Shared handles ---------------------------------------------------------------------------

TEST(ModuleParameters, ACopiedListKeepsParametersAliveAfterTheModuleIsDestroyed) {
    ParameterList kept;
    {
        const auto root = std::make_unique<Root>();
        const ParameterList list = root->parameters();
        kept = list;
    }
    ASSERT_EQ(kept.size(), 14U);
    EXPECT_EQ(kept[2].name, "inner.leaf.value");
    EXPECT_TRUE(testing::all_close(kept[2].parameter.value(), {11.0, 12.0}));
    EXPECT_TRUE(testing::all_close(kept[13].parameter.value(), {5.0, 6.0, 7.0, 8.0}));
    // Still usable leaves: they take part in a graph and receive gradients.
    Variable total = sum_of_all(kept);
    total.backward();
    for (const NamedParameter& named : kept) {
        EXPECT_TRUE(testing::all_close(named.parameter.gradient(),
                                       std::vector<double>(named.parameter.value().numel(), 1.0)))
            << named.name;
    }
}

TEST(ModuleParameters, AValueSetThroughTheListIsSeenByTheModulesForward) {
    const ScaleLeaf leaf(std::vector<float>{1.0F, 1.0F});
    const ParameterList list = leaf.parameters();
    const std::uint64_t version = leaf.value().version();
    Variable handle = list[0].parameter;
    handle.set_value(Tensor({2}, {3.0F, -4.0F}));
    EXPECT_GT(leaf.value().version(), version);

    const Variable x(Tensor({2}, {2.0F, 0.5F}), false);
    const Variable y = leaf.forward(x);
    EXPECT_TRUE(testing::all_close(y.value(), {6.0, -2.0}));
    // And gradients computed through the module reach the list's handle: d(Σ y)/d value = x.
    Variable total = sum(y);
    total.backward();
    EXPECT_TRUE(testing::all_close(list[0].parameter.gradient(), {2.0, 0.5}));
}

// ---- Backend ------------------------------------------------------------------------------------

TEST(ModuleBackend, IsTheFirstParametersBackendAndNeedsAParameter) {
    const Root root;
    EXPECT_EQ(root.backend(), ExecutionBackend::Cpu);
    const ModuleList empty;
    EXPECT_THROW(static_cast<void>(empty.backend()), std::logic_error);
}

TEST(ModuleBackend, MovingToTheCurrentBackendIsANoOp) {
    Root root;
    const ParameterList list = root.parameters();
    Variable total = sum_of_all(list);
    total.backward();
    // A graph built before the move must still be differentiable afterwards.
    Variable pending = sum_of_all(list);
    const ParameterSnapshot before = snapshot(root);

    root.to(ExecutionBackend::Cpu);

    expect_unchanged(before, snapshot(root));
    for (const NamedParameter& named : root.parameters()) {
        EXPECT_TRUE(named.parameter.has_gradient()) << named.name;
    }
    EXPECT_NO_THROW(pending.backward());
}

TEST(ModuleBackend, AFailedMoveToAnUnavailableBackendChangesNothing) {
    for (const ExecutionBackend target :
         {ExecutionBackend::Cuda, ExecutionBackend::Tpu, ExecutionBackend::Pjrt}) {
        if (execution_backend_available(target)) {
            continue;  // this test is about a target that cannot run here
        }
        Root root;
        const ParameterList list = root.parameters();
        Variable total = sum_of_all(list);
        total.backward();
        Variable pending = sum_of_all(list);
        const ParameterSnapshot before = snapshot(root);

        EXPECT_THROW(root.to(target), std::runtime_error) << execution_backend_name(target);

        expect_unchanged(before, snapshot(root));
        EXPECT_EQ(root.backend(), ExecutionBackend::Cpu);
        for (const NamedParameter& named : root.parameters()) {
            EXPECT_TRUE(named.parameter.has_gradient()) << named.name;
        }
        // No version moved, so graphs built before the attempt are still valid.
        EXPECT_NO_THROW(pending.backward());
    }
    if (execution_backend_available(ExecutionBackend::Cuda) &&
        execution_backend_available(ExecutionBackend::Tpu) &&
        execution_backend_available(ExecutionBackend::Pjrt)) {
        GTEST_SKIP() << "every accelerator is available: no unavailable target to try";
    }
}

// ---- Portable initialisation ------------------------------------------------------------------

TEST(Initialization, UniformUnitIsTheTop24BitsOfOneDrawTimes2ToTheMinus24) {
    for (const std::uint32_t seed : {0U, 1U, 5489U, 4294967295U}) {
        std::mt19937 generator(seed);
        std::mt19937 reference(seed);
        for (int i = 0; i < 1000; ++i) {
            const std::uint32_t raw = next_raw(reference);
            const float unit = uniform_unit(generator);
            EXPECT_EQ(unit, static_cast<float>(unit_from_raw(raw))) << seed << " draw " << i;
            EXPECT_GE(unit, 0.0F);
            EXPECT_LT(unit, 1.0F);
        }
        EXPECT_TRUE(generator == reference) << "exactly one raw draw per value";
    }
}

TEST(Initialization, UniformUnitCoversItsExtremes) {
    // The conversion maps the smallest and largest raw outputs to 0 and 1 − 2⁻²⁴. The first
    // raw output of mt19937 seeded with 5489 is the standard's 3499211612.
    std::mt19937 reference(5489U);
    EXPECT_EQ(next_raw(reference), 3499211612U);
    std::mt19937 generator(5489U);
    EXPECT_EQ(uniform_unit(generator), static_cast<float>(3499211612U >> 8U) * 0x1.0p-24F);
    EXPECT_EQ(unit_from_raw(0U), 0.0);
    EXPECT_EQ(unit_from_raw(0xFFFFFFFFU), 1.0 - 0x1.0p-24);
}

TEST(Initialization, UniformTensorDrawsRowMajorWithTheDocumentedConversion) {
    const struct {
        float lo, hi;
    } ranges[] = {{-1.0F, 1.0F}, {0.0F, 1.0F}, {-0.3F, 0.7F}, {2.5F, 1000.0F}, {-1e6F, -5.0F}};
    for (const auto& range : ranges) {
        std::mt19937 generator(123U);
        std::mt19937 reference(123U);
        const Tensor tensor = uniform_tensor({3, 4, 5}, range.lo, range.hi, generator);
        EXPECT_EQ(tensor.shape(), (Shape{3, 4, 5}));
        EXPECT_EQ(tensor.backend(), ExecutionBackend::Cpu);
        const std::vector<float> expected = expected_uniform(reference, 60, range.lo, range.hi);
        EXPECT_TRUE(testing::bit_identical(tensor.to_host(), expected))
            << range.lo << ", " << range.hi;
        for (const float value : tensor.to_host()) {
            EXPECT_GE(value, range.lo);
            EXPECT_LT(value, range.hi);
        }
        EXPECT_TRUE(generator == reference) << "one raw draw per element";
    }
}

TEST(Initialization, UniformTensorWithAnExplicitBackendMatchesTheDefaultOverload) {
    std::mt19937 first(9U);
    std::mt19937 second(9U);
    const Tensor implicit = uniform_tensor({7}, -2.0F, 3.0F, first);
    const Tensor explicit_cpu = uniform_tensor({7}, -2.0F, 3.0F, second, ExecutionBackend::Cpu);
    EXPECT_TRUE(testing::bit_identical(implicit.to_host(), explicit_cpu.to_host()));
    EXPECT_EQ(explicit_cpu.backend(), ExecutionBackend::Cpu);
}

TEST(Initialization, UniformTensorRoundingNeverReachesHi) {
    // [1, 1 + 2⁻²³): every u > 1/2 rounds lo + (hi − lo)·u up to hi in float, so the value must
    // be pulled back below hi; the only float in the interval is 1.
    const float lo = 1.0F;
    const float hi = std::nextafter(1.0F, 2.0F);
    std::mt19937 generator(77U);
    const Tensor tensor = uniform_tensor({256}, lo, hi, generator);
    for (const float value : tensor.to_host())
        EXPECT_EQ(value, 1.0F);
}

TEST(Initialization, UniformTensorRejectsBadBoundsWithoutDrawing) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const struct {
        float lo, hi;
    } bad[] = {{1.0F, 1.0F}, {2.0F, 1.0F}, {nan, 1.0F}, {0.0F, nan},
               {-inf, 0.0F}, {0.0F, inf},  {-inf, inf}, {inf, inf}};
    for (const auto& bounds : bad) {
        std::mt19937 generator(4U);
        const std::mt19937 untouched(4U);
        EXPECT_THROW(static_cast<void>(uniform_tensor({3}, bounds.lo, bounds.hi, generator)),
                     std::invalid_argument)
            << bounds.lo << ", " << bounds.hi;
        EXPECT_THROW(static_cast<void>(uniform_tensor({3}, bounds.lo, bounds.hi, generator,
                                                      ExecutionBackend::Cpu)),
                     std::invalid_argument);
        EXPECT_TRUE(generator == untouched) << "no draw before validation";
    }
    std::mt19937 generator(4U);
    EXPECT_THROW(static_cast<void>(uniform_tensor({2, 0}, -1.0F, 1.0F, generator)),
                 std::invalid_argument);
}

TEST(Initialization, XavierUniformUsesTheSqrtSixOverFanSumLimit) {
    const struct {
        Shape shape;
        std::size_t fan_in, fan_out;
    } cases[] = {{{5, 3}, 3, 5}, {{4, 4}, 4, 4}, {{64, 32}, 32, 64}, {{10}, 1, 1}};
    for (const auto& c : cases) {
        std::mt19937 generator(31U);
        std::mt19937 reference(31U);
        const Tensor tensor =
            xavier_uniform(c.shape, c.fan_in, c.fan_out, generator, ExecutionBackend::Cpu);
        const float limit = xavier_limit(c.fan_in, c.fan_out);
        const std::vector<float> expected =
            expected_uniform(reference, checked_element_count(c.shape), -limit, limit);
        EXPECT_EQ(tensor.shape(), c.shape);
        EXPECT_TRUE(testing::bit_identical(tensor.to_host(), expected)) << c.fan_in;
        EXPECT_TRUE(generator == reference);
    }
    // The limit by hand: √(6/8) for fans 3 and 5.
    EXPECT_EQ(xavier_limit(3, 5), static_cast<float>(std::sqrt(0.75)));
    // The draws fill the symmetric range (2048 of them land close to both ends).
    std::mt19937 generator(2U);
    const std::vector<float> values =
        xavier_uniform({2048}, 16, 8, generator, ExecutionBackend::Cpu).to_host();
    const float limit = xavier_limit(16, 8);
    float low = 0.0F;
    float high = 0.0F;
    for (const float value : values) {
        EXPECT_GE(value, -limit);
        EXPECT_LT(value, limit);
        low = std::min(low, value);
        high = std::max(high, value);
    }
    EXPECT_LT(low, -0.99F * limit);
    EXPECT_GT(high, 0.99F * limit);
}

TEST(Initialization, XavierUniformRejectsAZeroFanWithoutDrawing) {
    std::mt19937 generator(8U);
    const std::mt19937 untouched(8U);
    EXPECT_THROW(static_cast<void>(xavier_uniform({2, 2}, 0, 2, generator, ExecutionBackend::Cpu)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(xavier_uniform({2, 2}, 2, 0, generator, ExecutionBackend::Cpu)),
                 std::invalid_argument);
    EXPECT_THROW(static_cast<void>(xavier_uniform({2, 2}, 0, 0, generator, ExecutionBackend::Cpu)),
                 std::invalid_argument);
    EXPECT_TRUE(generator == untouched);
}

// ---- Construction draw order --------------------------------------------------------------

TEST(InitializationOrder, LinearDrawsOnlyItsWeight) {
    for (const bool use_bias : {true, false}) {
        std::mt19937 generator(2024U);
        std::mt19937 reference(2024U);
        const Linear layer(3, 5, generator, use_bias);
        const std::vector<float> expected =
            expected_uniform(reference, 15, -xavier_limit(3, 5), xavier_limit(3, 5));
        EXPECT_TRUE(testing::bit_identical(layer.weight().value().to_host(), expected));
        EXPECT_TRUE(generator == reference)
            << "the bias draws nothing (use_bias " << use_bias << ")";
        if (use_bias) {
            EXPECT_TRUE(testing::bit_identical(layer.parameters()[1].parameter.value().to_host(),
                                               std::vector<float>(5, 0.0F)));
        }
    }
}

TEST(InitializationOrder, FeedForwardAndSwiGLUDrawInRegistrationOrder) {
    std::mt19937 generator(6U);
    std::mt19937 reference(6U);
    const FeedForward feed_forward(4, 6, generator);
    const float limit = xavier_limit(4, 6);
    const std::vector<float> expand = expected_uniform(reference, 24, -limit, limit);
    const std::vector<float> project = expected_uniform(reference, 24, -limit, limit);
    const ParameterList ff = feed_forward.parameters();
    EXPECT_TRUE(testing::bit_identical(ff[0].parameter.value().to_host(), expand));
    EXPECT_TRUE(testing::bit_identical(ff[2].parameter.value().to_host(), project));
    EXPECT_TRUE(generator == reference);

    const SwiGLU swiglu(4, 6, generator);
    const ParameterList gated = swiglu.parameters();
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(testing::bit_identical(gated[i].parameter.value().to_host(),
                                           expected_uniform(reference, 24, -limit, limit)))
            << gated[i].name;
    }
    EXPECT_TRUE(generator == reference);
}

TEST(InitializationOrder, AModelsFirstParameterIsTheFirstUniformTensorOfItsSeed) {
    const TransformerDimensions dims{.vocabulary_size = 13,
                                     .maximum_context = 6,
                                     .model_width = 8,
                                     .head_count = 2,
                                     .block_count = 1,
                                     .feed_forward_width = 12};
    std::mt19937 model_generator(99U);
    const DecoderOnlyTransformer model(dims, model_generator);
    std::mt19937 direct(99U);
    const float limit = embedding_limit(8);
    const Tensor first = uniform_tensor({13, 8}, -limit, limit, direct);
    const ParameterList list = model.parameters();
    EXPECT_EQ(list[0].name, "token_embedding.weight");
    EXPECT_TRUE(testing::bit_identical(list[0].parameter.value().to_host(), first.to_host()));
}

TEST(InitializationOrder, AModelReplaysTheDocumentedDrawOrderExactly) {
    // Token embedding, position embedding, per block query/key/value/output, expand, project,
    // then the LM head; norms and biases draw nothing.
    const TransformerDimensions d{.vocabulary_size = 11,
                                  .maximum_context = 5,
                                  .model_width = 8,
                                  .head_count = 2,
                                  .block_count = 2,
                                  .feed_forward_width = 12};
    std::mt19937 generator(4242U);
    const DecoderOnlyTransformer model(d, generator);

    std::mt19937 reference(4242U);
    std::map<std::string, std::vector<float>> expected;
    const float e = embedding_limit(d.model_width);
    expected["token_embedding.weight"] = expected_uniform(reference, 11 * 8, -e, e);
    expected["position_embedding.weight"] = expected_uniform(reference, 5 * 8, -e, e);
    for (const std::string block : {"blocks.0.", "blocks.1."}) {
        expected[block + "attention_norm.scale"] = std::vector<float>(8, 1.0F);
        expected[block + "attention_norm.bias"] = std::vector<float>(8, 0.0F);
        const float square = xavier_limit(8, 8);
        for (const char* projection : {"query", "key", "value", "output"}) {
            const std::string prefix = block + "attention." + projection;
            expected[prefix + ".weight"] = expected_uniform(reference, 64, -square, square);
            expected[prefix + ".bias"] = std::vector<float>(8, 0.0F);
        }
        expected[block + "feed_forward_norm.scale"] = std::vector<float>(8, 1.0F);
        expected[block + "feed_forward_norm.bias"] = std::vector<float>(8, 0.0F);
        const float wide = xavier_limit(8, 12);
        expected[block + "feed_forward.expand.weight"] =
            expected_uniform(reference, 96, -wide, wide);
        expected[block + "feed_forward.expand.bias"] = std::vector<float>(12, 0.0F);
        expected[block + "feed_forward.project.weight"] =
            expected_uniform(reference, 96, -wide, wide);
        expected[block + "feed_forward.project.bias"] = std::vector<float>(8, 0.0F);
    }
    expected["final_norm.scale"] = std::vector<float>(8, 1.0F);
    expected["final_norm.bias"] = std::vector<float>(8, 0.0F);
    const float head = xavier_limit(8, 11);
    expected["language_model_head.weight"] = expected_uniform(reference, 88, -head, head);
    expected["language_model_head.bias"] = std::vector<float>(11, 0.0F);

    const ParameterList list = model.parameters();
    EXPECT_EQ(list.size(), expected.size());
    for (const NamedParameter& named : list) {
        const auto found = expected.find(named.name);
        ASSERT_NE(found, expected.end()) << named.name;
        EXPECT_TRUE(testing::bit_identical(named.parameter.value().to_host(), found->second))
            << named.name;
    }
    EXPECT_TRUE(generator == reference) << "the model drew exactly the documented values";
}

}  // namespace riftco_transformer
