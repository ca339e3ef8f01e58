// The PJRT backend: one adapter implementation behind two stable identities.
// - "tpu" (ExecutionBackend::Tpu) loads RIFTCO_TRANSFORMER_TPU_LIBRARY, else TPU_LIBRARY_PATH,
//   else libtpu.so from the loader's search path;
// - "pjrt" (ExecutionBackend::Pjrt) loads the plugin RIFTCO_TRANSFORMER_PJRT_PLUGIN names.
// Each identity loads its plugin once, on the first availability question; a failure is kept
// and answered from then on (the reason says which step failed).

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/pjrt/pjrt_device.hpp"
#include "core/backend/unavailable/unavailable_adapter.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail {
namespace pjrt {

// ---- storage -------------------------------------------------------------------------------

BufferPointer PjrtStorage::buffer(ElementType type) const {
    if (buffer_ == nullptr) {
        // Contents are unspecified until written; zeros keep every read defined.
        const std::vector<std::uint32_t> zeros(element_count(), 0U);
        buffer_ = context_.runtime->upload(type, zeros.data(), zeros.size());
    }
    return buffer_;
}

void PjrtStorage::read(std::size_t offset, void* destination, std::size_t count,
                       ElementType type) const {
    if (count == 0) {
        return;
    }
    const BufferPointer source = buffer(type);
    const std::size_t size = element_size(type);
    if (offset == 0 && count == element_count()) {
        context_.runtime->download(*source, destination);
        return;
    }
    std::vector<unsigned char> whole(element_count() * size);
    context_.runtime->download(*source, whole.data());
    std::memcpy(destination, whole.data() + offset * size, count * size);
}

void PjrtStorage::write(std::size_t offset, const void* source, std::size_t count,
                        ElementType type) {
    if (count == 0) {
        return;
    }
    if (offset == 0 && count == element_count()) {
        buffer_ = context_.runtime->upload(type, source, count);
        return;
    }
    // A partial write: the new values go up, a program splices them into a new buffer.
    const BufferPointer values = context_.runtime->upload(type, source, count);
    const BufferPointer start = index_scalar_buffer(context_, static_cast<std::uint32_t>(offset));
    const char* element = type == ElementType::F32 ? "f32" : "ui32";
    const std::string key = std::string("write_range/") + element + "/" +
                            std::to_string(element_count()) + "/" + std::to_string(count);
    const std::size_t total = element_count();
    auto text = [&] {
        ProgramText program;
        const std::string whole = program.parameter(tensor_type({total}, element));
        const std::string part = program.parameter(tensor_type({count}, element));
        const std::string at = program.parameter(tensor_type({1}, "ui32"));
        const std::string at_scalar =
            program.let("stablehlo.reshape " + at + " : (tensor<1xui32>) -> tensor<ui32>");
        const std::string result = program.let(
            "stablehlo.dynamic_update_slice " + whole + ", " + part + ", " + at_scalar + " : (" +
            tensor_type({total}, element) + ", " + tensor_type({count}, element) +
            ", tensor<ui32>) -> " + tensor_type({total}, element));
        const std::pair<std::string, std::string> results[] = {
            {result, tensor_type({total}, element)}};
        return program.finish(results);
    };
    buffer_ = run(context_, key, text, {buffer(type), values, start}, {{type, total}})[0];
}

void PjrtStorage::copy_to_host(std::size_t offset, std::span<float> destination) const {
    read(offset, destination.data(), destination.size(), ElementType::F32);
}
void PjrtStorage::copy_from_host(std::size_t offset, std::span<const float> source) {
    write(offset, source.data(), source.size(), ElementType::F32);
}
void PjrtStorage::copy_indices_to_host(std::size_t offset,
                                       std::span<std::uint32_t> destination) const {
    read(offset, destination.data(), destination.size(), ElementType::U32);
}
void PjrtStorage::copy_indices_from_host(std::size_t offset,
                                         std::span<const std::uint32_t> source) {
    write(offset, source.data(), source.size(), ElementType::U32);
}

BufferPointer buffer_of(const Tensor& tensor) {
    return static_cast<const PjrtStorage&>(TensorAccess::storage(tensor)).buffer(ElementType::F32);
}

BufferPointer buffer_of(const IndexTensor& indices) {
    return static_cast<const PjrtStorage&>(TensorAccess::storage(indices)).buffer(ElementType::U32);
}

void give(const Context& context, Tensor& out, BufferPointer buffer) {
    TensorAccess::replace_storage(
        out, std::make_shared<PjrtStorage>(context, out.numel(), std::move(buffer)));
}

std::vector<BufferPointer> run(const Context& context, const std::string& key,
                               const std::function<std::string()>& text,
                               std::span<const BufferPointer> inputs,
                               std::span<const Output> outputs) {
    LoadedExecutable* executable = context.runtime->program(key, text);
    std::vector<ElementType> types;
    std::vector<std::size_t> counts;
    for (const Output& output : outputs) {
        types.push_back(output.type);
        counts.push_back(output.count);
    }
    return context.runtime->execute(executable, inputs, types, counts);
}

std::vector<BufferPointer> run(const Context& context, const std::string& key,
                               const std::function<std::string()>& text,
                               std::initializer_list<BufferPointer> inputs,
                               std::initializer_list<Output> outputs) {
    return run(context, key, text, std::span<const BufferPointer>(inputs.begin(), inputs.size()),
               std::span<const Output>(outputs.begin(), outputs.size()));
}

BufferPointer scalar_buffer(const Context& context, float value) {
    return context.runtime->upload(ElementType::F32, &value, 1);
}

BufferPointer index_scalar_buffer(const Context& context, std::uint32_t value) {
    return context.runtime->upload(ElementType::U32, &value, 1);
}

void defer_check(const Context& context, BufferPointer flag,
                 std::function<std::exception_ptr(std::size_t position)> raise) {
    context.runtime->defer({std::move(flag), std::move(raise)});
}

float read_element(const Context& context, const BufferPointer& buffer, std::size_t position) {
    std::vector<float> values(buffer->element_count());
    context.runtime->download(*buffer, values.data());
    return values.at(position);
}

std::string shape_key(std::span<const std::size_t> shape) {
    std::string key;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i != 0) {
            key += 'x';
        }
        key += std::to_string(shape[i]);
    }
    return key.empty() ? "scalar" : key;
}

std::string first_violation_flag(ProgramText& program, const std::string& bad,
                                 std::span<const std::size_t> shape) {
    const std::size_t count = element_count(shape);
    const std::string flat_bad = program.flatten(bad, shape, "i1");
    const std::string positions =
        program.let("stablehlo.iota dim = 0 : " + tensor_type({count}, "i32"));
    const std::string one = program.integer_constant(1, std::vector<std::size_t>{count});
    const std::string none = program.integer_constant(0, std::vector<std::size_t>{count});
    const std::string numbered = program.let("stablehlo.add " + positions + ", " + one + " : " +
                                             tensor_type({count}, "i32"));
    // max(bad ? count + 1 − (position + 1) : 0) finds the smallest failing position.
    const std::string limit = program.integer_constant(static_cast<std::int64_t>(count) + 1,
                                                       std::vector<std::size_t>{count});
    const std::string reversed = program.let("stablehlo.subtract " + limit + ", " + numbered +
                                             " : " + tensor_type({count}, "i32"));
    const std::string scored =
        program.let("stablehlo.select " + flat_bad + ", " + reversed + ", " + none + " : " +
                    tensor_type({count}, "i1") + ", " + tensor_type({count}, "i32"));
    const std::string zero = program.integer_constant(0, std::vector<std::size_t>{});
    const std::string best =
        program.let("stablehlo.reduce(" + scored + " init: " + zero +
                    ") applies stablehlo.maximum across dimensions = [0] : (" +
                    tensor_type({count}, "i32") + ", tensor<i32>) -> tensor<i32>");
    // flag = best == 0 ? 0 : count + 1 − best  (= 1 + first position)
    const std::string total =
        program.integer_constant(static_cast<std::int64_t>(count) + 1, std::vector<std::size_t>{});
    const std::string position =
        program.let("stablehlo.subtract " + total + ", " + best + " : tensor<i32>");
    const std::string is_clear = program.let("stablehlo.compare EQ, " + best + ", " + zero +
                                             ", SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>");
    const std::string flag = program.let("stablehlo.select " + is_clear + ", " + zero + ", " +
                                         position + " : tensor<i1>, tensor<i32>");
    return program.let("stablehlo.reshape " + flag + " : (tensor<i32>) -> tensor<1xi32>");
}

std::string reduce(ProgramText& program, const std::string& value,
                   std::span<const std::size_t> shape, std::span<const std::size_t> axes,
                   bool maximum) {
    Steps steps(program);
    return steps.reduce(maximum ? "maximum" : "add", value, Steps::Dims(shape.begin(), shape.end()),
                        Steps::Dims(axes.begin(), axes.end()));
}

namespace {

class PjrtStorageCapability final : public StorageCapability {
  public:
    explicit PjrtStorageCapability(const Context& context) : context_(context) {}

    std::shared_ptr<Storage> allocate(std::size_t element_count) const override {
        return std::make_shared<PjrtStorage>(context_, element_count, nullptr);
    }
    // Buffers are immutable, so a clone shares its source's buffer.
    std::shared_ptr<Storage> clone(const Storage& source) const override {
        const auto& pjrt_source = static_cast<const PjrtStorage&>(source);
        return std::make_shared<PjrtStorage>(
            context_, source.element_count(),
            pjrt_source.has_buffer() ? pjrt_source.buffer(ElementType::F32) : nullptr);
    }
    void fill(Storage& storage, float value) const override {
        const std::size_t count = storage.element_count();
        const std::string key = "fill/" + std::to_string(count);
        auto text = [&] {
            ProgramText program;
            const std::string scalar = program.parameter("tensor<1xf32>");
            const std::string value_scalar =
                program.let("stablehlo.reshape " + scalar + " : (tensor<1xf32>) -> tensor<f32>");
            const std::string filled =
                program.broadcast_scalar(value_scalar, std::vector<std::size_t>{count});
            const std::pair<std::string, std::string> results[] = {{filled, tensor_type({count})}};
            return program.finish(results);
        };
        static_cast<PjrtStorage&>(storage).set_buffer(run(
            context_, key, text, {scalar_buffer(context_, value)}, {{ElementType::F32, count}})[0]);
    }
    void write_range(Tensor& tensor, std::size_t offset,
                     std::span<const float> values) const override {
        // A new storage with the range written (PjrtStorage::write splices on the device); the
        // old storage, possibly shared with copies, is untouched.
        const auto& old_storage = static_cast<const PjrtStorage&>(TensorAccess::storage(tensor));
        auto updated = std::make_shared<PjrtStorage>(context_, old_storage.element_count(),
                                                     old_storage.buffer(ElementType::F32));
        updated->copy_from_host(offset, values);
        TensorAccess::replace_storage(tensor, std::move(updated));
    }
    std::shared_ptr<Storage> import_from(const Storage& source) const override {
        if (source.backend() != ExecutionBackend::Cpu) {
            return nullptr;  // another device: staged through host memory by the caller
        }
        // Straight from the CPU storage's memory, with no intermediate host vector.
        const auto& cpu_source = static_cast<const CpuStorage&>(source);
        return std::make_shared<PjrtStorage>(
            context_, source.element_count(),
            context_.runtime->upload(ElementType::F32, cpu_source.data(), source.element_count()));
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<StorageCapability> make_storage(const Context& context) {
    return std::make_unique<PjrtStorageCapability>(context);
}

// ---- the adapter ---------------------------------------------------------------------------

namespace {

class PjrtAdapter final : public BackendAdapter {
  public:
    explicit PjrtAdapter(ExecutionBackend backend) : context_{backend, nullptr} {}

    ExecutionBackend backend() const noexcept override { return context_.backend; }
    bool is_available() const noexcept override {
        ensure_loaded();
        return context_.runtime != nullptr;
    }
    std::string_view unavailability_reason() const noexcept override {
        ensure_loaded();
        return reason_;
    }

    const StorageCapability* storage() const noexcept override { return storage_.get(); }
    const LayoutCapability* layout() const noexcept override { return layout_.get(); }
    const ElementwiseCapability* elementwise() const noexcept override {
        return elementwise_.get();
    }
    const ReductionCapability* reduction() const noexcept override { return reduction_.get(); }
    const MatmulCapability* matmul() const noexcept override { return matmul_.get(); }
    const SoftmaxCapability* softmax() const noexcept override { return softmax_.get(); }
    const IndexingCapability* indexing() const noexcept override { return indexing_.get(); }
    const NormalizationCapability* normalization() const noexcept override {
        return normalization_.get();
    }
    const LossCapability* loss() const noexcept override { return loss_.get(); }
    const AttentionCapability* attention() const noexcept override { return attention_.get(); }
    const PagedAttentionCapability* paged_attention() const noexcept override {
        return paged_attention_.get();
    }
    const QuantizedLinearCapability* quantized_linear() const noexcept override {
        return quantized_linear_.get();
    }
    const AdamCapability* adam() const noexcept override { return adam_.get(); }

    void collect_deferred_errors() const override {
        if (context_.runtime != nullptr) {
            context_.runtime->collect();
        }
    }

    [[nodiscard]] const Runtime* runtime() const noexcept {
        ensure_loaded();
        return context_.runtime;
    }

  private:
    void ensure_loaded() const noexcept {
        std::call_once(loaded_, [this] {
            try {
                load();
            } catch (const std::exception& error) {
                reason_ = std::string("PJRT initialisation failed: ") + error.what();
                context_.runtime = nullptr;
            } catch (...) {
                reason_ = "PJRT initialisation failed with an unknown error";
                context_.runtime = nullptr;
            }
        });
    }

    void load() const {
        std::vector<std::string> candidates;
        if (context_.backend == ExecutionBackend::Tpu) {
            for (const char* variable : {"RIFTCO_TRANSFORMER_TPU_LIBRARY", "TPU_LIBRARY_PATH"}) {
                const char* value = std::getenv(variable);
                if (value != nullptr && *value != '\0') {
                    candidates.emplace_back(value);
                    break;
                }
            }
            if (candidates.empty()) {
                candidates.emplace_back("libtpu.so");
            }
        } else {
            const char* value = std::getenv("RIFTCO_TRANSFORMER_PJRT_PLUGIN");
            if (value == nullptr || *value == '\0') {
                reason_ =
                    "no PJRT plugin is named: set RIFTCO_TRANSFORMER_PJRT_PLUGIN to the path of a "
                    "PJRT plugin library (one that exports GetPjrtApi)";
                return;
            }
            candidates.emplace_back(value);
        }
        LoadFailure failure{LoadFailure::Kind::LoadFailed, {}};
        Runtime* runtime = Runtime::load(candidates.front(), context_.backend, failure);
        if (runtime == nullptr) {
            const char* what = context_.backend == ExecutionBackend::Tpu ? "the TPU runtime library"
                                                                         : "the PJRT plugin";
            switch (failure.kind) {
                case LoadFailure::Kind::LoadFailed:
                    reason_ = std::string(what) + " failed to load: " + failure.message;
                    break;
                case LoadFailure::Kind::IncompatibleVersion:
                    reason_ =
                        std::string(what) + " has an incompatible PJRT version: " + failure.message;
                    break;
                case LoadFailure::Kind::NoDevice:
                    reason_ = std::string(what) + " found no device: " + failure.message;
                    break;
            }
            return;
        }
        context_.runtime = runtime;
        storage_ = make_storage(context_);
        layout_ = make_layout(context_);
        elementwise_ = make_elementwise(context_);
        reduction_ = make_reduction(context_);
        matmul_ = make_matmul(context_);
        softmax_ = make_softmax(context_);
        indexing_ = make_indexing(context_);
        normalization_ = make_normalization(context_);
        loss_ = make_loss(context_);
        attention_ = make_attention(context_);
        paged_attention_ = make_paged_attention(context_);
        quantized_linear_ = make_quantized_linear(context_);
        adam_ = make_adam(context_);
    }

    mutable Context context_;
    mutable std::once_flag loaded_;
    mutable std::string reason_;
    mutable std::unique_ptr<StorageCapability> storage_;
    mutable std::unique_ptr<LayoutCapability> layout_;
    mutable std::unique_ptr<ElementwiseCapability> elementwise_;
    mutable std::unique_ptr<ReductionCapability> reduction_;
    mutable std::unique_ptr<MatmulCapability> matmul_;
    mutable std::unique_ptr<SoftmaxCapability> softmax_;
    mutable std::unique_ptr<IndexingCapability> indexing_;
    mutable std::unique_ptr<NormalizationCapability> normalization_;
    mutable std::unique_ptr<LossCapability> loss_;
    mutable std::unique_ptr<AttentionCapability> attention_;
    mutable std::unique_ptr<PagedAttentionCapability> paged_attention_;
    mutable std::unique_ptr<QuantizedLinearCapability> quantized_linear_;
    mutable std::unique_ptr<AdamCapability> adam_;
};

// Process lifetime, never destroyed (see runtime.hpp).
PjrtAdapter& adapter_for(ExecutionBackend backend) {
    if (backend == ExecutionBackend::Tpu) {
        static auto* tpu = new PjrtAdapter(ExecutionBackend::Tpu);
        return *tpu;
    }
    static auto* pjrt = new PjrtAdapter(ExecutionBackend::Pjrt);
    return *pjrt;
}

}  // namespace

const Runtime* loaded_runtime(ExecutionBackend backend) noexcept {
    return adapter_for(backend).runtime();
}

}  // namespace pjrt

const BackendAdapter& tpu_adapter() noexcept {
    return pjrt::adapter_for(ExecutionBackend::Tpu);
}

const BackendAdapter& pjrt_adapter() noexcept {
    return pjrt::adapter_for(ExecutionBackend::Pjrt);
}

}  // namespace riftco_transformer::detail
