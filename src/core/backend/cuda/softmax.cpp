// Softmax capability: one kernel per call (softmax.cu), rows reduced on the device. A slice
// the CPU reference rejects (NaN/+inf, or only -inf) is raised at the next sync point with the
// reference's category and message.

#include <sstream>
#include <stdexcept>

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/row_capabilities.hpp"
#include "core/backend/cuda/row_kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

// cpu/softmax.cpp's message.
std::exception_ptr bad_slice(const char* operation, std::size_t slice) {
    std::ostringstream message;
    message << operation << ": slice " << slice
            << " contains NaN or +inf, or has no finite value (every entry is -inf)";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

struct AxisView {
    std::size_t outer = 1;
    std::size_t extent = 1;
    std::size_t inner = 1;
};

AxisView view_of(const Tensor& x, std::size_t axis) {
    AxisView view;
    for (std::size_t d = 0; d < axis; ++d) {
        view.outer *= x.shape()[d];
    }
    view.extent = x.shape()[axis];
    for (std::size_t d = axis + 1; d < x.rank(); ++d) {
        view.inner *= x.shape()[d];
    }
    return view;
}

class CudaSoftmax final : public SoftmaxCapability {
  public:
    explicit CudaSoftmax(const Runtime& runtime) : runtime_(runtime) {}

    void softmax(const Tensor& x, std::size_t axis, Tensor& out) const override {
        const AxisView view = view_of(x, axis);
        launch_forward("softmax", x, view, false, 1.0F, out);
    }

    void softmax_backward(const Tensor& probabilities, const Tensor& upstream, std::size_t axis,
                          Tensor& out) const override {
        const AxisView view = view_of(probabilities, axis);
        const cudaStream_t stream = current_stream();
        softmax_backward_rows(device_input(probabilities, stream), device_input(upstream, stream),
                              view.outer, view.extent, view.inner, false, 1.0F,
                              device_output(out, stream), stream);
    }

    void causal_softmax(const Tensor& scores, float scale, Tensor& out) const override {
        launch_forward("causal_softmax", scores, causal_view(scores), true, scale, out);
    }

    void causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream, float scale,
                                 Tensor& out) const override {
        const AxisView view = causal_view(probabilities);
        const cudaStream_t stream = current_stream();
        softmax_backward_rows(device_input(probabilities, stream), device_input(upstream, stream),
                              view.outer, view.extent, 1, true, scale, device_output(out, stream),
                              stream);
    }

  private:
    // scores [B,H,T,T] -> B·H·T rows of T
    static AxisView causal_view(const Tensor& scores) {
        AxisView view;
        view.extent = scores.shape()[3];
        view.outer = scores.numel() / view.extent;
        return view;
    }

    void launch_forward(const char* operation, const Tensor& x, const AxisView& view, bool causal,
                        float scale, Tensor& out) const {
        const cudaStream_t stream = current_stream();
        const float* in = device_input(x, stream);
        float* y = device_output(out, stream);
        runtime_.checked_launch(
            stream, [operation](std::size_t slice) { return bad_slice(operation, slice); },
            [&](unsigned long long* slot) {
                softmax_rows(in, view.outer, view.extent, view.inner, causal, scale, y, slot,
                             stream);
            });
    }

    const Runtime& runtime_;
};

}  // namespace

const SoftmaxCapability* softmax_capability(const Runtime& runtime) {
    static const auto* capability = new CudaSoftmax(runtime);
    return capability;
}

}  // namespace riftco_transformer::detail::cuda
