// A program-augmented model on a second backend (the emulated device under the Metal
// identity): its parameters and its frozen program coefficients move together, and it
// computes what it computes on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/programmed/program_augmented_model.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {

TEST(EmulatedProgrammed, AModelWithFrozenCoefficientsMovesAndComputesTheSame) {
    ASSERT_TRUE(execution_backend_available(ExecutionBackend::Metal));
    std::vector<double> values(3 * 3 * 3, 0.0);
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 3; ++j)
            values[((i + j) % 3) * 9 + i * 3 + j] = 1.0;
    ProgramBranch branch{.map = MultilinearMap::from_dense(3, {3, 3}, values),
                         .source_offset = 0,
                         .source_length = 2,
                         .target_offset = 2,
                         .output_length = 1,
                         .inputs = {{ProgramInputSource::SourcePosition, 0, 0},
                                    {ProgramInputSource::SourcePosition, 1, 0}},
                         .lowering = {},
                         .input_projection_bias = false,
                         .merge_bias = false};
    ProgramAugmentedModel model({.vocabulary_size = 5,
                                 .context_length = 3,
                                 .model_width = 8,
                                 .head_count = 2,
                                 .feed_forward_width = 16,
                                 .attention_branch_count = 1,
                                 .attention = AttentionKind::Flash,
                                 .random_seed = 42},
                                branch);
    const std::vector<std::uint32_t> tokens = {1, 2, 4, 0, 3, 4};
    const std::vector<float> on_cpu = model.forward(tokens, {2, 3}).logits.value().to_host();
    model.to(ExecutionBackend::Metal);
    EXPECT_EQ(model.lowered_program().coefficients().backend(), ExecutionBackend::Metal);
    const Variable logits = model.forward(tokens, {2, 3}).logits;
    EXPECT_EQ(logits.backend(), ExecutionBackend::Metal);
    EXPECT_TRUE(
        testing::all_close(logits.value().to_host(), testing::to_double(on_cpu), 1e-5, 1e-5));
    model.to(ExecutionBackend::Cpu);
    EXPECT_EQ(model.lowered_program().coefficients().backend(), ExecutionBackend::Cpu);
}

}  // namespace riftco_transformer
