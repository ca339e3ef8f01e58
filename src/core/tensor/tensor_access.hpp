#pragma once
// Private access to a tensor's storage for tensor_ops and backend adapters.

#include <memory>
#include <utility>

#include "core/backend/storage.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::detail {

struct TensorAccess {
    [[nodiscard]] static const Storage& storage(const Tensor& tensor) { return *tensor.storage_; }
    // Mutable access for an adapter writing a freshly allocated output: the output is never
    // shared yet, so no copy-on-write is needed.
    [[nodiscard]] static Storage& output_storage(Tensor& tensor) { return *tensor.storage_; }
    // Mutable access to an existing tensor's storage for an in-place update (an optimizer
    // step): storage shared with copies is cloned first, so no other value can observe the
    // write.
    [[nodiscard]] static Storage& unique_storage(Tensor& tensor) {
        tensor.make_storage_unique();
        return *tensor.storage_;
    }
    [[nodiscard]] static Tensor wrap(Shape shape, std::shared_ptr<Storage> storage) {
        return Tensor(std::move(shape), std::move(storage));
    }
    [[nodiscard]] static const std::shared_ptr<Storage>& shared_storage(const Tensor& tensor) {
        return tensor.storage_;
    }
    // An adapter giving an output (or a tensor it updates) a new buffer instead of writing
    // into the one it has: the replacement has the same backend and element count.
    static void replace_storage(Tensor& tensor, std::shared_ptr<Storage> storage);

    [[nodiscard]] static const Storage& storage(const IndexTensor& indices) {
        return *indices.storage_;
    }
};

// An output tensor with storage allocated (not initialised) by the backend's adapter.
[[nodiscard]] Tensor allocate_uninitialized(Shape shape, ExecutionBackend backend);

}  // namespace riftco_transformer::detail
