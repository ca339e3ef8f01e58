#pragma once
// Shared strided-copy kernel: permute, broadcast_to and slice are all "walk the output in
// row-major order, read the input through per-output-axis strides".

#include <cstddef>
#include <span>
#include <vector>

namespace riftco_transformer::detail {

// dst[out_index] = src[Σ_d out_index[d]·source_strides[d]] for every index of out_shape.
// A source stride of 0 repeats (broadcasts) along that axis.
void strided_copy(const float* src, std::span<const std::size_t> out_shape,
                  std::span<const std::size_t> source_strides, float* dst);

}  // namespace riftco_transformer::detail
