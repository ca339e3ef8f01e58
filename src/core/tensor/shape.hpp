#pragma once
// Shape helpers shared by the tensor and the backends.

#include <cstddef>
#include <span>
#include <vector>

namespace riftco_transformer::detail {

// Row-major strides of a shape ([2,3,4] -> [12,4,1]).
[[nodiscard]] std::vector<std::size_t> row_major_strides(std::span<const std::size_t> shape);

}  // namespace riftco_transformer::detail
