// The CUDA backend ("cuda"): storage in device memory, kernels on a stream per host thread,
// cuBLAS for matmul. The device is probed once, on the first availability question; a failure
// is kept and answered from then on ("no CUDA device visible" when there is none).

#include <cstring>
#include <mutex>
#include <string>

#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cuda/attention.hpp"
#include "core/backend/cuda/attention_nf4_adam.hpp"
#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/row_capabilities.hpp"
#include "core/backend/unavailable/unavailable_adapter.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::cuda {

// ---- storage -------------------------------------------------------------------------------

CudaStorage::CudaStorage(std::size_t element_count, cudaStream_t stream)
    : Storage(ExecutionBackend::Cuda, element_count),
      buffer_(element_count * sizeof(float), stream) {}

float* CudaStorage::floats_on(cudaStream_t stream) const {
    buffer_.use_on(stream);
    return static_cast<float*>(buffer_.data());
}

std::uint32_t* CudaStorage::indices_on(cudaStream_t stream) const {
    buffer_.use_on(stream);
    return static_cast<std::uint32_t*>(buffer_.data());
}

void CudaStorage::read(std::size_t offset, void* destination, std::size_t count) const {
    if (count == 0) {
        return;
    }
    const cudaStream_t stream = current_stream();
    const auto* source =
        static_cast<const unsigned char*>(static_cast<const void*>(floats_on(stream))) +
        offset * sizeof(float);
    check(
        cudaMemcpyAsync(destination, source, count * sizeof(float), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (device to host copy)");
}

void CudaStorage::write(std::size_t offset, const void* source, std::size_t count) {
    if (count == 0) {
        return;
    }
    const cudaStream_t stream = current_stream();
    auto* destination =
        static_cast<unsigned char*>(static_cast<void*>(floats_on(stream))) + offset * sizeof(float);
    check(
        cudaMemcpyAsync(destination, source, count * sizeof(float), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (host to device)");
    // The source is pageable host memory the caller may free on return: wait for the copy.
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (host to device copy)");
}

void CudaStorage::copy_to_host(std::size_t offset, std::span<float> destination) const {
    read(offset, destination.data(), destination.size());
}
void CudaStorage::copy_from_host(std::size_t offset, std::span<const float> source) {
    write(offset, source.data(), source.size());
}
void CudaStorage::copy_indices_to_host(std::size_t offset,
                                       std::span<std::uint32_t> destination) const {
    read(offset, destination.data(), destination.size());
}
void CudaStorage::copy_indices_from_host(std::size_t offset,
                                         std::span<const std::uint32_t> source) {
    write(offset, source.data(), source.size());
}

const float* device_input(const Tensor& tensor, cudaStream_t stream) {
    return static_cast<const CudaStorage&>(TensorAccess::storage(tensor)).floats_on(stream);
}

float* device_output(Tensor& tensor, cudaStream_t stream) {
    return static_cast<CudaStorage&>(TensorAccess::output_storage(tensor)).floats_on(stream);
}

const std::uint32_t* device_indices(const IndexTensor& indices, cudaStream_t stream) {
    return static_cast<const CudaStorage&>(TensorAccess::storage(indices)).indices_on(stream);
}

float read_element(const Storage& storage, std::size_t position) {
    float value = 0.0F;
    storage.copy_to_host(position, std::span<float>(&value, 1));
    return value;
}

namespace {

class CudaStorageCapability final : public StorageCapability {
  public:
    std::shared_ptr<Storage> allocate(std::size_t element_count) const override {
        return std::make_shared<CudaStorage>(element_count, current_stream());
    }
    // Bytes, not floats: index storage holds uint32 ids in the same 4-byte elements.
    std::shared_ptr<Storage> clone(const Storage& source) const override {
        const cudaStream_t stream = current_stream();
        auto copy = std::make_shared<CudaStorage>(source.element_count(), stream);
        copy_device(static_cast<const CudaStorage&>(source), *copy, stream);
        return copy;
    }
    void fill(Storage& storage, float value) const override {
        const cudaStream_t stream = current_stream();
        cuda::fill(static_cast<CudaStorage&>(storage).floats_on(stream), storage.element_count(),
                   value, stream);
    }
    void write_range(Tensor& tensor, std::size_t offset,
                     std::span<const float> values) const override {
        // unique_storage clones a storage shared with copies first, so none observes it.
        TensorAccess::unique_storage(tensor).copy_from_host(offset, values);
    }
    std::shared_ptr<Storage> import_from(const Storage& source) const override {
        if (source.backend() != ExecutionBackend::Cpu) {
            return nullptr;  // another device: staged through host memory by the caller
        }
        // Straight from the CPU storage's memory, with no intermediate host vector.
        const auto& host = static_cast<const CpuStorage&>(source);
        auto copy = std::make_shared<CudaStorage>(source.element_count(), current_stream());
        copy->copy_from_host(0, std::span<const float>(host.data(), source.element_count()));
        return copy;
    }

  private:
    static void copy_device(const CudaStorage& source, CudaStorage& target, cudaStream_t stream) {
        const std::size_t bytes = source.element_count() * sizeof(float);
        if (bytes == 0) {
            return;
        }
        check(cudaMemcpyAsync(target.floats_on(stream), source.floats_on(stream), bytes,
                              cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync (device to device)");
    }
};

}  // namespace

std::unique_ptr<StorageCapability> make_storage(const Runtime& /*runtime*/) {
    return std::make_unique<CudaStorageCapability>();
}

// ---- the adapter ---------------------------------------------------------------------------

namespace {

class CudaAdapter final : public BackendAdapter {
  public:
    ExecutionBackend backend() const noexcept override { return ExecutionBackend::Cuda; }
    bool is_available() const noexcept override {
        ensure_loaded();
        return runtime_ != nullptr;
    }
    std::string_view unavailability_reason() const noexcept override {
        ensure_loaded();
        return reason_;
    }

    const StorageCapability* storage() const noexcept override { return storage_.get(); }
    const LayoutCapability* layout() const noexcept override { return layout_.get(); }
    const ElementwiseCapability* elementwise() const noexcept override {
        return elementwise_.get();
    }
    const ReductionCapability* reduction() const noexcept override { return reduction_.get(); }
    const MatmulCapability* matmul() const noexcept override { return matmul_.get(); }
    const SoftmaxCapability* softmax() const noexcept override { return softmax_; }
    const IndexingCapability* indexing() const noexcept override { return indexing_; }
    const NormalizationCapability* normalization() const noexcept override {
        return normalization_;
    }
    const LossCapability* loss() const noexcept override { return loss_; }
    const AttentionCapability* attention() const noexcept override { return attention_; }
    const PagedAttentionCapability* paged_attention() const noexcept override {
        return paged_attention_;
    }
    const QuantizedLinearCapability* quantized_linear() const noexcept override {
        return quantized_linear_;
    }
    const AdamCapability* adam() const noexcept override { return adam_; }

    void collect_deferred_errors() const override {
        if (runtime_ != nullptr) {
            runtime_->collect();
        }
    }

    [[nodiscard]] const Runtime* runtime() const noexcept {
        ensure_loaded();
        return runtime_;
    }

  private:
    void ensure_loaded() const noexcept {
        std::call_once(loaded_, [this] {
            try {
                load();
            } catch (const std::exception& error) {
                reason_ = std::string("CUDA initialisation failed: ") + error.what();
                runtime_ = nullptr;
            } catch (...) {
                reason_ = "CUDA initialisation failed with an unknown error";
                runtime_ = nullptr;
            }
        });
    }

    void load() const {
        Runtime* runtime = Runtime::probe(reason_);
        if (runtime == nullptr) {
            return;
        }
        storage_ = make_storage(*runtime);
        layout_ = make_layout(*runtime);
        elementwise_ = make_elementwise(*runtime);
        reduction_ = make_reduction(*runtime);
        matmul_ = make_matmul(*runtime);
        // Process-lifetime instances (each factory builds its capability once).
        softmax_ = softmax_capability(*runtime);
        indexing_ = indexing_capability(*runtime);
        normalization_ = normalization_capability(*runtime);
        loss_ = loss_capability(*runtime);
        attention_ = attention_capability(*runtime);
        paged_attention_ = paged_attention_capability(*runtime);
        quantized_linear_ = quantized_linear_capability(*runtime);
        adam_ = adam_capability(*runtime);
        runtime_ = runtime;
    }

    mutable std::once_flag loaded_;
    mutable std::string reason_;
    mutable const Runtime* runtime_ = nullptr;
    mutable std::unique_ptr<StorageCapability> storage_;
    mutable std::unique_ptr<LayoutCapability> layout_;
    mutable std::unique_ptr<ElementwiseCapability> elementwise_;
    mutable std::unique_ptr<ReductionCapability> reduction_;
    mutable std::unique_ptr<MatmulCapability> matmul_;
    // Null until a device is loaded, like the members above.
    mutable const SoftmaxCapability* softmax_ = nullptr;
    mutable const IndexingCapability* indexing_ = nullptr;
    mutable const NormalizationCapability* normalization_ = nullptr;
    mutable const LossCapability* loss_ = nullptr;
    mutable const AttentionCapability* attention_ = nullptr;
    mutable const PagedAttentionCapability* paged_attention_ = nullptr;
    mutable const QuantizedLinearCapability* quantized_linear_ = nullptr;
    mutable const AdamCapability* adam_ = nullptr;
};

// Process lifetime, never destroyed (see runtime.hpp).
CudaAdapter& the_adapter() {
    static auto* adapter = new CudaAdapter;
    return *adapter;
}

}  // namespace

const Runtime* loaded_runtime() noexcept {
    return the_adapter().runtime();
}

}  // namespace riftco_transformer::detail::cuda

namespace riftco_transformer::detail {

const BackendAdapter& cuda_adapter() noexcept {
    return cuda::the_adapter();
}

}  // namespace riftco_transformer::detail
