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

}  // namespace riftco_transformer::detail::pjrt
