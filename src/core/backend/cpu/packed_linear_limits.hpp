#pragma once
// The shape limits of the packed-weight drivers (packed_linear_driver.hpp), apart from them so
// that kernel headers and benchmarks can name them without the drivers' OpenMP code.

#include <cstddef>

namespace riftco_transformer::detail {

// R <= this: matrix-vector products straight on the packed codes; more rows: panels + GEMM.
inline constexpr std::size_t packed_direct_row_limit = 8;
inline constexpr std::size_t packed_panel_floats = std::size_t{1} << 19U;  // 2 MiB per thread

}  // namespace riftco_transformer::detail
