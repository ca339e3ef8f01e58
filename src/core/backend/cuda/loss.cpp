// Loss capability: the fused softmax cross-entropy of LossCapability on the device (loss.cu):
// time window, 0/1 row mask and the mean over N rows exactly as the CPU reference defines
// them. Value checks are deferred to the next sync point and raised with the reference's
// category and message: a non-finite target logit (domain_error, first row) before a mean
// that is not a finite float (overflow_error).

#include <cfloat>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/row_capabilities.hpp"
#include "core/backend/cuda/row_kernels.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// Storage reads only: the checks are worded inside a sync point, which must not start another.
std::vector<float> floats_of(const Tensor& tensor) {
    std::vector<float> values(tensor.numel());
    TensorAccess::storage(tensor).copy_to_host(0, values);
    return values;
}

std::vector<std::uint32_t> ids_of(const IndexTensor& indices) {
    std::vector<std::uint32_t> ids(indices.numel());
    TensorAccess::storage(indices).copy_indices_to_host(0, ids);
    return ids;
}

// cpu/loss.cpp's domain_error for row `row`.
std::exception_ptr non_finite_target(const Tensor& logits, const IndexTensor& targets,
                                     std::size_t row) {
    const std::size_t vocabulary = logits.shape().back();
    std::uint32_t target = 0;
    TensorAccess::storage(targets).copy_indices_to_host(row, std::span<std::uint32_t>(&target, 1));
    std::ostringstream message;
    message << "cross_entropy: logits at position " << row << ", target " << target
            << " is not finite ("
            << read_element(TensorAccess::storage(logits), row * vocabulary + target) << ")";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

// The overflow_error of a mean the device found not to be a finite float. The reference words
// it from its own double mean (NaN with its sign, or a value past FLT_MAX), so the inputs are
// read back and the CPU reference raises it; should the reference's mean round within range
// (a rounding at the very limit), the device's mean is reported with the same wording.
struct OverflowReport {
    Tensor logits;
    IndexTensor targets;
    std::optional<IndexTensor> selected;
    LossWindow window;
    std::shared_ptr<DeviceBuffer> mean;

    std::exception_ptr operator()() const {
        const std::vector<float> values = floats_of(logits);
        const std::vector<std::uint32_t> ids = ids_of(targets);
        const Tensor host_logits(logits.shape(), values, ExecutionBackend::Cpu);
        const IndexTensor host_targets({ids.size()}, ids, ExecutionBackend::Cpu);
        std::optional<IndexTensor> host_selected;
        LossWindow host_window = window;
        if (selected.has_value()) {
            const std::vector<std::uint32_t> flags = ids_of(*selected);
            host_selected.emplace(Shape{flags.size()}, flags, ExecutionBackend::Cpu);
            host_window.selected = &*host_selected;
        }
        Tensor host_loss(Shape{}, ExecutionBackend::Cpu);
        Tensor host_gradient(logits.shape(), ExecutionBackend::Cpu);
        try {
            find_backend_adapter(ExecutionBackend::Cpu)
                ->loss()
                ->cross_entropy(host_logits, host_targets, host_window, host_loss, host_gradient);
        } catch (const std::overflow_error&) {
            return std::current_exception();
        }
        double device_mean = 0.0;
        const cudaStream_t stream = current_stream();
        mean->use_on(stream);
        check(cudaMemcpyAsync(&device_mean, mean->data(), sizeof(double), cudaMemcpyDeviceToHost,
                              stream),
              "cudaMemcpyAsync (cross_entropy mean)");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (cross_entropy mean)");
        std::ostringstream message;
        message << "cross_entropy: mean loss " << device_mean
                << " is not representable as a finite float";
        return std::make_exception_ptr(std::overflow_error(message.str()));
    }
};

class CudaLoss final : public LossCapability {
  public:
    explicit CudaLoss(const Runtime& runtime) : runtime_(runtime) {}

    void cross_entropy(const Tensor& logits, const IndexTensor& targets, LossWindow window,
                       Tensor& loss, Tensor& gradient) const override {
        const std::size_t vocabulary = logits.shape().back();
        const std::size_t rows = logits.numel() / vocabulary;
        const std::size_t positions = rows / window.time_extent * window.count;
        const bool masked = window.selected != nullptr;
        const std::size_t averaged = masked ? window.selected_count : positions;
        const auto inverse_count = static_cast<float>(1.0 / static_cast<double>(averaged));

        const cudaStream_t stream = current_stream();
        const float* z = device_input(logits, stream);
        const std::uint32_t* ids = device_indices(targets, stream);
        const std::uint32_t* flags = masked ? device_indices(*window.selected, stream) : nullptr;
        float* g = device_output(gradient, stream);
        float* out = device_output(loss, stream);
        // Scratch from the pool, freed in stream order after the kernels that use it; the mean
        // lives until its check has been read.
        const DeviceBuffer row_loss(rows * sizeof(double), stream);
        auto mean = std::make_shared<DeviceBuffer>(sizeof(double), stream);
        auto* losses = static_cast<double*>(row_loss.data());

        runtime_.checked_launch(
            stream,
            [logits, targets](std::size_t row) { return non_finite_target(logits, targets, row); },
            [&](unsigned long long* slot) {
                cross_entropy_rows(z, ids, flags, rows, vocabulary, window.time_extent,
                                   window.offset, window.count, inverse_count, losses, g, slot,
                                   stream);
            });

        OverflowReport report{logits, targets, std::nullopt, window, mean};
        report.window.selected = nullptr;
        if (masked) {
            report.selected = *window.selected;
        }
        runtime_.checked_launch(
            stream, [report = std::move(report)](std::size_t /*position*/) { return report(); },
            [&](unsigned long long* slot) {
                cross_entropy_mean(losses, rows, averaged, out, static_cast<double*>(mean->data()),
                                   slot, stream);
            });
    }

  private:
    const Runtime& runtime_;
};

}  // namespace

const LossCapability* loss_capability(const Runtime& runtime) {
    static const auto* capability = new CudaLoss(runtime);
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
