// Elementwise capability: one kernel per call (elementwise.cu). Divide, log and sqrt check
// their domain on the device; the first violation is raised at the next sync point with the
// CPU's category and message.

#include <sstream>
#include <stdexcept>

#include "core/backend/cuda/cuda_device.hpp"
#include "core/backend/cuda/kernels.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

BinaryKernel kernel_for(BinaryOperation operation) {
    switch (operation) {
        case BinaryOperation::Add:
            return BinaryKernel::Add;
        case BinaryOperation::Subtract:
            return BinaryKernel::Subtract;
        case BinaryOperation::Multiply:
            return BinaryKernel::Multiply;
        case BinaryOperation::Divide:
            return BinaryKernel::Divide;
    }
    throw std::invalid_argument("cuda binary: unknown operation");
}

UnaryKernel kernel_for(UnaryOperation operation) {
    switch (operation) {
        case UnaryOperation::Negate:
            return UnaryKernel::Negate;
        case UnaryOperation::Exp:
            return UnaryKernel::Exp;
        case UnaryOperation::Log:
            return UnaryKernel::Log;
        case UnaryOperation::Sqrt:
            return UnaryKernel::Sqrt;
        case UnaryOperation::Erf:
            return UnaryKernel::Erf;
        case UnaryOperation::Gelu:
            return UnaryKernel::Gelu;
        case UnaryOperation::GeluTanh:
            return UnaryKernel::GeluTanh;
        case UnaryOperation::Relu:
            return UnaryKernel::Relu;
        case UnaryOperation::Silu:
            return UnaryKernel::Silu;
        case UnaryOperation::Tanh:
            return UnaryKernel::Tanh;
    }
    throw std::invalid_argument("cuda unary: unknown operation");
}

DerivativeKernel kernel_for(UnaryDerivative derivative) {
    switch (derivative) {
        case UnaryDerivative::Gelu:
            return DerivativeKernel::Gelu;
        case UnaryDerivative::GeluTanh:
            return DerivativeKernel::GeluTanh;
        case UnaryDerivative::Relu:
            return DerivativeKernel::Relu;
        case UnaryDerivative::Silu:
            return DerivativeKernel::Silu;
    }
    throw std::invalid_argument("cuda unary_backward: unknown derivative");
}

// The CPU reference's message (cpu/elementwise.cpp): "<operation>: <argument> element <i> is
// <value> (<requirement>)".
std::exception_ptr domain_error_at(const char* operation, const char* argument, std::size_t index,
                                   float value, const char* requirement) {
    std::ostringstream message;
    message << operation << ": " << argument << " element " << index << " is " << value << " ("
            << requirement << ")";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

class CudaElementwise final : public ElementwiseCapability {
  public:
    explicit CudaElementwise(const Runtime& runtime) : runtime_(runtime) {}

    void binary(BinaryOperation operation, const Tensor& left, const Tensor& right,
                Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        const float* a = device_input(left, stream);
        const float* b = device_input(right, stream);
        float* y = device_output(out, stream);
        const std::size_t count = out.numel();
        if (operation != BinaryOperation::Divide) {
            cuda::binary(kernel_for(operation), a, b, y, count, nullptr, stream);
            return;
        }
        // The denominator's storage stays alive (and unchanged: storages are copy-on-write)
        // until the check is read.
        std::shared_ptr<Storage> denominator = TensorAccess::shared_storage(right);
        runtime_.checked_launch(
            stream,
            [denominator](std::size_t position) {
                return domain_error_at("divide", "denominator", position,
                                       read_element(*denominator, position), "must be non-zero");
            },
            [&](unsigned long long* slot) {
                cuda::binary(BinaryKernel::Divide, a, b, y, count, slot, stream);
            });
    }

    void unary(UnaryOperation operation, const Tensor& x, Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        const float* v = device_input(x, stream);
        float* y = device_output(out, stream);
        const std::size_t count = out.numel();
        if (operation != UnaryOperation::Log && operation != UnaryOperation::Sqrt) {
            cuda::unary(kernel_for(operation), v, y, count, nullptr, stream);
            return;
        }
        const bool log = operation == UnaryOperation::Log;
        std::shared_ptr<Storage> input = TensorAccess::shared_storage(x);
        runtime_.checked_launch(
            stream,
            [input, log](std::size_t position) {
                return domain_error_at(log ? "log" : "sqrt", "x", position,
                                       read_element(*input, position),
                                       log ? "must be > 0" : "must be >= 0");
            },
            [&](unsigned long long* slot) {
                cuda::unary(kernel_for(operation), v, y, count, slot, stream);
            });
    }

    void affine(const Tensor& x, float multiplier, float addend, Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        cuda::affine(device_input(x, stream), multiplier, addend, device_output(out, stream),
                     out.numel(), stream);
    }

    void unary_backward(UnaryDerivative derivative, const Tensor& x, const Tensor& upstream,
                        Tensor& out) const override {
        const cudaStream_t stream = current_stream();
        cuda::unary_backward(kernel_for(derivative), device_input(x, stream),
                             device_input(upstream, stream), device_output(out, stream),
                             out.numel(), stream);
    }

  private:
    const Runtime& runtime_;
};

}  // namespace

std::unique_ptr<ElementwiseCapability> make_elementwise(const Runtime& runtime) {
    return std::make_unique<CudaElementwise>(runtime);
}

}  // namespace riftco_transformer::detail::cuda
