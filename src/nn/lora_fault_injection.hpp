#pragma once
// Test hook (private header): makes attach_lora fail after it attached `count` adapters, so
// tests can prove the rollback. Zero (the default) disables it. Not thread-safe: tests only.

#include <cstddef>

namespace riftco_transformer::detail {

void set_lora_attach_failure_after(std::size_t count) noexcept;

}  // namespace riftco_transformer::detail
