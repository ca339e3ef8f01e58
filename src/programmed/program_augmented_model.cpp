#include "riftco_transformer/programmed/program_augmented_model.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/index_tensor.hpp"

namespace riftco_transformer {
namespace {

constexpr const char* op = "ProgramAugmentedModel";

[[noreturn]] void invalid(const std::string& what) {
    throw std::invalid_argument(std::string(op) + ": " + what);
}

void validate(const ProgramAugmentedModelConfig& c) {
    if (c.vocabulary_size == 0 || c.context_length == 0 || c.model_width == 0 ||
        c.head_count == 0 || c.feed_forward_width == 0 || c.attention_branch_count == 0) {
        invalid(
            "vocabulary_size, context_length, model_width, head_count, feed_forward_width "
            "and attention_branch_count must all be positive");
    }
    if (c.model_width % c.head_count != 0) {
        invalid("model_width " + std::to_string(c.model_width) +
                " is not a multiple of head_count " + std::to_string(c.head_count));
    }
    constexpr std::size_t id_limit = std::numeric_limits<std::uint32_t>::max();
    if (c.vocabulary_size - 1 > id_limit || c.context_length - 1 > id_limit) {
        invalid("vocabulary ids and positions must fit in uint32");
    }
    require_attention_kind(op, c.attention);
}

// The width of input i's raw vector.
std::size_t raw_width(const ProgramBranch& branch, const ProgramInputLayout& layout,
                      std::size_t width) {
    return layout.source == ProgramInputSource::WholeSource ? branch.source_length * width : width;
}

void validate(const ProgramBranch& b, const ProgramAugmentedModelConfig& c) {
    const std::size_t t = c.context_length;
    if (b.output_length == 0) {
        invalid("program output_length must be > 0");
    }
    if (b.source_offset > t || b.source_length > t - b.source_offset) {
        invalid("program source span [" + std::to_string(b.source_offset) + ", +" +
                std::to_string(b.source_length) + ") does not fit in context_length " +
                std::to_string(t));
    }
    if (b.target_offset > t || b.output_length > t - b.target_offset) {
        invalid("program target span [" + std::to_string(b.target_offset) + ", +" +
                std::to_string(b.output_length) + ") does not fit in context_length " +
                std::to_string(t));
    }
    if (b.map.arity() != 0 && b.source_length == 0) {
        invalid("a non-constant map needs source_length > 0");
    }
    if (b.inputs.size() != b.map.arity()) {
        invalid(std::to_string(b.inputs.size()) + " input layouts for a map of arity " +
                std::to_string(b.map.arity()));
    }
    for (std::size_t i = 0; i < b.inputs.size(); ++i) {
        const ProgramInputLayout& layout = b.inputs[i];
        const std::string name = "program input " + std::to_string(i);
        if (layout.source == ProgramInputSource::WholeSource) {
            if (layout.position != 0) {
                invalid(name + ": a whole_source input must have position 0 (got " +
                        std::to_string(layout.position) + ")");
            }
        } else if (layout.source == ProgramInputSource::SourcePosition) {
            if (layout.position >= b.source_length) {
                invalid(name + ": position " + std::to_string(layout.position) +
                        " is past the source span of " + std::to_string(b.source_length));
            }
        } else {
            invalid(name + ": unknown source value " +
                    std::to_string(static_cast<std::uint32_t>(layout.source)));
        }
        for (std::size_t j = 0; j < i; ++j) {
            const ProgramInputLayout& other = b.inputs[j];
            if (other.projection_group == layout.projection_group &&
                (raw_width(b, other, c.model_width) != raw_width(b, layout, c.model_width) ||
                 b.map.input_dimensions()[j] != b.map.input_dimensions()[i])) {
                invalid(name + " shares projection group " +
                        std::to_string(layout.projection_group) + " with input " +
                        std::to_string(j) + " but their widths differ");
            }
        }
    }
}

// numpy.roll along axis 0 of x [B, ...]: row b takes row (b − shift) mod B.
Variable batch_roll(const Variable& x, std::size_t shift) {
    const Shape& shape = x.shape();
    const std::size_t batch = shape[0];
    const std::size_t rest = x.value().numel() / batch;
    std::vector<std::uint32_t> rows(batch);
    for (std::size_t b = 0; b < batch; ++b)
        rows[b] = static_cast<std::uint32_t>((b + batch - shift % batch) % batch);
    const IndexTensor ids({batch}, rows, x.backend());
    return reshape(gather_rows(reshape(x, {batch, rest}), ids), shape);
}

Variable constant(const Shape& shape, std::vector<float> values, ExecutionBackend backend) {
    return Variable(Tensor(shape, values, backend), false);
}

}  // namespace

std::optional<std::size_t> RepresentationTrace::find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].name == name)
            return i;
    }
    return std::nullopt;
}

const Representation& RepresentationTrace::at(std::string_view name) const {
    const std::optional<std::size_t> index = find(name);
    if (!index) {
        throw std::out_of_range("RepresentationTrace: no representation named '" +
                                std::string(name) + "'");
    }
    return entries_[*index];
}

bool RepresentationTrace::contains(std::string_view name) const noexcept {
    return find(name).has_value();
}

void RepresentationTrace::add(std::string name, const Variable& value) {
    entries_.push_back({std::move(name), value.shape(), value.value().to_host()});
}

ProgramAugmentedModel::ProgramAugmentedModel(const ProgramAugmentedModelConfig& config,
                                             std::optional<ProgramBranch> program)
    : config_(config) {
    validate(config);
    if (program) {
        validate(*program, config);
    }
    const std::size_t d = config.model_width;
    // Created on the calling thread's construction default, like every module.
    const ExecutionBackend backend = current_execution_backend();
    std::mt19937 generator(config.random_seed);
    token_embedding_ = &register_module(
        "token_embedding", std::make_unique<Embedding>(config.vocabulary_size, d, generator));
    position_embedding_ = &register_module(
        "position_embedding", std::make_unique<Embedding>(config.context_length, d, generator));
    feed_forward_ = &register_module(
        "feed_forward",
        std::make_unique<FeedForward>(d, config.feed_forward_width, generator, Activation::Relu));
    auto& branches = register_module("attention_branches", std::make_unique<ModuleList>());
    for (std::size_t i = 0; i < config.attention_branch_count; ++i) {
        attention_branches_.push_back(&branches.append(std::make_unique<CausalSelfAttention>(
            d, config.head_count, generator, config.attention)));
    }
    attention_merge_ =
        &register_module("attention_merge",
                         std::make_unique<Linear>(config.attention_branch_count * d, d, generator));
    if (program) {
        Program state{program->source_offset,
                      program->source_length,
                      program->target_offset,
                      program->output_length,
                      program->inputs,
                      {},
                      {},
                      nullptr,
                      nullptr};
        auto& projections =
            register_module("program_input_projections", std::make_unique<ModuleList>());
        std::vector<std::size_t> groups;  // group id of each projection, first appearance order
        for (std::size_t i = 0; i < program->inputs.size(); ++i) {
            const ProgramInputLayout& layout = program->inputs[i];
            const auto found = std::find(groups.begin(), groups.end(), layout.projection_group);
            if (found != groups.end()) {
                state.projection_of_input.push_back(
                    static_cast<std::size_t>(found - groups.begin()));
                continue;
            }
            groups.push_back(layout.projection_group);
            state.projection_of_input.push_back(state.projections.size());
            state.projections.push_back(&projections.append(std::make_unique<Linear>(
                raw_width(*program, layout, d), program->map.input_dimensions()[i], generator,
                program->input_projection_bias)));
        }
        state.lowered = &register_module("program", std::make_unique<LoweredMultilinearMap>(
                                                        program->map, program->lowering, backend));
        state.merge = &register_module(
            "program_merge", std::make_unique<Linear>(d + program->map.output_dimension(), d,
                                                      generator, program->merge_bias));
        program_ = std::move(state);
    }
    output_ =
        &register_module("output", std::make_unique<Linear>(d, config.vocabulary_size, generator));
}

const LoweredMultilinearMap& ProgramAugmentedModel::lowered_program() const {
    if (!program_) {
        throw std::logic_error("ProgramAugmentedModel::lowered_program: the model has no program");
    }
    return *program_->lowered;
}

void ProgramAugmentedModel::set_attention(AttentionKind kind) {
    require_attention_kind(op, kind);
    for (CausalSelfAttention* branch : attention_branches_)
        branch->set_kind(kind);
    config_.attention = kind;
}

ProgramAugmentedForwardResult ProgramAugmentedModel::forward(
    std::span<const std::uint32_t> tokens, const Shape& shape,
    const ProgramAugmentedForwardOptions& options) const {
    const std::string fwd = std::string(op) + "::forward";
    const std::size_t t = config_.context_length;
    const std::size_t d = config_.model_width;
    if (shape.size() != 2 || shape[0] == 0 || shape[1] != t) {
        throw std::invalid_argument(fwd + ": tokens must be [B, " + std::to_string(t) +
                                    "] with B > 0 (got " + shape_to_string(shape) + ")");
    }
    const std::size_t batch = shape[0];
    if (tokens.size() / t != batch || tokens.size() % t != 0) {
        throw std::invalid_argument(fwd + ": " + std::to_string(tokens.size()) +
                                    " token ids for shape " + shape_to_string(shape));
    }
    // Options first: nothing is computed for a forward that is going to be rejected.
    if (options.batch_roll_shift == 0) {
        throw std::invalid_argument(fwd + ": batch_roll_shift must be > 0");
    }
    const bool program_options = !options.steering.empty() ||
                                 !options.ablated_program_inputs.empty() ||
                                 options.ablate_program_output;
    if (program_options && !program_) {
        throw std::invalid_argument(fwd + ": steering and program ablations need a program");
    }
    if (program_) {
        const std::size_t inputs = program_->inputs.size();
        std::set<std::size_t> seen;
        for (std::size_t index : options.ablated_program_inputs) {
            if (index >= inputs || !seen.insert(index).second) {
                throw std::invalid_argument(
                    fwd + ": ablated program input " + std::to_string(index) +
                    (index >= inputs ? " does not exist" : " is listed twice"));
            }
        }
        for (const ProgramSteering& edit : options.steering) {
            if (edit.input_index >= inputs) {
                throw std::invalid_argument(fwd + ": steering names program input " +
                                            std::to_string(edit.input_index) + " of " +
                                            std::to_string(inputs));
            }
            const ProgramInputLayout& layout = program_->inputs[edit.input_index];
            const std::size_t positions =
                layout.source == ProgramInputSource::WholeSource ? program_->source_length : 1;
            if (edit.position >= positions) {
                throw std::invalid_argument(fwd + ": steering position " +
                                            std::to_string(edit.position) + " of program input " +
                                            std::to_string(edit.input_index) + " is past its " +
                                            std::to_string(positions) + " row(s)");
            }
            if ((!edit.scales.empty() && edit.scales.size() != d) ||
                (!edit.offsets.empty() && edit.offsets.size() != d)) {
                throw std::invalid_argument(fwd + ": steering scales and offsets must hold " +
                                            std::to_string(d) + " values or none");
            }
        }
    }
    const ExecutionBackend backend = token_embedding_->weight().backend();
    IndexTensor ids(shape, tokens, backend);
    if (ids.max_id() >= config_.vocabulary_size) {
        throw std::out_of_range(fwd + ": token id " + std::to_string(ids.max_id()) +
                                " at position " + std::to_string(ids.max_id_position()) +
                                " is out of range for vocabulary size " +
                                std::to_string(config_.vocabulary_size));
    }
    ProgramAugmentedForwardResult result;
    RepresentationTrace trace;
    const bool capture = options.capture_representations;
    const auto keep = [&](const char* name, const Variable& value) {
        if (capture)
            trace.add(name, value);
    };

    const Variable tokens_embedded = token_embedding_->forward(ids);
    const Variable x =
        tokens_embedded + broadcast_to(position_embedding_->weight(), tokens_embedded.shape());
    keep("embedding.sum", x);
    const Variable r1 = x + feed_forward_->forward(x);
    keep("residual.pre_attention", r1);
    std::vector<Variable> branch_outputs;
    for (const CausalSelfAttention* branch : attention_branches_)
        branch_outputs.push_back(branch->forward(r1));
    Variable h = attention_merge_->forward(concatenate_last_axis(branch_outputs));
    if (options.batch_roll_learned_attention) {
        h = batch_roll(h, options.batch_roll_shift);
    }
    keep("learned_attention.merged", h);

    Variable r2;
    if (!program_) {
        r2 = r1 + h;
    } else {
        const Program& p = *program_;
        std::vector<Variable> projected(p.inputs.size());
        Variable source;
        if (p.source_length > 0) {
            source = slice(r1, 1, p.source_offset, p.source_length);  // [B, S, D]
            keep("program.source", source);
        }
        for (std::size_t i = 0; i < p.inputs.size(); ++i) {
            const ProgramInputLayout& layout = p.inputs[i];
            const bool whole = layout.source == ProgramInputSource::WholeSource;
            Variable raw = whole ? reshape(source, {batch, p.source_length * d})
                                 : reshape(slice(source, 1, layout.position, 1), {batch, d});
            const std::size_t width = raw.shape()[1];
            for (const ProgramSteering& edit : options.steering) {
                if (edit.input_index != i)
                    continue;
                std::vector<float> scales(width, 1.0F);
                std::vector<float> offsets(width, 0.0F);
                for (std::size_t k = 0; k < d; ++k) {
                    if (!edit.scales.empty())
                        scales[edit.position * d + k] = edit.scales[k];
                    if (!edit.offsets.empty())
                        offsets[edit.position * d + k] = edit.offsets[k];
                }
                raw =
                    raw * broadcast_to(constant({width}, std::move(scales), backend), raw.shape()) +
                    broadcast_to(constant({width}, std::move(offsets), backend), raw.shape());
            }
            const std::string name = "program.input." + std::to_string(i);
            keep(name.c_str(), raw);
            Variable projection = p.projections[p.projection_of_input[i]]->forward(raw);
            if (std::find(options.ablated_program_inputs.begin(),
                          options.ablated_program_inputs.end(),
                          i) != options.ablated_program_inputs.end()) {
                projection = batch_roll(projection, options.batch_roll_shift);
            }
            keep((name + ".projected").c_str(), projection);
            projected[i] = std::move(projection);
        }
        Variable output = p.lowered->forward(projected, {batch});  // [B, O]
        if (options.ablate_program_output) {
            output = batch_roll(output, options.batch_roll_shift);
        }
        keep("program.output.raw", output);
        // place(p) = mask [B, T, 1] · p [B, 1, O]: p at the target rows, zeros elsewhere.
        const std::size_t out = p.lowered->output_dimension();
        std::vector<float> mask(t, 0.0F);
        std::fill(mask.begin() + static_cast<std::ptrdiff_t>(p.target_offset),
                  mask.begin() + static_cast<std::ptrdiff_t>(p.target_offset + p.output_length),
                  1.0F);
        const Variable rows =
            broadcast_to(constant({1, t, 1}, std::move(mask), backend), {batch, t, 1});
        const Variable placed = matmul(rows, reshape(output, {batch, 1, out}));
        keep("program.output.placed", placed);
        r2 = r1 + p.merge->forward(concatenate_last_axis(h, placed));
    }
    keep("residual.post_merge", r2);
    result.logits = output_->forward(r2);
    keep("logits", result.logits);
    if (capture) {
        result.trace = std::move(trace);
    }
    return result;
}

}  // namespace riftco_transformer
