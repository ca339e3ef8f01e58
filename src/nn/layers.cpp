#include "riftco_transformer/nn/layers.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/nn/initialization.hpp"

namespace riftco_transformer {
namespace ops = tensor_ops;

Linear::Linear(std::size_t in_features, std::size_t out_features, std::mt19937& generator,
               bool use_bias)
    : in_features_(in_features), out_features_(out_features) {
    if (in_features == 0 || out_features == 0) {
        std::ostringstream message;
        message << "Linear: widths must be positive (in " << in_features << ", out " << out_features
                << ")";
        throw std::invalid_argument(message.str());
    }
    const ExecutionBackend backend = current_execution_backend();
    if (DeferredWeightsScope::projections_deferred()) {
        register_released_parameter("weight");  // a packed weight arrives after construction
    } else {
        weight_ =
            register_parameter("weight", xavier_uniform({out_features, in_features}, in_features,
                                                        out_features, generator, backend));
    }
    if (use_bias) {
        bias_ = register_parameter("bias", Tensor::zeros({out_features}, backend));
    }
}

Linear::Linear(Tensor weight, std::optional<Tensor> bias) {
    const Shape& shape = weight.shape();
    if (shape.size() != 2 || shape[0] == 0 || shape[1] == 0) {
        throw std::invalid_argument("Linear: weight must be [out,in] with positive widths (got " +
                                    shape_to_string(shape) + ")");
    }
    if (bias && (bias->shape() != Shape{shape[0]} || bias->backend() != weight.backend())) {
        throw std::invalid_argument("Linear: bias must be [" + std::to_string(shape[0]) +
                                    "] on the weight's backend '" +
                                    std::string(execution_backend_name(weight.backend())) +
                                    "' (got " + shape_to_string(bias->shape()) + " on '" +
                                    std::string(execution_backend_name(bias->backend())) + "')");
    }
    out_features_ = shape[0];
    in_features_ = shape[1];
    weight_ = register_parameter("weight", std::move(weight));
    if (bias) {
        bias_ = register_parameter("bias", std::move(*bias));
    }
}

namespace {

// One LoRA factor as a module, so its parameter is named "<proj>.lora_a.weight".
class AdapterFactor final : public Module {
  public:
    explicit AdapterFactor(Variable weight) {
        register_parameter("weight", std::move(weight), ParameterScope::Base);
    }
};

std::string linear_widths(std::size_t in, std::size_t out) {
    return "in " + std::to_string(in) + ", out " + std::to_string(out);
}

}  // namespace

Variable Linear::forward(const Variable& x) const {
    // Adapter dropout in a training forward (docs/ARCHITECTURE.md, 'LoRA'): the adapter reads a
    // masked x, so base and adapter are two nodes.
    if (adapter_active_ && adapter_->dropout() > 0.0F && !gradient_recording_disabled()) {
        if (const std::optional<std::uint64_t> key = LoraDropoutScope::current()) {
            const Variable base =
                is_quantized() ? quantized_linear(x, packed_, bias_) : linear(x, weight_, bias_);
            return base + adapter_->forward(x, *key);
        }
    }
    // One fused node whichever the base and adapter: the graph keeps only the output.
    std::optional<LowRankUpdate> update;
    if (adapter_active_) {
        update = LowRankUpdate{adapter_->a(), adapter_->b(), adapter_->scale()};
    }
    if (is_quantized()) {
        return quantized_linear(x, packed_, bias_, update ? &*update : nullptr);
    }
    return update ? linear(x, weight_, bias_, *update) : linear(x, weight_, bias_);
}

ExecutionBackend Linear::weight_backend() const {
    return is_quantized() ? packed_.backend() : weight_.backend();
}

void Linear::attach_adapter(LowRankAdapter adapter) {
    if (adapter_.has_value()) {
        throw std::logic_error("Linear::attach_adapter: this projection already used an adapter");
    }
    if (adapter.in_features() != in_features_ || adapter.out_features() != out_features_) {
        throw std::invalid_argument("Linear::attach_adapter: adapter widths (" +
                                    linear_widths(adapter.in_features(), adapter.out_features()) +
                                    ") differ from the layer's (" +
                                    linear_widths(in_features_, out_features_) + ")");
    }
    register_module("lora_a", std::make_unique<AdapterFactor>(adapter.a()),
                    ParameterScope::Adapter);
    try {
        register_module("lora_b", std::make_unique<AdapterFactor>(adapter.b()),
                        ParameterScope::Adapter);
    } catch (...) {
        remove_entry("lora_a");
        throw;
    }
    adapter_.emplace(std::move(adapter));
    adapter_active_ = true;
}

void Linear::rollback_adapter() noexcept {
    remove_entry("lora_a");
    remove_entry("lora_b");
    adapter_.reset();
    adapter_active_ = false;
}

Tensor Linear::prepare_merge() const {
    Tensor merged = is_quantized() ? packed_.dequantize() : weight_.value();
    if (adapter_active_) {
        merged = ops::add(merged, adapter_->weight_delta());
    }
    return merged;
}

void Linear::commit_merge(Variable prepared) noexcept {
    if (is_quantized()) {
        weight_ = prepared;
        set_parameter_slot("weight", std::move(prepared));
        packed_ = QuantizedWeight();
    } else if (adapter_active_) {
        weight_.replace_value(prepared.value());
    }
    if (adapter_active_) {
        remove_entry("lora_a");
        remove_entry("lora_b");
        adapter_active_ = false;
    }
}

void Linear::require_packable() const {
    if (is_quantized()) {
        throw std::logic_error("Linear: the weight is already packed");
    }
    // The layer's handle and the module's slot: any further one is an external holder.
    if (weight_.node().use_count() > 2) {
        throw std::logic_error(
            "Linear: the dense weight is still held outside the model (a parameter list, an "
            "optimizer or a graph); release it before packing");
    }
}

QuantizedWeight Linear::prepare_quantization(const Nf4Options& options) const {
    require_packable();
    return QuantizedWeight::quantize(weight_.value(), options);
}

QuantizedWeight Linear::prepare_block_quantization(WeightFormat format) const {
    require_packable();
    return QuantizedWeight::quantize_blocks(weight_.value(), format);
}

void Linear::check_packed_replacement(const QuantizedWeight& packed) const {
    require_packable();
    const Shape expected{out_features_, in_features_};
    if (packed.shape() != expected) {
        throw std::invalid_argument("Linear: the packed weight's shape " +
                                    shape_to_string(packed.shape()) + " differs from the layer's " +
                                    shape_to_string(expected));
    }
}

void Linear::commit_quantization(QuantizedWeight packed) noexcept {
    packed_ = std::move(packed);
    if (weight_.defined()) {
        set_parameter_slot("weight", Variable());
        weight_ = Variable();
    }
}

void Linear::prepare_transfer(ExecutionBackend backend,
                              std::vector<std::function<void()>>& commits) {
    if (is_quantized() && packed_.backend() != backend) {
        QuantizedWeight moved = packed_.to(backend);
        commits.emplace_back([this, moved]() mutable { packed_ = std::move(moved); });
    }
}

namespace {
thread_local bool projections_deferred_here = false;
thread_local bool token_embedding_deferred_here = false;
}  // namespace

DeferredWeightsScope::DeferredWeightsScope(bool projections, bool token_embedding) noexcept
    : previous_projections_(projections_deferred_here),
      previous_token_embedding_(token_embedding_deferred_here) {
    projections_deferred_here = projections;
    token_embedding_deferred_here = token_embedding;
}

DeferredWeightsScope::~DeferredWeightsScope() {
    projections_deferred_here = previous_projections_;
    token_embedding_deferred_here = previous_token_embedding_;
}

bool DeferredWeightsScope::projections_deferred() noexcept {
    return projections_deferred_here;
}

bool DeferredWeightsScope::token_embedding_deferred() noexcept {
    return token_embedding_deferred_here;
}

Embedding::Embedding(std::size_t vocabulary_size, std::size_t width, std::mt19937& generator)
    : Embedding(vocabulary_size, width, generator, false) {}

Embedding::Embedding(std::size_t vocabulary_size, std::size_t width, std::mt19937& generator,
                     bool deferred)
    : vocabulary_size_(vocabulary_size), width_(width) {
    if (vocabulary_size == 0 || width == 0) {
        std::ostringstream message;
        message << "Embedding: sizes must be positive (vocabulary " << vocabulary_size << ", width "
                << width << ")";
        throw std::invalid_argument(message.str());
    }
    if (deferred) {
        register_released_parameter("weight");  // a packed table arrives after construction
        return;
    }
    const auto limit = static_cast<float>(1.0 / std::sqrt(static_cast<double>(width)));
    weight_ = register_parameter("weight", uniform_tensor({vocabulary_size, width}, -limit, limit,
                                                          generator, current_execution_backend()));
}

Variable Embedding::forward(std::span<const std::size_t> ids, const Shape& index_shape) const {
    if (is_packed()) {
        std::vector<std::uint32_t> narrowed(ids.size());
        for (std::size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] >= vocabulary_size_) {
                throw std::out_of_range("Embedding: id " + std::to_string(ids[i]) +
                                        " at position " + std::to_string(i) +
                                        " is outside the vocabulary of " +
                                        std::to_string(vocabulary_size_));
            }
            narrowed[i] = static_cast<std::uint32_t>(ids[i]);
        }
        return forward(IndexTensor(index_shape, narrowed, packed_.backend()));
    }
    return gather_rows(weight_, ids, index_shape);
}

Variable Embedding::forward(const IndexTensor& ids) const {
    if (is_packed()) {
        return Variable(tensor_ops::quantized_gather_rows(packed_, ids), false);
    }
    return gather_rows(weight_, ids);
}

void Embedding::check_packed_replacement(const QuantizedWeight& packed) const {
    if (is_packed()) {
        throw std::logic_error("Embedding: the table is already packed");
    }
    // The layer's handle and the module's slot: any further one is an external holder.
    if (weight_.node().use_count() > 2) {
        throw std::logic_error(
            "Embedding: the dense table is still held outside the model (a parameter list, an "
            "optimizer or a graph); release it before packing");
    }
    const Shape expected{vocabulary_size_, width_};
    if (packed.shape() != expected) {
        throw std::invalid_argument("Embedding: the packed table's shape " +
                                    shape_to_string(packed.shape()) + " differs from the layer's " +
                                    shape_to_string(expected));
    }
}

void Embedding::commit_packed(QuantizedWeight packed) noexcept {
    packed_ = std::move(packed);
    set_parameter_slot("weight", Variable());
    weight_ = Variable();
}

void Embedding::prepare_transfer(ExecutionBackend backend,
                                 std::vector<std::function<void()>>& commits) {
    if (is_packed() && packed_.backend() != backend) {
        QuantizedWeight moved = packed_.to(backend);
        commits.emplace_back([this, moved]() mutable { packed_ = std::move(moved); });
    }
}

namespace {
void require_width(const char* layer, std::size_t width) {
    if (width == 0) {
        throw std::invalid_argument(std::string(layer) + ": width must be positive");
    }
}
void require_epsilon(const char* layer, float epsilon) {
    tensor_ops::require_normalization_epsilon(layer, "epsilon", epsilon);
}
}  // namespace

LayerNorm::LayerNorm(std::size_t width, float epsilon) : epsilon_(epsilon) {
    require_width("LayerNorm", width);
    require_epsilon("LayerNorm", epsilon);
    const ExecutionBackend backend = current_execution_backend();
    scale_ = register_parameter("scale", Tensor::full({width}, 1.0F, backend));
    bias_ = register_parameter("bias", Tensor::zeros({width}, backend));
}

Variable LayerNorm::forward(const Variable& x) const {
    return layer_norm(x, scale_, bias_, epsilon_);
}

RMSNorm::RMSNorm(std::size_t width, float epsilon, bool weight_offset)
    : epsilon_(epsilon), weight_offset_(weight_offset) {
    require_width("RMSNorm", width);
    require_epsilon("RMSNorm", epsilon);
    scale_ = register_parameter(
        "scale", Tensor::full({width}, weight_offset ? 0.0F : 1.0F, current_execution_backend()));
}

Variable RMSNorm::forward(const Variable& x) const {
    // Gemma's form: the stored w is the offset from one, 1 + w computed in float32.
    return rms_norm(x, weight_offset_ ? scale_ + 1.0F : scale_, epsilon_);
}

FeedForward::FeedForward(std::size_t width, std::size_t hidden_width, std::mt19937& generator,
                         Activation activation, bool bias)
    : activation_(activation) {
    if (activation != Activation::Gelu && activation != Activation::Relu &&
        activation != Activation::GeluTanh) {
        throw std::invalid_argument("FeedForward: unknown activation value " +
                                    std::to_string(static_cast<std::uint32_t>(activation)));
    }
    expand_ =
        &register_module("expand", std::make_unique<Linear>(width, hidden_width, generator, bias));
    project_ =
        &register_module("project", std::make_unique<Linear>(hidden_width, width, generator, bias));
}

Variable FeedForward::forward(const Variable& x) const {
    const Variable hidden = expand_->forward(x);
    switch (activation_) {
        case Activation::Gelu:
            return project_->forward(gelu(hidden));
        case Activation::GeluTanh:
            return project_->forward(gelu_tanh(hidden));
        case Activation::Relu:
            break;
    }
    return project_->forward(relu(hidden));
}

SwiGLU::SwiGLU(std::size_t width, std::size_t hidden_width, std::mt19937& generator,
               GatedActivation activation, bool bias)
    : activation_(activation) {
    if (activation != GatedActivation::Silu && activation != GatedActivation::GeluTanh) {
        throw std::invalid_argument("SwiGLU: unknown gated activation value " +
                                    std::to_string(static_cast<std::uint32_t>(activation)));
    }
    gate_ =
        &register_module("gate", std::make_unique<Linear>(width, hidden_width, generator, bias));
    up_ = &register_module("up", std::make_unique<Linear>(width, hidden_width, generator, bias));
    down_ =
        &register_module("down", std::make_unique<Linear>(hidden_width, width, generator, bias));
}

std::optional<std::vector<Variable>> fused_projections(
    const Variable& x, std::initializer_list<const Linear*> layers) {
    if (!gradient_recording_disabled() || !x.defined() || x.shape().empty()) {
        return std::nullopt;
    }
    std::vector<Tensor> weights;
    weights.reserve(layers.size());
    for (const Linear* layer : layers) {
        if (layer->is_quantized() || layer->adapter() != nullptr || layer->has_bias() ||
            layer->in_features() != x.shape().back() ||
            layer->weight().value().backend() != x.value().backend()) {
            return std::nullopt;
        }
        weights.push_back(layer->weight().value());
    }
    const std::size_t in = x.shape().back();
    const Tensor rows = x.value().reshape({x.value().numel() / in, in});
    std::vector<Tensor> products = tensor_ops::project_many(rows, weights);
    std::vector<Variable> outputs;
    outputs.reserve(products.size());
    for (Tensor& product : products) {
        Shape shape = x.shape();
        shape.back() = product.shape()[1];
        outputs.emplace_back(product.reshape(std::move(shape)), false);
    }
    return outputs;
}

Variable SwiGLU::forward(const Variable& x) const {
    const auto activate = [this](const Variable& gate) {
        return activation_ == GatedActivation::GeluTanh ? gelu_tanh(gate) : silu(gate);
    };
    if (auto fused = fused_projections(x, {gate_, up_})) {
        return down_->forward(activate((*fused)[0]) * (*fused)[1]);
    }
    return down_->forward(activate(gate_->forward(x)) * up_->forward(x));
}

}  // namespace riftco_transformer
