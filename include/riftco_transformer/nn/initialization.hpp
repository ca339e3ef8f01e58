#pragma once
// Portable seeded initialisation. std::mt19937's 32-bit output sequence is fixed by the C++
// standard; the conversion to floats is ours (std::uniform_real_distribution is
// implementation-defined), so a seed gives bit-identical weights on every platform.

#include <cstddef>
#include <random>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

// One draw -> a float in [0, 1): the top 24 bits of the 32-bit output, times 2^-24.
[[nodiscard]] float uniform_unit(std::mt19937& generator);

// Elements drawn in row-major order from U(lo, hi) (computed in double, rounded to float and
// kept below hi). lo < hi, both finite: std::invalid_argument otherwise.
[[nodiscard]] Tensor uniform_tensor(const Shape& shape, float lo, float hi, std::mt19937& generator,
                                    ExecutionBackend backend);
[[nodiscard]] Tensor uniform_tensor(const Shape& shape, float lo, float hi,
                                    std::mt19937& generator);

// U(±√(6/(fan_in + fan_out))) with the limit computed in double. A zero fan is
// std::invalid_argument.
[[nodiscard]] Tensor xavier_uniform(const Shape& shape, std::size_t fan_in, std::size_t fan_out,
                                    std::mt19937& generator, ExecutionBackend backend);

}  // namespace riftco_transformer
