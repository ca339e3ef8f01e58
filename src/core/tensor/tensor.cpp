#include "riftco_transformer/core/tensor.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/backend/adapter.hpp"
#include "core/backend/synchronization.hpp"
#include "core/tensor/shape.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer {
namespace {

const detail::StorageCapability& storage_capability(ExecutionBackend backend,
                                                    std::string_view operation) {
    return detail::require_storage(backend, operation);
}

std::shared_ptr<detail::Storage> allocate_storage(const Shape& shape, ExecutionBackend backend,
                                                  std::string_view operation) {
    const std::size_t count = checked_element_count(shape);
    return storage_capability(backend, operation).allocate(count);
}

}  // namespace

namespace detail {

Tensor allocate_uninitialized(Shape shape, ExecutionBackend backend) {
    auto storage = allocate_storage(shape, backend, "tensor allocation");
    return TensorAccess::wrap(std::move(shape), std::move(storage));
}

}  // namespace detail

Tensor::Tensor() noexcept = default;

Tensor::Tensor(Shape shape, std::shared_ptr<detail::Storage> storage)
    : shape_(std::move(shape)),
      strides_(detail::row_major_strides(shape_)),
      numel_(storage->element_count()),
      storage_(std::move(storage)) {}

Tensor::Tensor(Shape shape) : Tensor(std::move(shape), 0.0F, current_execution_backend()) {}
Tensor::Tensor(Shape shape, ExecutionBackend backend) : Tensor(std::move(shape), 0.0F, backend) {}
Tensor::Tensor(Shape shape, float fill_value)
    : Tensor(std::move(shape), fill_value, current_execution_backend()) {}

Tensor::Tensor(Shape shape, float fill_value, ExecutionBackend backend)
    : Tensor(detail::allocate_uninitialized(std::move(shape), backend)) {
    storage_capability(backend, "Tensor").fill(*storage_, fill_value);
}

Tensor::Tensor(Shape shape, std::span<const float> values)
    : Tensor(std::move(shape), values, current_execution_backend()) {}

Tensor::Tensor(Shape shape, std::span<const float> values, ExecutionBackend backend) {
    const std::size_t count = checked_element_count(shape);
    if (values.size() != count) {
        throw std::invalid_argument("Tensor: " + std::to_string(values.size()) +
                                    " values given for shape " + shape_to_string(shape) + " with " +
                                    std::to_string(count) + " elements");
    }
    *this = detail::allocate_uninitialized(std::move(shape), backend);
    storage_->copy_from_host(0, values);
}

Tensor::Tensor(Shape shape, std::initializer_list<float> values)
    : Tensor(std::move(shape), std::span<const float>(values.begin(), values.size())) {}
Tensor::Tensor(Shape shape, std::initializer_list<float> values, ExecutionBackend backend)
    : Tensor(std::move(shape), std::span<const float>(values.begin(), values.size()), backend) {}

Tensor Tensor::zeros(Shape shape) {
    return Tensor(std::move(shape), 0.0F);
}
Tensor Tensor::zeros(Shape shape, ExecutionBackend backend) {
    return Tensor(std::move(shape), 0.0F, backend);
}
Tensor Tensor::full(Shape shape, float value) {
    return Tensor(std::move(shape), value);
}
Tensor Tensor::full(Shape shape, float value, ExecutionBackend backend) {
    return Tensor(std::move(shape), value, backend);
}
Tensor Tensor::scalar(float value) {
    return Tensor(Shape{}, value);
}
Tensor Tensor::scalar(float value, ExecutionBackend backend) {
    return Tensor(Shape{}, value, backend);
}

// Copies share storage until either side writes (make_storage_unique), which keeps copies
// independent values without paying for a deep copy nobody observes.
Tensor::Tensor(const Tensor& other) = default;
Tensor& Tensor::operator=(const Tensor& other) = default;

Tensor::Tensor(Tensor&& other) noexcept
    : shape_(std::move(other.shape_)),
      strides_(std::move(other.strides_)),
      numel_(std::exchange(other.numel_, 0)),
      storage_(std::move(other.storage_)) {
    other.shape_.clear();
    other.strides_.clear();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
    if (this != &other) {
        shape_ = std::move(other.shape_);
        strides_ = std::move(other.strides_);
        numel_ = std::exchange(other.numel_, 0);
        storage_ = std::move(other.storage_);
        other.shape_.clear();
        other.strides_.clear();
    }
    return *this;
}

Tensor::~Tensor() = default;

void Tensor::require_not_singular(const char* operation) const {
    if (storage_ == nullptr) {
        throw std::logic_error(std::string(operation) +
                               ": the tensor is singular (default-constructed or moved-from)");
    }
}

ExecutionBackend Tensor::backend() const {
    require_not_singular("Tensor::backend");
    return storage_->backend();
}

std::size_t Tensor::offset_of(std::span<const std::size_t> index) const {
    require_not_singular("Tensor::offset_of");
    if (index.size() != shape_.size()) {
        throw std::invalid_argument("Tensor::offset_of: index has " + std::to_string(index.size()) +
                                    " components for rank " + std::to_string(shape_.size()) +
                                    " tensor " + shape_to_string(shape_));
    }
    std::size_t offset = 0;
    for (std::size_t axis = 0; axis < index.size(); ++axis) {
        if (index[axis] >= shape_[axis]) {
            throw std::out_of_range("Tensor::offset_of: index " + std::to_string(index[axis]) +
                                    " on axis " + std::to_string(axis) + " of shape " +
                                    shape_to_string(shape_) + " is out of range");
        }
        offset += index[axis] * strides_[axis];
    }
    return offset;
}

std::size_t Tensor::offset_of(std::initializer_list<std::size_t> index) const {
    return offset_of(std::span<const std::size_t>(index.begin(), index.size()));
}

float Tensor::flat(std::size_t flat_index) const {
    require_not_singular("Tensor::flat");
    if (flat_index >= numel_) {
        throw std::out_of_range("Tensor::flat: index " + std::to_string(flat_index) +
                                " is out of range for " + std::to_string(numel_) + " elements");
    }
    float value = 0.0F;
    detail::synchronize(storage_->backend());
    storage_->copy_to_host(flat_index, std::span<float>(&value, 1));
    return value;
}

float Tensor::at(std::initializer_list<std::size_t> index) const {
    return flat(offset_of(index));
}

float Tensor::item() const {
    require_not_singular("Tensor::item");
    if (numel_ != 1) {
        throw std::invalid_argument("Tensor::item: tensor of shape " + shape_to_string(shape_) +
                                    " has " + std::to_string(numel_) + " elements, not 1");
    }
    return flat(0);
}

std::vector<float> Tensor::to_host() const {
    require_not_singular("Tensor::to_host");
    std::vector<float> values(numel_);
    detail::synchronize(storage_->backend());
    storage_->copy_to_host(0, values);
    return values;
}

void Tensor::copy_to_host(std::span<float> destination) const {
    require_not_singular("Tensor::copy_to_host");
    if (destination.size() != numel_) {
        throw std::invalid_argument("Tensor::copy_to_host: destination holds " +
                                    std::to_string(destination.size()) + " floats, tensor has " +
                                    std::to_string(numel_));
    }
    detail::synchronize(storage_->backend());
    storage_->copy_to_host(0, destination);
}

void Tensor::make_storage_unique() {
    if (storage_.use_count() > 1) {
        storage_ = storage_capability(storage_->backend(), "Tensor write").clone(*storage_);
    }
}

void Tensor::copy_from_host(std::span<const float> source) {
    require_not_singular("Tensor::copy_from_host");
    if (source.size() != numel_) {
        throw std::invalid_argument("Tensor::copy_from_host: source holds " +
                                    std::to_string(source.size()) + " floats, tensor has " +
                                    std::to_string(numel_));
    }
    storage_capability(storage_->backend(), "Tensor::copy_from_host").write_range(*this, 0, source);
}

void Tensor::set_flat(std::size_t flat_index, float value) {
    require_not_singular("Tensor::set_flat");
    if (flat_index >= numel_) {
        throw std::out_of_range("Tensor::set_flat: index " + std::to_string(flat_index) +
                                " is out of range for " + std::to_string(numel_) + " elements");
    }
    storage_capability(storage_->backend(), "Tensor::set_flat")
        .write_range(*this, flat_index, std::span<const float>(&value, 1));
}

Tensor Tensor::reshape(Shape shape) const {
    require_not_singular("Tensor::reshape");
    const std::size_t count = checked_element_count(shape);
    if (count != numel_) {
        throw std::invalid_argument("Tensor::reshape: cannot reshape " + shape_to_string(shape_) +
                                    " (" + std::to_string(numel_) + " elements) to " +
                                    shape_to_string(shape) + " (" + std::to_string(count) +
                                    " elements)");
    }
    return Tensor(std::move(shape), storage_);
}

Tensor Tensor::to(ExecutionBackend backend) const {
    require_not_singular("Tensor::to");
    const ExecutionBackend source = storage_->backend();
    if (source == backend) {
        // An independent value; copy-on-write makes the deep copy lazy.
        static_cast<void>(detail::require_available_adapter(backend, "Tensor::to"));
        return Tensor(shape_, storage_);
    }
    // A direct copy when the target's adapter can read this storage (host memory, or a peer
    // device); otherwise host staging, a sync point of the source.
    if (std::shared_ptr<detail::Storage> copied =
            detail::import_storage(*storage_, backend, "Tensor::to")) {
        return Tensor(shape_, std::move(copied));
    }
    std::vector<float> staging(numel_);
    copy_to_host(staging);
    return Tensor(shape_, staging, backend);
}

}  // namespace riftco_transformer

namespace riftco_transformer::detail {

void TensorAccess::replace_storage(Tensor& tensor, std::shared_ptr<Storage> storage) {
    if (storage == nullptr || tensor.storage_ == nullptr ||
        storage->backend() != tensor.storage_->backend() ||
        storage->element_count() != tensor.storage_->element_count()) {
        throw std::logic_error(
            "TensorAccess::replace_storage: the replacement must be a storage of the same "
            "backend and element count");
    }
    tensor.storage_ = std::move(storage);
}

}  // namespace riftco_transformer::detail
