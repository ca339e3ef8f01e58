#pragma once
// Argument checks shared by every tensor operation. Each throws the category that
// docs/ARCHITECTURE.md, 'Error categories' names, with a message
// "<operation>: <argument> <problem> (<values>)".

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "core/backend/adapter.hpp"
#include "core/tensor/tensor_access.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::detail {

using NamedTensor = std::pair<std::string_view, const Tensor*>;

// logic_error when the tensor is singular (moved-from or default-constructed).
void require_tensor(std::string_view operation, std::string_view argument, const Tensor& tensor);

// Every input is non-singular and on one backend (invalid_argument naming both backends
// otherwise); returns the available adapter of that backend.
[[nodiscard]] const BackendAdapter& input_adapter(std::string_view operation,
                                                  std::initializer_list<NamedTensor> inputs);

// invalid_argument unless both shapes are identical.
void require_same_shape(std::string_view operation, NamedTensor left, NamedTensor right);

// out_of_range unless axis < rank.
void require_axis(std::string_view operation, std::size_t axis, std::size_t rank);

// invalid_argument unless the rank is exactly / at least `rank`.
void require_rank(std::string_view operation, NamedTensor tensor, std::size_t rank);
void require_minimum_rank(std::string_view operation, NamedTensor tensor, std::size_t rank);

// invalid_argument unless value is finite (and > 0 for the positive form).
void require_finite(std::string_view operation, std::string_view argument, float value);
void require_finite_positive(std::string_view operation, std::string_view argument, float value);
// The attention soft cap rule: finite and >= 0 (0: no capping); invalid_argument naming
// "<argument>" and the value otherwise.
void require_softcap(std::string_view operation, std::string_view argument, float value);

[[nodiscard]] std::string describe(const Tensor& tensor);  // "shape [2,3] on cpu"

// The one home of the id rules: `indices` is non-singular (logic_error) and on `backend`
// (invalid_argument), and every id is < bound (out_of_range "<op>: <argument>[<p>] = <id> is
// out of range for <bound> <what>", p being the first position of the largest id). O(1):
// it reads the maximum recorded at the upload, never the device.
void require_indices(std::string_view operation, std::string_view argument,
                     const IndexTensor& indices, ExecutionBackend backend, std::size_t bound,
                     std::string_view what);

}  // namespace riftco_transformer::detail
