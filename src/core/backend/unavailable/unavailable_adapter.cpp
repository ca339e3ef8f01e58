#include "core/backend/unavailable/unavailable_adapter.hpp"

namespace riftco_transformer::detail {

// Accelerator adapters are selected here by the build options; while an accelerator is not
// compiled in, its stable identity maps to a stub that says so.

// Test-only builds (riftco_transformer_test_emulation) define the Metal identity as an
// emulated device in tests/support/emulated_device.cpp instead.
#if !RIFTCO_TRANSFORMER_TEST_EMULATED_METAL
const BackendAdapter& metal_adapter() noexcept {
    static const UnavailableAdapter adapter(ExecutionBackend::Metal,
                                            "Metal support was not compiled into this build "
                                            "(RIFTCO_TRANSFORMER_ENABLE_METAL=OFF)");
    return adapter;
}
#endif

// Builds with the CUDA adapter (RIFTCO_TRANSFORMER_HAVE_CUDA=1) define the cuda identity in
// src/core/backend/cuda/ instead.
#if !RIFTCO_TRANSFORMER_HAVE_CUDA
const BackendAdapter& cuda_adapter() noexcept {
    static const UnavailableAdapter adapter(
        ExecutionBackend::Cuda,
        "CUDA support was not compiled into this build (RIFTCO_TRANSFORMER_ENABLE_CUDA=OFF)");
    return adapter;
}
#endif

// Builds with the PJRT adapter (RIFTCO_TRANSFORMER_HAVE_PJRT=1) define both PJRT identities in
// src/core/backend/pjrt/ instead; an undefined macro reads as 0 here.
#if !RIFTCO_TRANSFORMER_HAVE_PJRT
const BackendAdapter& tpu_adapter() noexcept {
    static const UnavailableAdapter adapter(ExecutionBackend::Tpu,
                                            "TPU (PJRT) support was not compiled into this build "
                                            "(RIFTCO_TRANSFORMER_ENABLE_TPU=OFF)");
    return adapter;
}

const BackendAdapter& pjrt_adapter() noexcept {
    static const UnavailableAdapter adapter(ExecutionBackend::Pjrt,
                                            "PJRT support was not compiled into this build "
                                            "(RIFTCO_TRANSFORMER_ENABLE_TPU=OFF)");
    return adapter;
}
#endif

}  // namespace riftco_transformer::detail
