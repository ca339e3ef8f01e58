#pragma once
// The building blocks of the decoder: Linear, Embedding, LayerNorm, RMSNorm, FeedForward and
// SwiGLU (docs/ARCHITECTURE.md, 'Building blocks'). Shapes in comments: [..] is any leading shape.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops/normalization.hpp"
#include "riftco_transformer/nn/lora.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

// linear(x, weight, bias), the operation Linear runs, is in core/autograd/operations.hpp.

// Parameters "weight" [out, in] (Xavier(in, out)) and, when use_bias, "bias" [out] (zeros).
// The weight is dense or, after quantize (AdaptationLifecycle::quantize_nf4), a packed NF4
// QuantizedWeight: its dense slot is then empty and forward decodes the packed codes inside the
// kernel. An attached LowRankAdapter adds adapter parameters "lora_a.weight" and
// "lora_b.weight" (listed by adapter_parameters(), never by parameters()).
class Linear final : public Module {
  public:
    Linear(std::size_t in_features, std::size_t out_features, std::mt19937& generator,
           bool use_bias = true);
    // From given values: weight [out,in] and, when given, bias [out], on the weight's backend
    // (a rank, shape or backend mismatch: std::invalid_argument).
    Linear(Tensor weight, std::optional<Tensor> bias);
    // x [.., in] -> [.., out]: x·Wᵀ + b (+ scale·(x·Aᵀ)·Bᵀ with an active adapter). Rank 0 or
    // a last dimension != in: std::invalid_argument.
    [[nodiscard]] Variable forward(const Variable& x) const;
    // The dense weight; an empty Variable while the weight is packed.
    [[nodiscard]] const Variable& weight() const { return weight_; }
    [[nodiscard]] const Variable& bias() const { return bias_; }
    [[nodiscard]] bool has_bias() const { return bias_.defined(); }
    [[nodiscard]] std::size_t in_features() const { return in_features_; }
    [[nodiscard]] std::size_t out_features() const { return out_features_; }
    [[nodiscard]] bool is_quantized() const noexcept { return !packed_.is_singular(); }
    // The packed weight (singular while dense).
    [[nodiscard]] const QuantizedWeight& quantized_weight() const noexcept { return packed_; }
    // The active adapter, or null.
    [[nodiscard]] const LowRankAdapter* adapter() const noexcept {
        return adapter_active_ ? &*adapter_ : nullptr;
    }
    // True once an adapter was ever attached (merged or not): a projection takes one adapter
    // in its lifetime.
    [[nodiscard]] bool used_adapter() const noexcept { return adapter_.has_value(); }
    // The backend of the base weight, dense or packed.
    [[nodiscard]] ExecutionBackend weight_backend() const;

    // Steps of AdaptationLifecycle's transactions (prepare may throw and changes nothing;
    // commit and rollback cannot throw).
    // Registers the adapter's factors (std::logic_error if one was ever attached,
    // std::invalid_argument if its widths differ from this layer's).
    void attach_adapter(LowRankAdapter adapter);
    void rollback_adapter() noexcept;  // undoes attach_adapter
    // The merged dense weight: (dense W or deq(W)) + the active adapter's delta.
    [[nodiscard]] Tensor prepare_merge() const;
    // Stores it as the dense weight (a fresh leaf when the weight was packed, else the same
    // leaf with a new value); the adapter stops contributing and its factors leave the
    // adapter list (the handles stay valid).
    void commit_merge(Variable prepared) noexcept;
    // Packs the dense weight (std::logic_error if it is already packed or still held outside
    // this layer).
    [[nodiscard]] QuantizedWeight prepare_quantization(const Nf4Options& options) const;
    // The same in a GGUF block format (QuantizedWeight::quantize_blocks).
    [[nodiscard]] QuantizedWeight prepare_block_quantization(WeightFormat format) const;
    // Checks that a packed weight from elsewhere (a file) can replace the dense one: the same
    // [out, in] shape (std::invalid_argument naming both) and the dense weight held only here
    // (std::logic_error, as prepare_quantization).
    void check_packed_replacement(const QuantizedWeight& packed) const;
    // Stores a packed weight and releases the dense value and gradient (also how a packed
    // state is loaded).
    void commit_quantization(QuantizedWeight packed) noexcept;

  protected:
    void prepare_transfer(ExecutionBackend backend,
                          std::vector<std::function<void()>>& commits) override;

  private:
    void require_packable() const;
    std::size_t in_features_;
    std::size_t out_features_;
    Variable weight_;  // handles share the registered leaves; empty while packed
    Variable bias_;    // empty without a bias
    QuantizedWeight packed_;
    std::optional<LowRankAdapter> adapter_;
    bool adapter_active_ = false;
};

// Parameter "weight" [V, D] ~ U(±1/√D).
// While one is alive on this thread, the models built here allocate no dense value for the
// weights it defers: every Linear's weight (its bias is allocated as usual) and, when asked,
// a decoder's token embedding table. Their parameter slots are registered released, so the
// parameter lists leave them out, and the builder must give each one a packed weight
// (CausalLanguageModel::adopt_packed_weights) before the model is used: a loader that reads
// packed weights from a file never holds a float32 copy of them. Scopes nest (the innermost
// one rules) and are restored on exit.
class DeferredWeightsScope {
  public:
    DeferredWeightsScope(bool projections, bool token_embedding) noexcept;
    ~DeferredWeightsScope();
    DeferredWeightsScope(const DeferredWeightsScope&) = delete;
    DeferredWeightsScope& operator=(const DeferredWeightsScope&) = delete;

    [[nodiscard]] static bool projections_deferred() noexcept;
    [[nodiscard]] static bool token_embedding_deferred() noexcept;

  private:
    bool previous_projections_;
    bool previous_token_embedding_;
};

class Embedding final : public Module {
  public:
    Embedding(std::size_t vocabulary_size, std::size_t width, std::mt19937& generator);
    // With `deferred`, no table is allocated: the slot is registered released, and a packed
    // table must be committed (check_packed_replacement, commit_packed) before use.
    Embedding(std::size_t vocabulary_size, std::size_t width, std::mt19937& generator,
              bool deferred);
    // ids (prod(index_shape) of them, each < V) -> index_shape + [D].
    [[nodiscard]] Variable forward(std::span<const std::size_t> ids,
                                   const Shape& index_shape) const;
    // ids on the weight's backend (each < V) -> ids.shape() + [D].
    [[nodiscard]] Variable forward(const IndexTensor& ids) const;
    // The dense table; an undefined Variable while the table is packed.
    [[nodiscard]] const Variable& weight() const { return weight_; }
    // A packed table (a GGUF file's blocks) replaces the dense one: the lookup decodes the
    // rows it reads, and no gradient reaches the table (it is no longer a parameter).
    [[nodiscard]] bool is_packed() const noexcept { return !packed_.is_singular(); }
    [[nodiscard]] const QuantizedWeight& packed_weight() const noexcept { return packed_; }
    // std::invalid_argument: a shape other than [V, D] (names both); std::logic_error: already
    // packed, or the dense table held outside the model (a parameter list, an optimizer).
    void check_packed_replacement(const QuantizedWeight& packed) const;
    void commit_packed(QuantizedWeight packed) noexcept;

  protected:
    void prepare_transfer(ExecutionBackend backend,
                          std::vector<std::function<void()>>& commits) override;

  private:
    std::size_t vocabulary_size_;
    std::size_t width_;
    Variable weight_;  // empty while packed
    QuantizedWeight packed_;
};

// Several projections of one input in one pass (q, k and v; a gate and an up projection):
// their outputs, x [.., in] -> [.., out_i], when no graph is recorded (NoGradientGuard) and
// every layer is dense, without an active adapter and without bias, with the values each
// layer's forward gives; otherwise nullopt, and the caller runs the layers one by one.
[[nodiscard]] std::optional<std::vector<Variable>> fused_projections(
    const Variable& x, std::initializer_list<const Linear*> layers);

// Parameters "scale" [W] (ones) and "bias" [W] (zeros) over the last axis.
class LayerNorm final : public Module {
  public:
    explicit LayerNorm(std::size_t width,
                       float epsilon = tensor_ops::default_normalization_epsilon);
    [[nodiscard]] Variable forward(const Variable& x) const;

  private:
    float epsilon_;
    Variable scale_;
    Variable bias_;
};

// Parameter "scale" [W] (ones): y = x·scale/√(mean(x²) + eps). With weight_offset (Gemma's
// form) the parameter is stored as w = scale − 1 (zeros): y = x·(1 + w)/√(mean(x²) + eps).
class RMSNorm final : public Module {
  public:
    explicit RMSNorm(std::size_t width, float epsilon = tensor_ops::default_normalization_epsilon,
                     bool weight_offset = false);
    [[nodiscard]] Variable forward(const Variable& x) const;
    [[nodiscard]] bool weight_offset() const noexcept { return weight_offset_; }

  private:
    float epsilon_;
    bool weight_offset_;
    Variable scale_;
};

// The feed-forward activation: exact-erf GELU, ReLU, or GELU in GPT-2's tanh form.
enum class Activation : std::uint32_t { Gelu = 0, Relu = 1, GeluTanh = 2 };

// expand (D -> F), activation, project (F -> D); no norm, no residual. Both projections carry
// a (zero-initialised) bias unless `bias` is false.
class FeedForward final : public Module {
  public:
    FeedForward(std::size_t width, std::size_t hidden_width, std::mt19937& generator,
                Activation activation = Activation::Gelu, bool bias = true);
    [[nodiscard]] Variable forward(const Variable& x) const;

  private:
    Activation activation_;
    Linear* expand_;
    Linear* project_;
};

// The activation of a gated feed-forward: SiLU (SwiGLU: Llama, Qwen, Phi-3) or GELU in its
// tanh form (GeGLU: Gemma). Stable ABI values (C ABI 2.10).
enum class GatedActivation : std::uint32_t { Silu = 0, GeluTanh = 1 };

// down(act(gate(x)) ⊙ up(x)); gate and up D -> F, down F -> D, without bias unless `bias` (then
// each carries a zero-initialised one); act is SiLU (SwiGLU) or tanh-GELU (GeGLU). An unknown
// activation: std::invalid_argument.
class SwiGLU final : public Module {
  public:
    SwiGLU(std::size_t width, std::size_t hidden_width, std::mt19937& generator,
           GatedActivation activation = GatedActivation::Silu, bool bias = false);
    [[nodiscard]] Variable forward(const Variable& x) const;

  private:
    GatedActivation activation_;
    Linear* gate_;
    Linear* up_;
    Linear* down_;
};

}  // namespace riftco_transformer
