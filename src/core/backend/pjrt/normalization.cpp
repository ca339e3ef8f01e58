// LayerNorm and RMSNorm programs over the last axis: x viewed as [R,W], one program per
// (operation, R, W); epsilon is a parameter. They compute the CPU reference's functions
// (cpu/normalization.cpp) and the same saved statistics (mean and 1/√(σ² + eps) for LayerNorm,
// 1/√(mean(x²) + eps) for RMSNorm, as float).
//
// The CPU accumulates the row statistics in double. Here they are float32 programs that keep
// the reference's range and centring:
// - each row is first multiplied by a power of two p (exact) that brings its largest |x| into
//   [1, 4) (below 1 only for rows of zeros and subnormals): no sum or square overflows,
//   whatever the row's magnitude (the CPU's double sums do not overflow either);
// - the mean is taken in two passes, μ = μ₁ + μ₂ with μ₂ the mean of (x·p − μ₁) (the corrected
//   two-pass algorithm): a float μ₁ alone is off by up to half an ulp of μ, which is large next
//   to σ when |μ| >> σ, and the reference centres in double for the same reason;
// - σ² = (σ²·p²)/p² can overflow float for rows near FLT_MAX, where eps no longer matters:
//   there the inverse is p/√(σ²·p²) instead (see inverse_root).

#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Dimensions = std::vector<std::size_t>;
using Results = std::vector<std::pair<std::string, std::string>>;

// Steps over a [R,W] matrix, its rows [R] and its columns [W].
class Matrix {
  public:
    Matrix(ProgramText& program, std::size_t rows, std::size_t width)
        : program_(program), rows_(rows), width_(width) {}

    [[nodiscard]] Dimensions shape() const { return {rows_, width_}; }
    [[nodiscard]] Dimensions row_shape() const { return {rows_}; }
    [[nodiscard]] Dimensions column_shape() const { return {width_}; }

    // `op` over operands of `shape` (element type f32 unless given).
    std::string binary(std::string_view op, const std::string& a, const std::string& b,
                       const Dimensions& shape, std::string_view element = "f32") {
        return program_.let(std::string("stablehlo.") + std::string(op) + " " + a + ", " + b +
                            " : " + tensor_type(shape, element));
    }
    std::string unary(std::string_view op, const std::string& a, const Dimensions& shape) {
        return program_.let(std::string("stablehlo.") + std::string(op) + " " + a + " : " +
                            tensor_type(shape));
    }
    std::string constant(float value, const Dimensions& shape) {
        return program_.constant(value, shape);
    }
    std::string select(const std::string& predicate, const std::string& a, const std::string& b,
                       const Dimensions& shape) {
        return program_.let("stablehlo.select " + predicate + ", " + a + ", " + b + " : " +
                            tensor_type(shape, "i1") + ", " + tensor_type(shape));
    }
    std::string is_finite(const std::string& value, const Dimensions& shape) {
        return program_.let("stablehlo.is_finite " + value + " : (" + tensor_type(shape) + ") -> " +
                            tensor_type(shape, "i1"));
    }

    // A per-row value [R] / a per-column value [W] repeated over the matrix.
    std::string by_row(const std::string& value) { return spread(value, row_shape(), "[0]"); }
    std::string by_row_flag(const std::string& flag) {
        return program_.let("stablehlo.broadcast_in_dim " + flag + ", dims = [0] : (" +
                            tensor_type(row_shape(), "i1") + ") -> " + tensor_type(shape(), "i1"));
    }
    std::string by_column(const std::string& value) { return spread(value, column_shape(), "[1]"); }

    // Σ over each row -> [R] (maximum: the row maximum); Σ over each column -> [W].
    std::string row_sum(const std::string& value, bool maximum = false) {
        const std::size_t axes[] = {1};
        return reduce(program_, value, shape(), axes, maximum);
    }
    std::string column_sum(const std::string& value) {
        const std::size_t axes[] = {0};
        return reduce(program_, value, shape(), axes, false);
    }
    // The row mean Σ/W -> [R].
    std::string row_mean(const std::string& value) {
        return binary("divide", row_sum(value), constant(static_cast<float>(width_), row_shape()),
                      row_shape());
    }

    // A rank-1 parameter as [R,W].
    std::string matrix_of(const std::string& flat) {
        const std::size_t count[] = {rows_ * width_};
        const Dimensions to = shape();
        return program_.reshape(flat, count, to);
    }
    // epsilon (tensor<1xf32> parameter) as [R].
    std::string row_parameter(const std::string& scalar_parameter) {
        const std::string scalar = program_.let("stablehlo.reshape " + scalar_parameter +
                                                " : (tensor<1xf32>) -> tensor<f32>");
        return program_.broadcast_scalar(scalar, row_shape());
    }

  private:
    std::string spread(const std::string& value, const Dimensions& from, std::string_view dims) {
        return program_.let("stablehlo.broadcast_in_dim " + value +
                            ", dims = " + std::string(dims) + " : (" + tensor_type(from) + ") -> " +
                            tensor_type(shape()));
    }

    ProgramText& program_;
    std::size_t rows_;
    std::size_t width_;
};

// The per-row power of two p = 2^(127 − E) that maps the row's largest |x| (biased exponent
// E, clamped to [1, 253] so p and 1/p stay normal floats) into [1, 4), and q = 1/p.
struct RowScale {
    std::string p;
    std::string q;
};

RowScale row_scale(ProgramText& program, Matrix& m, const std::string& x) {
    const Dimensions rows = m.row_shape();
    const std::string largest = m.row_sum(m.unary("abs", x, m.shape()), true);
    const std::string bits = program.let("stablehlo.bitcast_convert " + largest + " : (" +
                                         tensor_type(rows) + ") -> " + tensor_type(rows, "i32"));
    const std::string mantissa_bits = program.integer_constant(23, rows);
    const std::string exponent =
        m.binary("and", m.binary("shift_right_logical", bits, mantissa_bits, rows, "i32"),
                 program.integer_constant(0xFF, rows), rows, "i32");
    const std::string clamped = m.binary(
        "minimum", m.binary("maximum", exponent, program.integer_constant(1, rows), rows, "i32"),
        program.integer_constant(253, rows), rows, "i32");
    const std::string p_exponent =
        m.binary("subtract", program.integer_constant(254, rows), clamped, rows, "i32");
    const auto as_float = [&](const std::string& biased_exponent) {
        const std::string shifted =
            m.binary("shift_left", biased_exponent, mantissa_bits, rows, "i32");
        return program.let("stablehlo.bitcast_convert " + shifted + " : (" +
                           tensor_type(rows, "i32") + ") -> " + tensor_type(rows));
    };
    return {as_float(p_exponent), as_float(clamped)};
}

// 1/√(v + eps) for the mean square v = v_scaled·q² of a row scaled by p = 1/q. Where v
// overflows float (eps is far below its rounding there), the inverse is p/√(v_scaled) and
// x·inverse is computed as (x·p)/√(v_scaled): the inverse itself can be subnormal there, which
// a device that flushes subnormals to zero cannot hold, while the normalised values are near 1.
struct InverseRoot {
    std::string inverse;         // [R]
    std::string finite;          // [R] i1: v is a float (the direct form applies)
    std::string scaled_inverse;  // [R] 1/√(v_scaled), to multiply x·p with where v is not
};

InverseRoot inverse_root(Matrix& m, const std::string& scaled, const RowScale& scale,
                         const std::string& epsilon) {
    const Dimensions rows = m.row_shape();
    const std::string one = m.constant(1.0F, rows);
    const std::string unscaled =
        m.binary("multiply", m.binary("multiply", scaled, scale.q, rows), scale.q, rows);
    const std::string direct = m.binary(
        "divide", one, m.unary("sqrt", m.binary("add", unscaled, epsilon, rows), rows), rows);
    const std::string scaled_inverse = m.binary("divide", one, m.unary("sqrt", scaled, rows), rows);
    const std::string finite = m.is_finite(unscaled, rows);
    return {m.select(finite, direct, m.binary("multiply", scale.p, scaled_inverse, rows), rows),
            finite, scaled_inverse};
}

class PjrtNormalization final : public NormalizationCapability {
  public:
    explicit PjrtNormalization(const Context& context) : context_(context) {}

    // x [R,W] -> y = x̂·γ + β, x̂ = (x − μ)·inv; mean [R] = μ, inverse_deviation [R] = inv.
    void layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, float epsilon,
                    Tensor& out, Tensor& mean, Tensor& inverse_deviation) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const std::string key = "layer_norm/" + std::to_string(rows) + "x" + std::to_string(width);
        auto text = [&] {
            ProgramText program;
            Matrix m(program, rows, width);
            const Dimensions shape = m.shape();
            const Dimensions row = m.row_shape();
            const std::string x_flat = program.parameter(flat_type(shape));
            const std::string gamma = program.parameter(tensor_type({width}));
            const std::string beta = program.parameter(tensor_type({width}));
            const std::string epsilon_parameter = program.parameter("tensor<1xf32>");
            const std::string values = m.matrix_of(x_flat);
            const RowScale scale_of_row = row_scale(program, m, values);
            const std::string scaled =
                m.binary("multiply", values, m.by_row(scale_of_row.p), shape);
            // μ·p = μ₁ + μ₂ and the centred row (x − μ)·p.
            const std::string mean_high = m.row_mean(scaled);
            const std::string partly_centred =
                m.binary("subtract", scaled, m.by_row(mean_high), shape);
            const std::string mean_low = m.row_mean(partly_centred);
            const std::string centred =
                m.binary("subtract", partly_centred, m.by_row(mean_low), shape);
            const std::string variance_scaled =
                m.row_mean(m.binary("multiply", centred, centred, shape));
            const InverseRoot root =
                inverse_root(m, variance_scaled, scale_of_row, m.row_parameter(epsilon_parameter));
            // x̂ = ((x − μ)·p·q)·inv where σ² is a float, (x − μ)·p/√(σ²·p²) where it is not.
            const std::string normal_hat =
                m.binary("multiply", m.binary("multiply", centred, m.by_row(scale_of_row.q), shape),
                         m.by_row(root.inverse), shape);
            const std::string huge_hat =
                m.binary("multiply", centred, m.by_row(root.scaled_inverse), shape);
            const std::string finite_variance = m.by_row_flag(root.finite);
            const std::string x_hat = m.select(finite_variance, normal_hat, huge_hat, shape);
            const std::string y =
                m.binary("add", m.binary("multiply", x_hat, m.by_column(gamma), shape),
                         m.by_column(beta), shape);
            // μ = (μ₁ + μ₂)·q; a non-finite μ₁ (an infinite x) is μ itself, as in double.
            const std::string mean_value =
                m.select(m.is_finite(mean_high, row),
                         m.binary("multiply", m.binary("add", mean_high, mean_low, row),
                                  scale_of_row.q, row),
                         m.binary("multiply", mean_high, scale_of_row.q, row), row);
            const Results results = {{program.flatten(y, shape), flat_type(shape)},
                                     {mean_value, tensor_type(row)},
                                     {root.inverse, tensor_type(row)}};
            return program.finish(results);
        };
        std::vector<BufferPointer> results = run(
            context_, key, text,
            {buffer_of(x), buffer_of(scale), buffer_of(bias), scalar_buffer(context_, epsilon)},
            {{ElementType::F32, x.numel()}, {ElementType::F32, rows}, {ElementType::F32, rows}});
        give(context_, out, results[0]);
        give(context_, mean, results[1]);
        give(context_, inverse_deviation, results[2]);
    }

    // x̂ = (x − μ)·inv, ĝ = g ⊙ γ:
    // dx = inv·(ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)); dγ = Σ_rows g ⊙ x̂; dβ = Σ_rows g
    void layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean,
                             const Tensor& inverse_deviation, const Tensor& upstream,
                             Tensor& input_gradient, Tensor& scale_gradient,
                             Tensor& bias_gradient) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const std::string key =
            "layer_norm_backward/" + std::to_string(rows) + "x" + std::to_string(width);
        auto text = [&] {
            ProgramText program;
            Matrix m(program, rows, width);
            const Dimensions shape = m.shape();
            const std::string x_flat = program.parameter(flat_type(shape));
            const std::string gamma = program.parameter(tensor_type({width}));
            const std::string mu = program.parameter(tensor_type({rows}));
            const std::string inverse = program.parameter(tensor_type({rows}));
            const std::string g_flat = program.parameter(flat_type(shape));
            const std::string values = m.matrix_of(x_flat);
            const std::string g = m.matrix_of(g_flat);
            const std::string inverse_all = m.by_row(inverse);
            const std::string x_hat = m.binary(
                "multiply", m.binary("subtract", values, m.by_row(mu), shape), inverse_all, shape);
            const std::string g_hat = m.binary("multiply", g, m.by_column(gamma), shape);
            const std::string mean_g_hat = m.row_mean(g_hat);
            const std::string mean_g_hat_x_hat =
                m.row_mean(m.binary("multiply", g_hat, x_hat, shape));
            const std::string bracket =
                m.binary("subtract", m.binary("subtract", g_hat, m.by_row(mean_g_hat), shape),
                         m.binary("multiply", x_hat, m.by_row(mean_g_hat_x_hat), shape), shape);
            const std::string dx = m.binary("multiply", inverse_all, bracket, shape);
            const std::string d_gamma = m.column_sum(m.binary("multiply", g, x_hat, shape));
            const std::string d_beta = m.column_sum(g);
            const Results results = {{program.flatten(dx, shape), flat_type(shape)},
                                     {d_gamma, tensor_type({width})},
                                     {d_beta, tensor_type({width})}};
            return program.finish(results);
        };
        std::vector<BufferPointer> results = run(
            context_, key, text,
            {buffer_of(x), buffer_of(scale), buffer_of(mean), buffer_of(inverse_deviation),
             buffer_of(upstream)},
            {{ElementType::F32, x.numel()}, {ElementType::F32, width}, {ElementType::F32, width}});
        give(context_, input_gradient, results[0]);
        give(context_, scale_gradient, results[1]);
        give(context_, bias_gradient, results[2]);
    }

    // y = (x·r)·γ, r = 1/√(mean(x²) + eps); inverse_rms [R] = r.
    void rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& out,
                  Tensor& inverse_rms) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const std::string key = "rms_norm/" + std::to_string(rows) + "x" + std::to_string(width);
        auto text = [&] {
            ProgramText program;
            Matrix m(program, rows, width);
            const Dimensions shape = m.shape();
            const std::string x_flat = program.parameter(flat_type(shape));
            const std::string gamma = program.parameter(tensor_type({width}));
            const std::string epsilon_parameter = program.parameter("tensor<1xf32>");
            const std::string values = m.matrix_of(x_flat);
            const RowScale scale_of_row = row_scale(program, m, values);
            const std::string scaled =
                m.binary("multiply", values, m.by_row(scale_of_row.p), shape);
            const std::string mean_square_scaled =
                m.row_mean(m.binary("multiply", scaled, scaled, shape));
            const InverseRoot root = inverse_root(m, mean_square_scaled, scale_of_row,
                                                  m.row_parameter(epsilon_parameter));
            const std::string normalised =
                m.select(m.by_row_flag(root.finite),
                         m.binary("multiply", values, m.by_row(root.inverse), shape),
                         m.binary("multiply", scaled, m.by_row(root.scaled_inverse), shape), shape);
            const std::string y = m.binary("multiply", normalised, m.by_column(gamma), shape);
            const Results results = {{program.flatten(y, shape), flat_type(shape)},
                                     {root.inverse, tensor_type(m.row_shape())}};
            return program.finish(results);
        };
        std::vector<BufferPointer> results = run(
            context_, key, text, {buffer_of(x), buffer_of(scale), scalar_buffer(context_, epsilon)},
            {{ElementType::F32, x.numel()}, {ElementType::F32, rows}});
        give(context_, out, results[0]);
        give(context_, inverse_rms, results[1]);
    }

    // dx = r·g·γ − x·(mean(g ⊙ γ ⊙ x)·r³); dγ = Σ_rows g ⊙ x·r
    void rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inverse_rms,
                           const Tensor& upstream, Tensor& input_gradient,
                           Tensor& scale_gradient) const override {
        const std::size_t width = x.shape().back();
        const std::size_t rows = x.numel() / width;
        const std::string key =
            "rms_norm_backward/" + std::to_string(rows) + "x" + std::to_string(width);
        auto text = [&] {
            ProgramText program;
            Matrix m(program, rows, width);
            const Dimensions shape = m.shape();
            const Dimensions row = m.row_shape();
            const std::string x_flat = program.parameter(flat_type(shape));
            const std::string gamma = program.parameter(tensor_type({width}));
            const std::string r = program.parameter(tensor_type({rows}));
            const std::string g_flat = program.parameter(flat_type(shape));
            const std::string values = m.matrix_of(x_flat);
            const std::string g = m.matrix_of(g_flat);
            const std::string g_gamma = m.binary("multiply", g, m.by_column(gamma), shape);
            const std::string weighted = m.row_mean(m.binary("multiply", g_gamma, values, shape));
            const std::string correction = m.binary(
                "multiply", m.binary("multiply", m.binary("multiply", weighted, r, row), r, row), r,
                row);
            const std::string r_all = m.by_row(r);
            const std::string dx =
                m.binary("subtract",
                         m.binary("multiply", m.binary("multiply", r_all, g, shape),
                                  m.by_column(gamma), shape),
                         m.binary("multiply", values, m.by_row(correction), shape), shape);
            const std::string d_gamma = m.column_sum(
                m.binary("multiply", m.binary("multiply", g, values, shape), r_all, shape));
            const Results results = {{program.flatten(dx, shape), flat_type(shape)},
                                     {d_gamma, tensor_type({width})}};
            return program.finish(results);
        };
        std::vector<BufferPointer> results =
            run(context_, key, text,
                {buffer_of(x), buffer_of(scale), buffer_of(inverse_rms), buffer_of(upstream)},
                {{ElementType::F32, x.numel()}, {ElementType::F32, width}});
        give(context_, input_gradient, results[0]);
        give(context_, scale_gradient, results[1]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<NormalizationCapability> make_normalization(const Context& context) {
    return std::make_unique<PjrtNormalization>(context);
}

}  // namespace riftco_transformer::detail::pjrt
