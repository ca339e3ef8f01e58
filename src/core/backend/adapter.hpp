#pragma once
// BackendAdapter: the internal facade every execution backend implements, split into
// segregated capabilities. tensor_ops validates every argument before calling exactly one
// capability; adapters never validate user input again and never call back up.
//
// Contract for every capability call:
// - inputs are on this adapter's backend and have the shapes tensor_ops checked; index
//   inputs (IndexTensor) were range-checked by tensor_ops from the maximum recorded at their
//   upload, so kernels never check ids again;
// - outputs were allocated on this backend by tensor_ops (uninitialised) with their final
//   shapes. The adapter either writes into that storage or gives the output a new one
//   (TensorAccess::replace_storage): a device whose results are immutable buffers (PJRT)
//   hands back the buffer its program produced. Either way the output holds the result when
//   the call returns, as far as any later operation can tell;
// - value-domain violations a kernel discovers carry the category and message the operation
//   documents (std::domain_error, std::overflow_error). The CPU adapter, its own sync point,
//   throws them when the kernel ends. An asynchronous device records the first one
//   (detail::defer_error) and it is raised at the next sync point of that backend; outputs
//   computed after it are unspecified. Because outputs are fresh, nothing visible changed.
// - no capability writes into an input; the only writes to existing tensors are
//   StorageCapability::write_range, AdamCapability::apply_update and
//   PagedAttentionCapability::write_key_value (a KV pool), all inside the adapter.
//
// Sync points (detail::synchronize: one host read counted, then any deferred error raised):
// - Tensor::to_host, Tensor::copy_to_host, Tensor::flat / at / item, IndexTensor::to_host;
// - Tensor::to and IndexTensor::to when they stage through host memory (no direct copy);
// - the optimizer's one read per Adam::step, whatever the parameter count: the batched step
//   check (global norm, first non-finite gradient, clip factor, candidate check;
//   tensor_ops::adam_step_check). Adam's constructor, state() and load paths read once per
//   batched request too (tensor_ops::first_non_finite, gradient_statistics).
// This vtable is private: it is not part of any ABI.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>

#include "core/backend/quantized_storage.hpp"
#include "core/backend/storage.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"

namespace riftco_transformer::detail {

class StorageCapability {
  public:
    virtual ~StorageCapability() = default;
    // Storage for `element_count` floats, contents unspecified.
    [[nodiscard]] virtual std::shared_ptr<Storage> allocate(std::size_t element_count) const = 0;
    [[nodiscard]] virtual std::shared_ptr<Storage> clone(const Storage& source) const = 0;
    // Fills a fresh storage.
    virtual void fill(Storage& storage, float value) const = 0;
    // Writes values at [offset, offset + values.size()) of an existing tensor of this backend
    // (the caller checked the bounds). No copy sharing the old storage may observe it: the
    // adapter makes the storage unique and writes, or gives the tensor a new storage.
    virtual void write_range(Tensor& tensor, std::size_t offset,
                             std::span<const float> values) const = 0;
    // A copy, on this backend, of a storage that another backend owns, made without staging
    // through a host vector; null when this adapter cannot read that storage directly.
    [[nodiscard]] virtual std::shared_ptr<Storage> import_from(const Storage& source) const = 0;
};

class LayoutCapability {
  public:
    virtual ~LayoutCapability() = default;
    // out.shape[d] = x.shape[axes[d]].
    virtual void permute(const Tensor& x, std::span<const std::size_t> axes, Tensor& out) const = 0;
    // x's shape broadcasts (right-aligned) to out's shape.
    virtual void broadcast_to(const Tensor& x, Tensor& out) const = 0;
    // out's shape broadcasts to x's shape; out = Σ over the broadcast dimensions.
    virtual void sum_to_shape(const Tensor& x, Tensor& out) const = 0;
    virtual void concatenate_last_axis(std::span<const Tensor> inputs, Tensor& out) const = 0;
    // out = x[..., start:start+out.shape[axis], ...] along `axis`.
    virtual void slice(const Tensor& x, std::size_t axis, std::size_t start, Tensor& out) const = 0;
    // out = zeros, then out[..., start:start+x.shape[axis], ...] = x along `axis`.
    virtual void slice_backward(const Tensor& x, std::size_t axis, std::size_t start,
                                Tensor& out) const = 0;
};

enum class BinaryOperation { Add, Subtract, Multiply, Divide };
enum class UnaryOperation { Negate, Exp, Log, Sqrt, Erf, Gelu, GeluTanh, Relu, Silu, Tanh };
// (x, upstream) -> upstream · f'(x)
enum class UnaryDerivative { Gelu, GeluTanh, Relu, Silu };

class ElementwiseCapability {
  public:
    virtual ~ElementwiseCapability() = default;
    // Divide: domain_error on a zero denominator.
    virtual void binary(BinaryOperation operation, const Tensor& left, const Tensor& right,
                        Tensor& out) const = 0;
    // Log: domain_error on x <= 0 or NaN; Sqrt: domain_error on x < 0 or NaN.
    virtual void unary(UnaryOperation operation, const Tensor& x, Tensor& out) const = 0;
    // out = x·multiplier + addend.
    virtual void affine(const Tensor& x, float multiplier, float addend, Tensor& out) const = 0;
    virtual void unary_backward(UnaryDerivative derivative, const Tensor& x, const Tensor& upstream,
                                Tensor& out) const = 0;
};

class ReductionCapability {
  public:
    virtual ~ReductionCapability() = default;
    // out (one element) = multiplier · Σ x.
    virtual void sum_all(const Tensor& x, double multiplier, Tensor& out) const = 0;
    // out = multiplier · Σ_axis x; out has x's layout with `axis` reduced to one.
    virtual void sum_axis(const Tensor& x, std::size_t axis, double multiplier,
                          Tensor& out) const = 0;
};

// The extents of one batched_matmul call, read from its operands (the tensor_ops rules hold):
// each operand's last two axes, the product's m·n, the inner k, and the batch count.
struct MatmulExtents {
    std::size_t left_rows, left_columns, right_rows, right_columns, m, n, k, batch;

    static MatmulExtents of(const Tensor& left, const Tensor& right, bool transpose_left,
                            const Tensor& out) {
        const std::size_t rank = left.rank();
        MatmulExtents e{};
        e.left_rows = left.shape()[rank - 2];
        e.left_columns = left.shape()[rank - 1];
        e.right_rows = right.shape()[rank - 2];
        e.right_columns = right.shape()[rank - 1];
        e.m = out.shape()[rank - 2];
        e.n = out.shape()[rank - 1];
        e.k = transpose_left ? e.left_rows : e.left_columns;
        e.batch = out.numel() / (e.m * e.n);
        return e;
    }
};

class MatmulCapability {
  public:
    virtual ~MatmulCapability() = default;
    // out[b] = op(left[b]) · op(right[b]) over the flattened leading dimensions.
    virtual void batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                                bool transpose_right, Tensor& out) const = 0;
    // outs[i] = x · weights[i]ᵀ for one x [R,K] and weights [N_i,K] (outs [R,N_i], allocated
    // by the caller): the projections of one input. This default runs batched_matmul per
    // weight; a backend may fuse them into one pass that gives the same values.
    virtual void project_many(const Tensor& x, std::span<const Tensor* const> weights,
                              std::span<Tensor* const> outs) const {
        for (std::size_t i = 0; i < weights.size(); ++i)
            batched_matmul(x, *weights[i], false, true, *outs[i]);
    }
};

class SoftmaxCapability {
  public:
    virtual ~SoftmaxCapability() = default;
    // domain_error: a slice holding NaN/+inf, or only -inf.
    virtual void softmax(const Tensor& x, std::size_t axis, Tensor& out) const = 0;
    virtual void softmax_backward(const Tensor& probabilities, const Tensor& upstream,
                                  std::size_t axis, Tensor& out) const = 0;
    // scores [B,H,T,T]; domain_error like softmax over the visible keys.
    virtual void causal_softmax(const Tensor& scores, float scale, Tensor& out) const = 0;
    virtual void causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream,
                                         float scale, Tensor& out) const = 0;
};

class IndexingCapability {
  public:
    virtual ~IndexingCapability() = default;
    // table [R,W], indices (n ids, each < R) -> out [n,W] (flat over the index shape).
    virtual void gather_rows(const Tensor& table, const IndexTensor& indices,
                             Tensor& out) const = 0;
    // upstream [n,W], indices (n ids, each < row_count) -> out [row_count, W]: zero, then
    // every upstream row added at its index, repeated indices in index order.
    virtual void scatter_add_rows(const Tensor& upstream, const IndexTensor& indices,
                                  Tensor& out) const = 0;
};

class NormalizationCapability {
  public:
    virtual ~NormalizationCapability() = default;
    virtual void layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, float epsilon,
                            Tensor& out, Tensor& mean, Tensor& inverse_deviation) const = 0;
    virtual void layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean,
                                     const Tensor& inverse_deviation, const Tensor& upstream,
                                     Tensor& input_gradient, Tensor& scale_gradient,
                                     Tensor& bias_gradient) const = 0;
    virtual void rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& out,
                          Tensor& inverse_rms) const = 0;
    virtual void rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inverse_rms,
                                   const Tensor& upstream, Tensor& input_gradient,
                                   Tensor& scale_gradient) const = 0;
};

// The positions a loss averages over: logits [..., V] viewed as [B, T, V] (T = time_extent),
// the rows (b, t) with t in [offset, offset + count), N = B·count. The default is every row.
//
// `selected` (optional, on the logits' backend) narrows the window further: one 0/1 flag per
// row of logits, and only window rows flagged 1 count; then N = `selected_count`, the number
// of flagged window rows (> 0, computed by the caller), and unflagged rows get an exactly zero
// gradient (a response-only loss).
struct LossWindow {
    std::size_t time_extent = 1;
    std::size_t offset = 0;
    std::size_t count = 1;
    const IndexTensor* selected = nullptr;
    std::size_t selected_count = 0;
};

class LossCapability {
  public:
    virtual ~LossCapability() = default;
    // targets: one id < V per row of logits (every row, not only the window's).
    // loss = −(1/N)·Σ_{(b,t) in window} log softmax(z_bt)[y_bt]; gradient (logits' shape) =
    // (softmax − onehot)/N on the window's rows and exactly 0 elsewhere. domain_error:
    // non-finite target logit in the window; overflow_error: non-finite mean loss.
    virtual void cross_entropy(const Tensor& logits, const IndexTensor& targets, LossWindow window,
                               Tensor& loss, Tensor& gradient) const = 0;
};

// Memory-linear ("flash") causal attention: Q, context [B,Hq,T,d_h]; K, V [B,Hkv,T,d_h] with
// Hq % Hkv == 0 (query head h reads key/value head ⌊h/(Hq/Hkv)⌋, never a repeated copy); row
// statistics [B,Hq,T] hold m_i = max_j S_ij and l_i = Σ_j exp(S_ij − m_i) over the keys j
// visible from query i (j <= i, j > i − W when options.window = W > 0, and in packed rows
// (options.documents) j >= i − p_i, p_i query i's position inside its document) of the scaled
// scores S = scale·Q·Kᵀ. No [T,T] buffer exists in either direction, and key tiles outside
// the window are never touched. domain_error: a visible score that is NaN or +inf, or a query
// row without a finite visible score.
class AttentionCapability {
  public:
    virtual ~AttentionCapability() = default;
    virtual void flash_forward(const Tensor& query, const Tensor& key, const Tensor& value,
                               float scale, const tensor_ops::FlashAttentionOptions& options,
                               Tensor& context, Tensor& row_max, Tensor& row_sum) const = 0;
    // Recomputes P_ij = exp(S_ij − m_i)/l_i tile by tile and applies the softmax VJP; the
    // key and value gradients ([B,Hkv,T,d_h]) sum over the query heads of each group.
    virtual void flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                const Tensor& context, const Tensor& row_max, const Tensor& row_sum,
                                const Tensor& upstream, float scale,
                                const tensor_ops::FlashAttentionOptions& options,
                                Tensor& query_gradient, Tensor& key_gradient,
                                Tensor& value_gradient) const = 0;
};

// The KV-cached decode path's attention (tensor_ops/paged_attention.hpp has the layouts and
// the math). tensor_ops checked every shape, request length, page id and slot.
class PagedAttentionCapability {
  public:
    virtual ~PagedAttentionCapability() = default;
    // query, context [R,Hq,1,d_h]; pools [P,Hkv,S,d_h], Hq % Hkv == 0 (query head h reads
    // pool head ⌊h/(Hq/Hkv)⌋); one request per query row, seeing its last options.window
    // positions (all when 0). Reads every key and value in place through the page tables (no
    // gather, no repeated heads). domain_error: a visible score that is NaN or +inf.
    virtual void decode_attention(const Tensor& query, const Tensor& key_pool,
                                  const Tensor& value_pool,
                                  std::span<const tensor_ops::PagedAttentionRequest> requests,
                                  float scale, const tensor_ops::PagedAttentionOptions& options,
                                  Tensor& context) const = 0;
    // pools[slot_r.page, :, slot_r.offset, :] = rows r of key and value ([R,Hkv,1,d_h]), in
    // place after making each pool's storage unique (TensorAccess::unique_storage); the slots
    // are distinct.
    virtual void write_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                                 const Tensor& value,
                                 std::span<const tensor_ops::PagedSlot> slots) const = 0;
};

// Packed weights (docs/ARCHITECTURE.md, 'NF4'; the GGUF block formats of quantized_weight.hpp)
// and the linear products on them. The weight lives in a backend-owned QuantizedStorage; the
// kernels decode the codes themselves and never hold a float32 copy of the whole matrix
// (bounded per-thread panels are allowed). Every adapter stores nf4; the block formats only
// where supports_format says so, and QuantizedWeight refuses the others by name (there is no
// silent float32 fallback).
class QuantizedLinearCapability {
  public:
    virtual ~QuantizedLinearCapability() = default;
    [[nodiscard]] virtual bool supports_format(WeightFormat format) const noexcept {
        return format == WeightFormat::nf4;
    }
    // A block payload that passed validate_block_payload, of a format supports_format accepts
    // -> this backend's storage of it.
    // By value: the adapters that store blocks take ownership (this default only refuses).
    [[nodiscard]] virtual std::shared_ptr<const QuantizedStorage> upload_blocks(
        PackedBlockPayload /*payload*/) const {  // NOLINT(performance-unnecessary-value-param)
        throw std::logic_error("QuantizedLinearCapability::upload_blocks: format unsupported");
    }
    // The exact blocks of a block-format storage of this backend, in host memory.
    [[nodiscard]] virtual PackedBlockPayload download_blocks(
        const QuantizedStorage& /*weight*/) const {
        throw std::logic_error("QuantizedLinearCapability::download_blocks: format unsupported");
    }
    // A payload that passed validate_nf4_payload -> this backend's storage of it.
    [[nodiscard]] virtual std::shared_ptr<const QuantizedStorage> upload(
        PackedNf4Payload payload) const = 0;
    // The exact payload of a storage of this backend, in host memory (a host read).
    [[nodiscard]] virtual PackedNf4Payload download(const QuantizedStorage& weight) const = 0;
    // x [R, in] (leading dimensions flattened) -> out [R, out] = x·deq(W)ᵀ.
    virtual void forward(const Tensor& x, const QuantizedStorage& weight, Tensor& out) const = 0;
    // upstream [R, out] -> out [R, in] = upstream·deq(W).
    virtual void input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                                Tensor& out) const = 0;
    // Rows of deq(W) (a packed embedding table): out [n, in] = deq(W)[indices[i]], the ids
    // checked against out_features. Optional: only adapters that return true here are asked.
    [[nodiscard]] virtual bool gathers_rows() const noexcept { return false; }
    virtual void gather_rows(const QuantizedStorage& /*weight*/, const IndexTensor& /*indices*/,
                             Tensor& /*out*/) const {
        throw std::logic_error("QuantizedLinearCapability::gather_rows: unsupported");
    }
};

// The optimizer's value types (ScaledSumOfSquares, FirstNonFinite, GradientStatistics,
// AdamUpdateScalars, AdamSlice, AdamCheck) are tensor_ops's: see tensor_ops/optimizer.hpp.
using tensor_ops::AdamCheck;
using tensor_ops::AdamSlice;
using tensor_ops::AdamStepCheck;
using tensor_ops::AdamUpdateScalars;
using tensor_ops::FirstNonFinite;
using tensor_ops::GradientStatistics;
using tensor_ops::ScaledSumOfSquares;

// Adam as two passes over every slice of a step (docs/ARCHITECTURE.md, 'Transactions'): a
// read-only check, then an in-place write. Both evaluate, per scalar and in double,
//   g̃ = s·g,  m' = β1·m + (1−β1)·g̃,  v' = β2·v + (1−β2)·g̃²,
//   θ' = θ·(1 − lr·λ) − lr·(m'/c1)/(√(v'/c2) + ε)
// with the same arithmetic, so what the check accepted is exactly what the write stores.
class AdamCapability {
  public:
    virtual ~AdamCapability() = default;
    // One request over all tensors (null entries are skipped): each tensor's scaled sum of
    // squares, accumulated in double over fixed blocks merged in order (independent of the
    // thread count), merged in list order; and the first non-finite element in list order.
    [[nodiscard]] virtual GradientStatistics gradient_statistics(
        std::span<const Tensor* const> tensors) const = 0;
    // The first non-finite element of the tensors, in list order (null entries skipped).
    [[nodiscard]] virtual FirstNonFinite first_non_finite(
        std::span<const Tensor* const> tensors) const = 0;
    // Pass 1: reads every slice, writes nothing.
    [[nodiscard]] virtual AdamCheck check_update(const AdamUpdateScalars& scalars,
                                                 std::span<const AdamSlice> slices) const = 0;
    // Pass 1 of a whole step in one request: gradient_statistics, the clip factor
    // (tensor_ops::clip_scale_for), then check_update under it (skipped when a gradient is
    // non-finite). A device computes it without a host round trip in between; this default
    // composes the two calls above.
    [[nodiscard]] virtual AdamStepCheck check_step(const AdamUpdateScalars& scalars,
                                                   double maximum_gradient_norm,
                                                   std::span<const Tensor* const> gradients,
                                                   std::span<const AdamSlice> slices) const {
        AdamStepCheck result;
        result.gradients = gradient_statistics(gradients);
        result.check = {slices.size(), 0, 0.0F, slices.size(), 0};
        if (result.gradients.first_non_finite.tensor != gradients.size()) {
            return result;
        }
        result.clip_scale =
            tensor_ops::clip_scale_for(result.gradients.squares.norm(), maximum_gradient_norm);
        AdamUpdateScalars clipped = scalars;
        clipped.clip_scale = result.clip_scale;
        result.check = check_update(clipped, slices);
        return result;
    }
    // Pass 2: gives every value and moment its θ', m', v' (narrowed to float). The caller ran
    // check_update with the same arguments and it found nothing. The adapter either writes
    // in place after making each written storage unique (TensorAccess::unique_storage) or
    // gives the tensors new storages, so no copy and no gradient observes the write. Every
    // allocation happens before the first write: a failure changes nothing.
    virtual void apply_update(const AdamUpdateScalars& scalars,
                              std::span<const AdamSlice> slices) const = 0;
};

// Optional: RoPE in one pass (BackendAdapter::rotary() is null where a backend has no such
// kernel, and tensor_ops::rotary_embedding then composes it from layout and elementwise
// operations, with the same values).
class RotaryCapability {
  public:
    virtual ~RotaryCapability() = default;
    // The split-half rotation over x's last axis (d = 2h): out[.., i] = x[.., i]·c − x[.., i+h]·s
    // and out[.., i+h] = x[.., i+h]·c + x[.., i]·s, with c and s the entries [row, i] of
    // cosine and sine [rows, h], row being x's index along `table_axis`. Every product is
    // rounded before the sum (no fused multiply-add), as in the composite.
    virtual void rotate(const Tensor& x, const Tensor& cosine, const Tensor& sine,
                        std::size_t table_axis, Tensor& out) const = 0;
};

// Optional: inverted-dropout masks (tensor_ops::dropout_mask has the generator and the rule).
// Null where a backend has no kernel; tensor_ops then refuses with a capability error naming
// dropout (never a silent skip).
class DropoutCapability {
  public:
    virtual ~DropoutCapability() = default;
    // out[i] = keep(i) ? kept_value : 0 over out's elements, keep(i) the counter-based rule of
    // tensor_ops::dropout_keeps(stream, i, threshold).
    virtual void dropout_mask(std::uint64_t stream, std::uint64_t threshold, float kept_value,
                              Tensor& out) const = 0;
};

class BackendAdapter {
  public:
    virtual ~BackendAdapter() = default;

    [[nodiscard]] virtual ExecutionBackend backend() const noexcept = 0;
    [[nodiscard]] std::string_view name() const noexcept;
    [[nodiscard]] virtual bool is_available() const noexcept = 0;
    // Empty when available.
    [[nodiscard]] virtual std::string_view unavailability_reason() const noexcept = 0;

    // Each capability is null when this adapter does not provide it.
    [[nodiscard]] virtual const StorageCapability* storage() const noexcept = 0;
    [[nodiscard]] virtual const LayoutCapability* layout() const noexcept = 0;
    [[nodiscard]] virtual const ElementwiseCapability* elementwise() const noexcept = 0;
    [[nodiscard]] virtual const ReductionCapability* reduction() const noexcept = 0;
    [[nodiscard]] virtual const MatmulCapability* matmul() const noexcept = 0;
    [[nodiscard]] virtual const SoftmaxCapability* softmax() const noexcept = 0;
    [[nodiscard]] virtual const IndexingCapability* indexing() const noexcept = 0;
    [[nodiscard]] virtual const NormalizationCapability* normalization() const noexcept = 0;
    [[nodiscard]] virtual const LossCapability* loss() const noexcept = 0;
    [[nodiscard]] virtual const AttentionCapability* attention() const noexcept = 0;
    [[nodiscard]] virtual const PagedAttentionCapability* paged_attention() const noexcept = 0;
    [[nodiscard]] virtual const QuantizedLinearCapability* quantized_linear() const noexcept = 0;
    [[nodiscard]] virtual const AdamCapability* adam() const noexcept = 0;
    // Optional (see RotaryCapability): null unless the adapter has the fused kernel.
    [[nodiscard]] virtual const RotaryCapability* rotary() const noexcept { return nullptr; }
    // Optional (see DropoutCapability): null unless the adapter has the mask kernel.
    [[nodiscard]] virtual const DropoutCapability* dropout() const noexcept { return nullptr; }

    // Called by detail::synchronize at every sync point of this backend, before it raises the
    // deferred error: a device whose checks leave flags on the device reads them here and
    // hands the first failure to defer_error. Synchronous adapters have nothing to collect.
    virtual void collect_deferred_errors() const {}
};

// The fixed registry: one adapter per ExecutionBackend value, null for unknown values.
[[nodiscard]] const BackendAdapter* find_backend_adapter(ExecutionBackend backend) noexcept;

// The adapter for `backend` when it is available. Unknown value: invalid_argument; unavailable:
// runtime_error "<operation>: backend '<name>' is unavailable: <reason>".
[[nodiscard]] const BackendAdapter& require_available_adapter(ExecutionBackend backend,
                                                              std::string_view operation);

// The capability or runtime_error "<operation>: backend '<name>' does not provide <family>".
template <typename Capability>
[[nodiscard]] const Capability& require_capability(const Capability* capability,
                                                   const BackendAdapter& adapter,
                                                   std::string_view operation,
                                                   std::string_view family);

// The storage capability of an available `backend` (the errors of require_available_adapter
// and require_capability otherwise).
[[nodiscard]] const StorageCapability& require_storage(ExecutionBackend backend,
                                                       std::string_view operation);

// A direct copy of `source` onto `target` (the target's StorageCapability::import_from); when
// it lands in host memory (target Cpu) it is a sync point of the source. Null when the target
// cannot read the source directly: the caller then stages through a host read.
[[nodiscard]] std::shared_ptr<Storage> import_storage(const Storage& source,
                                                      ExecutionBackend target,
                                                      std::string_view operation);

[[noreturn]] void throw_missing_capability(const BackendAdapter& adapter,
                                           std::string_view operation, std::string_view family);

template <typename Capability>
const Capability& require_capability(const Capability* capability, const BackendAdapter& adapter,
                                     std::string_view operation, std::string_view family) {
    if (capability == nullptr) {
        throw_missing_capability(adapter, operation, family);
    }
    return *capability;
}

}  // namespace riftco_transformer::detail
