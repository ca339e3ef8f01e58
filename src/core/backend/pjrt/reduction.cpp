// Reduction programs: Σ in float32 with stablehlo.reduce, then × multiplier.
//
// The CPU reference (cpu/reduction.cpp) accumulates in double and rounds once; the device
// sums in float32 (TPUs have no float64), so results differ by the rounding of the partial
// sums: at most about n·2⁻²⁴·Σ|x| for n terms, in practice far less because XLA sums in a
// tree/vector order. One consequence of float32 partials: a sum whose partials pass
// ±3.4e38 is ±inf on the device even where the reference's double total fits a float.
// The multiplier is 1 (sum) or 1/extent (mean), a function of the shape, so it is part of the
// program (rounded to float32) rather than an uploaded parameter; 1 multiplies by nothing.
//
// sum_axis views x as [outer, extent, inner] and reduces the middle axis, so every tensor with
// the same three extents shares one program.

#include <string>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Results = std::pair<std::string, std::string>;

std::string multiplier_key(float multiplier) {
    return multiplier == 1.0F ? std::string("1") : float_literal(multiplier);
}

}  // namespace

std::string scaled_sum(ProgramText& program, const std::string& value,
                       std::span<const std::size_t> shape, std::span<const std::size_t> axes,
                       std::span<const std::size_t> result_shape, float multiplier) {
    std::string total = reduce(program, value, shape, axes, false);
    const std::string type = tensor_type(result_shape);
    if (multiplier != 1.0F) {
        total = program.let("stablehlo.multiply " + total + ", " +
                            program.constant(multiplier, result_shape) + " : " + type);
    }
    // A zero result is +0, as the reference's 0.0 + x makes it: XLA folds a reduce over unit
    // extents into a reshape, which would keep −0 (NaN compares unequal and stays).
    const std::string zero = program.constant(0.0F, result_shape);
    const std::string is_zero =
        program.let("stablehlo.compare EQ, " + total + ", " + zero + ", FLOAT : (" + type + ", " +
                    type + ") -> " + tensor_type(result_shape, "i1"));
    return program.let("stablehlo.select " + is_zero + ", " + zero + ", " + total + " : " +
                       tensor_type(result_shape, "i1") + ", " + type);
}

namespace {

class PjrtReduction final : public ReductionCapability {
  public:
    explicit PjrtReduction(const Context& context) : context_(context) {}

    // x [n] -> out [1] = multiplier · Σ x
    void sum_all(const Tensor& x, double multiplier, Tensor& out) const override {
        const std::size_t count = x.numel();
        const auto factor = static_cast<float>(multiplier);
        const std::string key = "sum_all/" + std::to_string(count) + "/" + multiplier_key(factor);
        auto text = [&] {
            ProgramText program;
            const std::string value = program.parameter(tensor_type({count}));
            const std::size_t shape[] = {count};
            const std::size_t axes[] = {0};
            const std::string result = scaled_sum(program, value, shape, axes, {}, factor);
            const Results results[] = {{program.flatten(result, {}), tensor_type({1})}};
            return program.finish(results);
        };
        give(context_, out, run(context_, key, text, {buffer_of(x)}, {{ElementType::F32, 1}})[0]);
    }

    // x [outer, extent, inner] -> out [outer, inner] = multiplier · Σ_extent x
    void sum_axis(const Tensor& x, std::size_t axis, double multiplier,
                  Tensor& out) const override {
        std::size_t outer = 1;
        std::size_t inner = 1;
        for (std::size_t d = 0; d < axis; ++d) {
            outer *= x.shape()[d];
        }
        for (std::size_t d = axis + 1; d < x.rank(); ++d) {
            inner *= x.shape()[d];
        }
        const std::size_t extent = x.shape()[axis];
        const auto factor = static_cast<float>(multiplier);
        const std::size_t blocks[] = {outer, extent, inner};
        const std::size_t kept[] = {outer, inner};
        const std::string key = "sum_axis/" + shape_key(blocks) + "/" + multiplier_key(factor);
        auto text = [&] {
            ProgramText program;
            const std::string flat = program.parameter(flat_type(blocks));
            const std::string value =
                program.reshape(flat, std::vector<std::size_t>{x.numel()}, blocks);
            const std::size_t axes[] = {1};
            const std::string result = scaled_sum(program, value, blocks, axes, kept, factor);
            const Results results[] = {{program.flatten(result, kept), flat_type(kept)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(x)}, {{ElementType::F32, out.numel()}})[0]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<ReductionCapability> make_reduction(const Context& context) {
    return std::make_unique<PjrtReduction>(context);
}

}  // namespace riftco_transformer::detail::pjrt
