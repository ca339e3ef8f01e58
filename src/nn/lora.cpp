#include "riftco_transformer/nn/lora.hpp"

#include "nn/lora_fault_injection.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/nn/initialization.hpp"
#include "riftco_transformer/nn/layers.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;

namespace {

// The one rule for a dropout probability (LoraConfig and LowRankAdapter).
void require_dropout_probability(float probability, std::string_view operation) {
    if (!std::isfinite(probability) || probability < 0.0F || probability >= 1.0F) {
        std::ostringstream message;
        message << operation << ": dropout must be finite and in [0, 1) (got " << probability
                << ")";
        throw std::invalid_argument(message.str());
    }
}

constexpr std::array<std::string_view, lora_target_count> target_names = {
    "attention.query",     "attention.key",        "attention.value",     "attention.output",
    "feed_forward.expand", "feed_forward.project", "language_model_head", "feed_forward.gate",
    "feed_forward.up",     "feed_forward.down",
};

std::string known_target_list() {
    std::string list;
    for (std::string_view name : target_names) {
        list += list.empty() ? "" : ", ";
        list += name;
    }
    return list;
}

// alpha and the scale alpha/rank (alpha/√rank when rank_stabilized), both finite and > 0 (the
// rule LoraConfig and LowRankAdapter share).
float checked_scale(std::size_t rank, float alpha, std::string_view operation,
                    bool rank_stabilized) {
    if (rank == 0) {
        throw std::invalid_argument(std::string(operation) + ": rank must be positive (got 0)");
    }
    if (!std::isfinite(alpha) || !(alpha > 0.0F)) {
        std::ostringstream message;
        message << operation << ": alpha must be finite and > 0 (got " << alpha << ")";
        throw std::invalid_argument(message.str());
    }
    const float scale =
        rank_stabilized
            ? static_cast<float>(static_cast<double>(alpha) / std::sqrt(static_cast<double>(rank)))
            : alpha / static_cast<float>(rank);
    if (!std::isfinite(scale) || !(scale > 0.0F)) {
        std::ostringstream message;
        message << operation << ": scale alpha/" << (rank_stabilized ? "sqrt(rank)" : "rank")
                << " = " << alpha << "/" << rank << " must be finite and > 0 in float32 (got "
                << scale << ")";
        throw std::invalid_argument(message.str());
    }
    return scale;
}

std::size_t attach_failure_after = 0;  // see lora_fault_injection.hpp

std::string describe_mask(LoraTargetMask mask) {
    std::ostringstream text;
    text << "0x" << std::hex << mask;
    return text.str();
}

}  // namespace

void detail::set_lora_attach_failure_after(std::size_t count) noexcept {
    attach_failure_after = count;
}

std::string_view lora_target_name(LoraTarget target) {
    const auto index = static_cast<std::size_t>(target);
    if (index >= lora_target_count) {
        throw std::invalid_argument("lora_target_name: unknown LoRA target value " +
                                    std::to_string(index));
    }
    return target_names[index];
}

LoraTarget lora_target_from_name(std::string_view name) {
    for (std::size_t i = 0; i < target_names.size(); ++i) {
        if (target_names[i] == name) {
            return static_cast<LoraTarget>(i);
        }
    }
    throw std::invalid_argument("LoRA target '" + std::string(name) +
                                "' is unknown (known: " + known_target_list() + ")");
}

float lora_scale(const LoraConfig& config, std::string_view operation) {
    const float scale = checked_scale(config.rank, config.alpha, operation, config.rank_stabilized);
    if (config.targets == 0) {
        throw std::invalid_argument(std::string(operation) +
                                    ": targets is empty (select at least one projection)");
    }
    require_dropout_probability(config.dropout, operation);
    if ((config.targets & ~lora_known_targets) != 0) {
        throw std::invalid_argument(std::string(operation) + ": targets mask " +
                                    describe_mask(config.targets) + " has unknown bits " +
                                    describe_mask(config.targets & ~lora_known_targets));
    }
    return scale;
}

LowRankAdapter::LowRankAdapter(std::size_t in_features, std::size_t out_features, std::size_t rank,
                               float alpha, std::mt19937& generator, ExecutionBackend backend,
                               bool rank_stabilized)
    : in_features_(in_features), out_features_(out_features), rank_(rank), scale_(0.0F) {
    constexpr std::string_view op = "LowRankAdapter";
    if (in_features == 0 || out_features == 0) {
        throw std::invalid_argument("LowRankAdapter: widths must be positive (in " +
                                    std::to_string(in_features) + ", out " +
                                    std::to_string(out_features) + ")");
    }
    scale_ = checked_scale(rank, alpha, op, rank_stabilized);
    if (rank > std::min(in_features, out_features)) {
        throw std::invalid_argument(
            "LowRankAdapter: rank " + std::to_string(rank) +
            " exceeds min(in, out) = " + std::to_string(std::min(in_features, out_features)));
    }
    a_ = Variable(xavier_uniform({rank, in_features}, in_features, rank, generator, backend), true);
    b_ = Variable(Tensor::zeros({out_features, rank}, backend), true);
}

Variable LowRankAdapter::forward(const Variable& x) const {
    if (!x.defined() || x.value().rank() == 0 || x.shape().back() != in_features_) {
        throw std::invalid_argument(
            "LowRankAdapter::forward: x " + (x.defined() ? shape_to_string(x.shape()) : "(empty)") +
            " must end in the adapter's input width " + std::to_string(in_features_));
    }
    // The scale multiplies the rank-wide intermediate: same product, R·rank multiplies instead
    // of R·out.
    return linear(linear(x, a_, Variable()) * scale_, b_, Variable());
}

Variable LowRankAdapter::forward(const Variable& x, std::uint64_t dropout_key) const {
    if (dropout_ == 0.0F) {
        return forward(x);
    }
    // Checked before the mask is drawn for x's shape.
    if (!x.defined() || x.value().rank() == 0 || x.shape().back() != in_features_) {
        return forward(x);  // throws
    }
    const Variable mask(ops::dropout_mask(x.shape(), x.value().backend(), dropout_, dropout_seed_,
                                          dropout_key, dropout_stream_),
                        false);
    return forward(x * mask);
}

void LowRankAdapter::set_dropout(float probability, std::uint64_t seed, std::uint64_t stream) {
    require_dropout_probability(probability, "LowRankAdapter");
    dropout_ = probability;
    dropout_seed_ = seed;
    dropout_stream_ = stream;
}

namespace {
thread_local std::optional<std::uint64_t> current_dropout_key;
}  // namespace

LoraDropoutScope::LoraDropoutScope(std::optional<std::uint64_t> key) noexcept
    : previous_(current_dropout_key) {
    current_dropout_key = key;
}

LoraDropoutScope::~LoraDropoutScope() {
    current_dropout_key = previous_;
}

std::optional<std::uint64_t> LoraDropoutScope::current() noexcept {
    return current_dropout_key;
}

Tensor LowRankAdapter::weight_delta() const {
    return ops::scale(ops::matmul(b_.value(), a_.value()), scale_);
}

// ---------------------------------------------------------------------------------------------

std::optional<std::uint64_t> AdaptationLifecycle::take_dropout_key() const noexcept {
    if (!lora_attached() || config_.dropout == 0.0F || !dropout_enabled_ ||
        gradient_recording_disabled()) {
        return std::nullopt;
    }
    return dropout_key_++;
}

const LoraConfig& AdaptationLifecycle::lora_config() const {
    if (!attached_) {
        throw std::logic_error("lora_config: no LoRA adapter was attached to this model");
    }
    return config_;
}

void AdaptationLifecycle::attach_lora(Module& model,
                                      std::span<const AdaptableProjection> projections,
                                      const LoraConfig& config) {
    constexpr std::string_view op = "attach_lora";
    if (merged_) {
        throw std::logic_error(
            "attach_lora: this model's adapters were merged; a model takes "
            "LoRA once in its lifetime");
    }
    if (attached_) {
        throw std::logic_error("attach_lora: a LoRA adapter is already attached to this model");
    }
    static_cast<void>(lora_scale(config, op));  // the config's own rules, before anything else
    // Which projections the mask selects, and the rules that depend on them, before any draw.
    std::vector<const AdaptableProjection*> selected;
    std::optional<ExecutionBackend> backend;
    for (const AdaptableProjection& projection : projections) {
        const ExecutionBackend here = projection.linear->weight_backend();
        if (backend && *backend != here) {
            throw std::logic_error(
                "attach_lora: base weights are on mixed backends (" + projection.path + " is on '" +
                std::string(execution_backend_name(here)) + "', earlier ones on '" +
                std::string(execution_backend_name(*backend)) + "')");
        }
        backend = here;
        if (config.dropout > 0.0F) {
            ops::require_dropout(op, here);  // a capability error naming dropout, before any draw
        }
        if ((config.targets & lora_target_bit(projection.target)) == 0) {
            continue;
        }
        if (projection.linear->used_adapter()) {
            throw std::logic_error("attach_lora: " + projection.path +
                                   " already used a LoRA adapter");
        }
        const std::size_t limit =
            std::min(projection.linear->in_features(), projection.linear->out_features());
        if (config.rank > limit) {
            throw std::invalid_argument("attach_lora: rank " + std::to_string(config.rank) +
                                        " exceeds min(in, out) = " + std::to_string(limit) +
                                        " of " + projection.path);
        }
        selected.push_back(&projection);
    }
    if (selected.empty()) {
        throw std::invalid_argument("attach_lora: targets mask " + describe_mask(config.targets) +
                                    " selects no projection of this model");
    }
    // Draw and attach in order; any failure rolls back every adapter attached so far.
    std::mt19937 generator(config.random_seed);
    std::vector<Linear*> done;
    try {
        for (const AdaptableProjection* projection : selected) {
            Linear& layer = *projection->linear;
            LowRankAdapter adapter(layer.in_features(), layer.out_features(), config.rank,
                                   config.alpha, generator, *backend, config.rank_stabilized);
            // The mask stream is the projection's index in the model's projection list.
            adapter.set_dropout(config.dropout, config.random_seed,
                                static_cast<std::uint64_t>(projection - projections.data()));
            layer.attach_adapter(std::move(adapter));
            done.push_back(&layer);
            if (attach_failure_after != 0 && done.size() == attach_failure_after) {
                throw std::runtime_error("attach_lora: injected failure (test hook)");
            }
        }
    } catch (...) {
        for (Linear* layer : done) {
            layer->rollback_adapter();
        }
        throw;
    }
    // Freeze the base: backward computes no gradient for it at all. merge_lora() thaws what
    // this froze.
    frozen_.clear();
    ParameterList base = model.parameters();
    for (NamedParameter& named : base) {
        if (named.parameter.requires_gradient()) {
            named.parameter.set_requires_gradient(false);
            frozen_.push_back(named.parameter);
        }
    }
    config_ = config;
    attached_ = true;
    ++structure_version_;
}

void AdaptationLifecycle::merge_lora(Module& /*model*/,
                                     std::span<const AdaptableProjection> projections) {
    if (!attached_) {
        throw std::logic_error("merge_lora: no LoRA adapter is attached to this model");
    }
    if (merged_) {
        throw std::logic_error("merge_lora: the adapters were already merged");
    }
    // Prepare every merged weight (the only step that can fail), then commit.
    std::vector<Variable> prepared(projections.size());
    for (std::size_t i = 0; i < projections.size(); ++i) {
        const Linear& layer = *projections[i].linear;
        if (layer.adapter() != nullptr || layer.is_quantized()) {
            prepared[i] = Variable(layer.prepare_merge(), true);
        }
    }
    for (std::size_t i = 0; i < projections.size(); ++i) {
        if (prepared[i].defined()) {
            projections[i].linear->commit_merge(std::move(prepared[i]));
        }
    }
    for (Variable& leaf : frozen_) {
        leaf.set_requires_gradient(true);
    }
    frozen_.clear();
    merged_ = true;
    quantized_ = false;
    ++structure_version_;
}

void AdaptationLifecycle::quantize_nf4(std::span<const AdaptableProjection> projections,
                                       const Nf4Options& options) {
    pack(projections, "quantize_nf4", [&](const Linear& layer, std::size_t /*index*/) {
        return layer.prepare_quantization(options);
    });
}

void AdaptationLifecycle::quantize_blocks(std::span<const AdaptableProjection> projections,
                                          WeightFormat format) {
    pack(projections, "quantize_blocks", [&](const Linear& layer, std::size_t /*index*/) {
        return layer.prepare_block_quantization(format);
    });
}

void AdaptationLifecycle::adopt_packed_weights(std::span<const AdaptableProjection> projections,
                                               std::span<const QuantizedWeight> weights) {
    if (weights.size() != projections.size()) {
        throw std::invalid_argument("adopt_packed_weights: " + std::to_string(weights.size()) +
                                    " packed weights given for " +
                                    std::to_string(projections.size()) + " projections");
    }
    pack(projections, "adopt_packed_weights", [&](const Linear& layer, std::size_t index) {
        if (weights[index].is_singular()) {
            throw std::invalid_argument("the packed weight is singular");
        }
        layer.check_packed_replacement(weights[index]);
        return weights[index];
    });
}

void AdaptationLifecycle::pack(
    std::span<const AdaptableProjection> projections, const char* operation,
    const std::function<QuantizedWeight(const Linear&, std::size_t)>& prepare) {
    const std::string op = operation;
    if (attached_) {
        throw std::invalid_argument(op +
                                    ": the model has LoRA adapters; quantize before attach_lora");
    }
    if (quantized_) {
        throw std::invalid_argument(op + ": the model's weights are already packed");
    }
    // Block sizes follow QuantizedWeight::quantize's one rule: the first projection reports them.
    std::vector<QuantizedWeight> packed;
    packed.reserve(projections.size());
    for (std::size_t i = 0; i < projections.size(); ++i) {
        // Failures name the projection and keep their category.
        const std::string where = op + ": " + projections[i].path + ": ";
        try {
            packed.push_back(prepare(*projections[i].linear, i));
        } catch (const std::invalid_argument& error) {  // a non-finite weight, a bad shape
            throw std::invalid_argument(where + error.what());
        } catch (const std::overflow_error& error) {  // a scale beyond its encoding
            throw std::overflow_error(where + error.what());
        } catch (const std::logic_error& error) {  // held outside the model
            throw std::logic_error(where + error.what());
        } catch (const std::runtime_error& error) {  // a backend that lacks the format
            throw std::runtime_error(where + error.what());
        }
    }
    for (std::size_t i = 0; i < projections.size(); ++i) {
        projections[i].linear->commit_quantization(std::move(packed[i]));
    }
    // The dense values just went back to the CPU block cache; hand them to the system, or a
    // QLoRA process would keep the float32 base resident as free cache blocks.
    release_cpu_memory_cache();
    quantized_ = true;
    ++structure_version_;
}

QuantizedMemoryUsage AdaptationLifecycle::quantized_memory(
    std::span<const AdaptableProjection> projections) {
    QuantizedMemoryUsage total;
    for (const AdaptableProjection& projection : projections) {
        if (projection.linear->is_quantized()) {
            total += projection.linear->quantized_weight().memory_usage();
        }
    }
    return total;
}

std::vector<QuantizedWeight> AdaptationLifecycle::packed_state(
    std::span<const AdaptableProjection> projections) const {
    if (!quantized_) {
        throw std::logic_error("packed_quantized_state: the model's weights are not packed");
    }
    std::vector<QuantizedWeight> state;
    state.reserve(projections.size());
    for (const AdaptableProjection& projection : projections) {
        state.push_back(projection.linear->quantized_weight());
    }
    return state;
}

void AdaptationLifecycle::load_packed_state(std::span<const AdaptableProjection> projections,
                                            std::span<const QuantizedWeight> weights) {
    constexpr const char* op = "load_packed_quantized_state";
    if (!quantized_) {
        throw std::logic_error(std::string(op) +
                               ": the model's weights are not packed "
                               "(quantize_nf4 first)");
    }
    if (weights.size() != projections.size()) {
        throw std::invalid_argument(std::string(op) + ": " + std::to_string(weights.size()) +
                                    " packed weights given for " +
                                    std::to_string(projections.size()) + " projections");
    }
    std::vector<QuantizedWeight> staged(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
        const QuantizedWeight& current = projections[i].linear->quantized_weight();
        const QuantizedWeight& incoming = weights[i];
        const std::string where = std::string(op) + ": " + projections[i].path;
        if (incoming.is_singular()) {
            throw std::invalid_argument(where + ": the packed weight is singular");
        }
        if (incoming.shape() != current.shape()) {
            throw std::invalid_argument(where + ": shape " + shape_to_string(incoming.shape()) +
                                        " differs from the model's " +
                                        shape_to_string(current.shape()));
        }
        if (incoming.format() != current.format()) {
            throw std::invalid_argument(
                where + ": format " + std::string(weight_format_name(incoming.format())) +
                " differs from the model's " + std::string(weight_format_name(current.format())));
        }
        if (incoming.block_size() != current.block_size() ||
            incoming.uses_double_quantized_scales() != current.uses_double_quantized_scales() ||
            incoming.scale_quantization_block_size() != current.scale_quantization_block_size()) {
            throw std::invalid_argument(
                where + ": block size " + std::to_string(incoming.block_size()) +
                (incoming.uses_double_quantized_scales()
                     ? " with double-quantized scales (C=" +
                           std::to_string(incoming.scale_quantization_block_size()) + ")"
                     : " with float32 scales") +
                " differs from the model's block size " + std::to_string(current.block_size()) +
                (current.uses_double_quantized_scales()
                     ? " with double-quantized scales (C=" +
                           std::to_string(current.scale_quantization_block_size()) + ")"
                     : " with float32 scales"));
        }
        staged[i] =
            incoming.backend() == current.backend() ? incoming : incoming.to(current.backend());
    }
    for (std::size_t i = 0; i < staged.size(); ++i) {
        projections[i].linear->commit_quantization(std::move(staged[i]));
    }
    ++structure_version_;
}

}  // namespace riftco_transformer
