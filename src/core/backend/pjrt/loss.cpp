// Fused softmax cross-entropy as one program per (logits shape, window, mask or not): the loss
// and the gradient come out of the same run. The window is a static slice of logits viewed as
// [B,T,V]; the mask flags and the count N are inputs (N changes with every masked batch, so it
// is a parameter and does not recompile).
//
// Per window row r (max-shifted log-sum-exp, as the CPU reference, cpu/loss.cpp):
//   m_r = max_j z_rj,  s_r = Σ_j exp(z_rj − m_r),  term_r = log s_r + (m_r − z_r,y)
//   loss = Σ_r term_r/N,  gradient_r = exp(z_r − m_r)·((1/s_r)·(1/N)) − onehot(y_r)/N
// The reference sums the terms in double; here each term and the sum are float32. Every term
// is >= 0, so the float sum rounds each addition by at most half an ulp of the running total:
// a relative error below (N−1)·2^-24 in the worst case and near √N·2^-24 in practice, within
// the 1e-6..1e-5 the tests allow for the vocabulary and row counts of training batches. The
// division by N comes before the sum (and, for a term beyond the float range, before the
// subtraction), so the float sum overflows only where the mean itself is beyond FLT_MAX.
//
// Value errors are checked on the device and raised at the next sync point: a non-finite target
// logit in the window (domain_error, naming the first such row of logits, as the reference) and
// then a non-finite mean loss (overflow_error).

#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Dimensions = std::vector<std::size_t>;
using Results = std::vector<std::pair<std::string, std::string>>;

// The window's geometry: logits [B,T,V], rows (b, t) with t in [offset, offset + count).
struct WindowGeometry {
    std::size_t batch = 1;
    std::size_t time = 1;
    std::size_t vocabulary = 1;
    std::size_t offset = 0;
    std::size_t count = 1;

    [[nodiscard]] std::size_t positions() const { return batch * count; }
    [[nodiscard]] bool whole() const { return count == time; }
    // The n-th window position -> its row of logits.
    [[nodiscard]] std::size_t row_of(std::size_t n) const {
        return n / count * time + offset + n % count;
    }
};

// `value` of shape [B,T,...] restricted to t in [offset, offset + count).
std::string window_slice(ProgramText& program, const std::string& value,
                         const WindowGeometry& window, Dimensions shape, std::string_view element) {
    if (window.whole()) {
        return value;
    }
    Dimensions start(shape.size(), 0);
    Dimensions limit = shape;
    const Dimensions strides(shape.size(), 1);
    start[1] = window.offset;
    limit[1] = window.offset + window.count;
    Dimensions result = shape;
    result[1] = window.count;
    return program.let("\"stablehlo.slice\"(" + value + ") {start_indices = " + i64_array(start) +
                       ", limit_indices = " + i64_array(limit) +
                       ", strides = " + i64_array(strides) + "} : (" + tensor_type(shape, element) +
                       ") -> " + tensor_type(result, element));
}

// A u32 parameter of one id per row of logits -> the window's ids as i32 [M].
std::string window_ids(ProgramText& program, const std::string& parameter,
                       const WindowGeometry& window) {
    const Dimensions flat = {window.batch * window.time};
    const Dimensions by_time = {window.batch, window.time};
    const Dimensions by_position = {window.positions()};
    const std::string shaped = program.reshape(parameter, flat, by_time, "ui32");
    const std::string sliced = window_slice(program, shaped, window, by_time, "ui32");
    Dimensions sliced_shape = {window.batch, window.count};
    const std::string positions = program.reshape(sliced, sliced_shape, by_position, "ui32");
    return program.let("stablehlo.convert " + positions + " : (" +
                       tensor_type(by_position, "ui32") + ") -> " +
                       tensor_type(by_position, "i32"));
}

std::exception_ptr non_finite_target(const Context& context, const BufferPointer& logits,
                                     const BufferPointer& targets, std::size_t vocabulary,
                                     std::size_t row) {
    std::vector<std::uint32_t> ids(targets->element_count());
    context.runtime->download(*targets, ids.data());
    const std::uint32_t target = ids.at(row);
    std::ostringstream message;
    message << "cross_entropy: logits at position " << row << ", target " << target
            << " is not finite (" << read_element(context, logits, row * vocabulary + target)
            << ")";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

// The overflow_error of a mean loss the device found non-finite. Its message names the
// reference's double-precision mean (NaN with its sign, or a value beyond FLT_MAX), which a
// float program cannot hold: at this sync point the inputs are read back and the CPU
// reference words the error from them. Only the message comes from there; the device
// decided that the mean is not a finite float.
struct OverflowReport {
    Shape logits_shape;
    BufferPointer logits;
    BufferPointer targets;
    BufferPointer selected;  // null without a mask
    LossWindow window;       // `selected` is rebuilt on the host
    BufferPointer loss;

    std::exception_ptr operator()(const Context& context) const {
        std::vector<float> values(logits->element_count());
        context.runtime->download(*logits, values.data());
        std::vector<std::uint32_t> ids(targets->element_count());
        context.runtime->download(*targets, ids.data());
        const Tensor host_logits(logits_shape, values, ExecutionBackend::Cpu);
        const IndexTensor host_targets({ids.size()}, ids, ExecutionBackend::Cpu);
        std::optional<IndexTensor> host_selected;
        LossWindow host_window = window;
        if (selected != nullptr) {
            std::vector<std::uint32_t> flags(selected->element_count());
            context.runtime->download(*selected, flags.data());
            host_selected.emplace(Shape{flags.size()}, flags, ExecutionBackend::Cpu);
            host_window.selected = &*host_selected;
        }
        Tensor host_loss(Shape{}, ExecutionBackend::Cpu);
        Tensor host_gradient(logits_shape, ExecutionBackend::Cpu);
        try {
            find_backend_adapter(ExecutionBackend::Cpu)
                ->loss()
                ->cross_entropy(host_logits, host_targets, host_window, host_loss, host_gradient);
        } catch (const std::overflow_error&) {
            return std::current_exception();
        }
        // The reference's double mean rounded to a float within FLT_MAX where the device's
        // float sum did not (a rounding at the very limit): the device's value is reported.
        std::ostringstream message;
        message << "cross_entropy: mean loss "
                << static_cast<double>(read_element(context, loss, 0))
                << " is not representable as a finite float";
        return std::make_exception_ptr(std::overflow_error(message.str()));
    }
};

class PjrtLoss final : public LossCapability {
  public:
    explicit PjrtLoss(const Context& context) : context_(context) {}

    void cross_entropy(const Tensor& logits, const IndexTensor& targets, LossWindow window,
                       Tensor& loss, Tensor& gradient) const override {
        const std::size_t vocabulary = logits.shape().back();
        const std::size_t rows = logits.numel() / vocabulary;
        const WindowGeometry geometry{rows / window.time_extent, window.time_extent, vocabulary,
                                      window.offset, window.count};
        const bool masked = window.selected != nullptr;
        const std::size_t averaged = masked ? window.selected_count : geometry.positions();
        const std::string key = "cross_entropy/" + std::to_string(geometry.batch) + "x" +
                                std::to_string(geometry.time) + "x" + std::to_string(vocabulary) +
                                "/window " + std::to_string(geometry.offset) + "+" +
                                std::to_string(geometry.count) + (masked ? "/masked" : "");
        auto text = [&] { return program_text(geometry, masked); };
        const BufferPointer logits_buffer = buffer_of(logits);
        const BufferPointer targets_buffer = buffer_of(targets);
        const BufferPointer selected_buffer = masked ? buffer_of(*window.selected) : nullptr;
        std::vector<BufferPointer> inputs = {logits_buffer, targets_buffer};
        if (masked) {
            inputs.push_back(selected_buffer);
        }
        inputs.push_back(scalar_buffer(context_, static_cast<float>(averaged)));
        inputs.push_back(
            scalar_buffer(context_, static_cast<float>(1.0 / static_cast<double>(averaged))));
        const Output outputs[] = {{ElementType::F32, 1},
                                  {ElementType::F32, logits.numel()},
                                  {ElementType::S32, 1},
                                  {ElementType::S32, 1}};
        std::vector<BufferPointer> results = run(context_, key, text, inputs, outputs);
        give(context_, loss, results[0]);
        give(context_, gradient, results[1]);
        const Context& context = context_;
        defer_check(context_, results[2],
                    [&context, logits_buffer, targets_buffer, geometry](std::size_t n) {
                        return non_finite_target(context, logits_buffer, targets_buffer,
                                                 geometry.vocabulary, geometry.row_of(n));
                    });
        LossWindow reported_window = window;
        reported_window.selected = nullptr;
        OverflowReport report{logits.shape(),  logits_buffer,   targets_buffer,
                              selected_buffer, reported_window, results[0]};
        defer_check(context_, results[3], [&context, report = std::move(report)](std::size_t) {
            return report(context);
        });
    }

  private:
    // Parameters: logits [B·T·V], targets u32 [B·T], (selected u32 [B·T]), N [1], 1/N [1].
    // Results: loss [1], gradient [B·T·V], the target check, the mean check.
    static std::string program_text(const WindowGeometry& window, bool masked) {
        ProgramText program;
        const std::size_t positions = window.positions();
        const std::size_t vocabulary = window.vocabulary;
        const Dimensions full = {window.batch, window.time, vocabulary};
        const Dimensions windowed = {window.batch, window.count, vocabulary};
        const Dimensions matrix = {positions, vocabulary};
        const Dimensions column = {positions};
        const std::string logits = program.parameter(flat_type(full));
        const std::string targets =
            program.parameter(tensor_type({window.batch * window.time}, "ui32"));
        const std::string selected_flags =
            masked ? program.parameter(tensor_type({window.batch * window.time}, "ui32")) : "";
        const std::string count_parameter = program.parameter("tensor<1xf32>");
        const std::string inverse_count_parameter = program.parameter("tensor<1xf32>");

        const auto binary = [&](std::string_view op, const std::string& a, const std::string& b,
                                const Dimensions& shape) {
            return program.let(std::string("stablehlo.") + std::string(op) + " " + a + ", " + b +
                               " : " + tensor_type(shape));
        };
        const auto unary = [&](std::string_view op, const std::string& a, const Dimensions& shape) {
            return program.let(std::string("stablehlo.") + std::string(op) + " " + a + " : " +
                               tensor_type(shape));
        };
        const auto select = [&](const std::string& predicate, const std::string& a,
                                const std::string& b, const Dimensions& shape) {
            return program.let("stablehlo.select " + predicate + ", " + a + ", " + b + " : " +
                               tensor_type(shape, "i1") + ", " + tensor_type(shape));
        };
        const auto is_finite = [&](const std::string& value, const Dimensions& shape) {
            return program.let("stablehlo.is_finite " + value + " : (" + tensor_type(shape) +
                               ") -> " + tensor_type(shape, "i1"));
        };
        const auto by_row = [&](const std::string& value, std::string_view element = "f32") {
            return program.let("stablehlo.broadcast_in_dim " + value + ", dims = [0] : (" +
                               tensor_type(column, element) + ") -> " +
                               tensor_type(matrix, element));
        };
        const auto scalar_over = [&](const std::string& parameter, const Dimensions& shape) {
            const std::string scalar =
                program.let("stablehlo.reshape " + parameter + " : (tensor<1xf32>) -> tensor<f32>");
            return program.broadcast_scalar(scalar, shape);
        };

        // z [M,V], y [M] (i32), and the rows that count.
        const Dimensions flat = {window.batch * window.time * vocabulary};
        const std::string by_time = program.reshape(logits, flat, full);
        const std::string z =
            program.reshape(window_slice(program, by_time, window, full, "f32"), windowed, matrix);
        const std::string y = window_ids(program, targets, window);
        std::string counted;
        if (masked) {
            const std::string flags = window_ids(program, selected_flags, window);
            counted = program.let("stablehlo.compare NE, " + flags + ", " +
                                  program.integer_constant(0, column) + ", SIGNED : (" +
                                  tensor_type(column, "i32") + ", " + tensor_type(column, "i32") +
                                  ") -> " + tensor_type(column, "i1"));
        }
        const std::string vocabulary_index =
            program.let("stablehlo.iota dim = 1 : " + tensor_type(matrix, "i32"));
        const std::string onehot =
            program.let("stablehlo.compare EQ, " + vocabulary_index + ", " + by_row(y, "i32") +
                        ", SIGNED : (" + tensor_type(matrix, "i32") + ", " +
                        tensor_type(matrix, "i32") + ") -> " + tensor_type(matrix, "i1"));
        const std::size_t vocabulary_axis[] = {1};
        const std::size_t position_axis[] = {0};
        const std::string zeros = program.constant(0.0F, matrix);
        const std::string target_logit =
            reduce(program, select(onehot, z, zeros, matrix), matrix, vocabulary_axis, false);
        const std::string maximum = reduce(program, z, matrix, vocabulary_axis, true);
        const std::string exponentials =
            unary("exponential", binary("subtract", z, by_row(maximum), matrix), matrix);
        const std::string sum = reduce(program, exponentials, matrix, vocabulary_axis, false);

        // term_r/N, with the division ahead of the subtraction when m − z_y overflows.
        const std::string count = scalar_over(count_parameter, column);
        const std::string log_sum = unary("log", sum, column);
        const std::string gap = binary("subtract", maximum, target_logit, column);
        const std::string regular =
            binary("divide", binary("add", log_sum, gap, column), count, column);
        const std::string extreme = binary("subtract",
                                           binary("add", binary("divide", log_sum, count, column),
                                                  binary("divide", maximum, count, column), column),
                                           binary("divide", target_logit, count, column), column);
        std::string term = select(is_finite(gap, column), regular, extreme, column);
        if (masked) {
            term = select(counted, term, program.constant(0.0F, column), column);
        }
        const Dimensions none;
        const std::string mean =
            program.let("stablehlo.reshape " + reduce(program, term, column, position_axis, false) +
                        " : (tensor<f32>) -> tensor<1xf32>");

        // (softmax − onehot)/N on the counted window rows, exactly 0 elsewhere.
        const std::string inverse_count = scalar_over(inverse_count_parameter, column);
        const std::string row_factor =
            binary("multiply", binary("divide", program.constant(1.0F, column), sum, column),
                   inverse_count, column);
        const std::string base = binary("multiply", exponentials, by_row(row_factor), matrix);
        std::string window_gradient =
            select(onehot, binary("subtract", base, by_row(inverse_count), matrix), base, matrix);
        if (masked) {
            window_gradient = select(by_row(counted, "i1"), window_gradient, zeros, matrix);
        }
        std::string gradient = program.reshape(window_gradient, matrix, windowed);
        if (!window.whole()) {
            const Dimensions low = {0, window.offset, 0};
            const Dimensions high = {0, window.time - window.offset - window.count, 0};
            const Dimensions interior = {0, 0, 0};
            gradient =
                program.let("\"stablehlo.pad\"(" + gradient + ", " + program.constant(0.0F, none) +
                            ") {edge_padding_low = " + i64_array(low) +
                            ", edge_padding_high = " + i64_array(high) +
                            ", interior_padding = " + i64_array(interior) + "} : (" +
                            tensor_type(windowed) + ", tensor<f32>) -> " + tensor_type(full));
        }

        // The checks: a non-finite target logit on a counted row; a non-finite mean.
        std::string bad_target = program.let("stablehlo.not " + is_finite(target_logit, column) +
                                             " : " + tensor_type(column, "i1"));
        if (masked) {
            bad_target = program.let("stablehlo.and " + bad_target + ", " + counted + " : " +
                                     tensor_type(column, "i1"));
        }
        const Dimensions one = {1};
        const std::string bad_mean =
            program.let("stablehlo.not " + is_finite(mean, one) + " : " + tensor_type(one, "i1"));
        const Results results = {
            {mean, tensor_type(one)},
            {program.flatten(gradient, full), flat_type(full)},
            {first_violation_flag(program, bad_target, column), tensor_type(one, "i32")},
            {first_violation_flag(program, bad_mean, one), tensor_type(one, "i32")}};
        return program.finish(results);
    }

    const Context& context_;
};

}  // namespace

std::unique_ptr<LossCapability> make_loss(const Context& context) {
    return std::make_unique<PjrtLoss>(context);
}

}  // namespace riftco_transformer::detail::pjrt
