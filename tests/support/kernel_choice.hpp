#pragma once
// Forces a packed-weight kernel set (nf4 and the GGUF block formats share the choice) for a
// test's lifetime, then restores the automatic choice.

#include "core/backend/cpu/nf4_kernels.hpp"

namespace riftco_transformer::testing {

class KernelChoiceGuard {
  public:
    explicit KernelChoiceGuard(detail::Nf4KernelChoice choice) {
        detail::set_nf4_kernel_choice(choice);
    }
    ~KernelChoiceGuard() { detail::set_nf4_kernel_choice(detail::Nf4KernelChoice::Automatic); }
    KernelChoiceGuard(const KernelChoiceGuard&) = delete;
    KernelChoiceGuard& operator=(const KernelChoiceGuard&) = delete;
};

}  // namespace riftco_transformer::testing
