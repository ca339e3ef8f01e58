#pragma once
// Differentiable operations on Variables. Each runs the raw tensor operation of the same name
// (tensor_ops, with the same validation and error categories) and records the vector-Jacobian
// product that backward() applies. Backward rules use raw tensor_ops only: no graph is built
// during backward. Shapes follow the raw operations.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/normalization.hpp"

namespace riftco_transformer {

// Arithmetic (identical shapes; use broadcast_to explicitly).
// VJPs: add (G, G); subtract (G, −G); multiply (G⊙B, G⊙A); divide (G⊘B, −G⊙A⊘B²).
[[nodiscard]] Variable operator+(const Variable& left, const Variable& right);
[[nodiscard]] Variable operator-(const Variable& left, const Variable& right);
[[nodiscard]] Variable operator*(const Variable& left, const Variable& right);
[[nodiscard]] Variable operator/(const Variable& left, const Variable& right);
[[nodiscard]] Variable operator-(const Variable& x);
// Scalars act elementwise on the variable's backend (finite scalars only).
[[nodiscard]] Variable operator+(const Variable& x, float scalar);
[[nodiscard]] Variable operator+(float scalar, const Variable& x);
[[nodiscard]] Variable operator-(const Variable& x, float scalar);
[[nodiscard]] Variable operator-(float scalar, const Variable& x);
[[nodiscard]] Variable operator*(const Variable& x, float scalar);
[[nodiscard]] Variable operator*(float scalar, const Variable& x);
[[nodiscard]] Variable operator/(const Variable& x, float scalar);  // scalar != 0
// scalar / x: domain_error if any x element is zero.
[[nodiscard]] Variable operator/(float scalar, const Variable& x);

// [..., M, K] × [..., K, N]: dA = G·Bᵀ (skipped unless A needs it), dB = Aᵀ·G (likewise).
// Runs on the inputs' backend in both directions, whatever the thread default is later.
[[nodiscard]] Variable matmul(const Variable& left, const Variable& right);
// op(left) · op(right), op transposing the last two axes where asked (no transposed copies in
// either direction).
[[nodiscard]] Variable matmul(const Variable& left, const Variable& right, bool transpose_left,
                              bool transpose_right);

// Layout. VJPs: the inverse permutation / reshape; sum_to_shape for broadcast_to; the
// transposed slice for concatenate and slice.
[[nodiscard]] Variable permute(const Variable& x, std::span<const std::size_t> axes);
[[nodiscard]] Variable permute(const Variable& x, std::initializer_list<std::size_t> axes);
[[nodiscard]] Variable transpose_2d(const Variable& x);
[[nodiscard]] Variable reshape(const Variable& x, Shape shape);
[[nodiscard]] Variable broadcast_to(const Variable& x, const Shape& shape);
[[nodiscard]] Variable sum_to_shape(const Variable& x, const Shape& shape);
[[nodiscard]] Variable concatenate_last_axis(std::span<const Variable> inputs);
[[nodiscard]] Variable concatenate_last_axis(const Variable& left, const Variable& right);
[[nodiscard]] Variable slice(const Variable& x, std::size_t axis, std::size_t start,
                             std::size_t length);

// Reductions. VJP: the upstream broadcast back (÷ count for mean).
[[nodiscard]] Variable sum(const Variable& x);
[[nodiscard]] Variable sum(const Variable& x, std::size_t axis, bool keep_dims = false);
[[nodiscard]] Variable mean(const Variable& x);
[[nodiscard]] Variable mean(const Variable& x, std::size_t axis, bool keep_dims = false);

// Unary functions. log needs x > 0 and sqrt needs x > 0 STRICTLY (domain_error at forward:
// the derivative of sqrt at 0 is infinite), unlike raw sqrt which accepts 0.
// VJPs: exp G⊙eˣ; log G⊘x; sqrt G/(2√x); erf G·(2/√π)e^{−x²}; tanh G⊙(1 − y²);
// soft_cap (c·tanh(x/c), c finite and > 0, invalid_argument naming `cap` otherwise)
// G⊙(1 − tanh²(x/c)).
[[nodiscard]] Variable exp(const Variable& x);
[[nodiscard]] Variable log(const Variable& x);
[[nodiscard]] Variable sqrt(const Variable& x);
[[nodiscard]] Variable erf(const Variable& x);
[[nodiscard]] Variable tanh(const Variable& x);
[[nodiscard]] Variable soft_cap(const Variable& x, float cap);
[[nodiscard]] Variable gelu(const Variable& x);
[[nodiscard]] Variable gelu_tanh(const Variable& x);  // GPT-2's tanh form
[[nodiscard]] Variable relu(const Variable& x);
[[nodiscard]] Variable silu(const Variable& x);

// Indexing: rows of a [R, W] table; VJP scatter-adds the upstream rows. The backward keeps
// the index tensor (on the table's backend), never a host copy of the ids.
[[nodiscard]] Variable gather_rows(const Variable& table, const IndexTensor& indices);
// Host ids: checked and uploaded once (tensor_ops::row_indices), then the form above.
[[nodiscard]] Variable gather_rows(const Variable& table, std::span<const std::size_t> indices,
                                   const Shape& index_shape);

// Softmax along `axis`; VJP p ⊙ (g − Σ g ⊙ p).
[[nodiscard]] Variable softmax(const Variable& x, std::size_t axis);

// Causal softmax of scores [B,H,T,T] scaled by `scale` (future keys get exactly 0);
// VJP scale·p ⊙ (g − Σ g ⊙ p), exactly 0 on masked entries.
[[nodiscard]] Variable causal_softmax(const Variable& scores, float scale);

// Normalisation over the last axis (forward saves the row statistics).
[[nodiscard]] Variable layer_norm(const Variable& x, const Variable& scale, const Variable& bias,
                                  float epsilon = tensor_ops::default_normalization_epsilon);
[[nodiscard]] Variable rms_norm(const Variable& x, const Variable& scale,
                                float epsilon = tensor_ops::default_normalization_epsilon);

// y = x·Wᵀ + b as one differentiable operation: x [.., in], weight [out, in], bias [out] or an
// empty Variable (no bias) -> [.., out]. Its rule computes dx = G·W, dW = Gᵀ·x and db = Σ G
// only for inputs that need them (a frozen weight costs no weight-gradient product), with no
// transposed copy of W in either direction.
[[nodiscard]] Variable linear(const Variable& x, const Variable& weight, const Variable& bias);

// y = x·deq(W)ᵀ for a packed NF4 weight [out, in] (tensor_ops::quantized_linear). The node has
// exactly one parent, x: the weight is frozen state, never a leaf. VJP dx = G·deq(W), decoded
// inside the kernel.
[[nodiscard]] Variable quantized_linear(const Variable& x, const QuantizedWeight& weight);

// A low-rank update scale·(x·Aᵀ)·Bᵀ computed inside a linear (LoRA): A [rank, in], B [out, rank].
struct LowRankUpdate {
    Variable a;
    Variable b;
    float scale = 1.0F;
};

// y = x·Wᵀ + b + scale·(x·Aᵀ)·Bᵀ as ONE node (the graph keeps y alone, not the base and
// adapter outputs): edges x, W, b (when defined), A, B. Its rule computes
//   dx = G·W + (s·G·B)·A,  dW = Gᵀ·x,  db = Σ G,  dA = (s·G·B)ᵀ·x,  dB = Gᵀ·(s·x·Aᵀ)
// only for inputs that need them, so a frozen base weight costs no weight-gradient product.
// Factor shapes that do not fit the weight, or a non-finite scale: std::invalid_argument.
[[nodiscard]] Variable linear(const Variable& x, const Variable& weight, const Variable& bias,
                              const LowRankUpdate& update);
// The same over a packed NF4 weight (never a parent: frozen state), with an optional bias and
// optional update; dx decodes the packed weight inside the input-backward kernel.
[[nodiscard]] Variable quantized_linear(const Variable& x, const QuantizedWeight& weight,
                                        const Variable& bias,
                                        const LowRankUpdate* update = nullptr);

// Memory-linear causal attention (tensor_ops::flash_attention): Q [B,Hq,T,d_h], K and V
// [B,Hkv,T,d_h] with Hq % Hkv == 0 (grouped-query attention without repeated K/V heads), an
// optional sliding window (options.window; 0: dense causal) -> context [B,Hq,T,d_h]. No [T,T]
// buffer in either direction; the VJP recomputes the probabilities tile by tile, and the key
// and value gradients have K's shape [B,Hkv,T,d_h] (summed over each group's query heads).
[[nodiscard]] Variable flash_attention(const Variable& query, const Variable& key,
                                       const Variable& value,
                                       const tensor_ops::FlashAttentionOptions& options = {});

// Mean cross-entropy of logits [..., V] against one target per position (scalar result).
// The forward pass keeps the base gradient (softmax − onehot)/N; backward scales it.
[[nodiscard]] Variable cross_entropy(const Variable& logits,
                                     std::span<const std::uint32_t> targets);
[[nodiscard]] Variable cross_entropy(const Variable& logits, const IndexTensor& targets);

// Mean cross-entropy of logits [B,T,V] over the time slice [offset, offset+count) of every
// row (B·count positions) against B·T targets, one per position (only the slice's count; all
// are range-checked). d logits is upstream·(softmax − onehot)/(B·count) on the slice and
// exactly 0 elsewhere. Errors: tensor_ops::cross_entropy_time_range.
[[nodiscard]] Variable cross_entropy_time_range(const Variable& logits,
                                                std::span<const std::uint32_t> targets,
                                                std::size_t offset, std::size_t count);
[[nodiscard]] Variable cross_entropy_time_range(const Variable& logits, const IndexTensor& targets,
                                                std::size_t offset, std::size_t count);

// Mean cross-entropy over the positions `mask` flags 1 (response-only loss); d logits is
// upstream·(softmax − onehot)/M on them and exactly 0 elsewhere. Errors:
// tensor_ops::cross_entropy_masked.
[[nodiscard]] Variable cross_entropy_masked(const Variable& logits,
                                            std::span<const std::uint32_t> targets,
                                            std::span<const std::uint8_t> mask);

}  // namespace riftco_transformer
