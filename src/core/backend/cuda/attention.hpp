#pragma once
// The CUDA flash attention capability (attention.cpp): made once per process for the loaded
// runtime and never destroyed, like the adapter itself.

#include "core/backend/adapter.hpp"
#include "core/backend/cuda/runtime.hpp"

namespace riftco_transformer::detail::cuda {

[[nodiscard]] const AttentionCapability* attention_capability(const Runtime& runtime);

}  // namespace riftco_transformer::detail::cuda
