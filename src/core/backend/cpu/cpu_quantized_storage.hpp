#pragma once
// CPU (host-memory) storage of a packed weight: the payload's own vectors (an NF4 payload or
// the blocks of a GGUF format), exactly sized, and nothing else (no decoded scales, no float32
// copy).

#include <cstddef>

#include "core/backend/quantized_storage.hpp"
#include "core/quantized/block_format.hpp"
#include "core/quantized/nf4_format.hpp"

namespace riftco_transformer::detail {

class CpuQuantizedStorage final : public QuantizedStorage {
  public:
    // `backend` is Cpu except for the test-only emulated device, which reuses host memory.
    CpuQuantizedStorage(ExecutionBackend backend, const PackedLayout& layout,
                        PackedNf4Payload payload);
    CpuQuantizedStorage(ExecutionBackend backend, const PackedLayout& layout,
                        PackedBlockPayload blocks);

    [[nodiscard]] std::size_t resident_bytes() const noexcept override;
    [[nodiscard]] PackedNf4Payload copy_payload_to_host() const override { return payload_; }
    [[nodiscard]] const PackedBlockPayload& blocks() const noexcept { return blocks_; }
    [[nodiscard]] Nf4View view() const noexcept { return view_of(payload_); }
    [[nodiscard]] BlockView block_view() const noexcept { return view_of(blocks_); }

  private:
    PackedNf4Payload payload_;   // nf4
    PackedBlockPayload blocks_;  // the block formats
};

}  // namespace riftco_transformer::detail
