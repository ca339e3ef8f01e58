// Adam on the PJRT device (cpu/adam.cpp is the reference): the gradients' statistics and the
// two passes of a step as StableHLO programs, compiled once per parameter layout.
//
// - Every per-step number (β1, β2, c1, c2, lr, ε, the clip factor or the maximum norm, the
//   decay factor, 1−β1, 1−β2) is a runtime parameter: doubles uploaded bit-exact as pairs of
//   u32 words and bit-cast to f64 inside the program, so a training run compiles each program
//   once and computes with the host's exact doubles.
// - Pass 1 of a step (statistics, clip factor, candidate check) is one program whose small
//   result (22 u32 words, below) is the step's only download. The same program also
//   produces θ', m', v': apply_update hands exactly those buffers to the tensors when it is
//   called with what the check saw (same scalars, tensors and buffers), so the write stores
//   what the check accepted, and otherwise runs the update program again. apply_update
//   transfers nothing to the host. A passed check keeps its results until the next
//   apply_update or check (at most one step's values and moments).
// - Each program evaluates one run: the slices' elements in list order, joined (θ, g, m, v:
//   f32[L]), or the listed tensors joined (statistics). The program text, and XLA's compile
//   time, then grow only with the joins and the output slices, not with a copy of the
//   arithmetic per tensor. Inputs and outputs of the evaluation pass through
//   optimization_barrier so that XLA does not re-fuse the evaluation into every one of the
//   slices (paged moments have one buffer per page; XLA's CPU compiler still spends a few
//   milliseconds per output buffer).
// - Many pages: XLA's compile time grows with a program's parameter and result buffers (a few
//   ms per result), so moments paged into thousands of tensors cannot all be parameters and
//   results of one program. When a step has direct_page_limit or more slices of one size S
//   (the optimizer's full pages), their m and v reach the update program joined, join_width
//   pages per execution of a join program, and leave it as the runs m', v' (f32[L]) that
//   apply_update cuts into pages, split_width per execution of a split program with the page
//   starts as a runtime table. Both are compiled once per S (and L), so compile time no
//   longer depends on the page count; the other slices (a parameter's last, shorter page)
//   stay parameters and results of the update program, at most one per parameter. Such a
//   step runs ⌈pages/join_width⌉ + 1 + ⌈pages/split_width⌉ programs; fewer pages, one.
// - Candidates follow the CPU term by term in f64 (g̃ = s·g; m' = β1·m + (1−β1)·g̃;
//   v' = β2·v + (1−β2)·g̃²; θ' = θ·decay − lr·(m'/c1)/(√(v'/c2) + ε)). XLA's CPU compiler
//   fuses a multiply into a following add (FMA) and runs with denormals flushed; the CPU
//   reference does neither (-ffp-contract=off, IEEE denormals). So every product that feeds
//   an add passes through an integer xor with a runtime zero (nothing can fuse across it),
//   and f32<->f64 conversions of float denormals are done on the bits. The candidates are
//   then the CPU's to the bit.
// - Statistics: max |x| and the first NaN/±inf are integer reductions on the bits (exact
//   tensor and element index); Σx² is summed in f64 over blocks of 4096 of the joined run
//   then across blocks. scale = max |x|, scaled = Σx²/scale²: within ~1e-15 relative of the
//   CPU's per-tensor blocked merge, not bit-identical (another order of additions).

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"
#include "core/tensor/tensor_access.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

constexpr std::size_t norm_block = 4096;  // cpu/adam.cpp's sum-of-squares block

// Paged moments (see "Many pages" above): from this many slices of one size on, those
// slices' moments reach the step program joined by `join_width` and leave it as two runs
// that a split program cuts into pages, `split_width` at a time (2·split_width results).
constexpr std::size_t direct_page_limit = 64;
constexpr std::size_t join_width = 128;
constexpr std::size_t split_width = 32;

// ---- result words --------------------------------------------------------------------------
// Both programs return u32 words; i64 and f64 values take two (little-endian), f32 bits one.
namespace word {
constexpr std::size_t bad_tensor = 0;   // i64: input position of the first non-finite tensor
constexpr std::size_t bad_element = 2;  // i64: its first non-finite element
constexpr std::size_t bad_bits = 4;     // u32: that element's bits (5 is zero)
constexpr std::size_t scale = 6;        // f64: max |g|
constexpr std::size_t scaled = 8;       // f64: Σg²/scale²
constexpr std::size_t statistics_count = 10;
constexpr std::size_t clip_scale = 10;      // f64: s
constexpr std::size_t value_slice = 12;     // i64: slice of the first non-finite θ
constexpr std::size_t value_element = 14;   // i64
constexpr std::size_t value_bits = 16;      // u32 (17 is zero)
constexpr std::size_t update_slice = 18;    // i64: slice of the first non-finite θ', m', v'
constexpr std::size_t update_element = 20;  // i64
constexpr std::size_t step_count = 22;
}  // namespace word

// The runtime scalars of the update programs, in the order of their f64 parameter slots.
namespace slot {
constexpr std::size_t beta1 = 0;
constexpr std::size_t beta2 = 1;
constexpr std::size_t bias_correction1 = 2;
constexpr std::size_t bias_correction2 = 3;
constexpr std::size_t learning_rate = 4;
constexpr std::size_t epsilon = 5;
constexpr std::size_t clip_or_maximum_norm = 6;  // s (update program) or G_max (step program)
constexpr std::size_t decay_factor = 7;
constexpr std::size_t one_minus_beta1 = 8;
constexpr std::size_t one_minus_beta2 = 9;
constexpr std::size_t zero = 10;  // +0.0: the xor mask of the FMA barrier
constexpr std::size_t count = 11;
}  // namespace slot

std::string double_literal(double value) {
    char text[24];
    std::snprintf(text, sizeof(text), "0x%016llX",
                  static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(value)));
    return text;
}

// key += separator, number (one piece at a time: GCC 12 misreports "x" + std::to_string).
void append_number(std::string& key, std::string_view separator, std::size_t number) {
    key += separator;
    key += std::to_string(number);
}

std::string integer_constant_list(const std::vector<std::int64_t>& values) {
    std::string text = "[";
    for (std::size_t i = 0; i < values.size(); ++i) {
        text += i == 0 ? "" : ", ";
        text += std::to_string(values[i]);
    }
    return text + "]";
}

// Operations on arrays of one shape (rank 1 or rank 0) of a program.
class Ops {
  public:
    Ops(ProgramText& program, std::vector<std::size_t> shape)
        : program_(program), shape_(std::move(shape)) {}

    [[nodiscard]] std::string type(std::string_view element) const {
        return tensor_type(shape_, element);
    }
    [[nodiscard]] std::size_t count() const { return element_count(shape_); }

    std::string binary(std::string_view op, const std::string& a, const std::string& b,
                       std::string_view element = "f64") {
        return program_.let("stablehlo." + std::string(op) + " " + a + ", " + b + " : " +
                            type(element));
    }
    std::string unary(std::string_view op, const std::string& a, std::string_view element = "f64") {
        return program_.let("stablehlo." + std::string(op) + " " + a + " : " + type(element));
    }
    std::string compare(std::string_view direction, const std::string& a, const std::string& b,
                        std::string_view element, std::string_view kind) {
        return program_.let("stablehlo.compare " + std::string(direction) + ", " + a + ", " + b +
                            ", " + std::string(kind) + " : (" + type(element) + ", " +
                            type(element) + ") -> " + type("i1"));
    }
    std::string select(const std::string& predicate, const std::string& a, const std::string& b,
                       std::string_view element) {
        return program_.let("stablehlo.select " + predicate + ", " + a + ", " + b + " : " +
                            type("i1") + ", " + type(element));
    }
    std::string convert(const std::string& a, std::string_view from, std::string_view to) {
        return program_.let("stablehlo.convert " + a + " : (" + type(from) + ") -> " + type(to));
    }
    // Same-width reinterpretation (f32<->ui32, f64<->i64).
    std::string bitcast(const std::string& a, std::string_view from, std::string_view to) {
        return program_.let("stablehlo.bitcast_convert " + a + " : (" + type(from) + ") -> " +
                            type(to));
    }
    std::string splat(const std::string& literal, std::string_view element) {
        return program_.let("stablehlo.constant dense<" + literal + "> : " + type(element));
    }
    std::string f64(double value) { return splat(double_literal(value), "f64"); }
    std::string u32(std::uint32_t value) { return splat(std::to_string(value), "ui32"); }
    std::string i64(std::int64_t value) { return splat(std::to_string(value), "i64"); }
    // A rank-0 value broadcast to this shape.
    std::string broadcast(const std::string& scalar, std::string_view element) {
        if (shape_.empty()) {
            return scalar;
        }
        return program_.broadcast_scalar(scalar, shape_, element);
    }
    std::string reduce(const std::string& a, std::string_view op, const std::string& init,
                       std::string_view element) {
        return program_.let("stablehlo.reduce(" + a + " init: " + init + ") applies stablehlo." +
                            std::string(op) + " across dimensions = [0] : (" + type(element) +
                            ", " + tensor_type({}, element) + ") -> " + tensor_type({}, element));
    }

    // f32 -> f64 exactly, float denormals included (the device flushes them in a convert):
    // a zero exponent field reads as ±mantissa·2^-149.
    std::string widen(const std::string& x) {
        const std::string bits = bitcast(x, "f32", "ui32");
        const std::string exponent = binary("and", bits, u32(0x7F800000U), "ui32");
        const std::string subnormal = compare("EQ", exponent, u32(0), "ui32", "UNSIGNED");
        const std::string mantissa = binary("and", bits, u32(0x007FFFFFU), "ui32");
        const std::string magnitude =
            binary("multiply", convert(mantissa, "ui32", "f64"), f64(0x1p-149));
        const std::string negative = compare("GE", bits, u32(0x80000000U), "ui32", "UNSIGNED");
        const std::string small = select(negative, unary("negate", magnitude), magnitude, "f64");
        return select(subnormal, small, convert(x, "f32", "f64"), "f64");
    }
    // f64 -> f32 rounded to nearest even, as static_cast<float>: below 2^-126 the result is
    // the integer round(|y|·2^149) as mantissa bits with y's sign (2^23 rounds up to the
    // smallest normal by itself); elsewhere the convert (overflow to ±inf, NaN kept).
    std::string narrow(const std::string& y) {
        const std::string magnitude = unary("abs", y);
        const std::string tiny = compare("LT", magnitude, f64(0x1p-126), "f64", "FLOAT");
        const std::string clamped = select(tiny, magnitude, f64(0.0), "f64");
        const std::string units =
            unary("round_nearest_even", binary("multiply", clamped, f64(0x1p149)));
        const std::string mantissa = convert(units, "f64", "ui32");
        const std::string negative =
            compare("LT", bitcast(y, "f64", "i64"), i64(0), "i64", "SIGNED");
        const std::string signed_bits =
            select(negative, binary("or", mantissa, u32(0x80000000U), "ui32"), mantissa, "ui32");
        return select(tiny, bitcast(signed_bits, "ui32", "f32"), convert(y, "f64", "f32"), "f32");
    }
    // x unchanged, but no longer a product the compiler may fuse into an add.
    std::string barrier(const std::string& x, const std::string& zero_mask) {
        const std::string bits = bitcast(x, "f64", "i64");
        return bitcast(binary("xor", bits, broadcast(zero_mask, "i64"), "i64"), "i64", "f64");
    }
    // NaN or ±inf, from the f32 bits.
    std::string non_finite(const std::string& x) {
        const std::string magnitude =
            binary("and", bitcast(x, "f32", "ui32"), u32(0x7FFFFFFFU), "ui32");
        return compare("GE", magnitude, u32(0x7F800000U), "ui32", "UNSIGNED");
    }
    // Rank-0 i64: the first position where `flags` holds, or count() when none does.
    std::string first_true(const std::string& flags) {
        const std::string positions = program_.let("stablehlo.iota dim = 0 : " + type("i64"));
        const auto none = static_cast<std::int64_t>(count());
        const std::string scored = select(flags, positions, i64(none), "i64");
        Ops scalar(program_, {});
        return reduce(scored, "minimum", scalar.i64(none), "i64");
    }
    // Rank-0 element `position` (rank-0 i64, in range) of this rank-1 array.
    std::string element_at(const std::string& a, const std::string& position,
                           std::string_view element) {
        const std::string one =
            program_.let("stablehlo.dynamic_slice " + a + ", " + position + ", sizes = [1] : (" +
                         type(element) + ", tensor<i64>) -> " + tensor_type({1}, element));
        return program_.let("stablehlo.reshape " + one + " : (" + tensor_type({1}, element) +
                            ") -> " + tensor_type({}, element));
    }
    // a[begin:end] of this rank-1 array.
    std::string range(const std::string& a, std::size_t begin, std::size_t end,
                      std::string_view element) {
        if (begin == 0 && end == count()) {
            return a;
        }
        return program_.let("stablehlo.slice " + a + " [" + std::to_string(begin) + ":" +
                            std::to_string(end) + "] : (" + type(element) + ") -> " +
                            tensor_type({end - begin}, element));
    }

  private:
    ProgramText& program_;
    std::vector<std::size_t> shape_;
};

// Rank-1 pieces joined in order (a single piece is itself).
std::string concatenate(ProgramText& program, const std::vector<std::string>& pieces,
                        const std::vector<std::size_t>& counts, std::string_view element) {
    if (pieces.size() == 1) {
        return pieces.front();
    }
    std::string operands;
    std::string types;
    std::size_t total = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
        operands += i == 0 ? "" : ", ";
        operands += pieces[i];
        types += i == 0 ? "" : ", ";
        types += tensor_type({counts[i]}, element);
        total += counts[i];
    }
    return program.let("stablehlo.concatenate " + operands + ", dim = 0 : (" + types + ") -> " +
                       tensor_type({total}, element));
}

// The result words from rank-0 values: (name, element) with element i64, f64 or ui32.
std::string pack_words(ProgramText& program,
                       const std::vector<std::pair<std::string, std::string>>& values) {
    std::vector<std::string> pieces;
    std::vector<std::size_t> counts;
    for (const auto& [name, element] : values) {
        if (element == "ui32") {
            pieces.push_back(
                program.let("stablehlo.reshape " + name + " : (tensor<ui32>) -> tensor<1xui32>"));
            counts.push_back(1);
        } else {
            pieces.push_back(program.let("stablehlo.bitcast_convert " + name + " : (tensor<" +
                                         element + ">) -> tensor<2xui32>"));
            counts.push_back(2);
        }
    }
    return concatenate(program, pieces, counts, "ui32");
}

// (id, element) of `position` in a run made of pieces starting at `starts` (ascending, the
// first 0) with ids `ids`, or (none, 0) when position == length (nothing found).
std::pair<std::string, std::string> locate(ProgramText& program,
                                           const std::vector<std::size_t>& starts,
                                           const std::vector<std::size_t>& ids, std::size_t length,
                                           std::size_t none, const std::string& position) {
    Ops scalar(program, {});
    const std::string found = scalar.compare(
        "LT", position, scalar.i64(static_cast<std::int64_t>(length)), "i64", "SIGNED");
    std::string id;
    std::string element;
    if (starts.size() == 1) {
        id = scalar.i64(static_cast<std::int64_t>(ids.front()));
        element = position;
    } else {
        const std::vector<std::int64_t> start_values(starts.begin(), starts.end());
        const std::vector<std::int64_t> id_values(ids.begin(), ids.end());
        Ops table(program, {starts.size()});
        const std::string start_table = table.splat(integer_constant_list(start_values), "i64");
        const std::string id_table = table.splat(integer_constant_list(id_values), "i64");
        // k = #(starts <= position) − 1: the piece that holds the position.
        const std::string at_or_before =
            table.compare("LE", start_table, table.broadcast(position, "i64"), "i64", "SIGNED");
        const std::string k = scalar.binary(
            "subtract",
            table.reduce(table.convert(at_or_before, "i1", "i64"), "add", scalar.i64(0), "i64"),
            scalar.i64(1), "i64");
        id = table.element_at(id_table, k, "i64");
        element =
            scalar.binary("subtract", position, table.element_at(start_table, k, "i64"), "i64");
    }
    return {scalar.select(found, id, scalar.i64(static_cast<std::int64_t>(none)), "i64"),
            scalar.select(found, element, scalar.i64(0), "i64")};
}

// `value` (of `type`) computed once into its own buffer: XLA fuses neither into it nor
// through it.
std::string materialise(ProgramText& program, const std::string& value, const std::string& type) {
    return program.let("stablehlo.optimization_barrier " + value + " : " + type);
}

// ---- gradient statistics (program fragment) -------------------------------------------------

struct StatisticsNames {
    std::string bad_tensor;   // i64
    std::string bad_element;  // i64
    std::string bad_bits;     // ui32
    std::string scale;        // f64
    std::string scaled;       // f64
};

// Over the rank-1 f32 inputs `tensors` (element counts `counts`, each > 0), joined in list
// order into one run of N elements: one scan, one max and one sum whatever the tensor count.
StatisticsNames emit_statistics(ProgramText& program, const std::vector<std::string>& tensors,
                                const std::vector<std::size_t>& counts, bool with_squares) {
    Ops scalar(program, {});
    StatisticsNames names;
    if (tensors.empty()) {
        names = {scalar.i64(0), scalar.i64(0), scalar.u32(0), scalar.f64(0.0), scalar.f64(0.0)};
        return names;
    }
    std::vector<std::size_t> starts;
    std::vector<std::size_t> ids;
    std::size_t length = 0;
    for (std::size_t t = 0; t < counts.size(); ++t) {
        starts.push_back(length);
        ids.push_back(t);
        length += counts[t];
    }
    const std::string run =
        materialise(program, concatenate(program, tensors, counts, "f32"), tensor_type({length}));
    Ops x(program, {length});
    const std::string bits = x.bitcast(run, "f32", "ui32");
    const std::string magnitude = x.binary("and", bits, x.u32(0x7FFFFFFFU), "ui32");
    const std::string first =
        x.first_true(x.compare("GE", magnitude, x.u32(0x7F800000U), "ui32", "UNSIGNED"));
    std::tie(names.bad_tensor, names.bad_element) =
        locate(program, starts, ids, length, tensors.size(), first);
    const std::string at =
        scalar.binary("minimum", first, scalar.i64(static_cast<std::int64_t>(length) - 1), "i64");
    names.bad_bits = scalar.select(
        scalar.compare("LT", first, scalar.i64(static_cast<std::int64_t>(length)), "i64", "SIGNED"),
        x.element_at(bits, at, "ui32"), scalar.u32(0), "ui32");
    if (!with_squares) {
        names.scale = scalar.f64(0.0);
        names.scaled = scalar.f64(0.0);
        return names;
    }
    const std::string largest = x.reduce(magnitude, "maximum", scalar.u32(0), "ui32");
    const std::string wide = x.widen(run);
    const std::string squares = x.binary("multiply", wide, wide);
    std::string total;
    if (length <= norm_block) {
        total = x.reduce(squares, "add", scalar.f64(0.0), "f64");
    } else {
        // [N] -> zero-padded [blocks, 4096] -> Σ per block -> Σ over blocks.
        const std::size_t blocks = (length + norm_block - 1) / norm_block;
        const std::string padded = program.let(
            "stablehlo.pad " + squares + ", " + scalar.f64(0.0) + ", low = [0], high = [" +
            std::to_string(blocks * norm_block - length) + "], interior = [0] : (" + x.type("f64") +
            ", tensor<f64>) -> " + tensor_type({blocks * norm_block}, "f64"));
        const std::string grid = program.let("stablehlo.reshape " + padded + " : (" +
                                             tensor_type({blocks * norm_block}, "f64") + ") -> " +
                                             tensor_type({blocks, norm_block}, "f64"));
        const std::string block_totals =
            program.let("stablehlo.reduce(" + grid + " init: " + scalar.f64(0.0) +
                        ") applies stablehlo.add across dimensions = [1] : (" +
                        tensor_type({blocks, norm_block}, "f64") + ", tensor<f64>) -> " +
                        tensor_type({blocks}, "f64"));
        total = Ops(program, {blocks}).reduce(block_totals, "add", scalar.f64(0.0), "f64");
    }
    names.scale = scalar.widen(scalar.bitcast(largest, "ui32", "f32"));
    const std::string is_zero = scalar.compare("EQ", names.scale, scalar.f64(0.0), "f64", "FLOAT");
    const std::string ratio =
        scalar.binary("divide", total, scalar.binary("multiply", names.scale, names.scale));
    names.scaled = scalar.select(is_zero, scalar.f64(0.0), ratio, "f64");
    return names;
}

std::string statistics_program(const std::vector<std::size_t>& counts, bool with_squares) {
    ProgramText program;
    std::vector<std::string> tensors;
    tensors.reserve(counts.size());
    for (const std::size_t n : counts) {
        tensors.push_back(program.parameter(tensor_type({n})));
    }
    const StatisticsNames s = emit_statistics(program, tensors, counts, with_squares);
    Ops scalar(program, {});
    const std::string zero = scalar.u32(0);
    const std::string words = pack_words(program, {{s.bad_tensor, "i64"},
                                                   {s.bad_element, "i64"},
                                                   {s.bad_bits, "ui32"},
                                                   {zero, "ui32"},
                                                   {s.scale, "f64"},
                                                   {s.scaled, "f64"}});
    const std::pair<std::string, std::string> results[] = {
        {words, tensor_type({word::statistics_count}, "ui32")}};
    return program.finish(results);
}

// ---- the update plan -----------------------------------------------------------------------

// How a request's tensors become program parameters and results. The non-empty slices, in
// list order, are joined into one run of L elements (θ, g, m, v each) that the program
// evaluates at once; every value tensor (a paged value appears in several slices) gets its θ'
// back from its slices' stretches of the run.
struct UpdatePlan {
    struct Slice {
        std::size_t index;     // position in the request's slice list
        std::size_t group;     // into groups
        std::size_t offset;    // in the value
        std::size_t count;     // > 0
        std::size_t start;     // in the run
        std::size_t gradient;  // into gradient_inputs; gradient_inputs.size() for none
    };
    struct Group {
        Tensor* value;
        std::size_t count;                // the value's elements
        std::vector<std::size_t> slices;  // into UpdatePlan::slices, in list order
        bool contiguous = false;  // θ' is run[start, start + count): the slices follow each
                                  // other in the run and cover the value in order
    };
    std::size_t slice_count = 0;                    // of the request (the "none" index)
    std::vector<std::size_t> statistics_positions;  // list positions of the statistics inputs
    std::vector<const Tensor*> gradient_inputs;     // statistics inputs first, then the rest
    std::vector<Group> groups;
    std::vector<Slice> slices;  // the non-empty ones, in list order
    std::size_t length = 0;     // L
    // Many slices of one size S (page_size, 0 for none): those ("pages", into slices, in list
    // order) are joined and split outside the step program; the others ("direct") are its
    // parameters and results one by one.
    std::size_t page_size = 0;
    std::vector<std::size_t> pages;
    std::vector<std::size_t> direct;
    std::string key;

    [[nodiscard]] std::size_t join_count() const {
        return (pages.size() + join_width - 1) / join_width;
    }
};

UpdatePlan make_plan(std::span<const Tensor* const> gradients, std::span<const AdamSlice> slices,
                     bool step) {
    UpdatePlan plan;
    plan.slice_count = slices.size();
    std::map<const Tensor*, std::size_t> gradient_index;
    if (step) {
        for (std::size_t t = 0; t < gradients.size(); ++t) {
            if (gradients[t] != nullptr && gradients[t]->numel() != 0) {
                // A tensor listed twice is passed twice; slices read its first input.
                plan.statistics_positions.push_back(t);
                gradient_index.emplace(gradients[t], plan.gradient_inputs.size());
                plan.gradient_inputs.push_back(gradients[t]);
            }
        }
    }
    std::map<const Tensor*, std::size_t> group_index;
    std::vector<const Tensor*> slice_gradients;
    for (std::size_t s = 0; s < slices.size(); ++s) {
        const AdamSlice& slice = slices[s];
        const std::size_t count = slice.first_moment->numel();
        if (count == 0) {
            continue;  // nothing to check or write
        }
        auto [entry, inserted] = group_index.emplace(slice.value, plan.groups.size());
        if (inserted) {
            plan.groups.push_back({slice.value, slice.value->numel(), {}});
        }
        plan.groups[entry->second].slices.push_back(plan.slices.size());
        plan.slices.push_back({s, entry->second, slice.offset, count, plan.length, 0});
        slice_gradients.push_back(slice.gradient);
        plan.length += count;
    }
    for (const Tensor* gradient : slice_gradients) {
        if (gradient != nullptr &&
            gradient_index.emplace(gradient, plan.gradient_inputs.size()).second) {
            plan.gradient_inputs.push_back(gradient);
        }
    }
    for (std::size_t i = 0; i < plan.slices.size(); ++i) {
        plan.slices[i].gradient = slice_gradients[i] == nullptr
                                      ? plan.gradient_inputs.size()
                                      : gradient_index.at(slice_gradients[i]);
    }
    for (UpdatePlan::Group& group : plan.groups) {
        const UpdatePlan::Slice& first = plan.slices[group.slices.front()];
        std::size_t offset = 0;
        std::size_t start = first.start;
        group.contiguous = true;
        for (const std::size_t i : group.slices) {
            group.contiguous = group.contiguous && plan.slices[i].offset == offset &&
                               plan.slices[i].start == start;
            offset += plan.slices[i].count;
            start += plan.slices[i].count;
        }
        group.contiguous = group.contiguous && offset == group.count;
    }
    // The most frequent slice size (the larger on a tie), when it is frequent enough. Page
    // starts are u32 split-program parameters, so the run must index in 32 bits.
    std::map<std::size_t, std::size_t> frequency;
    for (const UpdatePlan::Slice& slice : plan.slices) {
        ++frequency[slice.count];
    }
    std::size_t most = 0;
    for (const auto& [count, slices_of_count] : frequency) {
        if (slices_of_count >= direct_page_limit && slices_of_count >= most &&
            plan.length <= std::numeric_limits<std::uint32_t>::max()) {
            plan.page_size = count;
            most = slices_of_count;
        }
    }
    for (std::size_t i = 0; i < plan.slices.size(); ++i) {
        (plan.slices[i].count == plan.page_size ? plan.pages : plan.direct).push_back(i);
    }
    plan.key = step ? "adam/step/" : "adam/update/";
    plan.key += std::to_string(plan.statistics_positions.size());
    plan.key += "/g";
    for (const Tensor* gradient : plan.gradient_inputs) {
        append_number(plan.key, ":", gradient->numel());
    }
    append_number(plan.key, "/s", plan.slice_count);
    append_number(plan.key, "/pages", plan.page_size);
    for (const UpdatePlan::Group& group : plan.groups) {
        append_number(plan.key, "/v", group.count);
    }
    for (const UpdatePlan::Slice& slice : plan.slices) {
        append_number(plan.key, "/", slice.index);
        append_number(plan.key, "v", slice.group);
        append_number(plan.key, "@", slice.offset);
        append_number(plan.key, "+", slice.count);
        append_number(plan.key, "g", slice.gradient);
    }
    return plan;
}

// [offset, offset + count) of input `source`; source == the input count reads zeros.
struct Stretch {
    std::size_t source;
    std::size_t offset;
    std::size_t count;
};

// Appends `next`, merged into the last stretch when it continues it.
void extend(std::vector<Stretch>& stretches, const Stretch& next, std::size_t zeros) {
    if (!stretches.empty()) {
        Stretch& last = stretches.back();
        if (last.source == next.source &&
            (next.source == zeros || last.offset + last.count == next.offset)) {
            last.count += next.count;
            return;
        }
    }
    stretches.push_back(next);
}

// The stretches of rank-1 f32 `sources` (element counts `counts`) joined in order.
std::string join(ProgramText& program, const std::vector<Stretch>& stretches,
                 const std::vector<std::string>& sources, const std::vector<std::size_t>& counts) {
    std::vector<std::string> pieces;
    std::vector<std::size_t> sizes;
    for (const Stretch& stretch : stretches) {
        sizes.push_back(stretch.count);
        if (stretch.source == sources.size()) {
            pieces.push_back(Ops(program, {stretch.count}).splat(float_literal(0.0F), "f32"));
        } else {
            pieces.push_back(Ops(program, {counts[stretch.source]})
                                 .range(sources[stretch.source], stretch.offset,
                                        stretch.offset + stretch.count, "f32"));
        }
    }
    return concatenate(program, pieces, sizes, "f32");
}

// The update program. Parameters: the f64 scalar words (u32[2·slot::count]), the gradient
// inputs, one value per group, then (m, v) joined per join_width pages (f32[join_width·S],
// the last padded), then (m, v) of every direct slice. Results: the words
// (u32[word::step_count]), θ' per group, (m', v') as runs (f32[L]) when there are pages,
// then (m', v') per direct slice.
std::string update_program(const UpdatePlan& plan, bool step) {
    ProgramText program;
    Ops scalar(program, {});
    const std::string scalar_words = program.parameter(tensor_type({2 * slot::count}, "ui32"));
    std::vector<std::string> gradients;
    for (const Tensor* gradient : plan.gradient_inputs) {
        gradients.push_back(program.parameter(tensor_type({gradient->numel()})));
    }
    std::vector<std::string> values;
    for (const UpdatePlan::Group& group : plan.groups) {
        values.push_back(program.parameter(tensor_type({group.count})));
    }
    // The moments' sources, and where each planned slice reads them.
    std::vector<std::string> first_moments;
    std::vector<std::string> second_moments;
    std::vector<std::size_t> moment_counts;
    for (std::size_t j = 0; j < plan.join_count(); ++j) {
        moment_counts.push_back(join_width * plan.page_size);
    }
    for (const std::size_t i : plan.direct) {
        moment_counts.push_back(plan.slices[i].count);
    }
    for (const std::size_t count : moment_counts) {
        first_moments.push_back(program.parameter(tensor_type({count})));
        second_moments.push_back(program.parameter(tensor_type({count})));
    }
    std::vector<Stretch> moment_sources(plan.slices.size());
    for (std::size_t b = 0; b < plan.pages.size(); ++b) {
        moment_sources[plan.pages[b]] = {b / join_width, (b % join_width) * plan.page_size,
                                         plan.page_size};
    }
    for (std::size_t d = 0; d < plan.direct.size(); ++d) {
        moment_sources[plan.direct[d]] = {plan.join_count() + d, 0,
                                          plan.slices[plan.direct[d]].count};
    }

    // u32[2K] -> [K,2] -> f64[K] -> one rank-0 f64 per slot.
    const std::string pairs = program.let("stablehlo.reshape " + scalar_words + " : (" +
                                          tensor_type({2 * slot::count}, "ui32") + ") -> " +
                                          tensor_type({slot::count, 2}, "ui32"));
    const std::string doubles = program.let("stablehlo.bitcast_convert " + pairs + " : (" +
                                            tensor_type({slot::count, 2}, "ui32") + ") -> " +
                                            tensor_type({slot::count}, "f64"));
    Ops slots(program, {slot::count});
    std::vector<std::string> k(slot::count);
    for (std::size_t i = 0; i < slot::count; ++i) {
        const std::string one = slots.range(doubles, i, i + 1, "f64");
        k[i] = program.let("stablehlo.reshape " + one + " : (tensor<1xf64>) -> tensor<f64>");
    }
    const std::string zero_mask = scalar.bitcast(k[slot::zero], "f64", "i64");

    // Statistics and the clip factor s = G_max/‖g‖ when ‖g‖ > G_max, else 1.
    StatisticsNames statistics;
    std::string clip = k[slot::clip_or_maximum_norm];
    std::string gradients_finite;
    if (step) {
        const std::size_t inputs = plan.statistics_positions.size();
        std::vector<std::size_t> counts;
        for (std::size_t t = 0; t < inputs; ++t) {
            counts.push_back(plan.gradient_inputs[t]->numel());
        }
        statistics = emit_statistics(
            program,
            std::vector<std::string>(gradients.begin(),
                                     gradients.begin() + static_cast<std::ptrdiff_t>(inputs)),
            counts, true);
        const std::string norm =
            scalar.binary("multiply", statistics.scale, scalar.unary("sqrt", statistics.scaled));
        const std::string maximum = k[slot::clip_or_maximum_norm];
        const std::string above = scalar.compare("GT", norm, maximum, "f64", "FLOAT");
        clip = scalar.select(above, scalar.binary("divide", maximum, norm), scalar.f64(1.0), "f64");
        gradients_finite =
            scalar.compare("EQ", statistics.bad_tensor,
                           scalar.i64(static_cast<std::int64_t>(inputs)), "i64", "SIGNED");
    } else {
        statistics = {scalar.i64(0), scalar.i64(0), scalar.u32(0), scalar.f64(0.0),
                      scalar.f64(0.0)};
    }

    const std::size_t length = plan.length;
    const auto none = static_cast<std::int64_t>(plan.slice_count);
    std::string value_slice = scalar.i64(none);
    std::string value_element = scalar.i64(0);
    std::string value_bits = scalar.u32(0);
    std::string update_slice = scalar.i64(none);
    std::string update_element = scalar.i64(0);
    std::vector<std::pair<std::string, std::string>> results;
    std::vector<std::pair<std::string, std::string>> moment_results;
    if (length != 0) {
        // The run of θ, g, m, v over the slices in list order: f32[L]. Consecutive slices
        // that continue each other in one tensor (the pages of a value) read one stretch.
        std::vector<std::size_t> starts;
        std::vector<std::size_t> ids;
        std::vector<Stretch> theta_stretches;
        std::vector<Stretch> gradient_stretches;
        std::vector<Stretch> moment_stretches;
        for (const Stretch& source : moment_sources) {
            extend(moment_stretches, source, first_moments.size());
        }
        for (const UpdatePlan::Slice& slice : plan.slices) {
            starts.push_back(slice.start);
            ids.push_back(slice.index);
            extend(theta_stretches, {slice.group, slice.offset, slice.count}, plan.groups.size());
            extend(gradient_stretches, {slice.gradient, slice.offset, slice.count},
                   plan.gradient_inputs.size());
        }
        std::vector<std::size_t> value_counts;
        for (const UpdatePlan::Group& group : plan.groups) {
            value_counts.push_back(group.count);
        }
        std::vector<std::size_t> gradient_counts;
        for (const Tensor* input : plan.gradient_inputs) {
            gradient_counts.push_back(input->numel());
        }
        const std::string inputs_run = program.fresh();
        const std::string run_type = tensor_type({length});
        program.line(inputs_run + ":4 = stablehlo.optimization_barrier " +
                     join(program, theta_stretches, values, value_counts) + ", " +
                     join(program, gradient_stretches, gradients, gradient_counts) + ", " +
                     join(program, moment_stretches, first_moments, moment_counts) + ", " +
                     join(program, moment_stretches, second_moments, moment_counts) + " : " +
                     run_type + ", " + run_type + ", " + run_type + ", " + run_type);
        const std::string theta = inputs_run + "#0";
        const std::string gradient = inputs_run + "#1";
        const std::string first = inputs_run + "#2";
        const std::string second = inputs_run + "#3";

        // The candidates in f64, term by term as cpu/adam.cpp's adam_candidate.
        Ops run(program, {length});
        const auto at = [&](std::size_t i) { return run.broadcast(k[i], "f64"); };
        const std::string g_scaled =
            run.binary("multiply", run.broadcast(clip, "f64"), run.widen(gradient));
        const std::string m_new = run.binary(
            "add",
            run.barrier(run.binary("multiply", at(slot::beta1), run.widen(first)), zero_mask),
            run.barrier(run.binary("multiply", at(slot::one_minus_beta1), g_scaled), zero_mask));
        const std::string v_new = run.binary(
            "add",
            run.barrier(run.binary("multiply", at(slot::beta2), run.widen(second)), zero_mask),
            run.barrier(run.binary("multiply", at(slot::one_minus_beta2),
                                   run.binary("multiply", g_scaled, g_scaled)),
                        zero_mask));
        const std::string step_size = run.binary(
            "divide",
            run.binary("multiply", at(slot::learning_rate),
                       run.binary("divide", m_new, at(slot::bias_correction1))),
            run.binary("add",
                       run.unary("sqrt", run.binary("divide", v_new, at(slot::bias_correction2))),
                       at(slot::epsilon)));
        const std::string theta_new =
            run.binary("subtract",
                       run.barrier(run.binary("multiply", run.widen(theta), at(slot::decay_factor)),
                                   zero_mask),
                       step_size);
        // Materialised once: without the barrier XLA fuses the whole evaluation into every
        // output slice, and compile time grows with the slice count.
        const std::string narrowed = program.fresh();
        program.line(narrowed + ":3 = stablehlo.optimization_barrier " + run.narrow(theta_new) +
                     ", " + run.narrow(m_new) + ", " + run.narrow(v_new) + " : " + run.type("f32") +
                     ", " + run.type("f32") + ", " + run.type("f32"));
        const std::string theta_out = narrowed + "#0";
        const std::string first_out = narrowed + "#1";
        const std::string second_out = narrowed + "#2";

        // The first non-finite θ and the first non-finite θ', m' or v', in list order.
        const std::string theta_bad = run.first_true(run.non_finite(theta));
        std::tie(value_slice, value_element) =
            locate(program, starts, ids, length, plan.slice_count, theta_bad);
        const std::string theta_at = scalar.binary(
            "minimum", theta_bad, scalar.i64(static_cast<std::int64_t>(length) - 1), "i64");
        value_bits = run.element_at(run.bitcast(theta, "f32", "ui32"), theta_at, "ui32");
        const std::string update_bad = run.first_true(run.binary(
            "or", run.binary("or", run.non_finite(theta_out), run.non_finite(first_out), "i1"),
            run.non_finite(second_out), "i1"));
        std::tie(update_slice, update_element) =
            locate(program, starts, ids, length, plan.slice_count, update_bad);

        // θ' of each value: one stretch of the run, or its slices written at their offsets.
        for (std::size_t g = 0; g < plan.groups.size(); ++g) {
            const UpdatePlan::Group& group = plan.groups[g];
            const std::string type = tensor_type({group.count});
            if (group.contiguous) {
                const std::size_t begin = plan.slices[group.slices.front()].start;
                results.emplace_back(run.range(theta_out, begin, begin + group.count, "f32"), type);
                continue;
            }
            std::string value_out = values[g];
            for (const std::size_t i : group.slices) {
                const UpdatePlan::Slice& slice = plan.slices[i];
                const std::string part =
                    run.range(theta_out, slice.start, slice.start + slice.count, "f32");
                value_out = program.let(
                    "stablehlo.dynamic_update_slice " + value_out + ", " + part + ", " +
                    scalar.i64(static_cast<std::int64_t>(slice.offset)) + " : (" + type + ", " +
                    tensor_type({slice.count}) + ", tensor<i64>) -> " + type);
            }
            results.emplace_back(value_out, type);
        }
        if (!plan.pages.empty()) {
            moment_results.emplace_back(first_out, run.type("f32"));
            moment_results.emplace_back(second_out, run.type("f32"));
        }
        for (const std::size_t i : plan.direct) {
            const UpdatePlan::Slice& slice = plan.slices[i];
            const std::size_t end = slice.start + slice.count;
            moment_results.emplace_back(run.range(first_out, slice.start, end, "f32"),
                                        tensor_type({slice.count}));
            moment_results.emplace_back(run.range(second_out, slice.start, end, "f32"),
                                        tensor_type({slice.count}));
        }
    }
    if (step) {
        // A non-finite gradient: the check is skipped (nothing found), as the default does.
        value_slice = scalar.select(gradients_finite, value_slice, scalar.i64(none), "i64");
        value_element = scalar.select(gradients_finite, value_element, scalar.i64(0), "i64");
        value_bits = scalar.select(gradients_finite, value_bits, scalar.u32(0), "ui32");
        update_slice = scalar.select(gradients_finite, update_slice, scalar.i64(none), "i64");
        update_element = scalar.select(gradients_finite, update_element, scalar.i64(0), "i64");
    }
    const std::string zero = scalar.u32(0);
    const std::string words = pack_words(program, {{statistics.bad_tensor, "i64"},
                                                   {statistics.bad_element, "i64"},
                                                   {statistics.bad_bits, "ui32"},
                                                   {zero, "ui32"},
                                                   {statistics.scale, "f64"},
                                                   {statistics.scaled, "f64"},
                                                   {clip, "f64"},
                                                   {value_slice, "i64"},
                                                   {value_element, "i64"},
                                                   {value_bits, "ui32"},
                                                   {zero, "ui32"},
                                                   {update_slice, "i64"},
                                                   {update_element, "i64"}});
    results.insert(results.begin(), {words, tensor_type({word::step_count}, "ui32")});
    results.insert(results.end(), moment_results.begin(), moment_results.end());
    return program.finish(results);
}

// ---- many pages: joined before the update program, split after it -------------------------
// Both programs depend only on the page size (and the split on L), not on the page count: a
// model's pages reuse them, join_width or split_width pages per execution.

// (m_0..m_{K-1}, v_0..v_{K-1}: f32[S]) -> (m joined, v joined: f32[K·S]), K = join_width.
std::string joined_pages_program(std::size_t page_size) {
    ProgramText program;
    std::vector<std::string> first;
    std::vector<std::string> second;
    for (std::size_t k = 0; k < join_width; ++k) {
        first.push_back(program.parameter(tensor_type({page_size})));
    }
    for (std::size_t k = 0; k < join_width; ++k) {
        second.push_back(program.parameter(tensor_type({page_size})));
    }
    const std::vector<std::size_t> counts(join_width, page_size);
    const std::string type = tensor_type({join_width * page_size});
    const std::pair<std::string, std::string> results[] = {
        {concatenate(program, first, counts, "f32"), type},
        {concatenate(program, second, counts, "f32"), type}};
    return program.finish(results);
}

// (m', v': f32[L], starts: u32[K]) -> m'[starts[k], +S) for k < K, then v'[starts[k], +S)
// likewise, K = split_width.
std::string split_pages_program(std::size_t length, std::size_t page_size) {
    ProgramText program;
    const std::string first = program.parameter(tensor_type({length}));
    const std::string second = program.parameter(tensor_type({length}));
    const std::string starts = program.parameter(tensor_type({split_width}, "ui32"));
    Ops table(program, {split_width});
    std::vector<std::string> at;
    for (std::size_t k = 0; k < split_width; ++k) {
        at.push_back(program.let("stablehlo.reshape " + table.range(starts, k, k + 1, "ui32") +
                                 " : (tensor<1xui32>) -> tensor<ui32>"));
    }
    std::vector<std::pair<std::string, std::string>> results;
    const std::string page_type = tensor_type({page_size});
    for (const std::string& run : {first, second}) {
        for (const std::string& start : at) {
            results.emplace_back(
                program.let("stablehlo.dynamic_slice " + run + ", " + start + ", sizes = [" +
                            std::to_string(page_size) + "] : (" + tensor_type({length}) +
                            ", tensor<ui32>) -> " + page_type),
                page_type);
        }
    }
    return program.finish(results);
}

// ---- host side -----------------------------------------------------------------------------

std::uint64_t read_u64(const std::vector<std::uint32_t>& words, std::size_t at) {
    return static_cast<std::uint64_t>(words[at]) |
           (static_cast<std::uint64_t>(words[at + 1]) << 32U);
}
std::size_t read_index(const std::vector<std::uint32_t>& words, std::size_t at) {
    return static_cast<std::size_t>(read_u64(words, at));
}
double read_double(const std::vector<std::uint32_t>& words, std::size_t at) {
    return std::bit_cast<double>(read_u64(words, at));
}
float read_float(const std::vector<std::uint32_t>& words, std::size_t at) {
    return std::bit_cast<float>(words[at]);
}

// What a passed check saw, and the θ', m', v' it computed: apply_update with the same
// arguments installs these buffers instead of evaluating again.
struct CheckedUpdate {
    struct SliceInputs {
        Tensor* value;
        const Tensor* gradient;
        std::size_t offset;
        Tensor* first_moment;
        Tensor* second_moment;
        std::vector<BufferPointer> buffers;  // value, gradient (or null), m, v
    };
    std::array<std::uint64_t, 8> scalars{};
    std::vector<SliceInputs> slices;
    std::vector<BufferPointer> results;  // the update program's, words first
};

std::array<std::uint64_t, 8> scalar_bits(const AdamUpdateScalars& s) {
    return {std::bit_cast<std::uint64_t>(s.beta1),
            std::bit_cast<std::uint64_t>(s.beta2),
            std::bit_cast<std::uint64_t>(s.bias_correction1),
            std::bit_cast<std::uint64_t>(s.bias_correction2),
            std::bit_cast<std::uint64_t>(s.learning_rate),
            std::bit_cast<std::uint64_t>(s.epsilon),
            std::bit_cast<std::uint64_t>(s.clip_scale),
            std::bit_cast<std::uint64_t>(s.decay_factor)};
}

std::vector<CheckedUpdate::SliceInputs> slice_inputs(std::span<const AdamSlice> slices) {
    std::vector<CheckedUpdate::SliceInputs> inputs;
    inputs.reserve(slices.size());
    for (const AdamSlice& slice : slices) {
        inputs.push_back({slice.value,
                          slice.gradient,
                          slice.offset,
                          slice.first_moment,
                          slice.second_moment,
                          {buffer_of(*slice.value),
                           slice.gradient != nullptr ? buffer_of(*slice.gradient) : nullptr,
                           buffer_of(*slice.first_moment), buffer_of(*slice.second_moment)}});
    }
    return inputs;
}

bool same_inputs(const std::vector<CheckedUpdate::SliceInputs>& a,
                 const std::vector<CheckedUpdate::SliceInputs>& b) {
    if (a.size() != b.size()) {
        return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (a[i].value != b[i].value || a[i].gradient != b[i].gradient ||
            a[i].offset != b[i].offset || a[i].first_moment != b[i].first_moment ||
            a[i].second_moment != b[i].second_moment || a[i].buffers != b[i].buffers) {
            return false;
        }
    }
    return true;
}

class PjrtAdam final : public AdamCapability {
  public:
    explicit PjrtAdam(const Context& context) : context_(context) {}

    GradientStatistics gradient_statistics(std::span<const Tensor* const> tensors) const override {
        return statistics(tensors, true);
    }

    FirstNonFinite first_non_finite(std::span<const Tensor* const> tensors) const override {
        return statistics(tensors, false).first_non_finite;
    }

    AdamCheck check_update(const AdamUpdateScalars& scalars,
                           std::span<const AdamSlice> slices) const override {
        return evaluate(scalars, std::nullopt, {}, slices).check;
    }

    AdamStepCheck check_step(const AdamUpdateScalars& scalars, double maximum_gradient_norm,
                             std::span<const Tensor* const> gradients,
                             std::span<const AdamSlice> slices) const override {
        return evaluate(scalars, maximum_gradient_norm, gradients, slices);
    }

    void apply_update(const AdamUpdateScalars& scalars,
                      std::span<const AdamSlice> slices) const override {
        const UpdatePlan plan = make_plan({}, slices, false);
        if (plan.groups.empty()) {
            return;
        }
        std::vector<BufferPointer> results;
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            std::optional<CheckedUpdate> checked = std::exchange(checked_, std::nullopt);
            if (checked.has_value() && checked->scalars == scalar_bits(scalars) &&
                same_inputs(checked->slices, slice_inputs(slices))) {
                results = std::move(checked->results);
            }
        }
        if (results.empty()) {
            results = run_update(plan, scalars, scalars.clip_scale, false, slices);
        }
        // Every storage is made before the first tensor changes.
        std::vector<std::pair<Tensor*, std::shared_ptr<Storage>>> replacements;
        std::size_t next = 1;
        for (const UpdatePlan::Group& group : plan.groups) {
            replacements.emplace_back(
                group.value, std::make_shared<PjrtStorage>(context_, group.count, results[next++]));
        }
        std::vector<BufferPointer> moments(2 * plan.slices.size());  // (m', v') per slice
        if (!plan.pages.empty()) {
            const std::vector<BufferPointer> pages =
                split_pages(plan, results[next], results[next + 1]);
            next += 2;
            for (std::size_t b = 0; b < plan.pages.size(); ++b) {
                moments[2 * plan.pages[b]] = pages[2 * b];
                moments[2 * plan.pages[b] + 1] = pages[2 * b + 1];
            }
        }
        for (const std::size_t i : plan.direct) {
            moments[2 * i] = results[next++];
            moments[2 * i + 1] = results[next++];
        }
        for (std::size_t i = 0; i < plan.slices.size(); ++i) {
            const UpdatePlan::Slice& slice = plan.slices[i];
            replacements.emplace_back(
                slices[slice.index].first_moment,
                std::make_shared<PjrtStorage>(context_, slice.count, moments[2 * i]));
            replacements.emplace_back(
                slices[slice.index].second_moment,
                std::make_shared<PjrtStorage>(context_, slice.count, moments[2 * i + 1]));
        }
        for (auto& [tensor, storage] : replacements) {
            TensorAccess::replace_storage(*tensor, std::move(storage));
        }
    }

  private:
    GradientStatistics statistics(std::span<const Tensor* const> tensors, bool with_squares) const {
        GradientStatistics result;
        result.first_non_finite.tensor = tensors.size();
        std::vector<std::size_t> positions;
        std::vector<std::size_t> counts;
        std::vector<BufferPointer> inputs;
        for (std::size_t t = 0; t < tensors.size(); ++t) {
            if (tensors[t] != nullptr && tensors[t]->numel() != 0) {
                positions.push_back(t);
                counts.push_back(tensors[t]->numel());
                inputs.push_back(buffer_of(*tensors[t]));
            }
        }
        if (inputs.empty()) {
            return result;
        }
        std::string key = with_squares ? "adam/statistics" : "adam/first_non_finite";
        for (const std::size_t n : counts) {
            append_number(key, ":", n);
        }
        const Output outputs[] = {{ElementType::U32, word::statistics_count}};
        const std::vector<BufferPointer> results = run(
            context_, key, [&] { return statistics_program(counts, with_squares); }, inputs,
            outputs);
        std::vector<std::uint32_t> words(word::statistics_count);
        context_.runtime->download(*results[0], words.data());
        decode_statistics(words, positions, tensors.size(), result);
        return result;
    }

    static void decode_statistics(const std::vector<std::uint32_t>& words,
                                  const std::vector<std::size_t>& positions, std::size_t list_size,
                                  GradientStatistics& result) {
        const std::size_t bad = read_index(words, word::bad_tensor);
        if (bad < positions.size()) {
            result.first_non_finite = {positions[bad], read_index(words, word::bad_element),
                                       read_float(words, word::bad_bits)};
        } else {
            result.first_non_finite = {list_size, 0, 0.0F};
        }
        result.squares.scale = read_double(words, word::scale);
        result.squares.scaled_squares = read_double(words, word::scaled);
    }

    // (m, v) of the plan's pages joined, join_width pages per execution in plan.pages order
    // (the last execution repeats its last page): the update program's joined parameters.
    std::vector<BufferPointer> join_pages(const UpdatePlan& plan,
                                          std::span<const AdamSlice> slices) const {
        std::vector<BufferPointer> joined;
        if (plan.pages.empty()) {
            return joined;
        }
        std::string key = "adam/join_pages";
        append_number(key, ":", join_width);
        append_number(key, "x", plan.page_size);
        const Output outputs[] = {{ElementType::F32, join_width * plan.page_size},
                                  {ElementType::F32, join_width * plan.page_size}};
        std::vector<BufferPointer> inputs(2 * join_width);
        for (std::size_t begin = 0; begin < plan.pages.size(); begin += join_width) {
            for (std::size_t k = 0; k < join_width; ++k) {
                const std::size_t b = std::min(begin + k, plan.pages.size() - 1);
                const AdamSlice& slice = slices[plan.slices[plan.pages[b]].index];
                inputs[k] = buffer_of(*slice.first_moment);
                inputs[join_width + k] = buffer_of(*slice.second_moment);
            }
            const std::vector<BufferPointer> results = run(
                context_, key, [&] { return joined_pages_program(plan.page_size); }, inputs,
                outputs);
            joined.push_back(results[0]);
            joined.push_back(results[1]);
        }
        return joined;
    }

    // (m', v') of every page of the plan, in plan.pages order, cut from the update program's
    // runs split_width pages per execution.
    std::vector<BufferPointer> split_pages(const UpdatePlan& plan, const BufferPointer& first,
                                           const BufferPointer& second) const {
        std::string key = "adam/split_pages";
        append_number(key, ":", plan.length);
        append_number(key, ":", split_width);
        append_number(key, "x", plan.page_size);
        const std::vector<Output> outputs(2 * split_width,
                                          Output{ElementType::F32, plan.page_size});
        std::vector<BufferPointer> pages;
        pages.reserve(2 * plan.pages.size());
        for (const BufferPointer& starts : page_starts(plan)) {
            const std::vector<BufferPointer> results = run(
                context_, key, [&] { return split_pages_program(plan.length, plan.page_size); },
                std::vector<BufferPointer>{first, second, starts}, outputs);
            for (std::size_t k = 0; k < split_width && pages.size() < 2 * plan.pages.size(); ++k) {
                pages.push_back(results[k]);
                pages.push_back(results[split_width + k]);
            }
        }
        return pages;
    }

    // The split programs' start tables (u32[split_width] run positions of the pages, the last
    // table padded with its last start), uploaded once for a layout: the last one is kept.
    std::vector<BufferPointer> page_starts(const UpdatePlan& plan) const {
        const std::lock_guard<std::mutex> lock(mutex_);
        if (page_starts_key_ != plan.key) {
            page_starts_.clear();
            for (std::size_t begin = 0; begin < plan.pages.size(); begin += split_width) {
                std::array<std::uint32_t, split_width> table{};
                for (std::size_t k = 0; k < split_width; ++k) {
                    const std::size_t b = std::min(begin + k, plan.pages.size() - 1);
                    table[k] = static_cast<std::uint32_t>(plan.slices[plan.pages[b]].start);
                }
                page_starts_.push_back(
                    context_.runtime->upload(ElementType::U32, table.data(), table.size()));
            }
            page_starts_key_ = plan.key;
        }
        return page_starts_;
    }

    // Runs the update program (step: with statistics and the clip factor under
    // `clip_or_maximum_norm` = G_max; otherwise s itself).
    std::vector<BufferPointer> run_update(const UpdatePlan& plan, const AdamUpdateScalars& scalars,
                                          double clip_or_maximum_norm, bool step,
                                          std::span<const AdamSlice> slices) const {
        std::array<double, slot::count> values{};
        values[slot::beta1] = scalars.beta1;
        values[slot::beta2] = scalars.beta2;
        values[slot::bias_correction1] = scalars.bias_correction1;
        values[slot::bias_correction2] = scalars.bias_correction2;
        values[slot::learning_rate] = scalars.learning_rate;
        values[slot::epsilon] = scalars.epsilon;
        values[slot::clip_or_maximum_norm] = clip_or_maximum_norm;
        values[slot::decay_factor] = scalars.decay_factor;
        values[slot::one_minus_beta1] = 1.0 - scalars.beta1;  // as cpu/adam.cpp's constants_of
        values[slot::one_minus_beta2] = 1.0 - scalars.beta2;
        values[slot::zero] = 0.0;
        std::array<std::uint32_t, 2 * slot::count> words{};
        std::memcpy(words.data(), values.data(), sizeof(values));

        std::vector<BufferPointer> inputs;
        inputs.push_back(context_.runtime->upload(ElementType::U32, words.data(), words.size()));
        for (const Tensor* gradient : plan.gradient_inputs) {
            inputs.push_back(buffer_of(*gradient));
        }
        for (const UpdatePlan::Group& group : plan.groups) {
            inputs.push_back(buffer_of(*group.value));
        }
        std::vector<Output> outputs = {{ElementType::U32, word::step_count}};
        for (const UpdatePlan::Group& group : plan.groups) {
            outputs.push_back({ElementType::F32, group.count});
        }
        const std::vector<BufferPointer> joined = join_pages(plan, slices);
        inputs.insert(inputs.end(), joined.begin(), joined.end());
        if (!plan.pages.empty()) {
            outputs.push_back({ElementType::F32, plan.length});
            outputs.push_back({ElementType::F32, plan.length});
        }
        for (const std::size_t i : plan.direct) {
            const UpdatePlan::Slice& slice = plan.slices[i];
            inputs.push_back(buffer_of(*slices[slice.index].first_moment));
            inputs.push_back(buffer_of(*slices[slice.index].second_moment));
            outputs.push_back({ElementType::F32, slice.count});
            outputs.push_back({ElementType::F32, slice.count});
        }
        return run(
            context_, plan.key, [&] { return update_program(plan, step); }, inputs, outputs);
    }

    // The pass-1 request: check_update (no maximum norm) or check_step.
    AdamStepCheck evaluate(const AdamUpdateScalars& scalars,
                           std::optional<double> maximum_gradient_norm,
                           std::span<const Tensor* const> gradients,
                           std::span<const AdamSlice> slices) const {
        const bool step = maximum_gradient_norm.has_value();
        const std::lock_guard<std::mutex> lock(mutex_);
        checked_.reset();
        AdamStepCheck result;
        result.gradients.first_non_finite.tensor = gradients.size();
        result.clip_scale = step ? 1.0 : scalars.clip_scale;
        result.check = {slices.size(), 0, 0.0F, slices.size(), 0};
        const UpdatePlan plan = make_plan(gradients, slices, step);
        if (plan.groups.empty() && plan.statistics_positions.empty()) {
            return result;  // nothing to read: no gradient element and no slice element
        }
        std::vector<BufferPointer> results = run_update(
            plan, scalars, step ? *maximum_gradient_norm : scalars.clip_scale, step, slices);
        // The step's one download: the result words.
        std::vector<std::uint32_t> words(word::step_count);
        context_.runtime->download(*results[0], words.data());
        if (step) {
            decode_statistics(words, plan.statistics_positions, gradients.size(), result.gradients);
            if (result.gradients.first_non_finite.tensor != gradients.size()) {
                return result;  // the check is skipped, as the default check_step does
            }
            result.clip_scale = read_double(words, word::clip_scale);
        }
        const auto slice_index = [&](std::size_t at) {
            return std::min(read_index(words, at), slices.size());
        };
        result.check.value_slice = slice_index(word::value_slice);
        if (result.check.value_slice != slices.size()) {
            result.check.value_element = read_index(words, word::value_element);
            result.check.value = read_float(words, word::value_bits);
        }
        result.check.update_slice = slice_index(word::update_slice);
        if (result.check.update_slice != slices.size()) {
            result.check.update_element = read_index(words, word::update_element);
        }
        if (result.check.value_slice == slices.size() &&
            result.check.update_slice == slices.size() && !plan.groups.empty()) {
            AdamUpdateScalars checked_scalars = scalars;
            checked_scalars.clip_scale = result.clip_scale;
            checked_ = CheckedUpdate{scalar_bits(checked_scalars), slice_inputs(slices),
                                     std::move(results)};
        }
        return result;
    }

    const Context& context_;
    mutable std::mutex mutex_;
    mutable std::optional<CheckedUpdate> checked_;
    mutable std::string page_starts_key_;
    mutable std::vector<BufferPointer> page_starts_;
};

}  // namespace

std::unique_ptr<AdamCapability> make_adam(const Context& context) {
    return std::make_unique<PjrtAdam>(context);
}

}  // namespace riftco_transformer::detail::pjrt
