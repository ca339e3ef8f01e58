#pragma once
// The one axis-reduction kernel: x viewed as [outer, extent, inner] ->
// out[o, i] = multiplier · Σ_e x[o, e, i], accumulated in double in e order (so results do
// not depend on the thread count). Used by sum/mean over an axis and by sum_to_shape.

#include <cstddef>

namespace riftco_transformer::detail {

void sum_over_axis(const float* x, std::size_t outer, std::size_t extent, std::size_t inner,
                   double multiplier, float* out);

}  // namespace riftco_transformer::detail
