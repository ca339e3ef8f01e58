#pragma once
// The adapter compiled for a backend this build does not include: it reports why and
// provides no capability, so every request fails with that reason.

#include <string_view>

#include "core/backend/adapter.hpp"

namespace riftco_transformer::detail {

class UnavailableAdapter final : public BackendAdapter {
  public:
    constexpr UnavailableAdapter(ExecutionBackend backend, std::string_view reason) noexcept
        : backend_(backend), reason_(reason) {}

    [[nodiscard]] ExecutionBackend backend() const noexcept override { return backend_; }
    [[nodiscard]] bool is_available() const noexcept override { return false; }
    [[nodiscard]] std::string_view unavailability_reason() const noexcept override {
        return reason_;
    }

    [[nodiscard]] const StorageCapability* storage() const noexcept override { return nullptr; }
    [[nodiscard]] const LayoutCapability* layout() const noexcept override { return nullptr; }
    [[nodiscard]] const ElementwiseCapability* elementwise() const noexcept override {
        return nullptr;
    }
    [[nodiscard]] const ReductionCapability* reduction() const noexcept override { return nullptr; }
    [[nodiscard]] const MatmulCapability* matmul() const noexcept override { return nullptr; }
    [[nodiscard]] const SoftmaxCapability* softmax() const noexcept override { return nullptr; }
    [[nodiscard]] const IndexingCapability* indexing() const noexcept override { return nullptr; }
    [[nodiscard]] const NormalizationCapability* normalization() const noexcept override {
        return nullptr;
    }
    [[nodiscard]] const LossCapability* loss() const noexcept override { return nullptr; }
    [[nodiscard]] const AttentionCapability* attention() const noexcept override { return nullptr; }
    [[nodiscard]] const PagedAttentionCapability* paged_attention() const noexcept override {
        return nullptr;
    }
    [[nodiscard]] const QuantizedLinearCapability* quantized_linear() const noexcept override {
        return nullptr;
    }
    [[nodiscard]] const AdamCapability* adam() const noexcept override { return nullptr; }

  private:
    ExecutionBackend backend_;
    std::string_view reason_;
};

const BackendAdapter& metal_adapter() noexcept;
const BackendAdapter& cuda_adapter() noexcept;
const BackendAdapter& tpu_adapter() noexcept;
const BackendAdapter& pjrt_adapter() noexcept;

}  // namespace riftco_transformer::detail
