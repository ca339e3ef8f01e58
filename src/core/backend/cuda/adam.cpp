// CUDA Adam (the CPU reference is cpu/adam.cpp): every request is one multi-tensor launch
// sequence over all its tensors (adam.cu), and a request that answers the host ends in one
// read of a small result struct. check_step runs the gradients' statistics, the global norm,
// the clip factor and the check of every slice under it on the device, back to back on the
// stream, so a step reads the host once; apply_update is one fused kernel over every slice,
// contiguous or paged moments alike (a slice is a stretch of its value with moments of its
// own size). Only when a request did find a non-finite element does the host read that
// element's value (a second, small read on the failure path).

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "core/backend/cuda/attention_nf4_adam.hpp"
#include "core/backend/cuda/attention_nf4_adam_kernels.hpp"
#include "core/backend/cuda/cuda_device.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr unsigned long long none = std::numeric_limits<unsigned long long>::max();

template <typename Record>
std::unique_ptr<DeviceBuffer> upload_records(const std::vector<Record>& records,
                                             cudaStream_t stream) {
    auto buffer = std::make_unique<DeviceBuffer>(records.size() * sizeof(Record), stream);
    if (!records.empty()) {
        check(cudaMemcpyAsync(buffer->data(), records.data(), buffer->bytes(),
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (Adam records to device)");
    }
    return buffer;
}

AdamDeviceResult read_result(const DeviceBuffer& result, cudaStream_t stream) {
    AdamDeviceResult host;
    result.use_on(stream);
    check(cudaMemcpyAsync(&host, result.data(), sizeof(host), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (Adam result to host)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (Adam result)");
    return host;
}

AdamDeviceScalars device_scalars(const AdamUpdateScalars& s) {
    AdamDeviceScalars k;
    k.beta1 = s.beta1;
    k.beta2 = s.beta2;
    k.one_minus_beta1 = 1.0 - s.beta1;
    k.one_minus_beta2 = 1.0 - s.beta2;
    k.bias_correction1 = s.bias_correction1;
    k.bias_correction2 = s.bias_correction2;
    k.learning_rate = s.learning_rate;
    k.epsilon = s.epsilon;
    k.clip_scale = s.clip_scale;
    k.decay_factor = s.decay_factor;
    return k;
}

// The statistics request of a tensor list on the device (null entries skipped).
class StatisticsRequest {
  public:
    StatisticsRequest(std::span<const Tensor* const> tensors, cudaStream_t stream) {
        std::uint64_t elements = 0;
        for (std::size_t t = 0; t < tensors.size(); ++t) {
            if (tensors[t] == nullptr) {
                continue;
            }
            AdamTensorRecord record;
            record.data = device_input(*tensors[t], stream);
            record.count = tensors[t]->numel();
            record.element_base = elements;
            record.partial_base = partials_;
            records_.push_back(record);
            listed_.push_back(t);
            elements += record.count;
            partials_ += (record.count + adam_norm_block - 1) / adam_norm_block;
        }
    }

    // Enqueues the statistics into `result` (clip factor too when maximum_norm >= 0).
    void enqueue(double maximum_norm, AdamDeviceResult* result, cudaStream_t stream) {
        if (records_.empty()) {
            return;
        }
        device_records_ = upload_records(records_, stream);
        partial_buffer_ = std::make_unique<DeviceBuffer>(2 * partials_ * sizeof(double), stream);
        adam_statistics(static_cast<const AdamTensorRecord*>(device_records_->data()),
                        records_.size(), partials_, static_cast<double*>(partial_buffer_->data()),
                        maximum_norm, result, stream);
    }

    // The host answer for a read result; the failing element's value is read from the device.
    [[nodiscard]] FirstNonFinite first_non_finite(std::span<const Tensor* const> tensors,
                                                  unsigned long long position) const {
        FirstNonFinite answer{tensors.size(), 0, 0.0F};
        if (position == none) {
            return answer;
        }
        std::size_t r = 0;
        while (r + 1 < records_.size() && records_[r + 1].element_base <= position) {
            ++r;
        }
        answer.tensor = listed_[r];
        answer.element = static_cast<std::size_t>(position - records_[r].element_base);
        answer.value = read_element(TensorAccess::storage(*tensors[answer.tensor]), answer.element);
        return answer;
    }

  private:
    std::vector<AdamTensorRecord> records_;
    std::vector<std::size_t> listed_;  // list index of each record
    std::uint64_t partials_ = 0;
    std::unique_ptr<DeviceBuffer> device_records_;
    std::unique_ptr<DeviceBuffer> partial_buffer_;
};

// The slices of a check or an update as device records (writable pointers only for the
// update, after copy-on-write).
std::vector<AdamSliceRecord> slice_records(std::span<const AdamSlice> slices, bool for_write,
                                           cudaStream_t stream) {
    std::vector<AdamSliceRecord> records;
    records.reserve(slices.size());
    std::uint64_t elements = 0;
    for (const AdamSlice& slice : slices) {
        AdamSliceRecord record;
        if (for_write) {
            record.value = device_output(*slice.value, stream);
            record.first_moment = device_output(*slice.first_moment, stream);
            record.second_moment = device_output(*slice.second_moment, stream);
        } else {
            // The check only reads; the kernels' record type is shared with the update.
            record.value = const_cast<float*>(device_input(*slice.value, stream));
            record.first_moment = const_cast<float*>(device_input(*slice.first_moment, stream));
            record.second_moment = const_cast<float*>(device_input(*slice.second_moment, stream));
        }
        record.gradient =
            slice.gradient != nullptr ? device_input(*slice.gradient, stream) : nullptr;
        record.offset = slice.offset;
        record.count = slice.first_moment->numel();
        record.element_base = elements;
        elements += record.count;
        records.push_back(record);
    }
    return records;
}

std::size_t total_of(const std::vector<AdamSliceRecord>& records) {
    return records.empty() ? 0 : records.back().element_base + records.back().count;
}

// The host AdamCheck of a read result.
AdamCheck check_answer(std::span<const AdamSlice> slices,
                       const std::vector<AdamSliceRecord>& records,
                       const AdamDeviceResult& result) {
    AdamCheck check{slices.size(), 0, 0.0F, slices.size(), 0};
    const auto locate = [&](unsigned long long position) {
        std::size_t s = 0;
        while (s + 1 < records.size() && records[s + 1].element_base <= position) {
            ++s;
        }
        return std::pair<std::size_t, std::size_t>(
            s, static_cast<std::size_t>(position - records[s].element_base));
    };
    if (result.first_value != none) {
        const auto [s, element] = locate(result.first_value);
        check.value_slice = s;
        check.value_element = element;
        check.value =
            read_element(TensorAccess::storage(*slices[s].value), slices[s].offset + element);
    }
    if (result.first_update != none) {
        const auto [s, element] = locate(result.first_update);
        check.update_slice = s;
        check.update_element = element;
    }
    return check;
}

class CudaAdam final : public AdamCapability {
  public:
    [[nodiscard]] GradientStatistics gradient_statistics(
        std::span<const Tensor* const> tensors) const override {
        const cudaStream_t stream = current_stream();
        const DeviceBuffer result(sizeof(AdamDeviceResult), stream);
        auto* device_result = static_cast<AdamDeviceResult*>(result.data());
        adam_reset(device_result, stream);
        StatisticsRequest request(tensors, stream);
        request.enqueue(-1.0, device_result, stream);
        const AdamDeviceResult host = read_result(result, stream);
        GradientStatistics statistics;
        statistics.squares.scale = host.scale;
        statistics.squares.scaled_squares = host.scaled_squares;
        statistics.first_non_finite = request.first_non_finite(tensors, host.first_gradient);
        return statistics;
    }

    [[nodiscard]] FirstNonFinite first_non_finite(
        std::span<const Tensor* const> tensors) const override {
        return gradient_statistics(tensors).first_non_finite;
    }

    [[nodiscard]] AdamCheck check_update(const AdamUpdateScalars& scalars,
                                         std::span<const AdamSlice> slices) const override {
        const cudaStream_t stream = current_stream();
        const DeviceBuffer result(sizeof(AdamDeviceResult), stream);
        auto* device_result = static_cast<AdamDeviceResult*>(result.data());
        adam_reset(device_result, stream);
        const std::vector<AdamSliceRecord> records = slice_records(slices, false, stream);
        const std::unique_ptr<DeviceBuffer> device_records = upload_records(records, stream);
        adam_check(static_cast<const AdamSliceRecord*>(device_records->data()), records.size(),
                   total_of(records), device_scalars(scalars), false, device_result, stream);
        return check_answer(slices, records, read_result(result, stream));
    }

    // The whole read-only pass on the device: statistics, norm, clip factor, then the check
    // under that factor; one host read of the result.
    [[nodiscard]] AdamStepCheck check_step(const AdamUpdateScalars& scalars,
                                           double maximum_gradient_norm,
                                           std::span<const Tensor* const> gradients,
                                           std::span<const AdamSlice> slices) const override {
        const cudaStream_t stream = current_stream();
        const DeviceBuffer result(sizeof(AdamDeviceResult), stream);
        auto* device_result = static_cast<AdamDeviceResult*>(result.data());
        adam_reset(device_result, stream);
        StatisticsRequest request(gradients, stream);
        request.enqueue(std::max(0.0, maximum_gradient_norm), device_result, stream);
        const std::vector<AdamSliceRecord> records = slice_records(slices, false, stream);
        const std::unique_ptr<DeviceBuffer> device_records = upload_records(records, stream);
        adam_check(static_cast<const AdamSliceRecord*>(device_records->data()), records.size(),
                   total_of(records), device_scalars(scalars), true, device_result, stream);
        const AdamDeviceResult host = read_result(result, stream);

        AdamStepCheck step;
        step.gradients.squares.scale = host.scale;
        step.gradients.squares.scaled_squares = host.scaled_squares;
        step.gradients.first_non_finite = request.first_non_finite(gradients, host.first_gradient);
        step.check = {slices.size(), 0, 0.0F, slices.size(), 0};
        if (step.gradients.first_non_finite.tensor != gradients.size()) {
            return step;
        }
        step.clip_scale = host.clip_scale;
        step.check = check_answer(slices, records, host);
        return step;
    }

    void apply_update(const AdamUpdateScalars& scalars,
                      std::span<const AdamSlice> slices) const override {
        // Copy-on-write first (clones allocate here, before any write).
        for (const AdamSlice& slice : slices) {
            static_cast<void>(TensorAccess::unique_storage(*slice.value));
            static_cast<void>(TensorAccess::unique_storage(*slice.first_moment));
            static_cast<void>(TensorAccess::unique_storage(*slice.second_moment));
        }
        const cudaStream_t stream = current_stream();
        const std::vector<AdamSliceRecord> records = slice_records(slices, true, stream);
        const std::unique_ptr<DeviceBuffer> device_records = upload_records(records, stream);
        adam_apply(static_cast<const AdamSliceRecord*>(device_records->data()), records.size(),
                   total_of(records), device_scalars(scalars), stream);
    }
};

}  // namespace

const AdamCapability* adam_capability(const Runtime& /*runtime*/) {
    static const auto* capability = new CudaAdam;
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
