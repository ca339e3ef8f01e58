#pragma once
// Test helpers for whole models: the reference tiny decoder, and a centred finite-difference
// probe of a model's loss against the analytic gradients backward() left on its parameters.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
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

// A reference tiny model drawn from `seed`, `count` token ids below its V drawn from `seed`,
// and the logits [T, V] of its full forward over `tokens` (the decode tests' oracle).
inline DecoderOnlyTransformer reference_tiny_model(std::uint32_t seed = 11) {
    std::mt19937 generator(seed);
    return DecoderOnlyTransformer(reference_tiny(), generator);
}

inline std::vector<std::uint32_t> reference_tokens(std::size_t count, std::uint32_t seed) {
    std::mt19937 generator(seed);
    std::vector<std::uint32_t> tokens(count);
    for (auto& token : tokens) {
        token = static_cast<std::uint32_t>(generator() % reference_tiny().vocabulary_size);
    }
    return tokens;
}

inline std::vector<float> full_forward_logits(const DecoderOnlyTransformer& model,
                                              const std::vector<std::uint32_t>& tokens) {
    const NoGradientGuard guard;
    return model.forward(tokens, {1, tokens.size()}).value().to_host();
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
