#pragma once
// Fused, numerically stable softmax cross-entropy.

#include <cstddef>
#include <cstdint>
#include <span>

#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::tensor_ops {

struct CrossEntropyResult {
    Tensor loss;      // scalar []: −(1/N)·Σ_n log softmax(z_n)[y_n], summed in double
    Tensor gradient;  // logits.shape(): (softmax(z) − onehot(y))/N, the loss's base gradient
};

// logits [..., V] (N = numel/V positions), one target per position.
// Rank-0 logits or a target count != N: invalid_argument; a target >= V: out_of_range;
// a non-finite target logit: domain_error; a non-finite mean loss: overflow_error.
[[nodiscard]] CrossEntropyResult cross_entropy(const Tensor& logits,
                                               std::span<const std::uint32_t> targets);
// The same with targets already on the logits' backend (a targets tensor of any shape with
// N ids; another backend: invalid_argument). The range check reads the maximum recorded at
// the upload: O(1), no device read.
[[nodiscard]] CrossEntropyResult cross_entropy(const Tensor& logits, const IndexTensor& targets);

// Mean cross-entropy over the same time slice t in [offset, offset+count) of every row of
// logits [B,T,V] (N = B·count positions). targets hold B·T ids, one per position (row-major);
// every one is range-checked, only the slice's contribute. gradient [B,T,V] is
// (softmax − onehot)/N on the slice and exactly 0 elsewhere.
// Rank != 3 or count == 0: invalid_argument (zero dimensions cannot exist: Tensor rejects
// them); offset + count > T: out_of_range; a target count != B·T: invalid_argument; a
// target >= V: out_of_range; the value errors of cross_entropy, for the slice's positions.
[[nodiscard]] CrossEntropyResult cross_entropy_time_range(const Tensor& logits,
                                                          std::span<const std::uint32_t> targets,
                                                          std::size_t offset, std::size_t count);
// The same with targets already on the logits' backend (any shape with B·T ids).
[[nodiscard]] CrossEntropyResult cross_entropy_time_range(const Tensor& logits,
                                                          const IndexTensor& targets,
                                                          std::size_t offset, std::size_t count);

// Mean cross-entropy over the positions a mask selects (a response-only loss): logits
// [..., V] (N positions), N targets (all range-checked), and N mask flags, each 0 or 1; the
// mean runs over the M positions flagged 1, and gradient is (softmax − onehot)/M there and
// exactly 0 elsewhere. A mask count != N, a flag other than 0/1 or no flagged position:
// invalid_argument; the other errors of cross_entropy (value errors only for flagged
// positions).
[[nodiscard]] CrossEntropyResult cross_entropy_masked(const Tensor& logits,
                                                      std::span<const std::uint32_t> targets,
                                                      std::span<const std::uint8_t> mask);

}  // namespace riftco_transformer::tensor_ops
