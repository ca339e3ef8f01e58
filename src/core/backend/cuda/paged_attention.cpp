// CUDA paged attention (the CPU reference is cpu/paged_attention.cpp): batched decode
// attention reading every key and value in place through the page tables, and the paged
// key/value write. Each call uploads one small uint32 array (per request: its page table's
// offset, length and first visible position, then the page tables, only the pages covering
// [0, length)); it is the only host-to-device traffic and no host read happens. A score that
// is NaN or +inf is the CPU's domain_error with the CPU's message, raised at the next sync
// point (the first failing (request, head, position) in that order).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "core/backend/cuda/attention_nf4_adam.hpp"
#include "core/backend/cuda/attention_nf4_adam_kernels.hpp"
#include "core/backend/cuda/cuda_device.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr std::string_view operation = "paged_decode_attention";

std::uint32_t narrow_to_u32(std::size_t value) {
    if (value > std::numeric_limits<std::uint32_t>::max()) {
        throw std::length_error(std::string(operation) +
                                ": request metadata does not fit the CUDA kernels' 32-bit fields");
    }
    return static_cast<std::uint32_t>(value);
}

// A host array onto a fresh device buffer, enqueued on `stream` (pageable memory: the copy
// has left `values` when cudaMemcpyAsync returns).
std::unique_ptr<DeviceBuffer> upload_u32(const std::vector<std::uint32_t>& values,
                                         cudaStream_t stream) {
    auto buffer = std::make_unique<DeviceBuffer>(values.size() * sizeof(std::uint32_t), stream);
    if (!values.empty()) {
        check(cudaMemcpyAsync(buffer->data(), values.data(), buffer->bytes(),
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (paged attention metadata to device)");
    }
    return buffer;
}

float* unique_pool(Tensor& pool, cudaStream_t stream) {
    return static_cast<CudaStorage&>(TensorAccess::unique_storage(pool)).floats_on(stream);
}

class CudaPagedAttention final : public PagedAttentionCapability {
  public:
    explicit CudaPagedAttention(const Runtime& runtime) : runtime_(runtime) {}

    void decode_attention(const Tensor& query, const Tensor& key_pool, const Tensor& value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          const tensor_ops::PagedAttentionOptions& options,
                          Tensor& context) const override {
        const Shape& pool = key_pool.shape();
        const std::size_t query_heads = query.shape()[1];
        PagedGeometry geometry;
        geometry.kv_heads = pool[1];
        geometry.page_size = pool[2];
        geometry.head_width = pool[3];
        geometry.group_size = query_heads / pool[1];
        geometry.requests = requests.size();
        geometry.softcap = options.softcap;

        std::vector<std::uint32_t> metadata(3 * requests.size());
        std::vector<std::size_t> firsts(requests.size());
        std::size_t longest = 1;
        for (std::size_t r = 0; r < requests.size(); ++r) {
            const auto& request = requests[r];
            const std::size_t first = options.window == 0 || options.window >= request.length
                                          ? 0
                                          : request.length - options.window;
            const std::size_t pages = (request.length + pool[2] - 1) / pool[2];
            metadata[3 * r] = narrow_to_u32(metadata.size() - 3 * requests.size());
            metadata[3 * r + 1] = narrow_to_u32(request.length);
            metadata[3 * r + 2] = narrow_to_u32(first);
            metadata.insert(metadata.end(), request.page_table.begin(),
                            request.page_table.begin() + static_cast<std::ptrdiff_t>(pages));
            firsts[r] = first;
            longest = std::max(longest, request.length - first);
        }
        geometry.longest_visible = longest;

        const cudaStream_t stream = current_stream();
        const std::unique_ptr<DeviceBuffer> device_metadata = upload_u32(metadata, stream);
        const auto* records = static_cast<const std::uint32_t*>(device_metadata->data());
        const float* q = device_input(query, stream);
        const float* keys = device_input(key_pool, stream);
        const float* values = device_input(value_pool, stream);
        float* out = device_output(context, stream);
        runtime_.checked_launch(
            stream,
            [firsts = std::move(firsts), longest, query_heads](std::size_t code) {
                const bool nan = (code & 1U) != 0;
                const std::size_t position = code >> 1U;
                const std::size_t pair = position / longest;
                const std::size_t r = pair / query_heads;
                const std::size_t h = pair % query_heads;
                const float score = nan ? std::numeric_limits<float>::quiet_NaN()
                                        : std::numeric_limits<float>::infinity();
                std::ostringstream message;
                message << operation << ": score of request " << r << ", head " << h
                        << ", position " << firsts[r] + position % longest << " is " << score
                        << " (NaN and +inf are rejected)";
                return std::make_exception_ptr(std::domain_error(message.str()));
            },
            [&](unsigned long long* slot) {
                paged_decode(geometry, q, keys, values, records, records + 3 * requests.size(),
                             scale, out, slot, stream);
            });
    }

    void write_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                         const Tensor& value,
                         std::span<const tensor_ops::PagedSlot> slots) const override {
        const Shape& pool = key_pool.shape();
        PagedGeometry geometry;
        geometry.kv_heads = pool[1];
        geometry.page_size = pool[2];
        geometry.head_width = pool[3];
        std::vector<std::uint32_t> packed(2 * slots.size());
        for (std::size_t r = 0; r < slots.size(); ++r) {
            packed[2 * r] = slots[r].page;
            packed[2 * r + 1] = slots[r].offset;
        }
        const cudaStream_t stream = current_stream();
        const std::unique_ptr<DeviceBuffer> device_slots = upload_u32(packed, stream);
        // Copy-on-write first: a copy of a pool never observes the write.
        float* keys = unique_pool(key_pool, stream);
        float* values = unique_pool(value_pool, stream);
        paged_write(geometry, static_cast<const std::uint32_t*>(device_slots->data()), slots.size(),
                    device_input(key, stream), device_input(value, stream), keys, values, stream);
    }

  private:
    const Runtime& runtime_;
};

}  // namespace

const PagedAttentionCapability* paged_attention_capability(const Runtime& runtime) {
    static const auto* capability = new CudaPagedAttention(runtime);
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
