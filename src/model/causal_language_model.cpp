#include "riftco_transformer/model/causal_language_model.hpp"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "riftco_transformer/core/autograd/custom_gradient.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"

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

namespace {

void require_token_shape(const std::string& operation, const Shape& shape) {
    if (shape.size() != 2 || shape[0] == 0 || shape[1] == 0) {
        throw std::invalid_argument(operation + ": token shape must be [B,T] with B, T > 0 (got " +
                                    shape_to_string(shape) + ")");
    }
}

[[noreturn]] void throw_token_out_of_range(const std::string& operation, std::uint32_t id,
                                           std::size_t position, std::size_t vocabulary) {
    std::ostringstream message;
    message << operation << ": token id " << id << " at position " << position
            << " is out of range for vocabulary size " << vocabulary;
    throw std::out_of_range(message.str());
}

}  // namespace

namespace {

// forward's argument rules for host ids; returns them uploaded.
IndexTensor checked_upload(const CausalLanguageModel& model, const std::string& operation,
                           std::span<const std::uint32_t> tokens, const Shape& shape) {
    require_token_shape(operation, shape);
    const std::size_t batch = shape[0];
    const std::size_t time = shape[1];
    if (batch > std::numeric_limits<std::size_t>::max() / time || tokens.size() != batch * time) {
        std::ostringstream message;
        message << operation << ": " << tokens.size() << " token ids given for shape "
                << shape_to_string(shape);
        throw std::invalid_argument(message.str());
    }
    if (time > model.maximum_context()) {
        std::ostringstream message;
        message << operation << ": sequence length " << time << " exceeds the maximum context "
                << model.maximum_context();
        throw std::invalid_argument(message.str());
    }
    IndexTensor uploaded(shape, tokens, model.backend());
    if (uploaded.max_id() >= model.vocabulary_size()) {
        const auto bad = std::find_if(tokens.begin(), tokens.end(), [&](std::uint32_t id) {
            return id >= model.vocabulary_size();
        });
        throw_token_out_of_range(operation, *bad, static_cast<std::size_t>(bad - tokens.begin()),
                                 model.vocabulary_size());
    }
    return uploaded;
}

}  // namespace

Variable CausalLanguageModel::forward(std::span<const std::uint32_t> tokens,
                                      const Shape& shape) const {
    const std::string operation = std::string(model_name()) + "::forward";
    return forward_with_dropout(checked_upload(*this, operation, tokens, shape), nullptr);
}

Variable CausalLanguageModel::forward_with_dropout(
    const IndexTensor& tokens,
    const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const {
    const LoraDropoutScope scope(adaptation_.take_dropout_key());
    return forward_checked(tokens, documents);
}

Variable CausalLanguageModel::forward(std::span<const std::uint32_t> tokens, const Shape& shape,
                                      std::span<const std::uint32_t> positions) const {
    const std::string operation = std::string(model_name()) + "::forward";
    require_token_shape(operation, shape);
    // Every argument is checked before anything is uploaded.
    const auto documents = tensor_ops::packed_documents(operation, positions, shape[0], shape[1]);
    // Materialized attention composes generic operations; the flash kernel must know the
    // document bounds (said here, before anything runs, rather than in the first block).
    if (attention() == AttentionKind::Flash)
        tensor_ops::require_packed_attention(operation, backend());
    return forward_with_dropout(checked_upload(*this, operation, tokens, shape), documents);
}

Variable CausalLanguageModel::forward(const IndexTensor& tokens) const {
    const std::string operation = std::string(model_name()) + "::forward";
    if (tokens.is_singular())
        throw std::logic_error(operation + ": tokens is a singular index tensor");
    require_token_shape(operation, tokens.shape());
    if (tokens.shape()[1] > maximum_context()) {
        std::ostringstream message;
        message << operation << ": sequence length " << tokens.shape()[1]
                << " exceeds the maximum context " << maximum_context();
        throw std::invalid_argument(message.str());
    }
    if (tokens.max_id() >= vocabulary_size()) {
        throw_token_out_of_range(operation, tokens.max_id(), tokens.max_id_position(),
                                 vocabulary_size());
    }
    return forward_with_dropout(tokens, nullptr);
}

void CausalLanguageModel::require_incremental_rows(const char* operation,
                                                   std::span<const std::uint32_t> tokens,
                                                   std::span<const std::size_t> positions,
                                                   std::span<const std::size_t> output_rows) const {
    const std::size_t rows = tokens.size();
    if (rows == 0 || positions.size() != rows || output_rows.empty()) {
        std::ostringstream message;
        message << operation << ": " << rows << " tokens, " << positions.size() << " positions and "
                << output_rows.size()
                << " output rows given (one position per token, at least one of each)";
        throw std::invalid_argument(message.str());
    }
    for (std::size_t r = 0; r < rows; ++r) {
        if (tokens[r] >= vocabulary_size()) {
            std::ostringstream message;
            message << operation << ": token id " << tokens[r] << " at row " << r
                    << " is out of range for vocabulary size " << vocabulary_size();
            throw std::out_of_range(message.str());
        }
        if (positions[r] >= maximum_context()) {
            std::ostringstream message;
            message << operation << ": position " << positions[r] << " at row " << r
                    << " is outside the maximum context " << maximum_context();
            throw std::invalid_argument(message.str());
        }
    }
    for (const std::size_t row : output_rows) {
        if (row >= rows) {
            std::ostringstream message;
            message << operation << ": output row " << row << " is out of range for " << rows
                    << " rows";
            throw std::invalid_argument(message.str());
        }
    }
}

Variable CausalLanguageModel::language_model_logits(const Variable& normalized, const Linear* head,
                                                    const Embedding& token_embedding) {
    if (head != nullptr)
        return head->forward(normalized);
    if (token_embedding.is_packed())
        return quantized_linear(normalized, token_embedding.packed_weight());
    return linear(normalized, token_embedding.weight(), Variable());
}

Variable CausalLanguageModel::select_rows(const Variable& hidden,
                                          std::span<const std::size_t> output_rows) {
    const std::size_t rows = hidden.shape()[0];
    bool all = output_rows.size() == rows;
    for (std::size_t i = 0; all && i < rows; ++i)
        all = output_rows[i] == i;
    if (all)
        return hidden;
    const std::vector<std::uint32_t> selected(output_rows.begin(), output_rows.end());
    const IndexTensor indices({selected.size()}, selected, hidden.value().backend());
    return Variable(tensor_ops::gather_rows(hidden.value(), indices), false);
}

void CausalLanguageModel::set_activation_checkpointing(ActivationCheckpointing checkpointing) {
    require_checkpointing(model_name(), checkpointing);
    checkpointing_ = checkpointing;
}

void CausalLanguageModel::attach_lora(const LoraConfig& config) {
    // A tied head is the embedding table: an adapter on it would silently not exist.
    if ((config.targets & lora_target_bit(LoraTarget::LanguageModelHead)) != 0 &&
        embeddings_tied()) {
        throw std::invalid_argument(
            "attach_lora: the targets name language_model_head, but this " +
            std::string(model_name()) +
            "'s head is tied to the token embedding; call untie_embeddings() first, or leave "
            "the head out of the targets");
    }
    adaptation_.attach_lora(*this, projections_, config);
}

void CausalLanguageModel::merge_lora() {
    if (has_packed_embedding()) {
        throw std::logic_error(
            "merge_lora: the token embedding table is packed (the file's blocks); merging "
            "would leave it so while the projections become dense: keep base + adapter, or "
            "load the base in float32 to merge");
    }
    adaptation_.merge_lora(*this, projections_);
}

void CausalLanguageModel::untie_embeddings() {
    const std::string op = std::string(model_name()) + "::untie_embeddings";
    if (!embeddings_tied()) {
        throw std::invalid_argument(op + ": the model's embeddings are not tied");
    }
    if (adaptation_.lora_attached()) {
        throw std::invalid_argument(op + ": the model has LoRA adapters; untie before attach_lora");
    }
    if (adaptation_.quantized()) {
        throw std::invalid_argument(op +
                                    ": the model's weights are packed; untie before quantize_nf4");
    }
    projections_.reserve(projections_.size() + 1);
    projections_.push_back(attach_untied_head());
    adaptation_.note_structure_change();
}

void CausalLanguageModel::quantize_nf4(const Nf4Options& options) {
    adaptation_.quantize_nf4(projections_, options);
}

void CausalLanguageModel::quantize_blocks(WeightFormat format) {
    adaptation_.quantize_blocks(projections_, format);
}

void CausalLanguageModel::adopt_packed_weights(std::span<const QuantizedWeight> weights,
                                               const QuantizedWeight* embedding) {
    if (embedding != nullptr) {
        try {
            if (embedding->is_singular())
                throw std::invalid_argument("the packed table is singular");
            token_embedding_layer().check_packed_replacement(*embedding);
        } catch (const std::invalid_argument& error) {
            throw std::invalid_argument(std::string("adopt_packed_weights: token_embedding: ") +
                                        error.what());
        } catch (const std::logic_error& error) {
            throw std::logic_error(std::string("adopt_packed_weights: token_embedding: ") +
                                   error.what());
        }
    }
    adaptation_.adopt_packed_weights(projections_, weights);  // transactional
    if (embedding != nullptr)
        token_embedding_layer().commit_packed(*embedding);  // cannot throw
}

bool CausalLanguageModel::has_packed_embedding() const noexcept {
    return token_embedding_layer().is_packed();
}

QuantizedMemoryUsage CausalLanguageModel::quantized_memory_usage() const {
    QuantizedMemoryUsage usage = AdaptationLifecycle::quantized_memory(projections_);
    if (has_packed_embedding())
        usage += token_embedding_layer().packed_weight().memory_usage();
    return usage;
}

std::vector<QuantizedWeight> CausalLanguageModel::packed_quantized_state() const {
    std::vector<QuantizedWeight> state = adaptation_.packed_state(projections_);
    if (has_packed_embedding())
        state.push_back(token_embedding_layer().packed_weight());  // last, after the projections
    return state;
}

void CausalLanguageModel::load_packed_quantized_state(std::span<const QuantizedWeight> weights) {
    if (!has_packed_embedding()) {
        adaptation_.load_packed_state(projections_, weights);
        return;
    }
    constexpr const char* op = "load_packed_quantized_state";
    if (weights.size() != projections_.size() + 1) {
        throw std::invalid_argument(
            std::string(op) + ": " + std::to_string(weights.size()) + " packed weights given for " +
            std::to_string(projections_.size()) + " projections and the packed token embedding");
    }
    const QuantizedWeight& current = token_embedding_layer().packed_weight();
    const QuantizedWeight& incoming = weights.back();
    if (incoming.is_singular() || incoming.shape() != current.shape() ||
        incoming.format() != current.format()) {
        throw std::invalid_argument(
            std::string(op) + ": token_embedding: the packed table must be " +
            std::string(weight_format_name(current.format())) + " " +
            shape_to_string(current.shape()) + " like the model's (got " +
            (incoming.is_singular() ? std::string("a singular weight")
                                    : std::string(weight_format_name(incoming.format())) + " " +
                                          shape_to_string(incoming.shape())) +
            ")");
    }
    QuantizedWeight staged =
        incoming.backend() == current.backend() ? incoming : incoming.to(current.backend());
    adaptation_.load_packed_state(projections_, weights.first(projections_.size()));
    token_embedding_layer().commit_packed(std::move(staged));
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
        // A replay draws the same LoRA dropout masks as its forward.
        const std::optional<std::uint64_t> dropout_key = LoraDropoutScope::current();
        return checkpoint(
            hidden, dependencies,
            [forward, version, adaptation, index, model, dropout_key](const Variable& input) {
                if (adaptation->structure_version() != version) {
                    throw std::logic_error(std::string(model) + ": block " + std::to_string(index) +
                                           " cannot be replayed: LoRA or NF4 changed the model's "
                                           "structure after the forward pass");
                }
                const LoraDropoutScope scope(dropout_key);
                return forward(input);
            });
    } catch (const std::domain_error& error) {
        // A kernel of the block met NaN/inf (the softmax of non-finite attention scores): the
        // cause is the activations, not an argument of the op that noticed.
        throw std::domain_error(
            std::string(model_name()) + "::forward: non-finite activations in block " +
            std::to_string(index) + " (weights too large or not finite?): " + error.what());
    }
}

}  // namespace riftco_transformer
