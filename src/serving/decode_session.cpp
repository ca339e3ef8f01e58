#include "riftco_transformer/serving/decode_session.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"

namespace riftco_transformer {

KeyValueCacheDimensions key_value_cache_dimensions(const IncrementalDecoder& model) noexcept {
    const IncrementalCacheShape s = model.incremental_cache_shape();
    return {s.layer_count, s.head_count, s.head_width, s.maximum_context};
}

std::shared_ptr<KeyValueCachePool> make_key_value_cache_pool(const IncrementalDecoder& model,
                                                             std::size_t block_size,
                                                             std::size_t block_count,
                                                             bool prefix_caching) {
    return KeyValueCachePool::create(key_value_cache_dimensions(model), model.backend(), block_size,
                                     block_count, prefix_caching);
}

namespace {

std::shared_ptr<KeyValueCachePool> checked_pool(const IncrementalDecoder& model,
                                                std::shared_ptr<KeyValueCachePool> pool) {
    if (!pool) {
        throw std::invalid_argument("DecodeSession: pool is null");
    }
    const KeyValueCacheDimensions want = key_value_cache_dimensions(model);
    const KeyValueCacheDimensions& have = pool->dimensions();
    if (pool->backend() != model.backend() || have.layer_count != want.layer_count ||
        have.head_count != want.head_count || have.head_width != want.head_width ||
        have.maximum_context > want.maximum_context) {
        std::ostringstream message;
        message << "DecodeSession: the pool (" << execution_backend_name(pool->backend()) << ", "
                << have.layer_count << " layers, " << have.head_count << " heads of "
                << have.head_width << ", capacity " << have.maximum_context
                << ") does not fit the model (" << execution_backend_name(model.backend()) << ", "
                << want.layer_count << " layers, " << want.head_count << " heads of "
                << want.head_width << ", maximum context " << want.maximum_context << ")";
        throw std::invalid_argument(message.str());
    }
    return pool;
}

// The rows of one batched step that live in one pool: their indices into the step's rows,
// slots and requests.
struct PoolRows {
    KeyValueCachePool* pool = nullptr;
    std::vector<std::size_t> rows;
    std::vector<tensor_ops::PagedSlot> slots;
    std::vector<tensor_ops::PagedAttentionRequest> requests;
};

// The K/V store of one batched step: row r of every layer goes to its slot in its session's
// pool and attends to its request (its session's page table, its own position included, the
// last W positions under a window W). Queries have Hq heads, keys and values (and the pools)
// Hkv: the Hq/Hkv query heads of a group read one stored row. Sessions of one pool (the
// scheduler's case) take one write and one attention call per layer; sessions of several
// pools (contiguous caches, private pools) take one per pool, their rows gathered out and
// their contexts scattered back into place (each row belongs to exactly one pool, so the
// scatter-adds only add zeros: the values are exact).
// A step that is one session's whole sequence so far (a prompt prefilled into an empty
// cache) has every key it needs in its own rows: its attention is ordinary causal attention
// over Q [1,Hq,T,d], K, V [1,Hkv,T,d] with the same window, run as the memory-linear flash
// kernel (GEMM tiles instead of one dot product per position); the keys and values are still
// written to the pool for the steps that follow. Either way the result is exact attention
// within float rounding, and it does not depend on the cache strategy.
class BatchStepCache final : public IncrementalAttentionCache {
  public:
    BatchStepCache(std::vector<PoolRows> groups, bool whole_sequence)
        : groups_(std::move(groups)), whole_sequence_(whole_sequence) {}

    Tensor append_and_attend(std::size_t layer, const Tensor& query, const Tensor& key,
                             const Tensor& value,
                             const IncrementalAttentionOptions& options) override {
        if (whole_sequence_) {
            const PoolRows& group = groups_[0];
            tensor_ops::write_paged_key_value(group.pool->keys(layer), group.pool->values(layer),
                                              key, value, group.slots);
            // [T,H,1,d] -> [1,H,T,d] (a copy), and the context back.
            const auto heads_first = [](const Tensor& rows) {
                return tensor_ops::permute(rows, {2, 1, 0, 3});
            };
            const Tensor context =
                tensor_ops::flash_attention(
                    heads_first(query), heads_first(key), heads_first(value),
                    {.window = options.window, .softcap = options.softcap, .documents = nullptr})
                    .context;
            return tensor_ops::permute(context, {2, 1, 0, 3});
        }
        const tensor_ops::PagedAttentionOptions paged{.window = options.window,
                                                      .softcap = options.softcap};
        if (groups_.size() == 1) {
            return attend(groups_[0], layer, query, key, value, paged);
        }
        const Shape& shape = query.shape();  // [R, Hq, 1, d]
        const std::size_t rows = shape[0];
        // [R, heads, 1, d] -> [R, heads·d] and back for a group of n rows.
        const auto flat = [&](const Tensor& t) {
            return tensor_ops::reshape(t, {rows, t.numel() / rows});
        };
        const Tensor q = flat(query);
        const Tensor k = flat(key);
        const Tensor v = flat(value);
        Tensor context;
        for (const PoolRows& group : groups_) {
            const std::size_t n = group.rows.size();
            const Shape rows_shape{n};
            const auto pick = [&](const Tensor& t, const Tensor& original) {
                Shape picked = original.shape();
                picked[0] = n;
                return tensor_ops::reshape(tensor_ops::gather_rows(t, group.rows, rows_shape),
                                           picked);
            };
            const Tensor part =
                attend(group, layer, pick(q, query), pick(k, key), pick(v, value), paged);
            Tensor placed = tensor_ops::scatter_add_rows(
                tensor_ops::reshape(part, {n, q.shape()[1]}), group.rows, rows);
            context = context.is_singular() ? std::move(placed) : tensor_ops::add(context, placed);
        }
        return tensor_ops::reshape(context, shape);
    }

  private:
    static Tensor attend(const PoolRows& group, std::size_t layer, const Tensor& query,
                         const Tensor& key, const Tensor& value,
                         const tensor_ops::PagedAttentionOptions& options) {
        Tensor& keys = group.pool->keys(layer);
        Tensor& values = group.pool->values(layer);
        tensor_ops::write_paged_key_value(keys, values, key, value, group.slots);
        return tensor_ops::paged_decode_attention(query, keys, values, group.requests, 0.0F,
                                                  options);
    }

    std::vector<PoolRows> groups_;
    bool whole_sequence_;
};

// Aborts every begun transaction unless released (commit path).
class TransactionGuard {
  public:
    explicit TransactionGuard(std::size_t expected) { caches_.reserve(expected); }
    ~TransactionGuard() {
        for (KeyValueCache* cache : caches_) {
            cache->abort();
        }
    }
    TransactionGuard(const TransactionGuard&) = delete;
    TransactionGuard& operator=(const TransactionGuard&) = delete;
    void add(KeyValueCache& cache) { caches_.push_back(&cache); }
    void commit() noexcept {
        for (KeyValueCache* cache : caches_) {
            cache->commit();
        }
        caches_.clear();
    }

  private:
    std::vector<KeyValueCache*> caches_;
};

Tensor run_batch(std::span<const DecodeWork> work, PrefillLogits which,
                 std::vector<KeyValueCache*> caches) {
    // caches[i] is work[i].session's cache (decode_batch's friend access).
    constexpr const char* op = "decode_batch";
    const IncrementalDecoder& model = work[0].session->model();
    std::size_t rows = 0;
    for (std::size_t i = 0; i < work.size(); ++i) {
        const KeyValueCache& cache = *caches[i];
        const std::size_t count = work[i].tokens.size();
        if (count > cache.capacity() - cache.size()) {
            std::ostringstream message;
            message << op << ": work[" << i << "]: " << count << " more tokens do not fit the "
                    << "session (" << cache.size() << " of " << cache.capacity()
                    << " positions used); a session never rolls over by itself: reset() and "
                       "replay the newest tokens";
            throw std::out_of_range(message.str());
        }
        rows += count;
    }
    // One session, empty before this step, fed more than one token: see BatchStepCache.
    const bool whole_sequence =
        work.size() == 1 && caches[0]->size() == 0 && work[0].tokens.size() > 1;
    TransactionGuard transactions(work.size());
    for (std::size_t i = 0; i < work.size(); ++i) {
        caches[i]->begin(work[i].tokens.size(), work[i].tokens);
        transactions.add(*caches[i]);
    }
    std::vector<std::uint32_t> tokens;
    std::vector<std::size_t> positions;
    std::vector<std::size_t> output_rows;
    std::vector<PoolRows> groups;
    tokens.reserve(rows);
    positions.reserve(rows);
    for (std::size_t i = 0; i < work.size(); ++i) {
        const KeyValueCache& cache = *caches[i];
        KeyValueCachePool* pool = cache.pool().get();
        auto group = std::find_if(groups.begin(), groups.end(),
                                  [&](const PoolRows& g) { return g.pool == pool; });
        if (group == groups.end()) {
            groups.push_back({pool, {}, {}, {}});
            group = groups.end() - 1;
        }
        for (std::size_t j = 0; j < work[i].tokens.size(); ++j) {
            const std::size_t position = cache.size() + j;
            if (which == PrefillLogits::All || j + 1 == work[i].tokens.size()) {
                output_rows.push_back(tokens.size());
            }
            group->rows.push_back(tokens.size());
            group->slots.push_back(cache.slot(position));
            group->requests.push_back({cache.page_table(), position + 1});
            tokens.push_back(work[i].tokens[j]);
            positions.push_back(position);
        }
    }
    BatchStepCache step(std::move(groups), whole_sequence);
    Tensor logits = model.forward_incremental(tokens, positions, step, output_rows);
    transactions.commit();
    return logits;
}

}  // namespace

DecodeSession::DecodeSession(const IncrementalDecoder& model, KeyValueCacheKind kind,
                             std::size_t block_size)
    : model_(&model),
      cache_(KeyValueCache::with_private_pool(key_value_cache_dimensions(model), model.backend(),
                                              kind, block_size)),
      structure_version_(model.structure_version()),
      backend_(model.backend()) {
    cache_.set_prefix_version(prefix_version());
}

DecodeSession::DecodeSession(const IncrementalDecoder& model,
                             std::shared_ptr<KeyValueCachePool> pool)
    : model_(&model),
      cache_(checked_pool(model, std::move(pool)), KeyValueCacheKind::Paged),
      structure_version_(model.structure_version()),
      backend_(model.backend()) {
    cache_.set_prefix_version(prefix_version());
}

DecodeSession::DecodeSession(const IncrementalDecoder& model,
                             const std::shared_ptr<KeyValueCachePool>& pool,
                             std::size_t token_budget)
    : model_(&model),
      cache_(checked_pool(model, pool), KeyValueCacheKind::Paged,
             pool ? pool->blocks_for(token_budget) : 0),
      structure_version_(model.structure_version()),
      backend_(model.backend()) {
    cache_.set_prefix_version(prefix_version());
}

std::uint64_t DecodeSession::prefix_version() const noexcept {
    // The structure version and the caller's namespace, mixed (splitmix64's finaliser).
    std::uint64_t mixed = structure_version_ * 0x9E3779B97F4A7C15ULL ^ prefix_namespace_;
    mixed = (mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9ULL;
    mixed = (mixed ^ (mixed >> 27)) * 0x94D049BB133111EBULL;
    return mixed ^ (mixed >> 31);
}

void DecodeSession::set_prefix_namespace(std::uint64_t value) {
    if (cache_.size() != 0) {
        throw std::logic_error("DecodeSession::set_prefix_namespace: the session holds " +
                               std::to_string(cache_.size()) + " positions; reset() it first");
    }
    prefix_namespace_ = value;
    cache_.set_prefix_version(prefix_version());
}

std::size_t DecodeSession::reuse_prefix(std::span<const std::uint32_t> prompt) {
    constexpr const char* op = "DecodeSession::reuse_prefix";
    if (cache_.size() != 0) {
        throw std::logic_error(std::string(op) + ": the session holds " +
                               std::to_string(cache_.size()) +
                               " positions; a prefix is reused only by an empty session");
    }
    require_current(op);
    if (prompt.size() < 2) {
        return 0;
    }
    for (std::size_t i = 0; i < prompt.size(); ++i) {
        if (prompt[i] >= model_->vocabulary_size()) {
            throw std::out_of_range(std::string(op) + ": prompt[" + std::to_string(i) +
                                    "] = " + std::to_string(prompt[i]) +
                                    " is not below the vocabulary size " +
                                    std::to_string(model_->vocabulary_size()));
        }
    }
    // The last token is always fed: its logits are what the caller asks the session for.
    return cache_.adopt_prefix(prompt.first(prompt.size() - 1));
}

bool DecodeSession::stale() const {
    return model_->structure_version() != structure_version_ || model_->backend() != backend_;
}

void DecodeSession::require_current(const char* operation) const {
    if (model_->backend() != backend_) {
        throw std::logic_error(
            std::string(operation) + ": stale session: the model moved to backend '" +
            std::string(execution_backend_name(model_->backend())) +
            "' after the session was created on '" + std::string(execution_backend_name(backend_)) +
            "'; create a new session");
    }
    if (model_->structure_version() != structure_version_) {
        throw std::logic_error(std::string(operation) +
                               ": stale session: LoRA or NF4 changed the model's structure after "
                               "the session's keys and values were computed; reset() it first");
    }
}

void DecodeSession::reset() noexcept {
    structure_version_ = model_->structure_version();
    cache_.reset(prefix_version());
}

Tensor DecodeSession::decode_token(std::uint32_t token) {
    const DecodeWork work{this, {&token, 1}};
    return tensor_ops::reshape(decode_batch({&work, 1}), {1, 1, model_->vocabulary_size()});
}

Tensor DecodeSession::prefill(std::span<const std::uint32_t> tokens, PrefillLogits logits) {
    if (tokens.empty()) {
        throw std::invalid_argument("DecodeSession::prefill: tokens is empty");
    }
    if (logits != PrefillLogits::Last && logits != PrefillLogits::All) {
        throw std::invalid_argument("DecodeSession::prefill: unknown PrefillLogits value " +
                                    std::to_string(static_cast<std::uint32_t>(logits)));
    }
    require_current("DecodeSession::prefill");
    const DecodeWork work{this, tokens};
    const std::size_t rows = logits == PrefillLogits::All ? tokens.size() : 1;
    return tensor_ops::reshape(run_batch({&work, 1}, logits, {&cache_}),
                               {1, rows, model_->vocabulary_size()});
}

Tensor decode_batch(std::span<const DecodeWork> work) {
    constexpr const char* op = "decode_batch";
    if (work.empty()) {
        throw std::invalid_argument(std::string(op) + ": no work given");
    }
    std::vector<KeyValueCache*> caches;
    caches.reserve(work.size());
    for (std::size_t i = 0; i < work.size(); ++i) {
        DecodeSession* session = work[i].session;
        if (session == nullptr) {
            throw std::invalid_argument(std::string(op) + ": work[" + std::to_string(i) +
                                        "].session is null");
        }
        if (work[i].tokens.empty()) {
            throw std::invalid_argument(std::string(op) + ": work[" + std::to_string(i) +
                                        "].tokens is empty");
        }
        if (&session->model() != &work[0].session->model()) {
            throw std::invalid_argument(std::string(op) + ": work[" + std::to_string(i) +
                                        "] is a session of another model than work[0]");
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (work[j].session == session) {
                throw std::invalid_argument(std::string(op) + ": work[" + std::to_string(i) +
                                            "] repeats the session of work[" + std::to_string(j) +
                                            "]");
            }
        }
        session->require_current(op);
        caches.push_back(&session->cache_);
    }
    return run_batch(work, PrefillLogits::Last, std::move(caches));
}

}  // namespace riftco_transformer
