#include "riftco_transformer/core/tensor_ops/indexing.hpp"

#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "core/tensor_ops/validation.hpp"

namespace riftco_transformer::tensor_ops {
namespace {

const detail::IndexingCapability& indexing_of(const detail::BackendAdapter& adapter,
                                              std::string_view operation) {
    return detail::require_capability(adapter.indexing(), adapter, operation, "indexing");
}

// Host ids narrowed to uint32 in one pass: overflow_error above the uint32 id range,
// out_of_range at or past row_count, naming the first offending position.
std::vector<std::uint32_t> narrowed_host_indices(std::string_view op,
                                                 std::span<const std::size_t> indices,
                                                 std::size_t row_count) {
    std::vector<std::uint32_t> ids(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) {
        const std::size_t index = indices[i];
        if (index > std::numeric_limits<std::uint32_t>::max()) {
            std::ostringstream message;
            message << op << ": indices[" << i << "] = " << index
                    << " exceeds the uint32 index range";
            throw std::overflow_error(message.str());
        }
        if (index >= row_count) {
            std::ostringstream message;
            message << op << ": indices[" << i << "] = " << index << " is out of range for "
                    << row_count << " rows";
            throw std::out_of_range(message.str());
        }
        ids[i] = static_cast<std::uint32_t>(index);
    }
    return ids;
}

// row_count > 0, upstream rank >= 1 and one upstream row per index (invalid_argument).
void require_scatter_shapes(std::string_view op, const Tensor& upstream, std::size_t index_count,
                            std::size_t row_count) {
    if (row_count == 0) {
        throw std::invalid_argument(std::string(op) + ": row_count is 0");
    }
    detail::require_minimum_rank(op, {"upstream", &upstream}, 1);
    const std::size_t width = upstream.shape().back();
    if (upstream.numel() / width != index_count) {
        std::ostringstream message;
        message << op << ": upstream " << shape_to_string(upstream.shape()) << " holds "
                << upstream.numel() / width << " rows but " << index_count << " indices were given";
        throw std::invalid_argument(message.str());
    }
}

}  // namespace

Tensor gather_rows(const Tensor& table, const IndexTensor& indices) {
    constexpr std::string_view op = "gather_rows";
    const auto& adapter = detail::input_adapter(op, {{"table", &table}});
    detail::require_rank(op, {"table", &table}, 2);
    detail::require_indices(op, "indices", indices, table.backend(), table.shape()[0], "rows");
    Shape shape = indices.shape();
    shape.push_back(table.shape()[1]);
    static_cast<void>(checked_element_count(shape));
    Tensor out = detail::allocate_uninitialized(std::move(shape), table.backend());
    indexing_of(adapter, op).gather_rows(table, indices, out);
    return out;
}

IndexTensor row_indices(const Tensor& table, std::span<const std::size_t> indices,
                        const Shape& index_shape) {
    constexpr std::string_view op = "gather_rows";
    detail::require_tensor(op, "table", table);
    detail::require_rank(op, {"table", &table}, 2);
    const std::size_t expected = checked_element_count(index_shape);
    if (indices.size() != expected) {
        std::ostringstream message;
        message << op << ": " << indices.size() << " indices given for index_shape "
                << shape_to_string(index_shape) << " (" << expected << " positions)";
        throw std::invalid_argument(message.str());
    }
    return IndexTensor(index_shape, narrowed_host_indices(op, indices, table.shape()[0]),
                       table.backend());
}

Tensor gather_rows(const Tensor& table, std::span<const std::size_t> indices,
                   const Shape& index_shape) {
    return gather_rows(table, row_indices(table, indices, index_shape));
}

Tensor scatter_add_rows(const Tensor& upstream, const IndexTensor& indices, std::size_t row_count) {
    constexpr std::string_view op = "scatter_add_rows";
    const auto& adapter = detail::input_adapter(op, {{"upstream", &upstream}});
    if (row_count == 0) {
        throw std::invalid_argument(std::string(op) + ": row_count is 0");
    }
    detail::require_indices(op, "indices", indices, upstream.backend(), row_count, "rows");
    require_scatter_shapes(op, upstream, indices.numel(), row_count);
    Shape shape{row_count, upstream.shape().back()};
    static_cast<void>(checked_element_count(shape));
    Tensor out = detail::allocate_uninitialized(std::move(shape), upstream.backend());
    indexing_of(adapter, op).scatter_add_rows(upstream, indices, out);
    return out;
}

Tensor scatter_add_rows(const Tensor& upstream, std::span<const std::size_t> indices,
                        std::size_t row_count) {
    constexpr std::string_view op = "scatter_add_rows";
    detail::require_tensor(op, "upstream", upstream);
    require_scatter_shapes(op, upstream, indices.size(), row_count);
    return scatter_add_rows(
        upstream,
        IndexTensor({indices.size()}, narrowed_host_indices(op, indices, row_count),
                    upstream.backend()),
        row_count);
}

}  // namespace riftco_transformer::tensor_ops
