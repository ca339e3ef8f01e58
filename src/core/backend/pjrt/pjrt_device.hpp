#pragma once
// What every PJRT capability shares: the storage of a tensor on this backend (a device buffer,
// never a host mirror), how a capability reads its inputs' buffers, runs a cached program and
// hands its outputs their fresh buffers, and how it records a value-domain check.

#include <cstddef>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend/adapter.hpp"
#include "core/backend/pjrt/program.hpp"
#include "core/backend/pjrt/runtime.hpp"
#include "core/backend/storage.hpp"

namespace riftco_transformer::detail::pjrt {

// One identity's runtime; `runtime` is set once, when the plugin loads.
struct Context {
    ExecutionBackend backend;
    Runtime* runtime = nullptr;
};

// A tensor's (or index tensor's) elements on the device: one immutable rank-1 buffer, or none
// yet (an output allocated but not written; reading it gives zeros). Writes replace the
// buffer: a buffer is never changed once made.
class PjrtStorage final : public Storage {
  public:
    PjrtStorage(const Context& context, std::size_t element_count, BufferPointer buffer)
        : Storage(context.backend, element_count), context_(context), buffer_(std::move(buffer)) {}

    // The buffer, made (zero-filled, on the device) when there is none yet.
    [[nodiscard]] BufferPointer buffer(ElementType type) const;
    [[nodiscard]] bool has_buffer() const noexcept { return buffer_ != nullptr; }
    void set_buffer(BufferPointer buffer) { buffer_ = std::move(buffer); }

    void copy_to_host(std::size_t offset, std::span<float> destination) const override;
    void copy_from_host(std::size_t offset, std::span<const float> source) override;
    void copy_indices_to_host(std::size_t offset,
                              std::span<std::uint32_t> destination) const override;
    void copy_indices_from_host(std::size_t offset, std::span<const std::uint32_t> source) override;

  private:
    void read(std::size_t offset, void* destination, std::size_t count, ElementType type) const;
    void write(std::size_t offset, const void* source, std::size_t count, ElementType type);

    const Context& context_;
    mutable BufferPointer buffer_;
};

// The f32 buffer of a tensor / the u32 buffer of an index tensor of this backend.
[[nodiscard]] BufferPointer buffer_of(const Tensor& tensor);
[[nodiscard]] BufferPointer buffer_of(const IndexTensor& indices);
// Gives `out` a fresh storage holding `buffer` (the capability contract's replaceable output).
void give(const Context& context, Tensor& out, BufferPointer buffer);

struct Output {
    ElementType type;
    std::size_t count;
};

// Runs the program cached under `key` (compiled from `text()` on first use).
[[nodiscard]] std::vector<BufferPointer> run(const Context& context, const std::string& key,
                                             const std::function<std::string()>& text,
                                             std::span<const BufferPointer> inputs,
                                             std::span<const Output> outputs);
[[nodiscard]] std::vector<BufferPointer> run(const Context& context, const std::string& key,
                                             const std::function<std::string()>& text,
                                             std::initializer_list<BufferPointer> inputs,
                                             std::initializer_list<Output> outputs);

// A rank-0 scalar of this backend, uploaded (bit-exact) for a program parameter.
[[nodiscard]] BufferPointer scalar_buffer(const Context& context, float value);
[[nodiscard]] BufferPointer index_scalar_buffer(const Context& context, std::uint32_t value);

// Records a device check (see Runtime::defer): `flag` is an s32 rank-1 buffer of one element.
void defer_check(const Context& context, BufferPointer flag,
                 std::function<std::exception_ptr(std::size_t position)> raise);
// One element of a device buffer, read for an error message (inside a sync point).
[[nodiscard]] float read_element(const Context& context, const BufferPointer& buffer,
                                 std::size_t position);

// The shape key fragment "2x3x4".
[[nodiscard]] std::string shape_key(std::span<const std::size_t> shape);

// ---- program fragments shared by several capabilities ---------------------------------------
// The first-violation flag of a boolean array `bad` of `shape`: s32 rank-1 [1] holding 0, or
// 1 + the row-major position of the first true element.
[[nodiscard]] std::string first_violation_flag(ProgramText& program, const std::string& bad,
                                               std::span<const std::size_t> shape);
// Σ or max of f32 `value` (shape) over `axes`; the result keeps the other axes in order
// (Steps::reduce).
[[nodiscard]] std::string reduce(ProgramText& program, const std::string& value,
                                 std::span<const std::size_t> shape,
                                 std::span<const std::size_t> axes, bool maximum);
// reduction.cpp: multiplier · Σ of `value` (shape) over `axes` in float32, a zero result +0;
// layout.cpp's sum_to_shape uses it too.
[[nodiscard]] std::string scaled_sum(ProgramText& program, const std::string& value,
                                     std::span<const std::size_t> shape,
                                     std::span<const std::size_t> axes,
                                     std::span<const std::size_t> result_shape, float multiplier);

// The runtime behind an identity (Tpu or Pjrt), loading it on first use; null when
// unavailable. For tests and benchmarks (compile and transfer statistics).
[[nodiscard]] const Runtime* loaded_runtime(ExecutionBackend backend) noexcept;

// The capability factories, one per file.
[[nodiscard]] std::unique_ptr<StorageCapability> make_storage(const Context& context);
[[nodiscard]] std::unique_ptr<LayoutCapability> make_layout(const Context& context);
[[nodiscard]] std::unique_ptr<ElementwiseCapability> make_elementwise(const Context& context);
[[nodiscard]] std::unique_ptr<ReductionCapability> make_reduction(const Context& context);
[[nodiscard]] std::unique_ptr<MatmulCapability> make_matmul(const Context& context);
[[nodiscard]] std::unique_ptr<SoftmaxCapability> make_softmax(const Context& context);
[[nodiscard]] std::unique_ptr<IndexingCapability> make_indexing(const Context& context);
[[nodiscard]] std::unique_ptr<NormalizationCapability> make_normalization(const Context& context);
[[nodiscard]] std::unique_ptr<LossCapability> make_loss(const Context& context);
[[nodiscard]] std::unique_ptr<AttentionCapability> make_attention(const Context& context);
[[nodiscard]] std::unique_ptr<PagedAttentionCapability> make_paged_attention(
    const Context& context);
[[nodiscard]] std::unique_ptr<QuantizedLinearCapability> make_quantized_linear(
    const Context& context);
[[nodiscard]] std::unique_ptr<AdamCapability> make_adam(const Context& context);

}  // namespace riftco_transformer::detail::pjrt
