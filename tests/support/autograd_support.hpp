#pragma once
// Test helpers for "a failure changed nothing" checks on leaf gradients.

#include <gtest/gtest.h>

#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer::testing {

// What a caller can see of one leaf's gradient: whether it has one and its values.
struct GradientSnapshot {
    bool has_gradient = false;
    std::vector<float> values;
};

inline GradientSnapshot snapshot(const Variable& leaf) {
    return {leaf.has_gradient(), leaf.gradient().to_host()};
}

inline ::testing::AssertionResult unchanged(const GradientSnapshot& before, const Variable& leaf) {
    if (leaf.has_gradient() != before.has_gradient) {
        return ::testing::AssertionFailure() << "has_gradient changed from " << before.has_gradient
                                             << " to " << leaf.has_gradient();
    }
    return bit_identical(leaf.gradient().to_host(), before.values);
}

}  // namespace riftco_transformer::testing
