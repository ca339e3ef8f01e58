#include "riftco_transformer/core/index_tensor.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/backend/adapter.hpp"
#include "core/backend/synchronization.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer {
IndexTensor::IndexTensor() noexcept = default;

IndexTensor::IndexTensor(Shape shape, std::span<const std::uint32_t> ids)
    : IndexTensor(std::move(shape), ids, current_execution_backend()) {}

IndexTensor::IndexTensor(Shape shape, std::span<const std::uint32_t> ids,
                         ExecutionBackend backend) {
    const std::size_t count = checked_element_count(shape);
    if (ids.size() != count) {
        throw std::invalid_argument("IndexTensor: " + std::to_string(ids.size()) +
                                    " ids given for shape " + shape_to_string(shape) + " with " +
                                    std::to_string(count) + " elements");
    }
    std::uint32_t largest = 0;
    std::size_t position = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] > largest) {
            largest = ids[i];
            position = i;
        }
    }
    std::shared_ptr<detail::Storage> storage =
        detail::require_storage(backend, "IndexTensor").allocate(count);
    storage->copy_indices_from_host(0, ids);
    shape_ = std::move(shape);
    numel_ = count;
    max_id_ = largest;
    max_id_position_ = position;
    storage_ = std::move(storage);
}

ExecutionBackend IndexTensor::backend() const {
    require_not_singular("IndexTensor::backend");
    return storage_->backend();
}

void IndexTensor::require_not_singular(const char* operation) const {
    if (storage_ == nullptr) {
        throw std::logic_error(std::string(operation) +
                               ": the index tensor is empty (default-constructed or moved-from)");
    }
}

std::vector<std::uint32_t> IndexTensor::to_host() const {
    require_not_singular("IndexTensor::to_host");
    std::vector<std::uint32_t> ids(numel_);
    detail::synchronize(storage_->backend());
    storage_->copy_indices_to_host(0, ids);
    return ids;
}

IndexTensor IndexTensor::reshape(Shape shape) const {
    require_not_singular("IndexTensor::reshape");
    const std::size_t count = checked_element_count(shape);
    if (count != numel_) {
        throw std::invalid_argument("IndexTensor::reshape: cannot reshape " +
                                    shape_to_string(shape_) + " (" + std::to_string(numel_) +
                                    " ids) to " + shape_to_string(shape) + " (" +
                                    std::to_string(count) + " ids)");
    }
    IndexTensor result = *this;
    result.shape_ = std::move(shape);
    return result;
}

IndexTensor IndexTensor::to(ExecutionBackend backend) const {
    require_not_singular("IndexTensor::to");
    if (storage_->backend() == backend) {
        static_cast<void>(detail::require_available_adapter(backend, "IndexTensor::to"));
        return *this;  // immutable: sharing is a copy
    }
    if (std::shared_ptr<detail::Storage> copied =
            detail::import_storage(*storage_, backend, "IndexTensor::to")) {
        IndexTensor result = *this;
        result.storage_ = std::move(copied);
        return result;
    }
    return IndexTensor(shape_, to_host(), backend);  // staged: to_host is the sync point
}

}  // namespace riftco_transformer
