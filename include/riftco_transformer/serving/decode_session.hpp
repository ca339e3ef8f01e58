#pragma once
// KV-cached decoding of an IncrementalDecoder: the GPT decoder or the Llama/Mistral decoder
// (docs/ARCHITECTURE.md, 'Decoding and KV caches' and 'Context rollover').
//
// A DecodeSession is one request's sequence: decode_token(id) runs embedding (position = the
// current size), every block and the head for ONE position and returns its detached logits
// [1,1,V]; prefill(ids) runs a whole prompt (or chunk) as one batched pass over its T rows
// (one [T,D] product per projection, not T of them) and fills the cache. decode_batch()
// advances several sessions of one pool in ONE pass: every projection reads its weights once
// for all rows, which is what makes continuous batching pay. Attention goes through the
// paged-decode kernel, each row attending to its own request's positions in place; the one
// exception is a prompt prefilled into an empty cache, whose rows hold every key they need:
// it runs as causal flash attention over [1,H,T,d] (keys and values with the model's key/value
// heads; they still go to the pool). Both are exact attention; neither depends on the cache
// strategy.
//
// Rules:
// - positions are learned and absolute, so a session never rolls over by itself: stepping
//   past capacity() (= the model's maximum context) is std::out_of_range. The caller rolls
//   over by reset() and replaying the newest tokens (suffix replay; the Python generator's
//   policy);
// - every step is one cache transaction over all layers: on any error no session's size()
//   changed and pages it leased went back;
// - a session records the model's structure version (LoRA attach/merge, NF4 packing) and
//   backend when it is created: after either changed it is stale and every step throws
//   std::logic_error. After a structure change, reset() empties the cache and lets the
//   session follow the model as it is now; after a backend change only a new session works
//   (its pool lives on the old backend). Changing parameter VALUES (an optimizer step) while a
//   session lives leaves its cached keys/values describing the old weights: reset() first.
//   The C ABI and Python pin the model instead, rejecting such changes while a session lives;
// - the model must outlive its sessions. Packed NF4 and LoRA-adapted weights work as they are
//   (no float32 expansion).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/model/incremental_decoder.hpp"
#include "riftco_transformer/serving/kv_cache.hpp"

namespace riftco_transformer {

// The cache dimensions a model's sessions need (its incremental_cache_shape): N layers, the
// key/value heads (H for the GPT decoder, Hkv for grouped-query attention) of d_h, capacity C.
[[nodiscard]] KeyValueCacheDimensions key_value_cache_dimensions(
    const IncrementalDecoder& model) noexcept;

// A pool for sessions of `model`, on its backend (KeyValueCachePool::create's rules).
[[nodiscard]] std::shared_ptr<KeyValueCachePool> make_key_value_cache_pool(
    const IncrementalDecoder& model, std::size_t block_size = default_key_value_block_size,
    std::size_t block_count = 0, bool prefix_caching = false);

enum class PrefillLogits : std::uint32_t { Last = 0, All = 1 };

class DecodeSession;

// One session's share of a batched step: its next tokens (1 for a decode step, more for a
// prefill chunk).
struct DecodeWork {
    DecodeSession* session = nullptr;
    std::span<const std::uint32_t> tokens;
};

// Advances every session by its tokens in ONE pass over the model and returns the logits of
// each session's last new position, [n, V] in work order. The sessions must be distinct and
// belong to one model; they may lease from one shared pool (one K/V write and one attention
// call per layer for all of them: the scheduler's layout) or from several (contiguous or
// private caches: one per pool). std::invalid_argument: no work, a null or repeated session,
// mixed models, an empty token list; plus every error of decode_token. On any error no
// session changed.
[[nodiscard]] Tensor decode_batch(std::span<const DecodeWork> work);

class DecodeSession {
  public:
    // A session with a private cache: Paged (ceil(C / block_size) pages) or Contiguous (one
    // page of C positions). std::invalid_argument: block_size 0, an unknown kind.
    explicit DecodeSession(const IncrementalDecoder& model,
                           KeyValueCacheKind kind = KeyValueCacheKind::Paged,
                           std::size_t block_size = default_key_value_block_size);
    // A paged session leasing from a shared pool. std::invalid_argument: a null pool, or one
    // whose backend, layer count, head count or head width differ from the model's, or whose
    // capacity exceeds the model's maximum context.
    DecodeSession(const IncrementalDecoder& model, std::shared_ptr<KeyValueCachePool> pool);
    // A paged session of a shared pool holding a reservation for `token_budget` positions
    // (pool->blocks_for(token_budget) pages; the pool's admission): it never meets "pool
    // exhausted", and a step past its reservation is std::length_error. std::invalid_argument:
    // a budget of 0 (plus the rules above); std::out_of_range: more pages than the pool holds;
    // std::runtime_error "... pool full ...": not available now.
    DecodeSession(const IncrementalDecoder& model, const std::shared_ptr<KeyValueCachePool>& pool,
                  std::size_t token_budget);

    // Logits [1,1,V] of `token` at position size(). std::out_of_range: an id >= V, or the
    // session is full; std::runtime_error: the pool is exhausted; std::logic_error: stale.
    [[nodiscard]] Tensor decode_token(std::uint32_t token);
    // The tokens at positions size().., in one pass: logits [1,1,V] of the last one (Last) or
    // [1,T,V] of every one (All). Errors as decode_token, plus std::invalid_argument for no
    // tokens.
    [[nodiscard]] Tensor prefill(std::span<const std::uint32_t> tokens,
                                 PrefillLogits logits = PrefillLogits::Last);
    // Forgets every position and returns every page; the session then follows the model's
    // current structure (a backend change keeps it stale).
    void reset() noexcept;

    // Prefix caching, for a pool made with prefix_caching
    // (docs/ARCHITECTURE.md, 'Prefix caching'). An empty session takes, by reference, the published
    // pages holding the longest whole-page prefix of prompt[0, P-1) (the last token is always left
    // to feed, since its logits are the point) and returns the positions it now holds: the caller
    // feeds prompt[returned..]. 0 without prefix caching, for P < 2 or without a match.
    // std::logic_error: the session is not empty, or stale; std::out_of_range: an id >= V.
    // Nothing changed on error.
    std::size_t reuse_prefix(std::span<const std::uint32_t> prompt);
    // Pages are shared only between sessions of the same model structure and namespace. The
    // namespace is the caller's name for the parameter values (the C ABI passes its parameter
    // epoch): after an optimizer step, sessions under a new namespace never adopt pages
    // computed with the old weights. std::logic_error unless the session is empty.
    void set_prefix_namespace(std::uint64_t value);

    [[nodiscard]] std::size_t size() const noexcept { return cache_.size(); }
    [[nodiscard]] std::size_t capacity() const noexcept { return cache_.capacity(); }
    [[nodiscard]] std::size_t block_size() const noexcept { return cache_.block_size(); }
    [[nodiscard]] KeyValueCacheKind cache_kind() const noexcept { return cache_.kind(); }
    [[nodiscard]] const KeyValueCache& cache() const noexcept { return cache_; }
    [[nodiscard]] const IncrementalDecoder& model() const noexcept { return *model_; }
    // True once the model's structure (since creation or the last reset) or backend changed.
    [[nodiscard]] bool stale() const;

  private:
    friend Tensor decode_batch(std::span<const DecodeWork> work);
    void require_current(const char* operation) const;
    [[nodiscard]] std::uint64_t prefix_version() const noexcept;

    const IncrementalDecoder* model_;
    KeyValueCache cache_;
    std::uint64_t structure_version_;
    ExecutionBackend backend_;
    std::uint64_t prefix_namespace_ = 0;
};

}  // namespace riftco_transformer
