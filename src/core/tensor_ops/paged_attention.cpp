#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

// Pools rank 4 with identical shapes and no zero extent; rows [R, H, 1, d_h] matching them.
void require_pools(std::string_view op, const Tensor& key_pool, const Tensor& value_pool) {
    detail::require_rank(op, {"key_pool", &key_pool}, 4);
    detail::require_same_shape(op, {"key_pool", &key_pool}, {"value_pool", &value_pool});
    for (const std::size_t extent : key_pool.shape()) {
        if (extent == 0) {
            throw std::invalid_argument(std::string(op) + ": key_pool " +
                                        shape_to_string(key_pool.shape()) +
                                        " must have no zero extent");
        }
    }
}

// Key/value rows [R, Hkv, 1, d_h]: the pools' own head count (never repeated to Hq).
void require_rows(std::string_view op, std::string_view argument, const Tensor& rows,
                  const Tensor& pool) {
    detail::require_rank(op, {argument, &rows}, 4);
    const Shape& shape = rows.shape();
    const Shape& pools = pool.shape();
    if (shape[0] == 0 || shape[1] != pools[1] || shape[2] != 1 || shape[3] != pools[3]) {
        std::ostringstream message;
        message << op << ": " << argument << " " << shape_to_string(shape) << " must be [R,"
                << pools[1] << ",1," << pools[3] << "] with R > 0 (pools " << shape_to_string(pools)
                << ")";
        throw std::invalid_argument(message.str());
    }
}

// query [R, Hq, 1, d_h] for pools [P, Hkv, S, d_h]: R > 0, Hq a positive multiple of Hkv
// (query head h reads pool head ⌊h/(Hq/Hkv)⌋), d_h the pools'.
void require_query(std::string_view op, const Tensor& query, const Tensor& pool) {
    detail::require_rank(op, {"query", &query}, 4);
    const Shape& shape = query.shape();
    const Shape& pools = pool.shape();
    if (shape[0] == 0 || shape[1] % pools[1] != 0 || shape[2] != 1 || shape[3] != pools[3]) {
        std::ostringstream message;
        message << op << ": query " << shape_to_string(shape) << " must be [R,Hq,1," << pools[3]
                << "] with R > 0 and Hq a positive multiple of the pools' " << pools[1]
                << " heads (pools " << shape_to_string(pools) << ")";
        throw std::invalid_argument(message.str());
    }
}

}  // namespace

Tensor paged_decode_attention(const Tensor& query, const Tensor& key_pool, const Tensor& value_pool,
                              std::span<const PagedAttentionRequest> requests, float scale,
                              const PagedAttentionOptions& options) {
    constexpr std::string_view op = "paged_decode_attention";
    const auto& adapter = detail::input_adapter(
        op, {{"query", &query}, {"key_pool", &key_pool}, {"value_pool", &value_pool}});
    require_pools(op, key_pool, value_pool);
    require_query(op, query, key_pool);
    const std::size_t pages = key_pool.shape()[0];
    const std::size_t page_size = key_pool.shape()[2];
    if (requests.size() != query.shape()[0]) {
        std::ostringstream message;
        message << op << ": " << requests.size() << " requests for query "
                << shape_to_string(query.shape()) << " (one per query row)";
        throw std::invalid_argument(message.str());
    }
    for (std::size_t r = 0; r < requests.size(); ++r) {
        const auto& request = requests[r];
        const std::size_t covered = request.page_table.size() * page_size;
        if (request.length == 0 || request.length > covered) {
            std::ostringstream message;
            message << op << ": requests[" << r << "].length " << request.length
                    << " must be in [1, " << covered << "] (" << request.page_table.size()
                    << " pages of " << page_size << ")";
            throw std::invalid_argument(message.str());
        }
        const std::size_t used = (request.length + page_size - 1) / page_size;
        for (std::size_t p = 0; p < used; ++p) {
            if (request.page_table[p] >= pages) {
                std::ostringstream message;
                message << op << ": requests[" << r << "].page_table[" << p
                        << "] = " << request.page_table[p] << " is out of range for " << pages
                        << " pages";
                throw std::invalid_argument(message.str());
            }
        }
    }
    if (scale == 0.0F) {
        scale = 1.0F / std::sqrt(static_cast<float>(key_pool.shape()[3]));
    }
    detail::require_finite_positive(op, "scale", scale);
    detail::require_softcap(op, "options.softcap", options.softcap);
    Tensor context = detail::allocate_uninitialized(query.shape(), query.backend());
    detail::require_capability(adapter.paged_attention(), adapter, op, "paged attention")
        .decode_attention(query, key_pool, value_pool, requests, scale, options, context);
    return context;
}

void write_paged_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                           const Tensor& value, std::span<const PagedSlot> slots) {
    constexpr std::string_view op = "write_paged_key_value";
    const auto& adapter = detail::input_adapter(
        op,
        {{"key_pool", &key_pool}, {"value_pool", &value_pool}, {"key", &key}, {"value", &value}});
    require_pools(op, key_pool, value_pool);
    require_rows(op, "key", key, key_pool);
    detail::require_same_shape(op, {"key", &key}, {"value", &value});
    const std::size_t pages = key_pool.shape()[0];
    const std::size_t page_size = key_pool.shape()[2];
    if (slots.size() != key.shape()[0]) {
        std::ostringstream message;
        message << op << ": " << slots.size() << " slots for key " << shape_to_string(key.shape())
                << " (one per row)";
        throw std::invalid_argument(message.str());
    }
    std::vector<std::pair<std::size_t, std::size_t>> flat_slots;  // (page·S + offset, row)
    flat_slots.reserve(slots.size());
    for (std::size_t r = 0; r < slots.size(); ++r) {
        const auto& slot = slots[r];
        if (slot.page >= pages || slot.offset >= page_size) {
            std::ostringstream message;
            message << op << ": slots[" << r << "] = (page " << slot.page << ", offset "
                    << slot.offset << ") is outside the pools' " << pages << " pages of "
                    << page_size;
            throw std::invalid_argument(message.str());
        }
        flat_slots.emplace_back(std::size_t{slot.page} * page_size + slot.offset, r);
    }
    std::sort(flat_slots.begin(), flat_slots.end());
    for (std::size_t i = 1; i < flat_slots.size(); ++i) {
        if (flat_slots[i].first == flat_slots[i - 1].first) {
            const auto& slot = slots[flat_slots[i].second];
            std::ostringstream message;
            message << op << ": slots[" << flat_slots[i].second << "] = (page " << slot.page
                    << ", offset " << slot.offset << ") repeats slots[" << flat_slots[i - 1].second
                    << "]";
            throw std::invalid_argument(message.str());
        }
    }
    detail::require_capability(adapter.paged_attention(), adapter, op, "paged attention")
        .write_key_value(key_pool, value_pool, key, value, slots);
}

}  // namespace riftco_transformer::tensor_ops
