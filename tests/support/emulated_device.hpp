#pragma once
// The emulated second backend of the test builds (tests/test_emulated_*.cpp): the Metal
// identity, backed by host memory and the CPU kernels, but behaving like an asynchronous
// device in the three ways the adapter contract allows (src/core/backend/adapter.hpp):
// - deferred errors: value-domain errors its kernels find are recorded and raised at the
//   next sync point, never at the call;
// - replaceable outputs: elementwise, matmul, quantized linear, softmax, loss, attention and
//   Adam results arrive in new buffers that replace the preallocated ones; write_range replaces
//   too;
// - device copies: it imports host-memory (CPU) storages directly, counted below.

#include <cstddef>

namespace riftco_transformer::test {

// Number of outputs the emulated device handed a new buffer, and of direct storage imports
// it made, since the process started.
[[nodiscard]] std::size_t emulated_replaced_outputs() noexcept;
[[nodiscard]] std::size_t emulated_direct_imports() noexcept;

}  // namespace riftco_transformer::test
