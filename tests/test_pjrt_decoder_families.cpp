// Every rotary family on the PJRT backend (XLA's CPU plugin in CI) against the CPU reference:
// logits with flash and materialized attention, every parameter's gradient and a paged decode
// session's logits, for each preset of tests/support/decoder_families.hpp. Float32 on both
// sides; XLA's reduction order differs from ours: 1e-4 absolute + relative.
#include <gtest/gtest.h>

#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "support/decoder_families.hpp"
#include "support/model_support.hpp"
#include "support/pjrt_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

class PjrtDecoderFamilies : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }
    void TearDown() override { set_execution_backend(ExecutionBackend::Cpu); }
    ExecutionBackend device = test::pjrt_test_backend();
};

TEST_F(PjrtDecoderFamilies, EveryPresetGivesTheCpuLogitsGradientsAndDecoding) {
    for (const DecoderConfig& config : testing::family_configs()) {
        for (const AttentionKind attention : {AttentionKind::Materialized, AttentionKind::Flash}) {
            SCOPED_TRACE(testing::name_of(config) +
                         (attention == AttentionKind::Flash ? " flash" : " materialized"));
            const std::vector<float> on_cpu =
                testing::run_family(config, ExecutionBackend::Cpu, attention);
            const std::vector<float> on_device = testing::run_family(config, device, attention);
            EXPECT_TRUE(testing::all_close(on_device, testing::to_double(on_cpu), 1e-4, 1e-4));
        }
    }
}

// Packed rows through every preset and both kinds: the flash programs bound each query by its
// document (one more input), the materialized kind masks with generic operations.
TEST_F(PjrtDecoderFamilies, PackedRowsGiveTheCpuLogitsAndGradients) {
    for (const DecoderConfig& config : testing::family_configs()) {
        for (const AttentionKind attention : {AttentionKind::Materialized, AttentionKind::Flash}) {
            SCOPED_TRACE(testing::name_of(config) +
                         (attention == AttentionKind::Flash ? " flash" : " materialized"));
            const std::vector<float> on_cpu =
                testing::run_packed_family(config, ExecutionBackend::Cpu, attention);
            const std::vector<float> on_device =
                testing::run_packed_family(config, device, attention);
            EXPECT_TRUE(testing::all_close(on_device, testing::to_double(on_cpu), 1e-4, 1e-4));
        }
    }
}

}  // namespace
}  // namespace riftco_transformer
