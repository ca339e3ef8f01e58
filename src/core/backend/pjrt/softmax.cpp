// Softmax programs: one per (operation, shape). They follow the CPU reference
// (cpu/softmax.cpp) step by step: the slice maximum, exp(scale·(x − max)), the sum, the
// normalisation; the backward pass is scale·p ⊙ (g − Σ g ⊙ p). A slice holding NaN or +inf, or
// only −inf, is found on the device and raised at the next sync point with the CPU's
// domain_error and slice index. The causal forms run over [B·H, T, T] with the key j visible
// from the query i when j <= i; masked entries are exactly 0 in both directions.

#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Shape3 = std::vector<std::size_t>;
using Results = std::vector<std::pair<std::string, std::string>>;

constexpr const char* negative_infinity = "0xFF800000";
constexpr const char* positive_infinity = "0x7F800000";

std::exception_ptr bad_slice(const char* operation, std::size_t slice) {
    std::ostringstream message;
    message << operation << ": slice " << slice
            << " contains NaN or +inf, or has no finite value (every entry is -inf)";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

// Elementwise steps over arrays of one shape, and the row statistics broadcast back onto it.
class Rows {
  public:
    // `shape` is the array's; `row_shape` is it without `axis` (the reduced dimension).
    Rows(ProgramText& program, Shape3 shape, std::size_t axis)
        : program_(program), shape_(std::move(shape)), axis_(axis) {
        for (std::size_t d = 0; d < shape_.size(); ++d) {
            if (d != axis_) {
                row_shape_.push_back(shape_[d]);
                kept_.push_back(d);
            }
        }
    }

    std::string binary(std::string_view op, const std::string& a, const std::string& b) const {
        return program_.let(std::string("stablehlo.") + std::string(op) + " " + a + ", " + b +
                            " : " + tensor_type(shape_));
    }
    std::string exp(const std::string& a) const {
        return program_.let("stablehlo.exponential " + a + " : " + tensor_type(shape_));
    }
    std::string compare(std::string_view direction, const std::string& a,
                        const std::string& b) const {
        return program_.let("stablehlo.compare " + std::string(direction) + ", " + a + ", " + b +
                            ", FLOAT : (" + tensor_type(shape_) + ", " + tensor_type(shape_) +
                            ") -> " + tensor_type(shape_, "i1"));
    }
    std::string select(const std::string& predicate, const std::string& a,
                       const std::string& b) const {
        return program_.let("stablehlo.select " + predicate + ", " + a + ", " + b + " : " +
                            tensor_type(shape_, "i1") + ", " + tensor_type(shape_));
    }
    std::string constant(const std::string& literal) const {
        return program_.let("stablehlo.constant dense<" + literal + "> : " + tensor_type(shape_));
    }
    std::string constant(float value) const { return constant(float_literal(value)); }
    std::string logical_or(const std::string& a, const std::string& b,
                           const std::vector<std::size_t>& shape) const {
        return program_.let("stablehlo.or " + a + ", " + b + " : " + tensor_type(shape, "i1"));
    }

    // Σ or max over the axis -> row_shape.
    std::string reduce_rows(const std::string& value, bool maximum) const {
        const std::size_t axes[] = {axis_};
        return reduce(program_, value, shape_, axes, maximum);
    }
    // Whether any element of each row is set -> row_shape (i1).
    std::string any_in_rows(const std::string& flags) const {
        const std::string no = program_.let("stablehlo.constant dense<false> : tensor<i1>");
        return program_.let("stablehlo.reduce(" + flags + " init: " + no +
                            ") applies stablehlo.or across dimensions = [" + std::to_string(axis_) +
                            "] : (" + tensor_type(shape_, "i1") + ", tensor<i1>) -> " +
                            tensor_type(row_shape_, "i1"));
    }
    // A row statistic (row_shape) repeated along the axis.
    std::string spread(const std::string& row_value) const {
        return program_.let("stablehlo.broadcast_in_dim " + row_value +
                            ", dims = " + integer_list(kept_) + " : (" + tensor_type(row_shape_) +
                            ") -> " + tensor_type(shape_));
    }
    std::string row_compare(std::string_view direction, const std::string& a,
                            const std::string& b) const {
        return program_.let("stablehlo.compare " + std::string(direction) + ", " + a + ", " + b +
                            ", FLOAT : (" + tensor_type(row_shape_) + ", " +
                            tensor_type(row_shape_) + ") -> " + tensor_type(row_shape_, "i1"));
    }
    std::string row_constant(const std::string& literal) const {
        return program_.let("stablehlo.constant dense<" + literal +
                            "> : " + tensor_type(row_shape_));
    }
    std::string row_reciprocal(const std::string& value) const {
        const std::string one = row_constant(float_literal(1.0F));
        return program_.let("stablehlo.divide " + one + ", " + value + " : " +
                            tensor_type(row_shape_));
    }

    // True where an element is NaN or +inf.
    std::string nan_or_positive_infinity(const std::string& x) const {
        const std::string is_nan = compare("NE", x, x);
        const std::string is_infinite = compare("EQ", x, constant(positive_infinity));
        return logical_or(is_nan, is_infinite, shape_);
    }
    // The rejected rows: any flagged element, or a maximum of −inf (no finite value).
    std::string rejected_rows(const std::string& flagged, const std::string& maximum) const {
        const std::string no_finite = row_compare("EQ", maximum, row_constant(negative_infinity));
        return logical_or(any_in_rows(flagged), no_finite, row_shape_);
    }

    [[nodiscard]] const Shape3& shape() const { return shape_; }
    [[nodiscard]] const Shape3& row_shape() const { return row_shape_; }

  private:
    ProgramText& program_;
    Shape3 shape_;
    std::size_t axis_;
    Shape3 row_shape_;
    Shape3 kept_;
};

// A rank-1 parameter viewed as `shape`.
std::string from_flat(ProgramText& program, const std::string& value, const Shape3& shape) {
    const std::size_t flat[] = {element_count(shape)};
    return program.reshape(value, flat, shape);
}

// x viewed as [outer, extent, inner] for a softmax over `axis`.
Shape3 axis_view(const Tensor& x, std::size_t axis) {
    Shape3 view = {1, x.shape()[axis], 1};
    for (std::size_t d = 0; d < axis; ++d) {
        view[0] *= x.shape()[d];
    }
    for (std::size_t d = axis + 1; d < x.rank(); ++d) {
        view[2] *= x.shape()[d];
    }
    return view;
}

// scores [B,H,T,T] viewed as [B·H, T, T].
Shape3 causal_view(const Tensor& scores) {
    const std::size_t t_count = scores.shape()[3];
    return {scores.numel() / (t_count * t_count), t_count, t_count};
}

// visible[r,i,j] = j <= i over `shape` [R,T,T].
std::string causal_visibility(ProgramText& program, const Shape3& shape) {
    const std::string query = program.let("stablehlo.iota dim = 1 : " + tensor_type(shape, "i32"));
    const std::string key = program.let("stablehlo.iota dim = 2 : " + tensor_type(shape, "i32"));
    return program.let("stablehlo.compare LE, " + key + ", " + query + ", SIGNED : (" +
                       tensor_type(shape, "i32") + ", " + tensor_type(shape, "i32") + ") -> " +
                       tensor_type(shape, "i1"));
}

// A tensor<1xf32> parameter broadcast to `shape`.
std::string spread_scalar(ProgramText& program, const std::string& parameter, const Shape3& shape) {
    const std::string scalar =
        program.let("stablehlo.reshape " + parameter + " : (tensor<1xf32>) -> tensor<f32>");
    return program.broadcast_scalar(scalar, shape);
}

class PjrtSoftmax final : public SoftmaxCapability {
  public:
    explicit PjrtSoftmax(const Context& context) : context_(context) {}

    // x [O,E,I] -> softmax over E; flag over the slices [O,I] (slice = o·I + i).
    void softmax(const Tensor& x, std::size_t axis, Tensor& out) const override {
        const Shape3 view = axis_view(x, axis);
        const std::string key = "softmax/" + shape_key(view);
        auto text = [&] {
            ProgramText program;
            const std::string input = program.parameter(flat_type(view));
            Rows rows(program, view, 1);
            const std::string values = from_flat(program, input, view);
            const std::string maximum = rows.reduce_rows(values, true);
            const std::string shifted = rows.binary("subtract", values, rows.spread(maximum));
            const std::string exponentials = rows.exp(shifted);
            const std::string inverse = rows.row_reciprocal(rows.reduce_rows(exponentials, false));
            const std::string probabilities =
                rows.binary("multiply", exponentials, rows.spread(inverse));
            const std::string rejected =
                rows.rejected_rows(rows.nan_or_positive_infinity(values), maximum);
            const Results results = {{program.flatten(probabilities, view), flat_type(view)},
                                     {first_violation_flag(program, rejected, rows.row_shape()),
                                      tensor_type({1}, "i32")}};
            return program.finish(results);
        };
        std::vector<BufferPointer> results =
            run(context_, key, text, {buffer_of(x)},
                {{ElementType::F32, x.numel()}, {ElementType::S32, 1}});
        give(context_, out, results[0]);
        defer_check(context_, results[1],
                    [](std::size_t slice) { return bad_slice("softmax", slice); });
    }

    // dx = p ⊙ (g − Σ_E g ⊙ p) over [O,E,I].
    void softmax_backward(const Tensor& probabilities, const Tensor& upstream, std::size_t axis,
                          Tensor& out) const override {
        const Shape3 view = axis_view(probabilities, axis);
        const std::string key = "softmax_backward/" + shape_key(view);
        auto text = [&] {
            ProgramText program;
            const std::string p_flat = program.parameter(flat_type(view));
            const std::string g_flat = program.parameter(flat_type(view));
            Rows rows(program, view, 1);
            const std::string p = from_flat(program, p_flat, view);
            const std::string g = from_flat(program, g_flat, view);
            const std::string dot = rows.reduce_rows(rows.binary("multiply", g, p), false);
            const std::string dx =
                rows.binary("multiply", p, rows.binary("subtract", g, rows.spread(dot)));
            const Results results = {{program.flatten(dx, view), flat_type(view)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(probabilities), buffer_of(upstream)},
                 {{ElementType::F32, out.numel()}})[0]);
    }

    // scores [R,T,T] -> softmax(scale·s) over the visible keys; flag over the rows [R,T].
    void causal_softmax(const Tensor& scores, float scale, Tensor& out) const override {
        const Shape3 view = causal_view(scores);
        // The scale is a parameter: a new scale reuses the program.
        const std::string key = "causal_softmax/" + shape_key(view);
        auto text = [&] {
            ProgramText program;
            const std::string input = program.parameter(flat_type(view));
            const std::string scale_parameter = program.parameter("tensor<1xf32>");
            Rows rows(program, view, 2);
            const std::string values = from_flat(program, input, view);
            const std::string visible = causal_visibility(program, view);
            const std::string zero = rows.constant(0.0F);
            const std::string masked =
                rows.select(visible, values, rows.constant(negative_infinity));
            const std::string maximum = rows.reduce_rows(masked, true);
            // scale·(x − max) <= 0 never overflows, even where scale·x alone would.
            const std::string shifted = rows.binary("subtract", masked, rows.spread(maximum));
            const std::string exponentials = rows.select(
                visible,
                rows.exp(rows.binary("multiply", spread_scalar(program, scale_parameter, view),
                                     shifted)),
                zero);
            const std::string inverse = rows.row_reciprocal(rows.reduce_rows(exponentials, false));
            const std::string probabilities =
                rows.binary("multiply", exponentials, rows.spread(inverse));
            const std::string flagged = program.let("stablehlo.and " + visible + ", " +
                                                    rows.nan_or_positive_infinity(values) + " : " +
                                                    tensor_type(view, "i1"));
            const std::string rejected = rows.rejected_rows(flagged, maximum);
            const Results results = {{program.flatten(probabilities, view), flat_type(view)},
                                     {first_violation_flag(program, rejected, rows.row_shape()),
                                      tensor_type({1}, "i32")}};
            return program.finish(results);
        };
        std::vector<BufferPointer> results =
            run(context_, key, text, {buffer_of(scores), scalar_buffer(context_, scale)},
                {{ElementType::F32, scores.numel()}, {ElementType::S32, 1}});
        give(context_, out, results[0]);
        defer_check(context_, results[1],
                    [](std::size_t row) { return bad_slice("causal_softmax", row); });
    }

    // dx = scale·p ⊙ (g − Σ_visible g ⊙ p) on visible entries, exactly 0 on the others.
    void causal_softmax_backward(const Tensor& probabilities, const Tensor& upstream, float scale,
                                 Tensor& out) const override {
        const Shape3 view = causal_view(probabilities);
        const std::string key = "causal_softmax_backward/" + shape_key(view);
        auto text = [&] {
            ProgramText program;
            const std::string p_flat = program.parameter(flat_type(view));
            const std::string g_flat = program.parameter(flat_type(view));
            const std::string scale_parameter = program.parameter("tensor<1xf32>");
            Rows rows(program, view, 2);
            const std::string p = from_flat(program, p_flat, view);
            const std::string g = from_flat(program, g_flat, view);
            const std::string visible = causal_visibility(program, view);
            const std::string zero = rows.constant(0.0F);
            const std::string dot =
                rows.reduce_rows(rows.select(visible, rows.binary("multiply", g, p), zero), false);
            const std::string scaled_p =
                rows.binary("multiply", spread_scalar(program, scale_parameter, view), p);
            const std::string dx = rows.select(
                visible,
                rows.binary("multiply", scaled_p, rows.binary("subtract", g, rows.spread(dot))),
                zero);
            const Results results = {{program.flatten(dx, view), flat_type(view)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text,
                 {buffer_of(probabilities), buffer_of(upstream), scalar_buffer(context_, scale)},
                 {{ElementType::F32, out.numel()}})[0]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<SoftmaxCapability> make_softmax(const Context& context) {
    return std::make_unique<PjrtSoftmax>(context);
}

}  // namespace riftco_transformer::detail::pjrt
