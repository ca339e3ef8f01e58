#pragma once
// What KV-cached decoding (serving/decode_session.hpp) needs of a model: the shape of the
// cache its attention layers address, its backend and structure version (for staleness), and
// the incremental forward over R independent rows. The GPT decoder and the Llama/Mistral
// decoder both implement it, so one DecodeSession, pool and batched step serve either.

#include <cstddef>
#include <cstdint>
#include <span>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/nn/attention.hpp"

namespace riftco_transformer {

// The K/V layout every layer's cache holds: layer_count layers of head_count key/value heads
// (Hkv; a grouped-query model's query heads read them shared, never repeated) of head_width
// values, for at most maximum_context positions.
struct IncrementalCacheShape {
    std::size_t layer_count = 0;
    std::size_t head_count = 0;
    std::size_t head_width = 0;
    std::size_t maximum_context = 0;
};

class IncrementalDecoder {
  public:
    virtual ~IncrementalDecoder() = default;

    [[nodiscard]] virtual IncrementalCacheShape incremental_cache_shape() const noexcept = 0;
    [[nodiscard]] virtual std::size_t vocabulary_size() const noexcept = 0;
    [[nodiscard]] virtual ExecutionBackend backend() const = 0;
    [[nodiscard]] virtual std::uint64_t structure_version() const noexcept = 0;
    // R rows, row r being token tokens[r] at positions[r]; `cache` holds every layer's keys
    // and values. Returns the detached logits [n, V] of output_rows (no graph).
    [[nodiscard]] virtual Tensor forward_incremental(
        std::span<const std::uint32_t> tokens, std::span<const std::size_t> positions,
        IncrementalAttentionCache& cache, std::span<const std::size_t> output_rows) const = 0;

  protected:
    IncrementalDecoder() = default;
    IncrementalDecoder(const IncrementalDecoder&) = default;
    IncrementalDecoder& operator=(const IncrementalDecoder&) = default;
};

}  // namespace riftco_transformer
