#pragma once
// What every decoder-only language model offers, whatever its architecture (the GPT decoder,
// Llama/Mistral): the full-sequence forward, runtime attention and checkpointing policies,
// the incremental forward for KV-cached decoding, and the adaptation lifecycle (LoRA, packed
// NF4) over its projections. The C ABI's rt_model, the optimizers, decode sessions and the
// Python package talk to this interface, so a new architecture gets all of them at once.
//
// The lifecycle lives here once: a model registers its projections (attach order) with
// set_projections() at the end of its constructor and the rules are AdaptationLifecycle's.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/model/incremental_decoder.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

// Activation checkpointing: runtime policy, not model state.
enum class ActivationCheckpointing : std::uint32_t {
    Disabled = 0,
    TransformerBlock =
        1,  // each block is replayed during backward instead of keeping its activations
};

class CausalLanguageModel : public Module, public IncrementalDecoder {
  public:
    // token ids [B,T] (row-major) -> logits [B,T,V]. Shape not rank 2, B or T zero, id count
    // != B·T, T > C: std::invalid_argument; an id >= V: std::out_of_range. One upload, which
    // records the largest id (the host ids are scanned again only to name a bad position).
    [[nodiscard]] Variable forward(std::span<const std::uint32_t> tokens, const Shape& shape) const;
    // The same from ids already on the model's backend ([B,T]); the vocabulary check reads
    // the maximum recorded at the upload (no device read).
    [[nodiscard]] Variable forward(const IndexTensor& tokens) const;
    // Packed rows (several documents, e.g. fine-tuning examples, one after another in a row):
    // token ids [B,T] and positions [B·T], each token's position inside its document (rows
    // start at 0; each next position is 0, a new document, or the previous + 1). Positions
    // (RoPE or the learned table) restart in every document and attention never crosses a
    // boundary, in both attention kinds, so a document's logits are those it gets alone, up to
    // rounding. forward's rules, plus tensor_ops::packed_documents' (std::invalid_argument
    // naming the row and token). Materialized attention composes generic operations and runs on
    // every backend; flash needs a kernel with document bounds (tensor_ops::
    // require_packed_attention: std::invalid_argument naming the backend otherwise).
    [[nodiscard]] Variable forward(std::span<const std::uint32_t> tokens, const Shape& shape,
                                   std::span<const std::uint32_t> positions) const;
    [[nodiscard]] virtual std::size_t maximum_context() const noexcept = 0;

    [[nodiscard]] virtual AttentionKind attention() const noexcept = 0;
    virtual void set_attention(AttentionKind kind) = 0;
    [[nodiscard]] ActivationCheckpointing activation_checkpointing() const noexcept {
        return checkpointing_;
    }
    // An unknown value: std::invalid_argument naming `model_name()`.
    void set_activation_checkpointing(ActivationCheckpointing checkpointing);
    // "DecoderOnlyTransformer", "Decoder": the prefix of its messages.
    [[nodiscard]] virtual const char* model_name() const noexcept = 0;

    // The backend of the weights.
    [[nodiscard]] ExecutionBackend backend() const override { return Module::backend(); }
    [[nodiscard]] std::uint64_t structure_version() const noexcept override {
        return adaptation_.structure_version();
    }

    // LoRA and NF4 (docs/ARCHITECTURE.md, 'LoRA'; the rules are AdaptationLifecycle's).
    void attach_lora(const LoraConfig& config);
    [[nodiscard]] bool lora_attached() const noexcept { return adaptation_.lora_attached(); }
    [[nodiscard]] bool lora_merged() const noexcept { return adaptation_.lora_merged(); }
    [[nodiscard]] const LoraConfig& lora_config() const { return adaptation_.lora_config(); }
    // The LoRA dropout key (docs/ARCHITECTURE.md, 'LoRA'): the next training forward's masks
    // use it, and every training forward with dropout > 0 increments it. Saved and restored by
    // training checkpoints for an exact resume.
    [[nodiscard]] std::uint64_t lora_dropout_key() const noexcept {
        return adaptation_.dropout_key();
    }
    void set_lora_dropout_key(std::uint64_t key) noexcept { adaptation_.set_dropout_key(key); }
    // Evaluation mode for forwards that record a graph (AdaptationLifecycle::dropout_enabled).
    [[nodiscard]] bool lora_dropout_enabled() const noexcept {
        return adaptation_.dropout_enabled();
    }
    void set_lora_dropout_enabled(bool enabled) noexcept {
        adaptation_.set_dropout_enabled(enabled);
    }
    // The active adapter factors in projection order (empty without LoRA or after merge).
    [[nodiscard]] ParameterList lora_parameters() const { return adapter_parameters(); }
    void merge_lora();
    // Packs every projection.
    void quantize_nf4(const Nf4Options& options = {});
    // Packs every projection in a GGUF block format (AdaptationLifecycle::quantize_blocks).
    void quantize_blocks(WeightFormat format);
    // Takes packed weights made elsewhere (a GGUF file's blocks), one per projection in
    // projections() order (AdaptationLifecycle::adopt_packed_weights), and optionally the
    // token embedding table [V,D] (Embedding::check_packed_replacement): the lookup then
    // decodes rows and a tied head multiplies by the packed table. All checks run before
    // anything changes.
    void adopt_packed_weights(std::span<const QuantizedWeight> weights,
                              const QuantizedWeight* embedding = nullptr);
    // True when the token embedding table is packed (adopt_packed_weights).
    [[nodiscard]] bool has_packed_embedding() const noexcept;
    [[nodiscard]] bool has_quantized_weights() const noexcept { return adaptation_.quantized(); }
    [[nodiscard]] QuantizedMemoryUsage quantized_memory_usage() const;
    [[nodiscard]] std::vector<QuantizedWeight> packed_quantized_state() const;
    void load_packed_quantized_state(std::span<const QuantizedWeight> weights);
    // True when the head reads token_embedding.weight (no head parameters).
    [[nodiscard]] virtual bool embeddings_tied() const noexcept = 0;
    // Gives a tied model its own head: language_model_head.weight [V,D] starts as a copy of
    // the embedding table (a GPT head also gets a zero bias), so the logits do not change.
    // From then on the two are independent parameters, exactly as in a model built untied
    // with the same configuration (same parameter list and order, same artifacts), so
    // quantize_nf4 packs the head and LoRA can target it; the embedding lookups keep the
    // float32 table. Costs V·D more floats. std::invalid_argument (nothing changed) when the
    // embeddings are not tied, while LoRA adapters are attached, or once the weights are
    // packed; sessions created before it become stale.
    void untie_embeddings();
    // The projections in attach order.
    [[nodiscard]] const std::vector<AdaptableProjection>& projections() const noexcept {
        return projections_;
    }

  protected:
    // The forward pass proper, for ids the forward forms have checked; documents: packed rows
    // (null: every row is one document).
    [[nodiscard]] virtual Variable forward_checked(
        const IndexTensor& tokens,
        const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const = 0;
    // forward_incremental's argument rules (std::invalid_argument: no rows, tokens/positions
    // of different lengths, a position >= C, no output row or one >= R; std::out_of_range: an
    // id >= V), with `operation` naming the caller.
    void require_incremental_rows(const char* operation, std::span<const std::uint32_t> tokens,
                                  std::span<const std::size_t> positions,
                                  std::span<const std::size_t> output_rows) const;
    // The rows of hidden [R,D] listed in output_rows (hidden itself when they are all, in
    // order), detached.
    [[nodiscard]] static Variable select_rows(const Variable& hidden,
                                              std::span<const std::size_t> output_rows);
    // The language-model head: head->forward(normalized), or with tied embeddings (head null)
    // logits = h·Eᵀ, the embedding table [V,D] read as the head's weight [out,in], no bias.
    [[nodiscard]] static Variable language_model_logits(const Variable& normalized,
                                                        const Linear* head,
                                                        const Embedding& token_embedding);
    // An unknown checkpointing value: std::invalid_argument naming `model_name`.
    CausalLanguageModel(const char* model_name, ActivationCheckpointing checkpointing);
    // untie_embeddings' architecture part (called with the rules checked and room reserved
    // for one more projection; must not throw after registering the head): registers
    // "language_model_head" from the embedding table, records the untied configuration and
    // returns the head's projection.
    [[nodiscard]] virtual AdaptableProjection attach_untied_head() = 0;
    // The token embedding layer (dense or packed).
    [[nodiscard]] virtual Embedding& token_embedding_layer() noexcept = 0;
    [[nodiscard]] virtual const Embedding& token_embedding_layer() const noexcept = 0;
    void set_projections(std::vector<AdaptableProjection> projections) {
        projections_ = std::move(projections);
    }
    // Runs block `index`'s forward, replayed in backward when block checkpointing is on (its
    // dependencies: every trainable leaf of `block`, base and adapter). A replay after LoRA or
    // NF4 changed the structure: std::logic_error.
    // A domain_error inside (non-finite activations) is rethrown naming the block.
    [[nodiscard]] Variable run_block(const Module& block, std::size_t index, const Variable& hidden,
                                     const std::function<Variable(const Variable&)>& forward) const;

  private:
    // forward_checked under the LoRA dropout key of this forward (AdaptationLifecycle::
    // take_dropout_key).
    [[nodiscard]] Variable forward_with_dropout(
        const IndexTensor& tokens,
        const std::shared_ptr<const tensor_ops::PackedDocuments>& documents) const;

    ActivationCheckpointing checkpointing_;
    std::vector<AdaptableProjection> projections_;
    AdaptationLifecycle adaptation_;
};

}  // namespace riftco_transformer
