#pragma once
// The building blocks of the decoder: Linear, Embedding, LayerNorm, RMSNorm, FeedForward and
// SwiGLU (spec ENGINE §5.3). Shapes in comments: [..] is any leading shape.

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor_ops/normalization.hpp"
#include "riftco_transformer/nn/module.hpp"

namespace riftco_transformer {

// linear(x, weight, bias), the operation Linear runs, is in core/autograd/operations.hpp.

// Parameters "weight" [out, in] (Xavier(in, out)) and, when use_bias, "bias" [out] (zeros).
class Linear final : public Module {
  public:
    Linear(std::size_t in_features, std::size_t out_features, std::mt19937& generator,
           bool use_bias = true);
    // x [.., in] -> [.., out]. Rank 0 or a last dimension != in: std::invalid_argument.
    [[nodiscard]] Variable forward(const Variable& x) const;
    [[nodiscard]] const Variable& weight() const { return weight_; }
    [[nodiscard]] bool has_bias() const { return bias_.defined(); }
    [[nodiscard]] std::size_t in_features() const { return in_features_; }
    [[nodiscard]] std::size_t out_features() const { return out_features_; }

  private:
    std::size_t in_features_;
    std::size_t out_features_;
    Variable weight_;  // handles share the registered leaves
    Variable bias_;    // empty without a bias
};

// Parameter "weight" [V, D] ~ U(±1/√D).
class Embedding final : public Module {
  public:
    Embedding(std::size_t vocabulary_size, std::size_t width, std::mt19937& generator);
    // ids (prod(index_shape) of them, each < V) -> index_shape + [D].
    [[nodiscard]] Variable forward(std::span<const std::size_t> ids,
                                   const Shape& index_shape) const;
    // ids on the weight's backend (each < V) -> ids.shape() + [D].
    [[nodiscard]] Variable forward(const IndexTensor& ids) const;
    [[nodiscard]] const Variable& weight() const { return weight_; }

  private:
    Variable weight_;
};

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

// Parameter "scale" [W] (ones): y = x·scale/√(mean(x²) + eps).
class RMSNorm final : public Module {
  public:
    explicit RMSNorm(std::size_t width, float epsilon = tensor_ops::default_normalization_epsilon);
    [[nodiscard]] Variable forward(const Variable& x) const;

  private:
    float epsilon_;
    Variable scale_;
};

enum class Activation : std::uint32_t { Gelu = 0, Relu = 1 };

// expand (D -> F), activation, project (F -> D); no norm, no residual.
class FeedForward final : public Module {
  public:
    FeedForward(std::size_t width, std::size_t hidden_width, std::mt19937& generator,
                Activation activation = Activation::Gelu);
    [[nodiscard]] Variable forward(const Variable& x) const;

  private:
    Activation activation_;
    Linear* expand_;
    Linear* project_;
};

// down(silu(gate(x)) ⊙ up(x)); gate and up D -> F, down F -> D, all without bias.
class SwiGLU final : public Module {
  public:
    SwiGLU(std::size_t width, std::size_t hidden_width, std::mt19937& generator);
    [[nodiscard]] Variable forward(const Variable& x) const;

  private:
    Linear* gate_;
    Linear* up_;
    Linear* down_;
};

}  // namespace riftco_transformer
