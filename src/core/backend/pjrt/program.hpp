#pragma once
// Writing StableHLO programs as MLIR text. Every device array is a rank-1 buffer; a program
// reshapes its parameters to the shapes it works on and flattens its results again, so one
// compiled program serves every tensor of the same shape.
//
// ProgramText keeps SSA names unique; callers write the operations themselves (the StableHLO
// spec is the reference for each op's syntax), which keeps every program readable in one
// place.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace riftco_transformer::detail::pjrt {

// "tensor<2x3xf32>"; "tensor<f32>" for the scalar shape.
[[nodiscard]] std::string tensor_type(std::span<const std::size_t> shape,
                                      std::string_view element = "f32");
[[nodiscard]] std::string tensor_type(std::initializer_list<std::size_t> shape,
                                      std::string_view element = "f32");
// "tensor<6xf32>": the rank-1 view of `shape`.
[[nodiscard]] std::string flat_type(std::span<const std::size_t> shape,
                                    std::string_view element = "f32");
// An exact float literal ("0x3F800000"), usable in dense<...> attributes.
[[nodiscard]] std::string float_literal(float value);
// "[0, 2, 1]".
[[nodiscard]] std::string integer_list(std::span<const std::size_t> values);
[[nodiscard]] std::string integer_list(std::initializer_list<std::size_t> values);
// "array<i64: 0, 2, 1>".
[[nodiscard]] std::string i64_array(std::span<const std::size_t> values);
[[nodiscard]] std::size_t element_count(std::span<const std::size_t> shape) noexcept;

class ProgramText {
  public:
    // A parameter of rank-1 type `type`; returns its SSA name.
    std::string parameter(std::string type);
    // Appends "%vN = <expression>" and returns "%vN".
    std::string let(std::string_view expression);
    // A fresh name for a line the caller writes with `line` (multi-result operations).
    std::string fresh();
    void line(std::string_view text);

    // `value` of shape `from` (rank-1 parameter) as `to` (same element count).
    std::string reshape(const std::string& value, std::span<const std::size_t> from,
                        std::span<const std::size_t> to, std::string_view element = "f32");
    // `value` of `shape` as rank 1.
    std::string flatten(const std::string& value, std::span<const std::size_t> shape,
                        std::string_view element = "f32");
    // A splat constant of `shape`.
    std::string constant(float value, std::span<const std::size_t> shape);
    std::string constant(float value, std::initializer_list<std::size_t> shape);
    std::string integer_constant(std::int64_t value, std::span<const std::size_t> shape,
                                 std::string_view element = "i32");
    // Scalar `value` broadcast to `shape`.
    std::string broadcast_scalar(const std::string& value, std::span<const std::size_t> shape,
                                 std::string_view element = "f32");

    // The module text: func @main(parameters) -> (results), each result a (name, type).
    [[nodiscard]] std::string finish(
        std::span<const std::pair<std::string, std::string>> results) const;

  private:
    std::vector<std::string> parameter_types_;
    std::string body_;
    std::size_t next_value_ = 0;
};

// Typed StableHLO steps over one ProgramText, for programs that work on shaped values (the
// attention and paged-decode programs). Every method appends one operation and returns its
// value's name; `element` is the MLIR element type ("f32", "i32", "i1", ...).
class Steps {
  public:
    using Dims = std::vector<std::size_t>;

    explicit Steps(ProgramText& program) : p_(program) {}

    // stablehlo.<op> a, b (add, subtract, multiply, divide, maximum, minimum, and, or, ...).
    std::string binary(std::string_view op, const std::string& a, const std::string& b,
                       const Dims& shape, std::string_view element = "f32");
    // stablehlo.<op> a (exponential, negate, not, abs, ...).
    std::string unary(std::string_view op, const std::string& a, const Dims& shape,
                      std::string_view element = "f32");
    std::string exponential(const std::string& a, const Dims& shape) {
        return unary("exponential", a, shape);
    }
    // a <direction> b, FLOAT for f32 and SIGNED otherwise.
    std::string compare(std::string_view direction, const std::string& a, const std::string& b,
                        const Dims& shape, std::string_view element = "f32");
    std::string select(const std::string& predicate, const std::string& a, const std::string& b,
                       const Dims& shape, std::string_view element = "f32");
    // A splat constant given as literal text ("0xFF800000", "true", "7").
    std::string splat(std::string_view literal, const Dims& shape,
                      std::string_view element = "f32");
    std::string splat(float value, const Dims& shape) { return splat(float_literal(value), shape); }
    // x of `from` placed along `dims` of `to` (x itself when nothing changes).
    std::string broadcast(const std::string& x, const Dims& from, const Dims& to, const Dims& dims,
                          std::string_view element = "f32");
    std::string reshape(const std::string& x, const Dims& from, const Dims& to,
                        std::string_view element = "f32") {
        return p_.reshape(x, from, to, element);
    }
    std::string iota(std::size_t dimension, const Dims& shape, std::string_view element = "i32");
    // stablehlo.<op> (add, maximum, minimum, or, and) of x over `axes`, starting from `init`
    // (literal text); the result keeps the other axes in order.
    std::string reduce_from(std::string_view op, const std::string& x, const Dims& shape,
                            const Dims& axes, std::string_view init,
                            std::string_view element = "f32");
    // The same with the operation's identity as the start: 0, -inf, +inf, false or true.
    std::string reduce(std::string_view op, const std::string& x, const Dims& shape,
                       const Dims& axes, std::string_view element = "f32");
    std::string reduce_last(std::string_view op, const std::string& x, const Dims& shape,
                            std::string_view init, std::string_view element = "f32") {
        return reduce_from(op, x, shape, {shape.size() - 1}, init, element);
    }
    // dot_general at full float32 precision (HIGHEST: a TPU would otherwise use one bfloat16
    // pass); the result is the batch dimensions, then a's free dimensions, then b's.
    std::string dot(const std::string& a, const Dims& a_shape, const std::string& b,
                    const Dims& b_shape, const Dims& a_batch, const Dims& b_batch,
                    const Dims& a_contract, const Dims& b_contract, const Dims& result);
    std::string dot(const std::string& a, const Dims& a_shape, const std::string& b,
                    const Dims& b_shape, const Dims& batch, const Dims& a_contract,
                    const Dims& b_contract, const Dims& result) {
        return dot(a, a_shape, b, b_shape, batch, batch, a_contract, b_contract, result);
    }

    ProgramText& program() { return p_; }

  protected:
    ProgramText& p_;
};

}  // namespace riftco_transformer::detail::pjrt
