// The emulated device (see emulated_device.hpp). Test-only: it is linked into
// riftco_transformer_test_emulation, never into the shipped library.

#include "support/emulated_device.hpp"

#include <atomic>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/synchronization.hpp"
#include "core/backend/unavailable/unavailable_adapter.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::test {
namespace {
std::atomic<std::size_t> replaced_outputs{0};
std::atomic<std::size_t> direct_imports{0};
}  // namespace

std::size_t emulated_replaced_outputs() noexcept {
    return replaced_outputs.load();
}
std::size_t emulated_direct_imports() noexcept {
    return direct_imports.load();
}

}  // namespace riftco_transformer::test

namespace riftco_transformer::detail {
namespace {

constexpr ExecutionBackend device = ExecutionBackend::Metal;

// Runs a kernel as an asynchronous device would: a value-domain error is recorded for the
// next sync point instead of thrown.
template <typename Kernel>
void deferring(Kernel&& kernel) {
    try {
        kernel();
    } catch (const std::domain_error&) {
        defer_error(device, std::current_exception());
    } catch (const std::overflow_error&) {
        defer_error(device, std::current_exception());
    }
}

// A new buffer for `out`, written by the kernel, then swapped in (PJRT's way).
class Fresh {
  public:
    explicit Fresh(const Tensor& out) : tensor_(allocate_uninitialized(out.shape(), device)) {}
    Tensor& tensor() { return tensor_; }
    void replace(Tensor& out) {
        TensorAccess::replace_storage(out, TensorAccess::shared_storage(tensor_));
        test::replaced_outputs.fetch_add(1);
    }

  private:
    Tensor tensor_;
};

class EmulatedStorage final : public StorageCapability {
  public:
    std::shared_ptr<Storage> allocate(std::size_t count) const override {
        return cpu_.allocate(count);
    }
    std::shared_ptr<Storage> clone(const Storage& source) const override {
        return cpu_.clone(source);
    }
    void fill(Storage& storage, float value) const override { cpu_.fill(storage, value); }
    // Never in place: a copy of the buffer with the range written replaces it.
    void write_range(Tensor& tensor, std::size_t offset,
                     std::span<const float> values) const override {
        std::shared_ptr<Storage> copy = cpu_.clone(TensorAccess::storage(tensor));
        copy->copy_from_host(offset, values);
        TensorAccess::replace_storage(tensor, std::move(copy));
        test::replaced_outputs.fetch_add(1);
    }
    std::shared_ptr<Storage> import_from(const Storage& source) const override {
        std::shared_ptr<Storage> copy = cpu_.import_from(source);
        if (copy != nullptr) {
            test::direct_imports.fetch_add(1);
        }
        return copy;
    }

  private:
    CpuStorageCapability cpu_{device};
};

class EmulatedElementwise final : public ElementwiseCapability {
  public:
    void binary(BinaryOperation operation, const Tensor& left, const Tensor& right,
                Tensor& out) const override {
        Fresh fresh(out);
        deferring([&] { cpu_.binary(operation, left, right, fresh.tensor()); });
        fresh.replace(out);
    }
    void unary(UnaryOperation operation, const Tensor& x, Tensor& out) const override {
        Fresh fresh(out);
        deferring([&] { cpu_.unary(operation, x, fresh.tensor()); });
        fresh.replace(out);
    }
    void affine(const Tensor& x, float multiplier, float addend, Tensor& out) const override {
        Fresh fresh(out);
        cpu_.affine(x, multiplier, addend, fresh.tensor());
        fresh.replace(out);
    }
    void unary_backward(UnaryDerivative derivative, const Tensor& x, const Tensor& upstream,
                        Tensor& out) const override {
        Fresh fresh(out);
        cpu_.unary_backward(derivative, x, upstream, fresh.tensor());
        fresh.replace(out);
    }

  private:
    CpuElementwise cpu_;
};

class EmulatedMatmul final : public MatmulCapability {
  public:
    void batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                        bool transpose_right, Tensor& out) const override {
        Fresh fresh(out);
        cpu_.batched_matmul(left, right, transpose_left, transpose_right, fresh.tensor());
        fresh.replace(out);
    }

  private:
    CpuMatmul cpu_;
};

class EmulatedSoftmax final : public SoftmaxCapability {
  public:
    void softmax(const Tensor& x, std::size_t axis, Tensor& out) const override {
        Fresh fresh(out);
        deferring([&] { cpu_.softmax(x, axis, fresh.tensor()); });
        fresh.replace(out);
    }
    void softmax_backward(const Tensor& probabilities, const Tensor& upstream, std::size_t axis,
                          Tensor& out) const override {
        Fresh fresh(out);
        cpu_.softmax_backward(probabilities, upstream, axis, fresh.tensor());
        fresh.replace(out);
    }
    void causal_softmax(const Tensor& scores, float scale, Tensor& out) const override {
        Fresh fresh(out);
        deferring([&] { cpu_.causal_softmax(scores, scale, fresh.tensor()); });
        fresh.replace(out);
    }
    void causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream, float scale,
                                 Tensor& out) const override {
        Fresh fresh(out);
        cpu_.causal_softmax_backward(probabilities, upstream, scale, fresh.tensor());
        fresh.replace(out);
    }

  private:
    CpuSoftmax cpu_;
};

class EmulatedLoss final : public LossCapability {
  public:
    void cross_entropy(const Tensor& logits, const IndexTensor& targets, LossWindow window,
                       Tensor& loss, Tensor& gradient) const override {
        Fresh fresh_loss(loss);
        Fresh fresh_gradient(gradient);
        deferring([&] {
            cpu_.cross_entropy(logits, targets, window, fresh_loss.tensor(),
                               fresh_gradient.tensor());
        });
        fresh_loss.replace(loss);
        fresh_gradient.replace(gradient);
    }

  private:
    CpuLoss cpu_;
};

class EmulatedAttention final : public AttentionCapability {
  public:
    void flash_forward(const Tensor& query, const Tensor& key, const Tensor& value, float scale,
                       const tensor_ops::FlashAttentionOptions& options, Tensor& context,
                       Tensor& row_max, Tensor& row_sum) const override {
        Fresh fresh_context(context);
        deferring([&] {
            cpu_.flash_forward(query, key, value, scale, options, fresh_context.tensor(), row_max,
                               row_sum);
        });
        fresh_context.replace(context);
    }
    void flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& context, const Tensor& row_max, const Tensor& row_sum,
                        const Tensor& upstream, float scale,
                        const tensor_ops::FlashAttentionOptions& options, Tensor& query_gradient,
                        Tensor& key_gradient, Tensor& value_gradient) const override {
        deferring([&] {
            cpu_.flash_backward(query, key, value, context, row_max, row_sum, upstream, scale,
                                options, query_gradient, key_gradient, value_gradient);
        });
    }

  private:
    CpuAttention cpu_;
};

// Paged decode attention as a device would run it: the context in a new buffer, a bad
// score deferred to the next sync point, and the pool written in place (as a device writes
// into its own KV pool buffer).
class EmulatedPagedAttention final : public PagedAttentionCapability {
  public:
    void decode_attention(const Tensor& query, const Tensor& key_pool, const Tensor& value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          const tensor_ops::PagedAttentionOptions& options,
                          Tensor& context) const override {
        Fresh fresh_context(context);
        deferring([&] {
            cpu_.decode_attention(query, key_pool, value_pool, requests, scale, options,
                                  fresh_context.tensor());
        });
        fresh_context.replace(context);
    }
    void write_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                         const Tensor& value,
                         std::span<const tensor_ops::PagedSlot> slots) const override {
        cpu_.write_key_value(key_pool, value_pool, key, value, slots);
    }

  private:
    CpuPagedAttention cpu_;
};

// Packed weights in host memory under the Metal identity (their storages report Metal), the
// CPU kernels, and products in new buffers.
class EmulatedQuantizedLinear final : public QuantizedLinearCapability {
  public:
    std::shared_ptr<const QuantizedStorage> upload(PackedNf4Payload payload) const override {
        return cpu_.upload(std::move(payload));
    }
    PackedNf4Payload download(const QuantizedStorage& weight) const override {
        return cpu_.download(weight);
    }
    void forward(const Tensor& x, const QuantizedStorage& weight, Tensor& out) const override {
        Fresh fresh(out);
        cpu_.forward(x, weight, fresh.tensor());
        fresh.replace(out);
    }
    void input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                        Tensor& out) const override {
        Fresh fresh(out);
        cpu_.input_backward(upstream, weight, fresh.tensor());
        fresh.replace(out);
    }

  private:
    CpuQuantizedLinear cpu_{device};
};

// Adam whose pass 2 hands every value and moment a new buffer.
class EmulatedAdam final : public AdamCapability {
  public:
    GradientStatistics gradient_statistics(std::span<const Tensor* const> tensors) const override {
        return cpu_.gradient_statistics(tensors);
    }
    FirstNonFinite first_non_finite(std::span<const Tensor* const> tensors) const override {
        return cpu_.first_non_finite(tensors);
    }
    AdamCheck check_update(const AdamUpdateScalars& scalars,
                           std::span<const AdamSlice> slices) const override {
        return cpu_.check_update(scalars, slices);
    }
    void apply_update(const AdamUpdateScalars& scalars,
                      std::span<const AdamSlice> slices) const override {
        // Every allocation first (a paged value appears in several slices: one copy each).
        std::map<Tensor*, Tensor> fresh;
        const auto copy_of = [&](Tensor* tensor) {
            auto [entry, inserted] = fresh.try_emplace(tensor);
            if (inserted) {
                entry->second = TensorAccess::wrap(tensor->shape(),
                                                   storage_.clone(TensorAccess::storage(*tensor)));
            }
            return &entry->second;
        };
        std::vector<AdamSlice> rewritten;
        rewritten.reserve(slices.size());
        for (const AdamSlice& slice : slices) {
            rewritten.push_back({copy_of(slice.value), slice.gradient, slice.offset,
                                 copy_of(slice.first_moment), copy_of(slice.second_moment)});
        }
        cpu_.apply_update(scalars, rewritten);
        for (auto& [original, replacement] : fresh) {
            TensorAccess::replace_storage(*original, TensorAccess::shared_storage(replacement));
            test::replaced_outputs.fetch_add(1);
        }
    }

  private:
    CpuAdam cpu_;
    CpuStorageCapability storage_{device};
};

class EmulatedDevice final : public BackendAdapter {
  public:
    ExecutionBackend backend() const noexcept override { return device; }
    bool is_available() const noexcept override { return true; }
    std::string_view unavailability_reason() const noexcept override { return {}; }
    const StorageCapability* storage() const noexcept override { return &storage_; }
    const LayoutCapability* layout() const noexcept override { return &layout_; }
    const ElementwiseCapability* elementwise() const noexcept override { return &elementwise_; }
    const ReductionCapability* reduction() const noexcept override { return &reduction_; }
    const MatmulCapability* matmul() const noexcept override { return &matmul_; }
    const SoftmaxCapability* softmax() const noexcept override { return &softmax_; }
    const IndexingCapability* indexing() const noexcept override { return &indexing_; }
    const NormalizationCapability* normalization() const noexcept override {
        return &normalization_;
    }
    const LossCapability* loss() const noexcept override { return &loss_; }
    const AttentionCapability* attention() const noexcept override { return &attention_; }
    const PagedAttentionCapability* paged_attention() const noexcept override {
        return &paged_attention_;
    }
    const QuantizedLinearCapability* quantized_linear() const noexcept override {
        return &quantized_linear_;
    }
    const AdamCapability* adam() const noexcept override { return &adam_; }

  private:
    EmulatedStorage storage_;
    CpuLayout layout_;
    EmulatedElementwise elementwise_;
    CpuReduction reduction_;
    EmulatedMatmul matmul_;
    EmulatedSoftmax softmax_;
    CpuIndexing indexing_;
    CpuNormalization normalization_;
    EmulatedLoss loss_;
    EmulatedAttention attention_;
    EmulatedPagedAttention paged_attention_;
    EmulatedQuantizedLinear quantized_linear_;
    EmulatedAdam adam_;
};

}  // namespace

// In the test builds the Metal identity is this device (unavailable_adapter.cpp leaves the
// definition out when RIFTCO_TRANSFORMER_TEST_EMULATED_METAL is set).
const BackendAdapter& metal_adapter() noexcept {
    static const EmulatedDevice emulated;
    return emulated;
}

}  // namespace riftco_transformer::detail
