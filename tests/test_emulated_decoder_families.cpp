// Every rotary family on a second backend (the emulated asynchronous device under the Metal
// identity: deferred errors, replaced outputs) against the CPU reference: logits with flash and
// materialized attention, every parameter's gradient, and a paged decode session's logits,
// for each preset of tests/support/decoder_families.hpp.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "support/decoder_families.hpp"
#include "support/emulated_device.hpp"
#include "support/model_support.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr ExecutionBackend cpu = ExecutionBackend::Cpu;
constexpr ExecutionBackend metal = ExecutionBackend::Metal;

class EmulatedDecoderFamilies : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(execution_backend_available(metal)); }
    void TearDown() override { set_execution_backend(cpu); }
};

TEST_F(EmulatedDecoderFamilies, EveryPresetGivesTheCpuLogitsGradientsAndDecoding) {
    for (const DecoderConfig& config : testing::family_configs()) {
        for (const AttentionKind attention : {AttentionKind::Materialized, AttentionKind::Flash}) {
            SCOPED_TRACE(testing::name_of(config) +
                         (attention == AttentionKind::Flash ? " flash" : " materialized"));
            const std::vector<float> on_cpu = testing::run_family(config, cpu, attention);
            const std::size_t replaced_before = test::emulated_replaced_outputs();
            const std::vector<float> on_device = testing::run_family(config, metal, attention);
            EXPECT_GT(test::emulated_replaced_outputs(), replaced_before);
            EXPECT_TRUE(testing::all_close(on_device, testing::to_double(on_cpu), 1e-5, 1e-5));
        }
    }
}

// Packed rows: the materialized kind composes generic operations (a [B,1,T,T] mask, B·T RoPE
// rows, a gathered position table), so it runs on the device as on the CPU; the device's
// flash kernel has no document bounds yet and says so by name.
TEST_F(EmulatedDecoderFamilies, PackedRowsGiveTheCpuLogitsAndGradientsWithMaterializedAttention) {
    for (const DecoderConfig& config : testing::family_configs()) {
        SCOPED_TRACE(testing::name_of(config));
        const std::vector<float> on_cpu =
            testing::run_packed_family(config, cpu, AttentionKind::Materialized);
        const std::vector<float> on_device =
            testing::run_packed_family(config, metal, AttentionKind::Materialized);
        EXPECT_TRUE(testing::all_close(on_device, testing::to_double(on_cpu), 1e-5, 1e-5));
        EXPECT_THROW(
            static_cast<void>(testing::run_packed_family(config, metal, AttentionKind::Flash)),
            std::invalid_argument);
    }
}

}  // namespace
}  // namespace riftco_transformer
