#pragma once
// Shared by the tests/test_cuda_*.cpp suites: the skip-or-fail rule for a missing device and
// the parity comparison against the CPU reference (docs/ARCHITECTURE.md, 'Numeric parity').
//
// Without a visible device the device tests skip, saying why, unless the build was configured
// with RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON, which turns the skip into a failure.
// RIFTCO_TRANSFORMER_HAVE_CUDA (set for the test_cuda_* suites) says whether the adapter is
// compiled in, so the no-device contract knows which reason to expect.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::test {

// The reason a build with the adapter gives on a machine without a device (or driver).
inline constexpr const char* no_device_reason = "no CUDA device visible";

// In a fixture's SetUp or a test: skips (or fails, under REQUIRE_CUDA) without a device.
#define RIFTCO_REQUIRE_CUDA_DEVICE()                                                          \
    do {                                                                                      \
        if (!::riftco_transformer::execution_backend_available(                               \
                ::riftco_transformer::ExecutionBackend::Cuda)) {                              \
            const std::string reason(                                                         \
                ::riftco_transformer::execution_backend_unavailability_reason(                \
                    ::riftco_transformer::ExecutionBackend::Cuda));                           \
            if (RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA) {                                       \
                FAIL() << "RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON but CUDA is unavailable: " \
                       << reason;                                                             \
            }                                                                                 \
            GTEST_SKIP() << "CUDA unavailable: " << reason;                                   \
        }                                                                                     \
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

// Form B (docs/ARCHITECTURE.md, 'Numeric parity'): |d − r| <= tolerance·max(1, |d|, |r|)
// everywhere; NaN, ±inf and the sign of a zero reference must match exactly.
inline ::testing::AssertionResult matches_reference(const std::vector<float>& device,
                                                    const std::vector<float>& reference,
                                                    double tolerance) {
    if (device.size() != reference.size()) {
        return ::testing::AssertionFailure()
               << "sizes differ: " << device.size() << " vs " << reference.size();
    }
    for (std::size_t i = 0; i < device.size(); ++i) {
        const double d = device[i];
        const double r = reference[i];
        if (std::isnan(r) || std::isinf(r) || (r == 0.0 && std::signbit(r))) {
            const bool same =
                (std::isnan(r) && std::isnan(d)) || (d == r && std::signbit(d) == std::signbit(r));
            if (!same) {
                return ::testing::AssertionFailure()
                       << "element " << i << ": device " << d << ", reference " << r;
            }
            continue;
        }
        const double bound = tolerance * std::max({1.0, std::abs(d), std::abs(r)});
        if (!(std::abs(d - r) <= bound)) {
            return ::testing::AssertionFailure()
                   << "element " << i << ": device " << d << ", reference " << r << " (bound "
                   << bound << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

// Form A for matmul (docs/ARCHITECTURE.md, 'Numeric parity'): |d − r| <= atol + rtol·max(|d|, |r|).
inline ::testing::AssertionResult matches_product(const std::vector<float>& device,
                                                  const std::vector<float>& reference, double atol,
                                                  double rtol) {
    if (device.size() != reference.size()) {
        return ::testing::AssertionFailure()
               << "sizes differ: " << device.size() << " vs " << reference.size();
    }
    for (std::size_t i = 0; i < device.size(); ++i) {
        const double d = device[i];
        const double r = reference[i];
        const double bound = atol + rtol * std::max(std::abs(d), std::abs(r));
        if (!(std::abs(d - r) <= bound)) {
            return ::testing::AssertionFailure()
                   << "element " << i << ": device " << d << ", reference " << r << " (bound "
                   << bound << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

}  // namespace riftco_transformer::test
