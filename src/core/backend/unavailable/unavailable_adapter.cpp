#include "core/backend/unavailable/unavailable_adapter.hpp"

#if RIFTCO_TRANSFORMER_TEST_EMULATED_METAL
#include "core/backend/cpu/cpu_adapter.hpp"
#endif

namespace riftco_transformer::detail {

// Accelerator adapters are selected here by the build options; while an accelerator is not
// compiled in, its stable identity maps to a stub that says so.

const BackendAdapter& metal_adapter() noexcept {
#if RIFTCO_TRANSFORMER_TEST_EMULATED_METAL
    // Test-only build (riftco_transformer_test_emulation): the Metal identity is an emulated
    // device with its own host allocations running the CPU kernels, so mixed-backend rules,
    // transfers and explicit execution overrides can be exercised on machines without one.
    static const HostAdapter emulated(ExecutionBackend::Metal);
    return emulated;
#else
    static const UnavailableAdapter adapter(ExecutionBackend::Metal,
                                            "Metal support was not compiled into this build "
                                            "(RIFTCO_TRANSFORMER_ENABLE_METAL=OFF)");
    return adapter;
#endif
}

const BackendAdapter& cuda_adapter() noexcept {
    static const UnavailableAdapter adapter(
        ExecutionBackend::Cuda,
        "CUDA support was not compiled into this build (RIFTCO_TRANSFORMER_ENABLE_CUDA=OFF)");
    return adapter;
}

const BackendAdapter& tpu_adapter() noexcept {
    static const UnavailableAdapter adapter(ExecutionBackend::Tpu,
                                            "TPU (PJRT) support was not compiled into this build "
                                            "(RIFTCO_TRANSFORMER_ENABLE_TPU=OFF)");
    return adapter;
}

}  // namespace riftco_transformer::detail
