#pragma once
// LoRA (docs/ARCHITECTURE.md, 'LoRA'): low-rank adapters on a frozen base.
//
//   y = x·Wᵀ + b + scale·(x·Aᵀ)·Bᵀ,   A [rank, in] ~ Xavier(in, rank),  B [out, rank] = 0,
//   scale = alpha / rank (in float), or alpha / √rank with rank_stabilized (rsLoRA, Kalajdzievski
//   2023: the update's magnitude no longer shrinks as the rank grows)
//
// so a freshly attached adapter leaves every output unchanged.
//
// Dropout on the adapter input (LoraConfig::dropout = p, PEFT's lora_dropout): in a training
// forward (one that records gradients) each adapted projection computes
//
//   y = x·Wᵀ + b + scale·(dropout(x)·Aᵀ)·Bᵀ,   dropout(x) = x ⊙ m,  m_i ∈ {0, 1/(1−p)}
//
// (inverted dropout: each element kept with probability 1−p, independently per projection).
// The mask is a pure function of (random_seed, the model's dropout key, the projection's index
// in the model's projection list, the element's index) through tensor_ops::dropout_mask's
// counter-based generator; every training forward of the model uses the current key and then
// increments it (lora_dropout_key / set_lora_dropout_key restore it for an exact resume), and a
// checkpointed block's replay reuses its forward's key. A forward under NoGradientGuard
// (evaluation, decoding, serving) applies no dropout, and p = 0 runs the fused path unchanged.
// Targets are chosen by projection name; a model lists the projections it has (AdaptableProjection)
// and the lifecycle below works on any such list, the GPT and the Llama/Mistral models alike.
//
// Attaching freezes the whole base (requires_gradient false), so backward
// computes no weight-gradient product for any base weight; only the adapter factors train.
// merge_lora() makes the base trainable again.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/nn/module.hpp"
#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer {

class Linear;

// The projections an adapter can target. Values 0..6 are the C ABI's mask bits (1 << value);
// the SwiGLU names exist only in models with a gated feed-forward.
enum class LoraTarget : std::uint32_t {
    Query = 0,
    Key = 1,
    Value = 2,
    Output = 3,
    FeedForwardExpand = 4,
    FeedForwardProject = 5,
    LanguageModelHead = 6,
    FeedForwardGate = 7,
    FeedForwardUp = 8,
    FeedForwardDown = 9,
};
inline constexpr std::size_t lora_target_count = 10;

using LoraTargetMask = std::uint64_t;
[[nodiscard]] constexpr LoraTargetMask lora_target_bit(LoraTarget target) noexcept {
    return LoraTargetMask{1} << static_cast<std::uint32_t>(target);
}
inline constexpr LoraTargetMask lora_default_targets =
    lora_target_bit(LoraTarget::Query) | lora_target_bit(LoraTarget::Value);
inline constexpr LoraTargetMask lora_known_targets = (LoraTargetMask{1} << lora_target_count) - 1;

// "attention.query", "attention.key", "attention.value", "attention.output",
// "feed_forward.expand", "feed_forward.project", "language_model_head", "feed_forward.gate",
// "feed_forward.up", "feed_forward.down": the path of the projection inside a block (or the
// model, for the head).
[[nodiscard]] std::string_view lora_target_name(LoraTarget target);
// The target of a name above; std::invalid_argument naming the unknown name and listing the
// known ones.
[[nodiscard]] LoraTarget lora_target_from_name(std::string_view name);

struct LoraConfig {
    std::size_t rank = 4;
    float alpha = 8.0F;
    std::uint32_t random_seed = 5489;
    LoraTargetMask targets = lora_default_targets;
    bool rank_stabilized = false;  // rsLoRA: scale = alpha / √rank
    float dropout = 0.0F;          // p in [0, 1): dropout on the adapter input while training
};

// alpha / rank (alpha / √rank when rank_stabilized) in float, after the config's own rules
// (std::invalid_argument naming the field): rank 0; alpha not finite or not > 0; a scale that is
// not finite or not > 0; an empty mask; a bit that names no target; dropout not finite or
// outside [0, 1).
[[nodiscard]] float lora_scale(const LoraConfig& config, std::string_view operation);

class LowRankAdapter {
  public:
    // A [rank, in] ~ Xavier(fan_in = in, fan_out = rank) drawn from `generator`; B [out, rank]
    // zeros; both on `backend`. std::invalid_argument: a zero width, rank 0 or
    // rank > min(in, out), alpha or alpha/rank not finite and > 0.
    // rank_stabilized: scale alpha/√rank (rsLoRA) instead of alpha/rank.
    LowRankAdapter(std::size_t in_features, std::size_t out_features, std::size_t rank, float alpha,
                   std::mt19937& generator, ExecutionBackend backend, bool rank_stabilized = false);

    // scale·((x·Aᵀ)·Bᵀ) over the last axis; x's last dimension must be `in`
    // (std::invalid_argument).
    [[nodiscard]] Variable forward(const Variable& x) const;
    // scale·((x ⊙ m)·Aᵀ)·Bᵀ with m = tensor_ops::dropout_mask(x's shape, p = dropout(),
    // seed, key, stream) (set_dropout's seed and stream); the mask is a constant of the graph.
    [[nodiscard]] Variable forward(const Variable& x, std::uint64_t dropout_key) const;
    // The adapter's dropout: probability p in [0, 1) (std::invalid_argument naming dropout
    // otherwise), the seed and the stream (the projection's index) of its masks.
    void set_dropout(float probability, std::uint64_t seed, std::uint64_t stream);
    [[nodiscard]] float dropout() const noexcept { return dropout_; }
    // scale·B·A [out, in] (no graph).
    [[nodiscard]] Tensor weight_delta() const;

    [[nodiscard]] const Variable& a() const noexcept { return a_; }
    [[nodiscard]] const Variable& b() const noexcept { return b_; }
    [[nodiscard]] float scale() const noexcept { return scale_; }
    [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
    [[nodiscard]] std::size_t in_features() const noexcept { return in_features_; }
    [[nodiscard]] std::size_t out_features() const noexcept { return out_features_; }

  private:
    std::size_t in_features_;
    std::size_t out_features_;
    std::size_t rank_;
    float scale_;
    Variable a_;
    Variable b_;
    float dropout_ = 0.0F;
    std::uint64_t dropout_seed_ = 0;
    std::uint64_t dropout_stream_ = 0;
};

// The dropout key of the training forward running on this thread: the model's forward installs
// it (std::nullopt outside a training forward, or when no adapter has dropout), Linear reads it.
class LoraDropoutScope {
  public:
    explicit LoraDropoutScope(std::optional<std::uint64_t> key) noexcept;
    ~LoraDropoutScope();
    LoraDropoutScope(const LoraDropoutScope&) = delete;
    LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;
    [[nodiscard]] static std::optional<std::uint64_t> current() noexcept;

  private:
    std::optional<std::uint64_t> previous_;
};

// One Linear a target names: `path` is its dot-qualified module path in the model.
struct AdaptableProjection {
    LoraTarget target;
    std::string path;
    Linear* linear;
};

// The LoRA and NF4 lifecycle of one model (docs/ARCHITECTURE.md, 'LoRA' and 'NF4'), over the
// model's projections in its attach order (block-major: q, k, v, o, expand, project per block, then
// the head). Every operation validates and prepares everything first, then commits: a failure
// changes nothing. Each successful change bumps structure_version(), so activation-checkpoint
// replays recorded before it fail loudly.
class AdaptationLifecycle {
  public:
    // Once per model lifetime. std::logic_error: a second attach, an attach after merge, a
    // projection that already used an adapter, projections on mixed backends.
    // std::invalid_argument: the config's rules (lora_scale), a mask that selects no projection
    // of this model, rank > min(in, out) of any selected projection (named). Freezes every base
    // parameter of `model`.
    void attach_lora(Module& model, std::span<const AdaptableProjection> projections,
                     const LoraConfig& config);
    // W ← W + scale·B·A for every adapted weight; packed weights are dequantized (plus their
    // delta when adapted), so the dense schema is whole again; the base becomes trainable.
    // std::logic_error: no adapter attached, or already merged.
    void merge_lora(Module& model, std::span<const AdaptableProjection> projections);
    // Packs every projection's weight (all of them, whatever the LoRA mask) and releases the
    // dense value. std::invalid_argument: after attach_lora, a second time, an unsupported
    // block size. std::logic_error: a weight still held outside the model (a parameter list,
    // an optimizer, a graph).
    void quantize_nf4(std::span<const AdaptableProjection> projections, const Nf4Options& options);
    // The same in a GGUF block format (QuantizedWeight::quantize_blocks); std::invalid_argument
    // also for an in_features that is not a multiple of 32 (names the projection).
    void quantize_blocks(std::span<const AdaptableProjection> projections, WeightFormat format);
    // Replaces every projection's dense weight with `weights[i]` (packed elsewhere: a file's
    // blocks), as if quantized to them. The rules of quantize_nf4, plus: one weight per
    // projection, each of the projection's shape (std::invalid_argument naming it). Nothing
    // changes on failure.
    void adopt_packed_weights(std::span<const AdaptableProjection> projections,
                              std::span<const QuantizedWeight> weights);

    [[nodiscard]] bool lora_attached() const noexcept { return attached_ && !merged_; }
    [[nodiscard]] bool lora_merged() const noexcept { return merged_; }
    [[nodiscard]] bool ever_attached() const noexcept { return attached_; }
    // The attached config (std::logic_error when none was ever attached).
    [[nodiscard]] const LoraConfig& lora_config() const;
    [[nodiscard]] bool quantized() const noexcept { return quantized_; }
    [[nodiscard]] std::uint64_t structure_version() const noexcept { return structure_version_; }
    // The key the next training forward's dropout masks use (0 on a new model). The key lives
    // with the model whether or not adapters are attached.
    [[nodiscard]] std::uint64_t dropout_key() const noexcept { return dropout_key_; }
    void set_dropout_key(std::uint64_t key) noexcept { dropout_key_ = key; }
    // Evaluation through an API without NoGradientGuard (the C ABI's forward always records a
    // graph): while disabled, no forward applies dropout or advances the key. Enabled on a new
    // model.
    [[nodiscard]] bool dropout_enabled() const noexcept { return dropout_enabled_; }
    void set_dropout_enabled(bool enabled) noexcept { dropout_enabled_ = enabled; }
    // For a forward about to run: the current key, then incremented, when adapters with
    // dropout > 0 are attached and gradients are being recorded; std::nullopt (and no
    // increment) otherwise.
    [[nodiscard]] std::optional<std::uint64_t> take_dropout_key() const noexcept;
    // A structural change made outside this lifecycle (untie_embeddings): sessions whose keys
    // and values predate it become stale.
    void note_structure_change() noexcept { ++structure_version_; }

    // Summed over the packed projections (all zero when nothing is packed).
    [[nodiscard]] static QuantizedMemoryUsage quantized_memory(
        std::span<const AdaptableProjection> projections);
    // The packed weights in projection order (std::logic_error unless every projection is
    // packed).
    [[nodiscard]] std::vector<QuantizedWeight> packed_state(
        std::span<const AdaptableProjection> projections) const;
    // Replaces every packed weight, transactionally: count, shapes, block sizes and scale
    // encodings must match the packed ones (std::invalid_argument naming the projection), the
    // model must be fully packed (std::logic_error). Adapters are untouched; weights on another
    // backend are moved to the model's first.
    void load_packed_state(std::span<const AdaptableProjection> projections,
                           std::span<const QuantizedWeight> weights);

  private:
    // quantize_nf4, quantize_blocks and adopt_packed_weights: prepare every projection's packed
    // weight (failures name the projection, keep their category and change nothing), then
    // commit them all.
    void pack(std::span<const AdaptableProjection> projections, const char* operation,
              const std::function<QuantizedWeight(const Linear&, std::size_t)>& prepare);
    bool attached_ = false;
    bool merged_ = false;
    bool quantized_ = false;
    LoraConfig config_;
    std::vector<Variable> frozen_;  // base leaves attach_lora froze
    std::uint64_t structure_version_ = 0;
    mutable std::uint64_t dropout_key_ = 0;  // advanced by const forwards
    bool dropout_enabled_ = true;
};

}  // namespace riftco_transformer
