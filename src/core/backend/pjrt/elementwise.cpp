// Elementwise programs: one per (operation, element count). The formulas follow the CPU
// reference (cpu/elementwise.cpp) term by term, including its limits at ±inf: GELU as
// 0.5·x·erfc(−x/√2), tanh-GELU as x·σ(2u), SiLU as x·σ(x) with the stable sigmoid.
// Divide, log and sqrt check their domain on the device; the check is read at the next sync
// point and raised with the CPU's category and message.

#include <sstream>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

constexpr float inverse_sqrt_two = 0.707106781186547524F;
constexpr float inverse_sqrt_two_pi = 0.398942280401432678F;
constexpr float gelu_tanh_scale = 0.797884560802865356F;
constexpr float gelu_tanh_cubic = 0.044715F;

// Helpers writing one elementwise step over `type` (a rank-1 f32 tensor type).
class Flat {
  public:
    Flat(ProgramText& program, std::size_t count)
        : program_(program), count_(count), type_(tensor_type({count})) {}

    std::string binary(std::string_view op, const std::string& a, const std::string& b) {
        return program_.let(std::string("stablehlo.") + std::string(op) + " " + a + ", " + b +
                            " : " + type_);
    }
    std::string unary(std::string_view op, const std::string& a) {
        return program_.let(std::string("stablehlo.") + std::string(op) + " " + a + " : " + type_);
    }
    std::string constant(float value) {
        return program_.constant(value, std::vector<std::size_t>{count_});
    }
    std::string compare(std::string_view direction, const std::string& a, const std::string& b) {
        return program_.let("stablehlo.compare " + std::string(direction) + ", " + a + ", " + b +
                            ", FLOAT : (" + type_ + ", " + type_ + ") -> " +
                            tensor_type({count_}, "i1"));
    }
    std::string select(const std::string& predicate, const std::string& a, const std::string& b) {
        return program_.let("stablehlo.select " + predicate + ", " + a + ", " + b + " : " +
                            tensor_type({count_}, "i1") + ", " + type_);
    }
    std::string erf(const std::string& a) {
        return program_.let("chlo.erf " + a + " : " + type_ + " -> " + type_);
    }
    // σ(x) = 1/(1 + e^{−x}) for x >= 0 and e^{x}/(1 + e^{x}) otherwise.
    std::string sigmoid(const std::string& x) {
        const std::string zero = constant(0.0F);
        const std::string one = constant(1.0F);
        const std::string non_negative = compare("GE", x, zero);
        const std::string negated = unary("negate", x);
        const std::string exponent = select(non_negative, negated, x);
        const std::string e = unary("exponential", exponent);
        const std::string denominator = binary("add", one, e);
        const std::string numerator = select(non_negative, one, e);
        return binary("divide", numerator, denominator);
    }
    // where(condition_value == 0, replacement, value)
    std::string unless_zero(const std::string& condition_value, const std::string& replacement,
                            const std::string& value) {
        const std::string is_zero = compare("EQ", condition_value, constant(0.0F));
        return select(is_zero, replacement, value);
    }
    [[nodiscard]] const std::string& type() const { return type_; }

  private:
    ProgramText& program_;
    std::size_t count_;
    std::string type_;
};

const char* unary_name(UnaryOperation operation) {
    switch (operation) {
        case UnaryOperation::Negate:
            return "negate";
        case UnaryOperation::Exp:
            return "exp";
        case UnaryOperation::Log:
            return "log";
        case UnaryOperation::Sqrt:
            return "sqrt";
        case UnaryOperation::Erf:
            return "erf";
        case UnaryOperation::Gelu:
            return "gelu";
        case UnaryOperation::GeluTanh:
            return "gelu_tanh";
        case UnaryOperation::Relu:
            return "relu";
        case UnaryOperation::Silu:
            return "silu";
        case UnaryOperation::Tanh:
            return "tanh";
    }
    return "unknown";
}

const char* binary_name(BinaryOperation operation) {
    switch (operation) {
        case BinaryOperation::Add:
            return "add";
        case BinaryOperation::Subtract:
            return "subtract";
        case BinaryOperation::Multiply:
            return "multiply";
        case BinaryOperation::Divide:
            return "divide";
    }
    return "unknown";
}

const char* derivative_name(UnaryDerivative derivative) {
    switch (derivative) {
        case UnaryDerivative::Gelu:
            return "gelu";
        case UnaryDerivative::GeluTanh:
            return "gelu_tanh";
        case UnaryDerivative::Relu:
            return "relu";
        case UnaryDerivative::Silu:
            return "silu";
    }
    return "unknown";
}

std::exception_ptr domain_error_at(const char* operation, const char* argument, std::size_t index,
                                   float value, const char* requirement) {
    std::ostringstream message;
    message << operation << ": " << argument << " element " << index << " is " << value << " ("
            << requirement << ")";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

// tanh-GELU's z = 2·√(2/π)·(x + 0.044715·x³).
std::string gelu_tanh_argument(Flat& f, const std::string& x) {
    const std::string cube = f.binary("multiply", f.binary("multiply", x, x), x);
    const std::string inner =
        f.binary("add", x, f.binary("multiply", f.constant(gelu_tanh_cubic), cube));
    return f.binary("multiply", f.constant(2.0F * gelu_tanh_scale), inner);
}

class PjrtElementwise final : public ElementwiseCapability {
  public:
    explicit PjrtElementwise(const Context& context) : context_(context) {}

    void binary(BinaryOperation operation, const Tensor& left, const Tensor& right,
                Tensor& out) const override {
        const std::size_t count = out.numel();
        const bool divide = operation == BinaryOperation::Divide;
        const std::string key =
            std::string("binary/") + binary_name(operation) + "/" + std::to_string(count);
        auto text = [&] {
            ProgramText program;
            Flat f(program, count);
            const std::string a = program.parameter(f.type());
            const std::string b = program.parameter(f.type());
            const std::string y = f.binary(binary_name(operation), a, b);
            std::vector<std::pair<std::string, std::string>> results = {{y, f.type()}};
            if (divide) {
                const std::string zero = f.constant(0.0F);
                const std::string bad = f.compare("EQ", b, zero);
                const std::size_t shape[] = {count};
                results.emplace_back(first_violation_flag(program, bad, shape),
                                     tensor_type({1}, "i32"));
            }
            return program.finish(results);
        };
        const BufferPointer denominator = buffer_of(right);
        std::vector<Output> outputs = {{ElementType::F32, count}};
        if (divide) {
            outputs.push_back({ElementType::S32, 1});
        }
        const BufferPointer inputs[] = {buffer_of(left), denominator};
        std::vector<BufferPointer> results = run(context_, key, text, inputs, outputs);
        give(context_, out, results[0]);
        if (divide) {
            const Context& context = context_;
            defer_check(context_, results[1], [&context, denominator](std::size_t position) {
                return domain_error_at("divide", "denominator", position,
                                       read_element(context, denominator, position),
                                       "must be non-zero");
            });
        }
    }

    void unary(UnaryOperation operation, const Tensor& x, Tensor& out) const override {
        const std::size_t count = out.numel();
        const bool checked = operation == UnaryOperation::Log || operation == UnaryOperation::Sqrt;
        const std::string key =
            std::string("unary/") + unary_name(operation) + "/" + std::to_string(count);
        auto text = [&] {
            ProgramText program;
            Flat f(program, count);
            const std::string v = program.parameter(f.type());
            std::string y;
            switch (operation) {
                case UnaryOperation::Negate:
                    y = f.unary("negate", v);
                    break;
                case UnaryOperation::Exp:
                    y = f.unary("exponential", v);
                    break;
                case UnaryOperation::Log:
                    y = f.unary("log", v);
                    break;
                case UnaryOperation::Sqrt:
                    y = f.unary("sqrt", v);
                    break;
                case UnaryOperation::Erf:
                    y = f.erf(v);
                    break;
                case UnaryOperation::Gelu: {
                    // 0.5·x·erfc(−x/√2) = 0.5·x·(1 + erf(x/√2)); −0 where the tail is 0.
                    const std::string scaled =
                        f.binary("multiply", v, f.constant(inverse_sqrt_two));
                    const std::string tail = f.binary("add", f.constant(1.0F), f.erf(scaled));
                    const std::string value =
                        f.binary("multiply", f.binary("multiply", f.constant(0.5F), v), tail);
                    y = f.unless_zero(tail, f.constant(-0.0F), value);
                    break;
                }
                case UnaryOperation::GeluTanh: {
                    const std::string s = f.sigmoid(gelu_tanh_argument(f, v));
                    y = f.unless_zero(s, f.constant(-0.0F), f.binary("multiply", v, s));
                    break;
                }
                case UnaryOperation::Relu: {
                    // x <= 0 gives 0; NaN passes through.
                    const std::string not_positive = f.compare("LE", v, f.constant(0.0F));
                    y = f.select(not_positive, f.constant(0.0F), v);
                    break;
                }
                case UnaryOperation::Silu: {
                    const std::string s = f.sigmoid(v);
                    y = f.unless_zero(s, f.constant(-0.0F), f.binary("multiply", v, s));
                    break;
                }
                case UnaryOperation::Tanh:
                    y = f.unary("tanh", v);
                    break;
            }
            std::vector<std::pair<std::string, std::string>> results = {{y, f.type()}};
            if (checked) {
                // log: !(x > 0); sqrt: !(x >= 0) — NaN fails both.
                const std::string good =
                    f.compare(operation == UnaryOperation::Log ? "GT" : "GE", v, f.constant(0.0F));
                const std::string bad =
                    program.let("stablehlo.not " + good + " : " + tensor_type({count}, "i1"));
                const std::size_t shape[] = {count};
                results.emplace_back(first_violation_flag(program, bad, shape),
                                     tensor_type({1}, "i32"));
            }
            return program.finish(results);
        };
        const BufferPointer input = buffer_of(x);
        std::vector<Output> outputs = {{ElementType::F32, count}};
        if (checked) {
            outputs.push_back({ElementType::S32, 1});
        }
        const BufferPointer inputs[] = {input};
        std::vector<BufferPointer> results = run(context_, key, text, inputs, outputs);
        give(context_, out, results[0]);
        if (checked) {
            const Context& context = context_;
            const bool log = operation == UnaryOperation::Log;
            defer_check(context_, results[1], [&context, input, log](std::size_t position) {
                return domain_error_at(log ? "log" : "sqrt", "x", position,
                                       read_element(context, input, position),
                                       log ? "must be > 0" : "must be >= 0");
            });
        }
    }

    void affine(const Tensor& x, float multiplier, float addend, Tensor& out) const override {
        const std::size_t count = out.numel();
        // The scalars are program parameters, so a new multiplier does not recompile.
        const std::string key = "affine/" + std::to_string(count);
        auto text = [&] {
            ProgramText program;
            Flat f(program, count);
            const std::string v = program.parameter(f.type());
            const std::string m = program.parameter("tensor<1xf32>");
            const std::string a = program.parameter("tensor<1xf32>");
            const std::string m_all = program.let("stablehlo.broadcast_in_dim " + m +
                                                  ", dims = [0] : (tensor<1xf32>) -> " + f.type());
            const std::string a_all = program.let("stablehlo.broadcast_in_dim " + a +
                                                  ", dims = [0] : (tensor<1xf32>) -> " + f.type());
            const std::string y = f.binary("add", f.binary("multiply", v, m_all), a_all);
            const std::pair<std::string, std::string> results[] = {{y, f.type()}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text,
                 {buffer_of(x), scalar_buffer(context_, multiplier),
                  scalar_buffer(context_, addend)},
                 {{ElementType::F32, count}})[0]);
    }

    void unary_backward(UnaryDerivative derivative, const Tensor& x, const Tensor& upstream,
                        Tensor& out) const override {
        const std::size_t count = out.numel();
        const std::string key = std::string("unary_backward/") + derivative_name(derivative) + "/" +
                                std::to_string(count);
        auto text = [&] {
            ProgramText program;
            Flat f(program, count);
            const std::string v = program.parameter(f.type());
            const std::string g = program.parameter(f.type());
            std::string y;
            switch (derivative) {
                case UnaryDerivative::Gelu: {
                    // 0.5·erfc(−x/√2) + x·φ(x), the second term 0 where φ underflows.
                    const std::string scaled =
                        f.binary("multiply", v, f.constant(inverse_sqrt_two));
                    const std::string cdf =
                        f.binary("multiply", f.constant(0.5F),
                                 f.binary("add", f.constant(1.0F), f.erf(scaled)));
                    const std::string square = f.binary("multiply", v, v);
                    const std::string density = f.binary(
                        "multiply", f.constant(inverse_sqrt_two_pi),
                        f.unary("exponential", f.binary("multiply", f.constant(-0.5F), square)));
                    const std::string term =
                        f.unless_zero(density, f.constant(0.0F), f.binary("multiply", v, density));
                    y = f.binary("multiply", g, f.binary("add", cdf, term));
                    break;
                }
                case UnaryDerivative::GeluTanh: {
                    const std::string z = gelu_tanh_argument(f, v);
                    const std::string s = f.sigmoid(z);
                    const std::string one_minus = f.sigmoid(f.unary("negate", z));
                    const std::string slope =
                        f.binary("multiply", f.constant(gelu_tanh_scale),
                                 f.binary("add", f.constant(1.0F),
                                          f.binary("multiply", f.constant(3.0F * gelu_tanh_cubic),
                                                   f.binary("multiply", v, v))));
                    // s + 2·x·s·(1 − s)·slope, just s where σ saturates.
                    const std::string tail = f.binary(
                        "multiply",
                        f.binary("multiply",
                                 f.binary("multiply", f.binary("multiply", f.constant(2.0F), v), s),
                                 one_minus),
                        slope);
                    const std::string full = f.binary("add", s, tail);
                    const std::string saturated =
                        program.let("stablehlo.or " + f.compare("EQ", s, f.constant(0.0F)) + ", " +
                                    f.compare("EQ", one_minus, f.constant(0.0F)) + " : " +
                                    tensor_type({count}, "i1"));
                    y = f.binary("multiply", g, f.select(saturated, s, full));
                    break;
                }
                case UnaryDerivative::Relu: {
                    // g where x > 0; 0 where x <= 0; NaN (x itself) otherwise.
                    const std::string positive = f.compare("GT", v, f.constant(0.0F));
                    const std::string not_positive = f.compare("LE", v, f.constant(0.0F));
                    y = f.select(positive, g, f.select(not_positive, f.constant(0.0F), v));
                    break;
                }
                case UnaryDerivative::Silu: {
                    const std::string s = f.sigmoid(v);
                    const std::string one_minus = f.binary("subtract", f.constant(1.0F), s);
                    const std::string saturated = program.let(
                        "stablehlo.or " + f.compare("EQ", one_minus, f.constant(0.0F)) + ", " +
                        f.compare("EQ", s, f.constant(0.0F)) + " : " + tensor_type({count}, "i1"));
                    const std::string tail =
                        f.select(saturated, f.constant(0.0F), f.binary("multiply", v, one_minus));
                    y = f.binary("multiply", f.binary("multiply", g, s),
                                 f.binary("add", f.constant(1.0F), tail));
                    break;
                }
            }
            const std::pair<std::string, std::string> results[] = {{y, f.type()}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(x), buffer_of(upstream)},
                 {{ElementType::F32, count}})[0]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<ElementwiseCapability> make_elementwise(const Context& context) {
    return std::make_unique<PjrtElementwise>(context);
}

}  // namespace riftco_transformer::detail::pjrt
