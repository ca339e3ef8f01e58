#pragma once
// CPU (host-memory) storage of a packed NF4 weight: the payload's own vectors, exactly
// sized, and nothing else (no decoded scales, no float32 copy).

#include <cstddef>

#include "core/backend/quantized_storage.hpp"
#include "core/quantized/nf4_format.hpp"

namespace riftco_transformer::detail {

class CpuQuantizedStorage final : public QuantizedStorage {
  public:
    // `backend` is Cpu except for the test-only emulated device, which reuses host memory.
    CpuQuantizedStorage(ExecutionBackend backend, const Nf4Layout& layout,
                        PackedNf4Payload payload);

    [[nodiscard]] std::size_t resident_bytes() const noexcept override;
    [[nodiscard]] PackedNf4Payload copy_payload_to_host() const override { return payload_; }
    [[nodiscard]] Nf4View view() const noexcept { return view_of(payload_); }

  private:
    PackedNf4Payload payload_;
};

}  // namespace riftco_transformer::detail
