#pragma once
// The CPU adapter: the readable reference every other backend is checked against, with
// vectorised loops threaded over rows and GEMM through the BLAS seam. One file per family.

#include "core/backend/adapter.hpp"

namespace riftco_transformer::detail {

class CpuStorageCapability final : public StorageCapability {
  public:
    explicit CpuStorageCapability(ExecutionBackend backend) noexcept : backend_(backend) {}
    [[nodiscard]] std::shared_ptr<Storage> allocate(std::size_t element_count) const override;
    [[nodiscard]] std::shared_ptr<Storage> clone(const Storage& source) const override;
    void fill(Storage& storage, float value) const override;
    void write_range(Tensor& tensor, std::size_t offset,
                     std::span<const float> values) const override;
    // Reads any host-memory (CpuStorage) source directly.
    [[nodiscard]] std::shared_ptr<Storage> import_from(const Storage& source) const override;

  private:
    ExecutionBackend backend_;
};

class CpuLayout final : public LayoutCapability {
  public:
    void permute(const Tensor& x, std::span<const std::size_t> axes, Tensor& out) const override;
    void broadcast_to(const Tensor& x, Tensor& out) const override;
    void sum_to_shape(const Tensor& x, Tensor& out) const override;
    void concatenate_last_axis(std::span<const Tensor> inputs, Tensor& out) const override;
    void slice(const Tensor& x, std::size_t axis, std::size_t start, Tensor& out) const override;
    void slice_backward(const Tensor& x, std::size_t axis, std::size_t start,
                        Tensor& out) const override;
};

class CpuElementwise final : public ElementwiseCapability {
  public:
    void binary(BinaryOperation operation, const Tensor& left, const Tensor& right,
                Tensor& out) const override;
    void unary(UnaryOperation operation, const Tensor& x, Tensor& out) const override;
    void affine(const Tensor& x, float multiplier, float addend, Tensor& out) const override;
    void unary_backward(UnaryDerivative derivative, const Tensor& x, const Tensor& upstream,
                        Tensor& out) const override;
};

class CpuRotary final : public RotaryCapability {
  public:
    void rotate(const Tensor& x, const Tensor& cosine, const Tensor& sine, std::size_t table_axis,
                Tensor& out) const override;
};

class CpuDropout final : public DropoutCapability {
  public:
    void dropout_mask(std::uint64_t stream, std::uint64_t threshold, float kept_value,
                      Tensor& out) const override;
};

class CpuReduction final : public ReductionCapability {
  public:
    void sum_all(const Tensor& x, double multiplier, Tensor& out) const override;
    void sum_axis(const Tensor& x, std::size_t axis, double multiplier, Tensor& out) const override;
};

class CpuMatmul final : public MatmulCapability {
  public:
    void batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                        bool transpose_right, Tensor& out) const override;
    void project_many(const Tensor& x, std::span<const Tensor* const> weights,
                      std::span<Tensor* const> outs) const override;
};

class CpuSoftmax final : public SoftmaxCapability {
  public:
    void softmax(const Tensor& x, std::size_t axis, Tensor& out) const override;
    void softmax_backward(const Tensor& probabilities, const Tensor& upstream, std::size_t axis,
                          Tensor& out) const override;
    void causal_softmax(const Tensor& scores, float scale, Tensor& out) const override;
    void causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream, float scale,
                                 Tensor& out) const override;
};

class CpuIndexing final : public IndexingCapability {
  public:
    void gather_rows(const Tensor& table, const IndexTensor& indices, Tensor& out) const override;
    void scatter_add_rows(const Tensor& upstream, const IndexTensor& indices,
                          Tensor& out) const override;
};

class CpuNormalization final : public NormalizationCapability {
  public:
    void layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, float epsilon,
                    Tensor& out, Tensor& mean, Tensor& inverse_deviation) const override;
    void layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean,
                             const Tensor& inverse_deviation, const Tensor& upstream,
                             Tensor& input_gradient, Tensor& scale_gradient,
                             Tensor& bias_gradient) const override;
    void rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& out,
                  Tensor& inverse_rms) const override;
    void rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inverse_rms,
                           const Tensor& upstream, Tensor& input_gradient,
                           Tensor& scale_gradient) const override;
};

class CpuAttention final : public AttentionCapability {
  public:
    void flash_forward(const Tensor& query, const Tensor& key, const Tensor& value, float scale,
                       const tensor_ops::FlashAttentionOptions& options, Tensor& context,
                       Tensor& row_max, Tensor& row_sum) const override;
    void flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& context, const Tensor& row_max, const Tensor& row_sum,
                        const Tensor& upstream, float scale,
                        const tensor_ops::FlashAttentionOptions& options, Tensor& query_gradient,
                        Tensor& key_gradient, Tensor& value_gradient) const override;
};

// Paged decode attention (paged_attention.cpp): a readable double-precision reference and
// a vectorised path threaded over (request, query head) pairs; RIFTCO_TRANSFORMER_PAGED_ATTENTION=
// reference|fast picks one (default fast). Both walk each request's visible positions in
// logical order, so neither depends on the page size.
class CpuPagedAttention final : public PagedAttentionCapability {
  public:
    void decode_attention(const Tensor& query, const Tensor& key_pool, const Tensor& value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          const tensor_ops::PagedAttentionOptions& options,
                          Tensor& context) const override;
    void write_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                         const Tensor& value,
                         std::span<const tensor_ops::PagedSlot> slots) const override;
};

class CpuLoss final : public LossCapability {
  public:
    void cross_entropy(const Tensor& logits, const IndexTensor& targets, LossWindow window,
                       Tensor& loss, Tensor& gradient) const override;
};

class CpuAdam final : public AdamCapability {
  public:
    [[nodiscard]] GradientStatistics gradient_statistics(
        std::span<const Tensor* const> tensors) const override;
    [[nodiscard]] FirstNonFinite first_non_finite(
        std::span<const Tensor* const> tensors) const override;
    [[nodiscard]] AdamCheck check_update(const AdamUpdateScalars& scalars,
                                         std::span<const AdamSlice> slices) const override;
    void apply_update(const AdamUpdateScalars& scalars,
                      std::span<const AdamSlice> slices) const override;
};

// NF4 weights in host memory (cpu_quantized_storage.hpp); kernels in quantized_linear.cpp.
class CpuQuantizedLinear final : public QuantizedLinearCapability {
  public:
    explicit CpuQuantizedLinear(ExecutionBackend backend) noexcept : backend_(backend) {}
    [[nodiscard]] std::shared_ptr<const QuantizedStorage> upload(
        PackedNf4Payload payload) const override;
    [[nodiscard]] PackedNf4Payload download(const QuantizedStorage& weight) const override;
    [[nodiscard]] bool supports_format(WeightFormat /*format*/) const noexcept override {
        return true;
    }
    [[nodiscard]] std::shared_ptr<const QuantizedStorage> upload_blocks(
        PackedBlockPayload payload) const override;
    [[nodiscard]] PackedBlockPayload download_blocks(const QuantizedStorage& weight) const override;
    void forward(const Tensor& x, const QuantizedStorage& weight, Tensor& out) const override;
    void input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                        Tensor& out) const override;
    [[nodiscard]] bool gathers_rows() const noexcept override { return true; }
    void gather_rows(const QuantizedStorage& weight, const IndexTensor& indices,
                     Tensor& out) const override;

  private:
    ExecutionBackend backend_;
};

// Host-memory adapter running the CPU kernels under a backend identity (the CPU adapter).
class HostAdapter final : public BackendAdapter {
  public:
    explicit HostAdapter(ExecutionBackend identity) noexcept
        : identity_(identity), storage_(identity), quantized_linear_(identity) {}

    [[nodiscard]] ExecutionBackend backend() const noexcept override { return identity_; }
    [[nodiscard]] bool is_available() const noexcept override { return true; }
    [[nodiscard]] std::string_view unavailability_reason() const noexcept override { return {}; }

    [[nodiscard]] const StorageCapability* storage() const noexcept override { return &storage_; }
    [[nodiscard]] const LayoutCapability* layout() const noexcept override { return &layout_; }
    [[nodiscard]] const ElementwiseCapability* elementwise() const noexcept override {
        return &elementwise_;
    }
    [[nodiscard]] const ReductionCapability* reduction() const noexcept override {
        return &reduction_;
    }
    [[nodiscard]] const MatmulCapability* matmul() const noexcept override { return &matmul_; }
    [[nodiscard]] const SoftmaxCapability* softmax() const noexcept override { return &softmax_; }
    [[nodiscard]] const IndexingCapability* indexing() const noexcept override {
        return &indexing_;
    }
    [[nodiscard]] const NormalizationCapability* normalization() const noexcept override {
        return &normalization_;
    }
    [[nodiscard]] const LossCapability* loss() const noexcept override { return &loss_; }
    [[nodiscard]] const AttentionCapability* attention() const noexcept override {
        return &attention_;
    }
    [[nodiscard]] const PagedAttentionCapability* paged_attention() const noexcept override {
        return &paged_attention_;
    }
    [[nodiscard]] const QuantizedLinearCapability* quantized_linear() const noexcept override {
        return &quantized_linear_;
    }
    [[nodiscard]] const AdamCapability* adam() const noexcept override { return &adam_; }
    [[nodiscard]] const RotaryCapability* rotary() const noexcept override { return &rotary_; }
    [[nodiscard]] const DropoutCapability* dropout() const noexcept override { return &dropout_; }

  private:
    ExecutionBackend identity_;
    CpuStorageCapability storage_;
    CpuLayout layout_;
    CpuElementwise elementwise_;
    CpuRotary rotary_;
    CpuDropout dropout_;
    CpuReduction reduction_;
    CpuMatmul matmul_;
    CpuSoftmax softmax_;
    CpuIndexing indexing_;
    CpuNormalization normalization_;
    CpuLoss loss_;
    CpuAttention attention_;
    CpuPagedAttention paged_attention_;
    CpuQuantizedLinear quantized_linear_;
    CpuAdam adam_;
};

[[nodiscard]] const BackendAdapter& cpu_adapter() noexcept;

}  // namespace riftco_transformer::detail
