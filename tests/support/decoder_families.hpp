#pragma once
// The decoder's families as test configurations, shared by the CPU suite
// (test_decoder_families.cpp) and the second-backend suites: every family with the choices that
// make it differ from Llama switched on, small enough for finite differences.

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/serving/decode_session.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer::testing {

// V=17, C=24, D=16, Hq=4, Hkv=2, N=2, F=20, θ=500.
inline DecoderConfig dimensions() {
    DecoderConfig c;
    c.vocabulary_size = 17;
    c.maximum_context = 24;
    c.model_width = 16;
    c.query_head_count = 4;
    c.key_value_head_count = 2;
    c.block_count = 2;
    c.feed_forward_width = 20;
    c.rope_theta = 500.0;
    return c;
}

// Llama with Llama 3's scaling; Mistral with a window of 3; Qwen 2 with YaRN; Qwen 3 and Gemma 3
// with a head width that is not D/Hq; Gemma 3 with six blocks (five windowed with their own RoPE
// base, one dense with linear scaling) and an attention scale; Gemma 2 with four blocks alternating
// windowed and dense, an attention scale and both soft caps small enough to bite; Phi-3 with a
// window of 4; GPT-2 (learned positions, LayerNorm, the plain biased feed-forward) with
// Hkv = Hq and an untied, biased head.
inline std::vector<DecoderConfig> family_configs() {
    std::vector<DecoderConfig> configs;
    DecoderConfig llama3 = dimensions();
    llama3.rope_scaling.kind = RopeScalingKind::Llama3;
    llama3.rope_scaling.factor = 8.0;
    llama3.rope_scaling.original_context = 12;
    configs.push_back(architecture_preset(DecoderArchitecture::Llama, llama3));
    DecoderConfig mistral = dimensions();
    mistral.sliding_window = 3;
    configs.push_back(architecture_preset(DecoderArchitecture::Mistral, mistral));
    // Qwen 2 with YaRN over an original context of half C (ramp inside the head width).
    DecoderConfig qwen2 = dimensions();
    qwen2.rope_scaling.kind = RopeScalingKind::Yarn;
    qwen2.rope_scaling.factor = 4.0;
    qwen2.rope_scaling.original_context = 12;
    qwen2.rope_scaling.beta_fast = 8.0;
    configs.push_back(architecture_preset(DecoderArchitecture::Qwen2, qwen2));
    DecoderConfig qwen3 = dimensions();
    qwen3.head_width = 6;
    qwen3.tie_embeddings = true;
    configs.push_back(architecture_preset(DecoderArchitecture::Qwen3, qwen3));
    DecoderConfig gemma3 = dimensions();
    gemma3.block_count = 6;
    gemma3.head_width = 6;
    gemma3.sliding_window = 3;
    gemma3.attention_scale = 0.3F;
    gemma3.tie_embeddings = true;
    gemma3.rope_scaling.kind = RopeScalingKind::Linear;
    gemma3.rope_scaling.factor = 4.0;
    configs.push_back(architecture_preset(DecoderArchitecture::Gemma3, gemma3));
    DecoderConfig gemma2 = dimensions();
    gemma2.block_count = 4;
    gemma2.head_width = 6;
    gemma2.sliding_window = 3;
    gemma2.attention_scale = 0.3F;
    gemma2.tie_embeddings = true;
    // Caps small enough to bite on these scores and logits.
    gemma2.attention_logit_softcap = 0.7F;
    gemma2.final_logit_softcap = 1.5F;
    configs.push_back(architecture_preset(DecoderArchitecture::Gemma2, gemma2));
    DecoderConfig phi3 = dimensions();
    phi3.sliding_window = 4;
    configs.push_back(architecture_preset(DecoderArchitecture::Phi3, phi3));
    DecoderConfig gpt2 = dimensions();
    gpt2.key_value_head_count = gpt2.query_head_count;
    configs.push_back(architecture_preset(DecoderArchitecture::Gpt2, gpt2));
    return configs;
}

inline std::string name_of(const DecoderConfig& c) {
    return std::string(decoder_architecture_name(c.architecture));
}

// Every parameter moved off its initial value (norms off the identity, biases off zero), so no
// choice is invisible because its parameter starts neutral.
inline void perturb(const Module& model, unsigned seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> noise(0.0F, 0.2F);
    for (const NamedParameter& named : model.parameters()) {
        Variable leaf = named.parameter;
        std::vector<float> values = named.parameter.value().to_host();
        for (float& value : values)
            value += noise(generator);
        leaf.set_value(Tensor(named.parameter.shape(), values));
    }
}

// The values a second backend must reproduce for `config` (seed 31, perturbed): the logits of
// two rows of 10 tokens, then every parameter's gradient of their loss in parameter order, then
// a paged decode session's logits of a 12-token prefill, computed on `backend`.
// The family's model on `backend` (seed 31, perturbed by 32), the one every run below trains.
inline std::unique_ptr<Decoder> family_model(const DecoderConfig& config, ExecutionBackend backend,
                                             AttentionKind attention) {
    std::mt19937 generator(31);
    auto model = std::make_unique<Decoder>(config, generator, attention);
    perturb(*model, 32);
    if (backend != ExecutionBackend::Cpu)
        model->to(backend);
    return model;
}

// logits [2,10,17] of `tokens` on `backend`, then their values and every parameter's gradient
// of the next-token cross-entropy, flattened.
inline std::vector<float> logits_and_gradients(const Decoder& model, const Variable& logits,
                                               const std::vector<std::uint32_t>& tokens,
                                               ExecutionBackend backend) {
    std::vector<std::uint32_t> targets(tokens.begin() + 1, tokens.end());
    targets.push_back(0);
    EXPECT_EQ(logits.value().backend(), backend);
    Variable loss = cross_entropy(reshape(logits, {20, 17}), targets);
    loss.backward();
    std::vector<float> out = logits.value().to_host();
    for (const NamedParameter& named : model.parameters()) {
        const std::vector<float> gradient = named.parameter.gradient().to_host();
        out.insert(out.end(), gradient.begin(), gradient.end());
    }
    return out;
}

inline std::vector<float> run_family(const DecoderConfig& config, ExecutionBackend backend,
                                     AttentionKind attention) {
    const std::unique_ptr<Decoder> owned = family_model(config, backend, attention);
    Decoder& model = *owned;
    const std::vector<std::uint32_t> tokens = pseudo_random_tokens(20, 17, 33);
    std::vector<float> out =
        logits_and_gradients(model, model.forward(tokens, {2, 10}), tokens, backend);
    DecodeSession session(model, KeyValueCacheKind::Paged, 4);
    const std::vector<float> decoded =
        session.prefill({tokens.data(), 12}, PrefillLogits::All).to_host();
    out.insert(out.end(), decoded.begin(), decoded.end());
    return out;
}

// Packed rows on `backend`: two rows of 10 tokens holding documents of 4 + 6 and 3 + 2 + 5
// tokens; the logits and the parameter gradients of a cross-entropy, flattened.
inline std::vector<float> run_packed_family(const DecoderConfig& config, ExecutionBackend backend,
                                            AttentionKind attention) {
    const std::unique_ptr<Decoder> model = family_model(config, backend, attention);
    const std::vector<std::uint32_t> tokens = pseudo_random_tokens(20, 17, 34);
    const std::vector<std::uint32_t> positions = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5,
                                                  0, 1, 2, 0, 1, 0, 1, 2, 3, 4};
    return logits_and_gradients(*model, model->forward(tokens, {2, 10}, positions), tokens,
                                backend);
}

}  // namespace riftco_transformer::testing
