#include "core/backend/pjrt/program.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <sstream>

namespace riftco_transformer::detail::pjrt {

std::size_t element_count(std::span<const std::size_t> shape) noexcept {
    std::size_t count = 1;
    for (const std::size_t extent : shape) {
        count *= extent;
    }
    return count;
}

std::string tensor_type(std::span<const std::size_t> shape, std::string_view element) {
    std::string text = "tensor<";
    for (const std::size_t extent : shape) {
        text += std::to_string(extent);
        text += 'x';
    }
    text += element;
    text += '>';
    return text;
}

std::string tensor_type(std::initializer_list<std::size_t> shape, std::string_view element) {
    return tensor_type(std::span<const std::size_t>(shape.begin(), shape.size()), element);
}

std::string flat_type(std::span<const std::size_t> shape, std::string_view element) {
    const std::size_t count = element_count(shape);
    return tensor_type({count}, element);
}

std::string float_literal(float value) {
    char text[16];
    std::snprintf(text, sizeof(text), "0x%08X", std::bit_cast<std::uint32_t>(value));
    return text;
}

std::string integer_list(std::span<const std::size_t> values) {
    std::string text = "[";
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i != 0) {
            text += ", ";
        }
        text += std::to_string(values[i]);
    }
    text += ']';
    return text;
}

std::string integer_list(std::initializer_list<std::size_t> values) {
    return integer_list(std::span<const std::size_t>(values.begin(), values.size()));
}

std::string i64_array(std::span<const std::size_t> values) {
    std::string text = "array<i64";
    for (std::size_t i = 0; i < values.size(); ++i) {
        text += i == 0 ? ": " : ", ";
        text += std::to_string(values[i]);
    }
    text += '>';
    return text;
}

std::string ProgramText::parameter(std::string type) {
    parameter_types_.push_back(std::move(type));
    return "%p" + std::to_string(parameter_types_.size() - 1);
}

std::string ProgramText::fresh() {
    return "%v" + std::to_string(next_value_++);
}

std::string ProgramText::let(std::string_view expression) {
    std::string name = fresh();
    body_ += "    ";
    body_ += name;
    body_ += " = ";
    body_ += expression;
    body_ += '\n';
    return name;
}

void ProgramText::line(std::string_view text) {
    body_ += "    ";
    body_ += text;
    body_ += '\n';
}

std::string ProgramText::reshape(const std::string& value, std::span<const std::size_t> from,
                                 std::span<const std::size_t> to, std::string_view element) {
    const std::string from_type = tensor_type(from, element);
    const std::string to_type = tensor_type(to, element);
    if (from_type == to_type) {
        return value;
    }
    return let("stablehlo.reshape " + value + " : (" + from_type + ") -> " + to_type);
}

std::string ProgramText::flatten(const std::string& value, std::span<const std::size_t> shape,
                                 std::string_view element) {
    const std::size_t count = element_count(shape);
    const std::size_t flat[] = {count};
    return reshape(value, shape, flat, element);
}

std::string ProgramText::constant(float value, std::span<const std::size_t> shape) {
    return let("stablehlo.constant dense<" + float_literal(value) + "> : " + tensor_type(shape));
}

std::string ProgramText::constant(float value, std::initializer_list<std::size_t> shape) {
    return constant(value, std::span<const std::size_t>(shape.begin(), shape.size()));
}

std::string ProgramText::integer_constant(std::int64_t value, std::span<const std::size_t> shape,
                                          std::string_view element) {
    return let("stablehlo.constant dense<" + std::to_string(value) +
               "> : " + tensor_type(shape, element));
}

std::string ProgramText::broadcast_scalar(const std::string& value,
                                          std::span<const std::size_t> shape,
                                          std::string_view element) {
    return let("stablehlo.broadcast_in_dim " + value + ", dims = [] : (" +
               tensor_type({}, element) + ") -> " + tensor_type(shape, element));
}

std::string ProgramText::finish(
    std::span<const std::pair<std::string, std::string>> results) const {
    std::ostringstream text;
    text << "module {\n  func.func @main(";
    for (std::size_t i = 0; i < parameter_types_.size(); ++i) {
        text << (i == 0 ? "" : ", ") << "%p" << i << ": " << parameter_types_[i];
    }
    text << ") -> (";
    for (std::size_t i = 0; i < results.size(); ++i) {
        text << (i == 0 ? "" : ", ") << results[i].second;
    }
    text << ") {\n" << body_ << "    return ";
    for (std::size_t i = 0; i < results.size(); ++i) {
        text << (i == 0 ? "" : ", ") << results[i].first;
    }
    text << " : ";
    for (std::size_t i = 0; i < results.size(); ++i) {
        text << (i == 0 ? "" : ", ") << results[i].second;
    }
    text << "\n  }\n}\n";
    return text.str();
}

std::string Steps::binary(std::string_view op, const std::string& a, const std::string& b,
                          const Dims& shape, std::string_view element) {
    return p_.let("stablehlo." + std::string(op) + " " + a + ", " + b + " : " +
                  tensor_type(shape, element));
}

std::string Steps::unary(std::string_view op, const std::string& a, const Dims& shape,
                         std::string_view element) {
    return p_.let("stablehlo." + std::string(op) + " " + a + " : " + tensor_type(shape, element));
}

std::string Steps::compare(std::string_view direction, const std::string& a, const std::string& b,
                           const Dims& shape, std::string_view element) {
    const char* kind = element == "f32" ? "FLOAT" : "SIGNED";
    return p_.let("stablehlo.compare " + std::string(direction) + ", " + a + ", " + b + ", " +
                  kind + " : (" + tensor_type(shape, element) + ", " + tensor_type(shape, element) +
                  ") -> " + tensor_type(shape, "i1"));
}

std::string Steps::select(const std::string& predicate, const std::string& a, const std::string& b,
                          const Dims& shape, std::string_view element) {
    return p_.let("stablehlo.select " + predicate + ", " + a + ", " + b + " : " +
                  tensor_type(shape, "i1") + ", " + tensor_type(shape, element));
}

std::string Steps::splat(std::string_view literal, const Dims& shape, std::string_view element) {
    return p_.let("stablehlo.constant dense<" + std::string(literal) +
                  "> : " + tensor_type(shape, element));
}

std::string Steps::broadcast(const std::string& x, const Dims& from, const Dims& to,
                             const Dims& dims, std::string_view element) {
    bool identity = from == to;
    for (std::size_t i = 0; identity && i < dims.size(); ++i) {
        identity = dims[i] == i;
    }
    if (identity) {
        return x;
    }
    return p_.let("stablehlo.broadcast_in_dim " + x + ", dims = " + integer_list(dims) + " : (" +
                  tensor_type(from, element) + ") -> " + tensor_type(to, element));
}

std::string Steps::iota(std::size_t dimension, const Dims& shape, std::string_view element) {
    return p_.let("stablehlo.iota dim = " + std::to_string(dimension) + " : " +
                  tensor_type(shape, element));
}

std::string Steps::reduce_from(std::string_view op, const std::string& x, const Dims& shape,
                               const Dims& axes, std::string_view init, std::string_view element) {
    Dims kept;
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
        if (std::find(axes.begin(), axes.end(), axis) == axes.end()) {
            kept.push_back(shape[axis]);
        }
    }
    const std::string start = splat(init, {}, element);
    return p_.let("stablehlo.reduce(" + x + " init: " + start + ") applies stablehlo." +
                  std::string(op) + " across dimensions = " + integer_list(axes) + " : (" +
                  tensor_type(shape, element) + ", " + tensor_type({}, element) + ") -> " +
                  tensor_type(kept, element));
}

std::string Steps::reduce(std::string_view op, const std::string& x, const Dims& shape,
                          const Dims& axes, std::string_view element) {
    const bool floating = element == "f32";
    std::string_view init = floating ? "0.0" : "0";
    if (op == "maximum") {
        init = floating ? "0xFF800000" : "-2147483648";
    } else if (op == "minimum") {
        init = floating ? "0x7F800000" : "2147483647";
    } else if (op == "or") {
        init = "false";
    } else if (op == "and") {
        init = "true";
    }
    return reduce_from(op, x, shape, axes, init, element);
}

std::string Steps::dot(const std::string& a, const Dims& a_shape, const std::string& b,
                       const Dims& b_shape, const Dims& a_batch, const Dims& b_batch,
                       const Dims& a_contract, const Dims& b_contract, const Dims& result) {
    return p_.let(
        "stablehlo.dot_general " + a + ", " + b + ", batching_dims = " + integer_list(a_batch) +
        " x " + integer_list(b_batch) + ", contracting_dims = " + integer_list(a_contract) + " x " +
        integer_list(b_contract) + ", precision = [HIGHEST, HIGHEST] : (" + tensor_type(a_shape) +
        ", " + tensor_type(b_shape) + ") -> " + tensor_type(result));
}

}  // namespace riftco_transformer::detail::pjrt
