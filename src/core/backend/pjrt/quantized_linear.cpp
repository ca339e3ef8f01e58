// PJRT quantized linear: packed NF4 weights (docs/ARCHITECTURE.md, 'NF4') as device buffers,
// and the two linear products as StableHLO programs that decode the nibbles themselves (the CPU
// reference is cpu/quantized_linear.cpp over nf4_kernels; the format rules are
// quantized/nf4_format.hpp).
//
// Storage: the payload's own arrays, uploaded as they are: packed codes (u8, ceil(N/2)) and
// either the legacy float scales [M], or the scale codes (u8, [M]), second-level ranges [G]
// and offset [1] of the double-quantized encoding. Nothing decoded is kept.
//
// Decode inside a program, for flat weight indices i (row-major [O, I]):
//   byte = codes[i >> 1];  code = i odd ? byte >> 4 : byte & 0xF
//   ŝ_b  = scales[b]  (legacy), or clamp(μ + (t_{b>>log2 C}·(q_b − 128))/127, 0, FLT_MAX)
//   w_i  = ŝ_{i >> log2 B}·codebook[code]       (the CPU's table ŝ·codebook: the same float)
// The block scales [M] are decoded once per call (1/B of the weight's size); the weight
// itself is decoded one bounded panel at a time inside a `stablehlo.while` (at most
// `panel_floats` floats), never as a whole float32 matrix:
//   forward        x [R, I] -> y [R, O] = x·deq(W)ᵀ, row panels of W (K = I whole)
//   input backward g [R, O] -> dx [R, I] = g·deq(W), column panels of W (K = O whole)
// so no output element is accumulated over split reductions.

#include <algorithm>
#include <bit>
#include <cfloat>
#include <string>
#include <utility>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Dims = std::vector<std::size_t>;

// The most float32 weight values one decoded panel holds (2 MiB, as the CPU's panels).
constexpr std::size_t panel_floats = std::size_t{1} << 19U;

class PjrtQuantizedStorage final : public QuantizedStorage {
  public:
    PjrtQuantizedStorage(ExecutionBackend backend, const PackedLayout& layout,
                         const Runtime& runtime, const PackedNf4Payload& payload)
        : QuantizedStorage(backend, layout), runtime_(runtime) {
        codes = runtime.upload(ElementType::U8, payload.codes.data(), payload.codes.size());
        if (layout.double_quantized) {
            scale_codes = runtime.upload(ElementType::U8, payload.scale_codes.data(),
                                         payload.scale_codes.size());
            scale_ranges = runtime.upload(ElementType::F32, payload.scale_ranges.data(),
                                          payload.scale_ranges.size());
            scale_offset = runtime.upload(ElementType::F32, &payload.scale_offset, 1);
        } else {
            scales = runtime.upload(ElementType::F32, payload.scales.data(), payload.scales.size());
        }
    }

    [[nodiscard]] std::size_t resident_bytes() const noexcept override {
        std::size_t bytes = 0;
        for (const BufferPointer* buffer :
             {&codes, &scales, &scale_codes, &scale_ranges, &scale_offset}) {
            if (*buffer != nullptr) {
                bytes += (*buffer)->element_count() * element_size((*buffer)->type());
            }
        }
        return bytes;
    }

    // Every buffer back, with the transfers in flight together.
    [[nodiscard]] PackedNf4Payload copy_payload_to_host() const override {
        const PackedLayout& shape = layout();
        PackedNf4Payload payload;
        payload.out_features = shape.out_features;
        payload.in_features = shape.in_features;
        payload.block_size = shape.block_size;
        payload.double_quantized = shape.double_quantized;
        payload.scale_block_size = shape.scale_block_size;
        payload.codes.resize(codes->element_count());
        std::vector<const DeviceBuffer*> buffers = {codes.get()};
        std::vector<void*> destinations = {payload.codes.data()};
        if (shape.double_quantized) {
            payload.scale_codes.resize(scale_codes->element_count());
            payload.scale_ranges.resize(scale_ranges->element_count());
            buffers.insert(buffers.end(),
                           {scale_codes.get(), scale_ranges.get(), scale_offset.get()});
            destinations.insert(
                destinations.end(),
                {payload.scale_codes.data(), payload.scale_ranges.data(), &payload.scale_offset});
        } else {
            payload.scales.resize(scales->element_count());
            buffers.push_back(scales.get());
            destinations.push_back(payload.scales.data());
        }
        runtime_.download_all(buffers, destinations);
        return payload;
    }

    // The program parameters after the input: codes, then the scale metadata.
    [[nodiscard]] std::vector<BufferPointer> weight_inputs() const {
        if (layout().double_quantized) {
            return {codes, scale_codes, scale_ranges, scale_offset};
        }
        return {codes, scales};
    }

    BufferPointer codes;         // u8 [ceil(N/2)]
    BufferPointer scales;        // legacy: f32 [M]
    BufferPointer scale_codes;   // double: u8 [M]
    BufferPointer scale_ranges;  // double: f32 [G]
    BufferPointer scale_offset;  // double: f32 [1]

  private:
    const Runtime& runtime_;
};

std::size_t log2_of(std::size_t power_of_two) {
    return static_cast<std::size_t>(std::countr_zero(power_of_two));
}

// Writes one product program; `forward` picks the direction (see the file comment).
class ProductProgram {
  public:
    ProductProgram(const PackedLayout& layout, std::size_t rows, bool forward)
        : layout_(layout), rows_(rows), forward_(forward) {}

    [[nodiscard]] std::string text() {
        const std::size_t out = layout_.out_features;
        const std::size_t in = layout_.in_features;
        const std::size_t input_width = forward_ ? in : out;
        const std::size_t result_width = forward_ ? out : in;
        const std::string input = reshape(p_.parameter(tensor_type({rows_ * input_width})),
                                          {rows_ * input_width}, {rows_, input_width});
        codes_ = p_.parameter(tensor_type({layout_.packed_byte_count()}, "ui8"));
        block_scales_ = decode_block_scales();
        codebook_ = codebook();

        // Panels along the result's columns: rows of W (forward) or columns of W (backward).
        const std::size_t other = forward_ ? in : out;
        panel_ = std::clamp<std::size_t>(panel_floats / other, 1, result_width);
        const std::size_t panels = (result_width + panel_ - 1) / panel_;
        const Dims padded = {rows_, panels * panel_};
        const std::string zero = let("stablehlo.constant dense<0.0> : " + tensor_type(padded));
        const std::string start = let("stablehlo.constant dense<0> : tensor<i64>");
        const std::string results = p_.fresh();
        const std::string counter = p_.fresh();
        const std::string accumulated = p_.fresh();
        const std::string types = "tensor<i64>, " + tensor_type(padded);
        p_.line(results + ":2 = stablehlo.while(" + counter + " = " + start + ", " + accumulated +
                " = " + zero + ") : " + types);
        p_.line("cond {");
        const std::string limit =
            let("stablehlo.constant dense<" + std::to_string(panels) + "> : tensor<i64>");
        p_.line("  stablehlo.return " +
                let("stablehlo.compare LT, " + counter + ", " + limit +
                    ", SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>") +
                " : tensor<i1>");
        p_.line("} do {");
        const std::string first =
            let("stablehlo.multiply " + counter + ", " + scalar_i64(panel_) + " : tensor<i64>");
        const Dims panel_shape = forward_ ? Dims{panel_, in} : Dims{out, panel_};
        const std::string weights = decode_panel(first, panel_shape);
        // forward: [R, I]·[P, I]ᵀ -> [R, P];  backward: [R, O]·[O, P] -> [R, P]
        const Dims product_shape = {rows_, panel_};
        const std::string product =
            let("stablehlo.dot_general " + input + ", " + weights + ", contracting_dims = [1] x [" +
                (forward_ ? "1" : "0") + "], precision = [HIGHEST, HIGHEST] : (" +
                tensor_type({rows_, input_width}) + ", " + tensor_type(panel_shape) + ") -> " +
                tensor_type(product_shape));
        const std::string zero_index = let("stablehlo.constant dense<0> : tensor<i64>");
        const std::string written = let("stablehlo.dynamic_update_slice " + accumulated + ", " +
                                        product + ", " + zero_index + ", " + first + " : (" +
                                        tensor_type(padded) + ", " + tensor_type(product_shape) +
                                        ", tensor<i64>, tensor<i64>) -> " + tensor_type(padded));
        const std::string next =
            let("stablehlo.add " + counter + ", " + scalar_i64(1) + " : tensor<i64>");
        p_.line("  stablehlo.return " + next + ", " + written + " : " + types);
        p_.line("}");
        std::string result = results + "#1";
        const Dims result_shape = {rows_, result_width};
        if (padded != result_shape) {
            result = let("\"stablehlo.slice\"(" + result +
                         ") {start_indices = array<i64: 0, 0>, limit_indices = " +
                         i64_array(result_shape) + ", strides = array<i64: 1, 1>} : (" +
                         tensor_type(padded) + ") -> " + tensor_type(result_shape));
        }
        const std::pair<std::string, std::string> outputs[] = {
            {p_.flatten(result, result_shape), tensor_type({rows_ * result_width})}};
        return p_.finish(outputs);
    }

  private:
    std::string let(std::string_view expression) { return p_.let(expression); }
    std::string reshape(const std::string& x, const Dims& from, const Dims& to,
                        std::string_view element = "f32") {
        return p_.reshape(x, from, to, element);
    }
    std::string scalar_i64(std::size_t value) {
        return let("stablehlo.constant dense<" + std::to_string(value) + "> : tensor<i64>");
    }
    std::string splat(std::string_view literal, const Dims& shape, std::string_view element) {
        return let("stablehlo.constant dense<" + std::string(literal) +
                   "> : " + tensor_type(shape, element));
    }
    // a ∘ b elementwise over `shape`.
    std::string binary(std::string_view op, const std::string& a, const std::string& b,
                       const Dims& shape, std::string_view element) {
        return let("stablehlo." + std::string(op) + " " + a + ", " + b + " : " +
                   tensor_type(shape, element));
    }
    std::string convert(const std::string& x, const Dims& shape, std::string_view from,
                        std::string_view to) {
        return let("stablehlo.convert " + x + " : (" + tensor_type(shape, from) + ") -> " +
                   tensor_type(shape, to));
    }
    // table[index] for an i64 index array of `shape` into a rank-1 table of `size`.
    std::string lookup(const std::string& table, std::size_t size, std::string_view element,
                       const std::string& index, const Dims& shape) {
        Dims index_shape = shape;
        index_shape.push_back(1);
        const std::string indices = reshape(index, shape, index_shape, "i64");
        return let("\"stablehlo.gather\"(" + table + ", " + indices +
                   ") {dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], "
                   "start_index_map = [0], index_vector_dim = " +
                   std::to_string(shape.size()) + ">, slice_sizes = array<i64: 1>} : (" +
                   tensor_type({size}, element) + ", " + tensor_type(index_shape, "i64") + ") -> " +
                   tensor_type(shape, element));
    }

    // ŝ [M]: the legacy scales as they are, or the double-quantized decode
    // clamp(μ + (t_g·(q − 128))/127, 0, FLT_MAX) in float, left to right.
    std::string decode_block_scales() {
        const std::size_t blocks = layout_.block_count();
        const Dims shape = {blocks};
        if (!layout_.double_quantized) {
            return p_.parameter(tensor_type(shape));
        }
        const std::size_t groups = layout_.scale_group_count();
        const std::size_t group_size = layout_.scale_block_size;
        const std::string codes = p_.parameter(tensor_type(shape, "ui8"));
        const std::string ranges = p_.parameter(tensor_type({groups}));
        const std::string offset_flat = p_.parameter(tensor_type({1}));
        const std::string steps = convert(binary("subtract", convert(codes, shape, "ui8", "i32"),
                                                 splat("128", shape, "i32"), shape, "i32"),
                                          shape, "i32", "f32");
        // t_{b >> log2 C}: each range repeated over its group, cut to M.
        const Dims grouped = {groups, group_size};
        std::string range = let("stablehlo.broadcast_in_dim " + ranges + ", dims = [0] : (" +
                                tensor_type({groups}) + ") -> " + tensor_type(grouped));
        range = reshape(range, grouped, {groups * group_size});
        if (groups * group_size != blocks) {
            range = let("\"stablehlo.slice\"(" + range +
                        ") {start_indices = array<i64: 0>, limit_indices = array<i64: " +
                        std::to_string(blocks) + ">, strides = array<i64: 1>} : (" +
                        tensor_type({groups * group_size}) + ") -> " + tensor_type(shape));
        }
        const std::string delta = binary("divide", binary("multiply", range, steps, shape, "f32"),
                                         splat(float_literal(127.0F), shape, "f32"), shape, "f32");
        const std::string offset = let("stablehlo.broadcast_in_dim " + offset_flat +
                                       ", dims = [0] : (tensor<1xf32>) -> " + tensor_type(shape));
        const std::string scale = binary("add", offset, delta, shape, "f32");
        // !(ŝ > 0) -> 0 (negative, −inf, NaN); ŝ > FLT_MAX -> FLT_MAX.
        const std::string zero = splat("0.0", shape, "f32");
        const std::string largest = splat(float_literal(FLT_MAX), shape, "f32");
        const std::string positive = let("stablehlo.compare GT, " + scale + ", " + zero +
                                         ", FLOAT : (" + tensor_type(shape) + ", " +
                                         tensor_type(shape) + ") -> " + tensor_type(shape, "i1"));
        const std::string too_large = let("stablehlo.compare GT, " + scale + ", " + largest +
                                          ", FLOAT : (" + tensor_type(shape) + ", " +
                                          tensor_type(shape) + ") -> " + tensor_type(shape, "i1"));
        const std::string kept = let("stablehlo.select " + positive + ", " + scale + ", " + zero +
                                     " : " + tensor_type(shape, "i1") + ", " + tensor_type(shape));
        return let("stablehlo.select " + too_large + ", " + largest + ", " + kept + " : " +
                   tensor_type(shape, "i1") + ", " + tensor_type(shape));
    }

    std::string codebook() {
        std::string values;
        for (std::size_t k = 0; k < nf4_codebook.size(); ++k) {
            values += (k == 0 ? "" : ", ") + float_literal(nf4_codebook[k]);
        }
        return let("stablehlo.constant dense<[" + values +
                   "]> : " + tensor_type({nf4_codebook.size()}));
    }

    // The panel of deq(W) starting at row (forward) or column (backward) `first` (tensor<i64>),
    // `shape` [P, I] or [O, P]; entries past the matrix are 0.
    std::string decode_panel(const std::string& first, const Dims& shape) {
        const std::size_t in = layout_.in_features;
        const std::size_t moving_axis = forward_ ? 0 : 1;
        const std::string row_offsets =
            let("stablehlo.iota dim = 0 : " + tensor_type(shape, "i64"));
        const std::string column_offsets =
            let("stablehlo.iota dim = 1 : " + tensor_type(shape, "i64"));
        const std::string first_all =
            let("stablehlo.broadcast_in_dim " + first + ", dims = [] : (tensor<i64>) -> " +
                tensor_type(shape, "i64"));
        const std::string row =
            forward_ ? binary("add", row_offsets, first_all, shape, "i64") : row_offsets;
        const std::string column =
            forward_ ? column_offsets : binary("add", column_offsets, first_all, shape, "i64");
        const std::string moving = moving_axis == 0 ? row : column;
        const std::size_t moving_limit = forward_ ? layout_.out_features : in;
        const std::string inside =
            let("stablehlo.compare LT, " + moving + ", " +
                splat(std::to_string(moving_limit), shape, "i64") + ", SIGNED : (" +
                tensor_type(shape, "i64") + ", " + tensor_type(shape, "i64") + ") -> " +
                tensor_type(shape, "i1"));
        // i = row·I + column, 0 outside the matrix (decoded, then zeroed).
        const std::string flat = binary(
            "add", binary("multiply", row, splat(std::to_string(in), shape, "i64"), shape, "i64"),
            column, shape, "i64");
        const std::string zero_index = splat("0", shape, "i64");
        const std::string index =
            let("stablehlo.select " + inside + ", " + flat + ", " + zero_index + " : " +
                tensor_type(shape, "i1") + ", " + tensor_type(shape, "i64"));
        const std::string one = splat("1", shape, "i64");
        const std::string byte =
            lookup(codes_, layout_.packed_byte_count(), "ui8",
                   binary("shift_right_logical", index, one, shape, "i64"), shape);
        const std::string low = binary("and", byte, splat("15", shape, "ui8"), shape, "ui8");
        const std::string high =
            binary("shift_right_logical", byte, splat("4", shape, "ui8"), shape, "ui8");
        const std::string odd =
            let("stablehlo.compare EQ, " + binary("and", index, one, shape, "i64") + ", " + one +
                ", SIGNED : (" + tensor_type(shape, "i64") + ", " + tensor_type(shape, "i64") +
                ") -> " + tensor_type(shape, "i1"));
        const std::string code = let("stablehlo.select " + odd + ", " + high + ", " + low + " : " +
                                     tensor_type(shape, "i1") + ", " + tensor_type(shape, "ui8"));
        const std::string level = lookup(codebook_, nf4_codebook.size(), "f32",
                                         convert(code, shape, "ui8", "i64"), shape);
        const std::string block =
            binary("shift_right_logical", index,
                   splat(std::to_string(log2_of(layout_.block_size)), shape, "i64"), shape, "i64");
        const std::string scale = lookup(block_scales_, layout_.block_count(), "f32", block, shape);
        const std::string value = binary("multiply", scale, level, shape, "f32");
        return let("stablehlo.select " + inside + ", " + value + ", " + splat("0.0", shape, "f32") +
                   " : " + tensor_type(shape, "i1") + ", " + tensor_type(shape));
    }

    PackedLayout layout_;
    std::size_t rows_;
    bool forward_;
    ProgramText p_;
    std::string codes_;
    std::string block_scales_;
    std::string codebook_;
    std::size_t panel_ = 1;
};

std::string product_key(const PackedLayout& layout, std::size_t rows, bool forward) {
    return std::string(forward ? "nf4_linear_forward/" : "nf4_linear_input_backward/") +
           std::to_string(rows) + "/" + std::to_string(layout.out_features) + "x" +
           std::to_string(layout.in_features) + "/B" + std::to_string(layout.block_size) +
           (layout.double_quantized ? "/C" + std::to_string(layout.scale_block_size) : "/legacy");
}

class PjrtQuantizedLinear final : public QuantizedLinearCapability {
  public:
    explicit PjrtQuantizedLinear(const Context& context) : context_(context) {}

    std::shared_ptr<const QuantizedStorage> upload(PackedNf4Payload payload) const override {
        const PackedLayout layout{payload.out_features, payload.in_features, payload.block_size,
                                  payload.double_quantized, payload.scale_block_size};
        return std::make_shared<PjrtQuantizedStorage>(context_.backend, layout, *context_.runtime,
                                                      payload);
    }

    PackedNf4Payload download(const QuantizedStorage& weight) const override {
        return weight.copy_payload_to_host();
    }

    // x [R, I] -> out [R, O] = x·deq(W)ᵀ
    void forward(const Tensor& x, const QuantizedStorage& weight, Tensor& out) const override {
        product(x, weight, out, true);
    }

    // upstream [R, O] -> out [R, I] = upstream·deq(W)
    void input_backward(const Tensor& upstream, const QuantizedStorage& weight,
                        Tensor& out) const override {
        product(upstream, weight, out, false);
    }

  private:
    void product(const Tensor& input, const QuantizedStorage& weight, Tensor& out,
                 bool forward) const {
        const auto& stored = static_cast<const PjrtQuantizedStorage&>(weight);
        const PackedLayout& layout = stored.layout();
        const std::size_t rows =
            input.numel() / (forward ? layout.in_features : layout.out_features);
        std::vector<BufferPointer> inputs = {buffer_of(input)};
        const std::vector<BufferPointer> weight_inputs = stored.weight_inputs();
        inputs.insert(inputs.end(), weight_inputs.begin(), weight_inputs.end());
        const Output outputs[] = {{ElementType::F32, out.numel()}};
        give(context_, out,
             run(
                 context_, product_key(layout, rows, forward),
                 [&] { return ProductProgram(layout, rows, forward).text(); }, inputs, outputs)[0]);
    }

    const Context& context_;
};

}  // namespace

std::unique_ptr<QuantizedLinearCapability> make_quantized_linear(const Context& context) {
    return std::make_unique<PjrtQuantizedLinear>(context);
}

}  // namespace riftco_transformer::detail::pjrt
