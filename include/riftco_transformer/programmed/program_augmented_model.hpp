#pragma once
// ProgramAugmentedModel (docs/ARCHITECTURE.md, 'Programmed models'): a small transformer with a
// fixed program (a lowered multilinear map) as an extra branch, for research into how a model uses
// a known computation.
//
//   x  = E_tok[id] + E_pos[t]                                   "embedding.sum"
//   r1 = x + FFN_ReLU(x)                                         "residual.pre_attention"
//   h  = W_A·[Attn_1(r1); …; Attn_N(r1)] + b_A                   "learned_attention.merged"
//        (N independent causal multi-head attention branches, in construction order)
//   without a program:  r2 = r1 + h
//   with a program:     r2 = r1 + W_M·[h; place(p)] (+ b_M with merge_bias)
//                                                                "residual.post_merge"
//   logits = W_out·r2 + b_out                                    "logits"
//
// The program branch, every choice spelled out:
//   - source = r1[:, source_offset : source_offset + source_length, :]     "program.source"
//   - input i (one per map argument), from its ProgramInputLayout:
//       whole_source     the span flattened, [B, source_length·D] (position must be 0)
//       source_position  the span's row `position`, [B, D]
//     after steering edits                                            "program.input.i"
//     then its group's learned projection to d_i (+ bias with input_projection_bias), after
//     an ablation roll                                                "program.input.i.projected"
//     Inputs whose projection_group is equal share one projection (same raw width and d_i).
//   - p = lowered map of the projected inputs, [B, O], after an output ablation roll
//                                                                     "program.output.raw"
//   - place(p): [B, T, O], p copied to each of the output_length positions from target_offset,
//     zeros elsewhere                                                 "program.output.placed"
// Interventions are part of the graph (gradients still flow through them):
//   - batch roll (numpy's roll along the batch: row b takes row (b − shift) mod B) of the
//     learned attention h, of chosen projected program inputs, or of the program output;
//   - steering: an affine edit scales ⊙ v + offsets of program input `input_index`'s raw rows
//     at `position` (a span row for whole_source, 0 for source_position); scales and offsets
//     are D wide, or empty (identity scale, zero offset).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "riftco_transformer/nn/layers.hpp"
#include "riftco_transformer/nn/module.hpp"
#include "riftco_transformer/programmed/multilinear_map.hpp"
#include "riftco_transformer/programmed/neural_lowering.hpp"

namespace riftco_transformer {

struct ProgramAugmentedModelConfig {
    std::size_t vocabulary_size = 512;
    std::size_t context_length = 128;  // every forward takes exactly this many positions
    std::size_t model_width = 64;
    std::size_t head_count = 4;
    std::size_t feed_forward_width = 256;
    std::size_t attention_branch_count = 2;
    AttentionKind attention = AttentionKind::Materialized;
    std::uint32_t random_seed = 42;
};

// Values are the C ABI's.
enum class ProgramInputSource : std::uint32_t { WholeSource = 0, SourcePosition = 1 };

struct ProgramInputLayout {
    ProgramInputSource source = ProgramInputSource::WholeSource;
    std::size_t position = 0;
    std::size_t projection_group = 0;
};

struct ProgramBranch {
    MultilinearMap map;  // copied
    std::size_t source_offset = 0;
    std::size_t source_length = 0;
    std::size_t target_offset = 0;
    std::size_t output_length = 1;
    std::vector<ProgramInputLayout> inputs = {};  // one per map argument
    NeuralLoweringConfig lowering = {};
    bool input_projection_bias = false;
    bool merge_bias = false;
};

struct ProgramSteering {
    std::size_t input_index = 0;
    std::size_t position = 0;
    std::vector<float> scales = {};   // D values, or empty: identity
    std::vector<float> offsets = {};  // D values, or empty: zero
};

struct ProgramAugmentedForwardOptions {
    bool capture_representations = false;
    bool batch_roll_learned_attention = false;
    std::size_t batch_roll_shift = 1;  // > 0; shared by every roll
    std::vector<ProgramSteering> steering = {};
    std::vector<std::size_t> ablated_program_inputs = {};  // unique; rolled after projection
    bool ablate_program_output = false;                    // rolled before placement
};

// Named representations: detached host copies, independent of the model and the graph.
struct Representation {
    std::string name;
    Shape shape;
    std::vector<float> values;
};

class RepresentationTrace {
  public:
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    [[nodiscard]] const std::vector<Representation>& entries() const noexcept { return entries_; }
    // The representation called `name` (std::out_of_range naming it otherwise).
    [[nodiscard]] const Representation& at(std::string_view name) const;
    [[nodiscard]] bool contains(std::string_view name) const noexcept;
    // The position of `name` in entries(), or none.
    [[nodiscard]] std::optional<std::size_t> find(std::string_view name) const noexcept;
    void add(std::string name, const Variable& value);

  private:
    std::vector<Representation> entries_;
};

struct ProgramAugmentedForwardResult {
    Variable logits;                           // [B, T, V]
    std::optional<RepresentationTrace> trace;  // with capture_representations
};

class ProgramAugmentedModel final : public Module {
  public:
    // std::invalid_argument: a zero dimension or branch count, model_width % head_count != 0,
    // an unknown attention kind, ids or positions past uint32; with a program: spans outside
    // the context (source_offset + source_length or target_offset + output_length > T),
    // output_length 0, a non-constant map with source_length 0, an input count other than the
    // map's arity, an unknown source kind, a whole_source input with position != 0, a
    // source_position input past the span, projection groups whose inputs differ in width,
    // and the lowering's own rules (LoweredMultilinearMap).
    // Parameters live on the calling thread's construction default backend.
    explicit ProgramAugmentedModel(const ProgramAugmentedModelConfig& config,
                                   std::optional<ProgramBranch> program = std::nullopt);

    // tokens [B, T] with T == context_length. std::invalid_argument: another shape, a bad
    // option (shift 0, a steering edit naming a missing input or position or with a width
    // other than D, a repeated or missing ablated input, program interventions without a
    // program); std::out_of_range: an id >= V.
    [[nodiscard]] ProgramAugmentedForwardResult forward(
        std::span<const std::uint32_t> tokens, const Shape& shape,
        const ProgramAugmentedForwardOptions& options = {}) const;

    [[nodiscard]] const ProgramAugmentedModelConfig& config() const noexcept { return config_; }
    [[nodiscard]] bool has_program() const noexcept { return program_.has_value(); }
    // The program's resolved lowering (std::logic_error without a program).
    [[nodiscard]] const LoweredMultilinearMap& lowered_program() const;
    void set_attention(AttentionKind kind);

  private:
    struct Program {
        std::size_t source_offset;
        std::size_t source_length;
        std::size_t target_offset;
        std::size_t output_length;
        std::vector<ProgramInputLayout> inputs;
        std::vector<std::size_t> projection_of_input;  // index into projections
        std::vector<Linear*> projections;
        LoweredMultilinearMap* lowered;
        Linear* merge;
    };

    ProgramAugmentedModelConfig config_;
    Embedding* token_embedding_;
    Embedding* position_embedding_;
    FeedForward* feed_forward_;
    std::vector<CausalSelfAttention*> attention_branches_;
    Linear* attention_merge_;
    std::optional<Program> program_;
    Linear* output_;
};

}  // namespace riftco_transformer
