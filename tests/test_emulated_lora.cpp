// LoRA and QLoRA on a second backend (the emulated device under the Metal identity): a packed
// model moves with its packed weights and computes what it computes on the CPU; adapters are
// created on the base's backend and train there; attach rejects a base on mixed backends.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

class EmulatedLora : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(execution_backend_available(metal)); }
    void TearDown() override { set_execution_backend(cpu); }
};

const std::vector<std::uint32_t>& tokens() {
    static const std::vector<std::uint32_t> ids = testing::pseudo_random_tokens(2 * 7, 27, 4);
    return ids;
}

}  // namespace

TEST_F(EmulatedLora, APackedModelMovesWithItsPackedWeightsAndComputesTheSame) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    model.quantize_nf4();
    const std::vector<float> on_cpu = model.forward(tokens(), {2, 7}).value().to_host();
    model.to(metal);
    for (const AdaptableProjection& projection : model.projections())
        EXPECT_EQ(projection.linear->quantized_weight().backend(), metal) << projection.path;
    const Variable logits = model.forward(tokens(), {2, 7});
    EXPECT_EQ(logits.backend(), metal);
    EXPECT_TRUE(
        testing::all_close(logits.value().to_host(), testing::to_double(on_cpu), 1e-5, 1e-5));
    EXPECT_EQ(model.quantized_memory_usage().resident_payload_bytes,
              model.quantized_memory_usage().logical_payload_bytes);
    model.to(cpu);
    EXPECT_TRUE(testing::bit_identical(model.forward(tokens(), {2, 7}).value().to_host(), on_cpu));
}

TEST_F(EmulatedLora, QloraTrainsOnTheDeviceAndMergesThere) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    model.quantize_nf4();
    model.to(metal);
    model.attach_lora({.targets = 0x7F});
    for (const NamedParameter& named : model.lora_parameters())
        EXPECT_EQ(named.parameter.backend(), metal) << named.name;
    Adam adam(model.lora_parameters(), AdamOptions{.learning_rate = 1e-2});
    const std::vector<std::uint32_t> targets = testing::pseudo_random_tokens(2 * 7, 27, 9);
    float first = 0;
    float last = 0;
    for (int step = 0; step < 15; ++step) {
        Variable loss = cross_entropy(model.forward(tokens(), {2, 7}), targets);
        (step == 0 ? first : last) = loss.value().item();
        loss.backward();
        adam.step();
    }
    EXPECT_LT(last, first);
    const std::vector<float> adapted = model.forward(tokens(), {2, 7}).value().to_host();
    model.merge_lora();
    for (const NamedParameter& named : model.parameters())
        EXPECT_EQ(named.parameter.backend(), metal) << named.name;
    EXPECT_TRUE(testing::all_close(model.forward(tokens(), {2, 7}).value().to_host(),
                                   testing::to_double(adapted), 1e-5, 1e-5));
}

TEST_F(EmulatedLora, AttachRejectsABaseOnMixedBackendsAndChangesNothing) {
    std::mt19937 generator(5);
    DecoderOnlyTransformer model(testing::reference_tiny(), generator);
    {
        Variable head = model.projections().back().linear->weight();
        head.replace_value(head.value().to(metal));
    }
    EXPECT_THROW(model.attach_lora({.targets = 0x7F}), std::logic_error);
    EXPECT_FALSE(model.lora_attached());
    EXPECT_TRUE(model.lora_parameters().empty());
    for (const NamedParameter& named : model.parameters())
        EXPECT_TRUE(named.parameter.requires_gradient()) << named.name;
}

}  // namespace riftco_transformer
