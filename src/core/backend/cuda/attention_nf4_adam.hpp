#pragma once
// The CUDA quantized-linear, paged-attention and Adam capabilities (quantized_linear.cpp,
// paged_attention.cpp, adam.cpp): each made once per process for the loaded runtime and never
// destroyed, like the adapter itself.

#include "core/backend/adapter.hpp"
#include "core/backend/cuda/runtime.hpp"

namespace riftco_transformer::detail::cuda {

[[nodiscard]] const QuantizedLinearCapability* quantized_linear_capability(const Runtime& runtime);
[[nodiscard]] const PagedAttentionCapability* paged_attention_capability(const Runtime& runtime);
[[nodiscard]] const AdamCapability* adam_capability(const Runtime& runtime);

}  // namespace riftco_transformer::detail::cuda
