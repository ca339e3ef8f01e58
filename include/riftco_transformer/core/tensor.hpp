#pragma once
// Tensor: an FP32, dense, row-major array with an intrinsic execution backend.
//
// Value semantics: copies are independent values. Internally a copy (or reshape) may share
// storage until one side is written (copy-on-write), which no caller can observe.
// Storage is backend-owned and never promises a host pointer: host data moves only through
// the explicit copy calls below, which are the synchronisation points of device backends.

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "riftco_transformer/core/backend.hpp"

namespace riftco_transformer {

using Shape = std::vector<std::size_t>;

namespace detail {
class Storage;
struct TensorAccess;
}  // namespace detail

// Number of elements of a shape: 1 for the scalar shape []. Zero dimensions are
// std::invalid_argument; a product that overflows (elements or bytes) is std::overflow_error.
[[nodiscard]] std::size_t checked_element_count(std::span<const std::size_t> shape);

// "[2,3,4]".
[[nodiscard]] std::string shape_to_string(std::span<const std::size_t> shape);

class Tensor {
  public:
    // A singular tensor (also what a move leaves behind): numel()==0, no backend storage.
    // Reading, reshaping or transferring it is std::logic_error.
    Tensor() noexcept;

    // Zero-filled tensor on `backend` (default: the calling thread's construction default).
    explicit Tensor(Shape shape);
    Tensor(Shape shape, ExecutionBackend backend);
    Tensor(Shape shape, float fill_value);
    Tensor(Shape shape, float fill_value, ExecutionBackend backend);
    // Values in row-major order; their count must equal numel (std::invalid_argument).
    Tensor(Shape shape, std::span<const float> values);
    Tensor(Shape shape, std::span<const float> values, ExecutionBackend backend);
    Tensor(Shape shape, std::initializer_list<float> values);
    Tensor(Shape shape, std::initializer_list<float> values, ExecutionBackend backend);

    [[nodiscard]] static Tensor zeros(Shape shape);
    [[nodiscard]] static Tensor zeros(Shape shape, ExecutionBackend backend);
    [[nodiscard]] static Tensor full(Shape shape, float value);
    [[nodiscard]] static Tensor full(Shape shape, float value, ExecutionBackend backend);
    [[nodiscard]] static Tensor scalar(float value);
    [[nodiscard]] static Tensor scalar(float value, ExecutionBackend backend);

    Tensor(const Tensor& other);
    Tensor& operator=(const Tensor& other);
    Tensor(Tensor&& other) noexcept;
    Tensor& operator=(Tensor&& other) noexcept;
    ~Tensor();

    [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
    [[nodiscard]] const std::vector<std::size_t>& strides() const noexcept { return strides_; }
    [[nodiscard]] std::size_t rank() const noexcept { return shape_.size(); }
    [[nodiscard]] std::size_t numel() const noexcept { return numel_; }
    [[nodiscard]] bool is_singular() const noexcept { return storage_ == nullptr; }
    // The backend that owns the storage. Singular tensors: std::logic_error.
    [[nodiscard]] ExecutionBackend backend() const;

    // Row-major offset of a multi-index: rank mismatch is std::invalid_argument, an index
    // past its dimension std::out_of_range.
    [[nodiscard]] std::size_t offset_of(std::span<const std::size_t> index) const;
    [[nodiscard]] std::size_t offset_of(std::initializer_list<std::size_t> index) const;

    // Checked single-element reads (each is a host copy; use to_host() for bulk reads).
    [[nodiscard]] float flat(std::size_t flat_index) const;
    [[nodiscard]] float at(std::initializer_list<std::size_t> index) const;
    // The value of a one-element tensor (std::invalid_argument otherwise).
    [[nodiscard]] float item() const;

    // Bulk host transfer. The span size must equal numel (std::invalid_argument).
    [[nodiscard]] std::vector<float> to_host() const;
    void copy_to_host(std::span<float> destination) const;
    void copy_from_host(std::span<const float> source);
    // Checked single-element write (through the backend's adapter, which may give this
    // tensor a new buffer; copies never observe it).
    void set_flat(std::size_t flat_index, float value);

    // Same elements in the same flat order under a shape with equal numel.
    [[nodiscard]] Tensor reshape(Shape shape) const;
    // Deep transfer to `backend` (an independent value even when the backend is the same).
    // Unavailable target: std::runtime_error naming the reason.
    [[nodiscard]] Tensor to(ExecutionBackend backend) const;

  private:
    friend struct detail::TensorAccess;
    Tensor(Shape shape, std::shared_ptr<detail::Storage> storage);
    void require_not_singular(const char* operation) const;
    void make_storage_unique();

    Shape shape_;
    std::vector<std::size_t> strides_;
    std::size_t numel_ = 0;
    std::shared_ptr<detail::Storage> storage_;
};

}  // namespace riftco_transformer
