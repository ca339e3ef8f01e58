#include "riftco_transformer/model/causal_language_model.hpp"

#include <stdexcept>
#include <string>

#include "riftco_transformer/core/autograd/custom_gradient.hpp"

namespace riftco_transformer {
namespace {

void require_checkpointing(const char* model, ActivationCheckpointing checkpointing) {
    if (checkpointing != ActivationCheckpointing::Disabled &&
        checkpointing != ActivationCheckpointing::TransformerBlock) {
        throw std::invalid_argument(std::string(model) +
                                    ": unknown activation checkpointing value " +
                                    std::to_string(static_cast<std::uint32_t>(checkpointing)));
    }
}

}  // namespace

CausalLanguageModel::CausalLanguageModel(const char* model_name,
                                         ActivationCheckpointing checkpointing)
    : checkpointing_(checkpointing) {
    require_checkpointing(model_name, checkpointing);
}

void CausalLanguageModel::set_activation_checkpointing(ActivationCheckpointing checkpointing) {
    require_checkpointing(model_name(), checkpointing);
    checkpointing_ = checkpointing;
}

void CausalLanguageModel::attach_lora(const LoraConfig& config) {
    adaptation_.attach_lora(*this, projections_, config);
}

void CausalLanguageModel::merge_lora() {
    adaptation_.merge_lora(*this, projections_);
}

void CausalLanguageModel::quantize_nf4(const Nf4Options& options) {
    adaptation_.quantize_nf4(projections_, options);
}

QuantizedMemoryUsage CausalLanguageModel::quantized_memory_usage() const {
    return AdaptationLifecycle::quantized_memory(projections_);
}

std::vector<QuantizedWeight> CausalLanguageModel::packed_quantized_state() const {
    return adaptation_.packed_state(projections_);
}

void CausalLanguageModel::load_packed_quantized_state(std::span<const QuantizedWeight> weights) {
    adaptation_.load_packed_state(projections_, weights);
}

Variable CausalLanguageModel::run_block(
    const Module& block, std::size_t index, const Variable& hidden,
    const std::function<Variable(const Variable&)>& forward) const {
    try {
        if (checkpointing_ != ActivationCheckpointing::TransformerBlock)
            return forward(hidden);
        // Dependencies: every trainable leaf of the block, base and adapter alike.
        std::vector<Variable> dependencies;
        for (const ParameterList& list : {block.parameters(), block.adapter_parameters()}) {
            for (const NamedParameter& named : list) {
                if (named.parameter.requires_gradient())
                    dependencies.push_back(named.parameter);
            }
        }
        const std::uint64_t version = structure_version();
        const AdaptationLifecycle* adaptation = &adaptation_;
        const char* model = model_name();
        return checkpoint(hidden, dependencies,
                          [forward, version, adaptation, index, model](const Variable& input) {
                              if (adaptation->structure_version() != version) {
                                  throw std::logic_error(
                                      std::string(model) + ": block " + std::to_string(index) +
                                      " cannot be replayed: LoRA or NF4 changed the model's "
                                      "structure after the forward pass");
                              }
                              return forward(input);
                          });
    } catch (const std::domain_error& error) {
        // A kernel of the block met NaN/inf (the softmax of non-finite attention scores): the
        // cause is the activations, not an argument of the op that noticed.
        throw std::domain_error(std::string(model_name()) +
                                "::forward: non-finite activations in block " +
                                std::to_string(index) +
                                " (weights too large or not finite?): " + error.what());
    }
}

}  // namespace riftco_transformer
