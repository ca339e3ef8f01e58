#pragma once
// Shared by the tests/test_pjrt_*.cpp suites: which identity they run on, the skip-or-fail
// rule, parity comparison against the CPU reference, and the runtime's counters.
//
// The suites run on the identity named by RIFTCO_TRANSFORMER_TEST_PJRT_BACKEND ("pjrt" by
// default, "tpu" for the tpu-hardware preset). When that identity is unavailable they skip,
// unless the build was configured with RIFTCO_TRANSFORMER_TEST_REQUIRE_TPU=ON, which turns the
// skip into a failure.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

#include "core/backend/pjrt/runtime.hpp"  // RuntimeStatistics: plain data, in every build
#if RIFTCO_TRANSFORMER_HAVE_PJRT
#include "core/backend/pjrt/pjrt_device.hpp"
#endif

namespace riftco_transformer::test {

inline ExecutionBackend pjrt_test_backend() {
    const char* name = std::getenv("RIFTCO_TRANSFORMER_TEST_PJRT_BACKEND");
    if (name != nullptr && std::string(name) == "tpu") {
        return ExecutionBackend::Tpu;
    }
    return ExecutionBackend::Pjrt;
}

// In a fixture's SetUp: skips (or fails, when the build requires the device) when the
// identity under test is unavailable.
#define RIFTCO_REQUIRE_PJRT_DEVICE()                                                     \
    do {                                                                                 \
        const auto backend_under_test = ::riftco_transformer::test::pjrt_test_backend(); \
        if (!::riftco_transformer::execution_backend_available(backend_under_test)) {    \
            const std::string reason(                                                    \
                ::riftco_transformer::execution_backend_unavailability_reason(           \
                    backend_under_test));                                                \
            if (RIFTCO_TRANSFORMER_TEST_REQUIRE_TPU) {                                   \
                FAIL() << "the PJRT device is required but unavailable: " << reason;     \
            }                                                                            \
            GTEST_SKIP() << "PJRT backend unavailable: " << reason;                      \
        }                                                                                \
    } while (false)

// Uniform values in [low, high) from a fixed seed.
inline std::vector<float> uniform_values(std::size_t count, float low, float high, unsigned seed) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> distribution(low, high);
    std::vector<float> values(count);
    for (float& value : values) {
        value = distribution(generator);
    }
    return values;
}

// |device − reference| <= absolute + relative·|reference| everywhere, with special values
// (NaN, ±inf, signed zero) required to match exactly.
inline ::testing::AssertionResult close_to(const std::vector<float>& device,
                                           const std::vector<float>& reference, double absolute,
                                           double relative) {
    if (device.size() != reference.size()) {
        return ::testing::AssertionFailure()
               << "sizes differ: " << device.size() << " vs " << reference.size();
    }
    for (std::size_t i = 0; i < device.size(); ++i) {
        const double d = device[i];
        const double r = reference[i];
        if (std::isnan(r) || std::isinf(r) || (r == 0.0 && std::signbit(r) && d == 0.0)) {
            const bool same = (std::isnan(r) && std::isnan(d)) || d == r;
            if (!same || (r == 0.0 && std::signbit(r) != std::signbit(d))) {
                return ::testing::AssertionFailure()
                       << "element " << i << ": device " << d << ", reference " << r;
            }
            continue;
        }
        if (!(std::abs(d - r) <= absolute + relative * std::abs(r))) {
            return ::testing::AssertionFailure()
                   << "element " << i << ": device " << d << ", reference " << r << " (tolerance "
                   << absolute << " + " << relative << "·|r|)";
        }
    }
    return ::testing::AssertionSuccess();
}

// The runtime's counters (compiles, cache hits, executions, bytes each way). Builds without
// the adapter get zeros; their PJRT tests skip before reading them.
#if RIFTCO_TRANSFORMER_HAVE_PJRT
inline detail::pjrt::RuntimeStatistics pjrt_statistics() {
    const detail::pjrt::Runtime* runtime = detail::pjrt::loaded_runtime(pjrt_test_backend());
    return runtime != nullptr ? runtime->statistics() : detail::pjrt::RuntimeStatistics{};
}
#else
inline detail::pjrt::RuntimeStatistics pjrt_statistics() {
    return {};
}
#endif

}  // namespace riftco_transformer::test
