#pragma once
// Test helpers for whole models: the reference tiny decoder, and a centred finite-difference
// probe of a model's loss against the analytic gradients backward() left on its parameters.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "riftco_transformer/model/transformer.hpp"

namespace riftco_transformer::testing {

// The reference tiny model (docs/ARCHITECTURE.md, 'The decoder'): V=27, C=16, D=32, H=4, N=2,
// F=64 (19,419 parameters).
inline TransformerDimensions reference_tiny() {
    return {.vocabulary_size = 27,
            .maximum_context = 16,
            .model_width = 32,
            .head_count = 4,
            .block_count = 2,
            .feed_forward_width = 64};
}

// For every parameter of `list` (whose gradients a backward pass of `loss` just computed),
// probes `probes` elements evenly spread over it with centred differences of step 1e-2 and
// expects |analytic − numeric| <= 5e-3 + 5e-3·|numeric|. Values are restored afterwards.
inline void expect_gradients_match_finite_differences(const ParameterList& list,
                                                      const std::function<double()>& loss,
                                                      std::size_t probes) {
    for (const NamedParameter& named : list) {
        Variable parameter = named.parameter;
        const std::vector<float> analytic = parameter.gradient().to_host();
        std::vector<float> values = parameter.value().to_host();
        for (std::size_t i = 0; i < values.size();
             i += std::max<std::size_t>(1, values.size() / probes)) {
            const float original = values[i];
            const auto loss_at = [&](float v) {
                values[i] = v;
                parameter.set_value(Tensor(parameter.shape(), values));
                return loss();
            };
            const double numeric = (loss_at(original + 1e-2F) - loss_at(original - 1e-2F)) / 2e-2;
            loss_at(original);
            EXPECT_NEAR(analytic[i], numeric, 5e-3 + 5e-3 * std::fabs(numeric))
                << named.name << "[" << i << "]";
        }
    }
}

}  // namespace riftco_transformer::testing
