#pragma once
// The row capabilities (softmax, normalization, loss, indexing), one file each: each is made
// once, on first use, for the process-wide runtime and never destroyed (see runtime.hpp).

#include "core/backend/adapter.hpp"
#include "core/backend/cuda/runtime.hpp"

namespace riftco_transformer::detail::cuda {

[[nodiscard]] const SoftmaxCapability* softmax_capability(const Runtime& runtime);
[[nodiscard]] const NormalizationCapability* normalization_capability(const Runtime& runtime);
[[nodiscard]] const LossCapability* loss_capability(const Runtime& runtime);
[[nodiscard]] const IndexingCapability* indexing_capability(const Runtime& runtime);

}  // namespace riftco_transformer::detail::cuda
