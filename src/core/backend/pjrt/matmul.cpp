// Batched matmul as one stablehlo.dot_general: left [B, r_l, c_l] and right [B, r_r, c_r]
// (the leading dimensions flattened into B; tensor_ops requires them equal, never broadcast)
// with batching dimension 0 on both sides and the contracting dimension chosen by the
// transpose flags, so no transposed copy is ever made:
//   op(left) = left  -> contract left dim 2;  op(left) = leftᵀ  -> contract left dim 1;
//   op(right) = right -> contract right dim 1; op(right) = rightᵀ -> contract right dim 2.
// dot_general orders its result (batch, left free, right free) = [B, m, n], which is out.
// Precision HIGHEST with float32 operands and result: float32 products on every device (on a
// TPU, DEFAULT would mean one bfloat16 pass and break parity; XLA's CPU plugin computes float32
// either way). The accumulation order differs from the CPU GEMM's, hence rounding-level
// differences.

#include <string>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

class PjrtMatmul final : public MatmulCapability {
  public:
    explicit PjrtMatmul(const Context& context) : context_(context) {}

    // left [.., r_l, c_l], right [.., r_r, c_r] -> out [.., m, n]
    void batched_matmul(const Tensor& left, const Tensor& right, bool transpose_left,
                        bool transpose_right, Tensor& out) const override {
        const std::size_t rank = left.rank();
        const std::size_t m = out.shape()[rank - 2];
        const std::size_t n = out.shape()[rank - 1];
        const std::size_t batch = out.numel() / (m * n);
        const std::size_t left_blocks[] = {batch, left.shape()[rank - 2], left.shape()[rank - 1]};
        const std::size_t right_blocks[] = {batch, right.shape()[rank - 2],
                                            right.shape()[rank - 1]};
        const std::size_t product[] = {batch, m, n};
        const std::string key = "batched_matmul/" + shape_key(left_blocks) + "/" +
                                shape_key(right_blocks) + "/" + (transpose_left ? "T" : "N") +
                                (transpose_right ? "T" : "N");
        auto text = [&] {
            ProgramText program;
            const std::string a =
                program.reshape(program.parameter(flat_type(left_blocks)),
                                std::vector<std::size_t>{left.numel()}, left_blocks);
            const std::string b =
                program.reshape(program.parameter(flat_type(right_blocks)),
                                std::vector<std::size_t>{right.numel()}, right_blocks);
            const std::string contracting = std::string("contracting_dims = [") +
                                            (transpose_left ? "1" : "2") + "] x [" +
                                            (transpose_right ? "2" : "1") + "]";
            const std::string c = program.let(
                "stablehlo.dot_general " + a + ", " + b + ", batching_dims = [0] x [0], " +
                contracting + ", precision = [HIGHEST, HIGHEST] : (" + tensor_type(left_blocks) +
                ", " + tensor_type(right_blocks) + ") -> " + tensor_type(product));
            const std::pair<std::string, std::string> results[] = {
                {program.flatten(c, product), flat_type(product)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(left), buffer_of(right)},
                 {{ElementType::F32, out.numel()}})[0]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<MatmulCapability> make_matmul(const Context& context) {
    return std::make_unique<PjrtMatmul>(context);
}

}  // namespace riftco_transformer::detail::pjrt
