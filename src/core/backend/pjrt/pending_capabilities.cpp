// Capability families this backend does not run yet. A null capability makes every request
// for it fail with "execution backend '<name>' does not provide the <family> capability"
// (registry.cpp): never a silent fallback to the host.

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {

std::unique_ptr<SoftmaxCapability> make_softmax(const Context&) { return nullptr; }
std::unique_ptr<IndexingCapability> make_indexing(const Context&) { return nullptr; }
std::unique_ptr<NormalizationCapability> make_normalization(const Context&) { return nullptr; }
std::unique_ptr<LossCapability> make_loss(const Context&) { return nullptr; }
std::unique_ptr<AttentionCapability> make_attention(const Context&) { return nullptr; }
std::unique_ptr<PagedAttentionCapability> make_paged_attention(const Context&) { return nullptr; }
std::unique_ptr<QuantizedLinearCapability> make_quantized_linear(const Context&) {
    return nullptr;
}
std::unique_ptr<AdamCapability> make_adam(const Context&) { return nullptr; }

}  // namespace riftco_transformer::detail::pjrt
