// Indexing capability: row gather and a deterministic scatter-add (indexing.cu: stable sort of
// the ids, then each destination row sums its sources in index order, bit-identical to the
// CPU reference; no floating-point atomics). tensor_ops range-checks the ids before the call;
// the kernels check them again and an id out of range is raised at the next sync point with
// tensor_ops' category and message (out_of_range), its output row being left 0.

#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/row_capabilities.hpp"
#include "core/backend/cuda/row_kernels.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// tensor_ops' out_of_range (validation.cpp require_indices), read from the ids at the sync
// point: it names the largest id and the first position holding it, as tensor_ops does.
std::exception_ptr out_of_range(const char* operation, const IndexTensor& indices,
                                std::size_t rows) {
    std::vector<std::uint32_t> ids(indices.numel());
    TensorAccess::storage(indices).copy_indices_to_host(0, ids);
    std::size_t position = 0;
    for (std::size_t i = 1; i < ids.size(); ++i) {
        if (ids[i] > ids[position]) {
            position = i;
        }
    }
    std::ostringstream message;
    message << operation << ": indices[" << position << "] = " << ids[position]
            << " is out of range for " << rows << " rows";
    return std::make_exception_ptr(std::out_of_range(message.str()));
}

class CudaIndexing final : public IndexingCapability {
  public:
    explicit CudaIndexing(const Runtime& runtime) : runtime_(runtime) {}

    void gather_rows(const Tensor& table, const IndexTensor& indices, Tensor& out) const override {
        const std::size_t rows = table.shape()[0];
        const std::size_t width = table.shape()[1];
        const std::size_t count = indices.numel();
        const cudaStream_t stream = current_stream();
        const float* src = device_input(table, stream);
        const std::uint32_t* ids = device_indices(indices, stream);
        float* dst = device_output(out, stream);
        runtime_.checked_launch(
            stream,
            [indices, rows](std::size_t /*first_failure*/) {
                return out_of_range("gather_rows", indices, rows);
            },
            [&](unsigned long long* slot) {
                cuda::gather_rows(src, rows, width, ids, count, dst, slot, stream);
            });
    }

    void scatter_add_rows(const Tensor& upstream, const IndexTensor& indices,
                          Tensor& out) const override {
        const std::size_t rows = out.shape()[0];
        const std::size_t width = out.shape()[1];
        const std::size_t count = indices.numel();
        const cudaStream_t stream = current_stream();
        const float* src = device_input(upstream, stream);
        const std::uint32_t* ids = device_indices(indices, stream);
        float* dst = device_output(out, stream);
        const std::size_t scratch_bytes = scatter_add_scratch_bytes(count, indices.max_id());
        // Scratch from the pool, freed in stream order after the kernels that use it.
        const DeviceBuffer scratch(scratch_bytes, stream);
        runtime_.checked_launch(
            stream,
            [indices, rows](std::size_t /*first_failure*/) {
                return out_of_range("scatter_add_rows", indices, rows);
            },
            [&](unsigned long long* slot) {
                cuda::scatter_add_rows(src, ids, count, indices.max_id(), rows, width, dst,
                                       scratch.data(), scratch_bytes, slot, stream);
            });
    }

  private:
    const Runtime& runtime_;
};

}  // namespace

const IndexingCapability* indexing_capability(const Runtime& runtime) {
    static const auto* capability = new CudaIndexing(runtime);
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
