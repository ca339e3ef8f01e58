// PJRT flash attention: the CPU reference's math (cpu/attention.cpp) as two StableHLO
// programs, each a `stablehlo.while` over key tiles of `tile` = min(T, 64) keys. Every query
// of a (batch, head) pair is processed at once against one key tile, so the largest array a
// program holds is a tile's scores [B,Hkv,r,T,tile]: memory linear in T, never [T,T].
//
// Grouped-query heads: Q [B,Hq,T,d] is viewed as [B,Hkv,r,T,d] (query head h = g·r + j reads
// key/value head g = ⌊h/r⌋) and every product is a dot_general batched over (B, Hkv), so a
// key tile serves the r query heads of its group without a repeated copy.
//
// Forward, per key tile K_j, V_j [B,Hkv,tile,d] (keys past T are zero padding, always masked):
//   S = scale·Q·K_jᵀ (masked -> -inf);  m' = max(m, rowmax S)
//   l = l·e^{m−m'} + Σ e^{S−m'};  acc = acc·e^{m−m'} + e^{S−m'}·V_j;  m = m'
//   O = acc / l
// (m' = -inf, nothing visible yet, uses 0 in place of m' so every term stays 0, as the CPU's
// skipped row.) Backward (D = rowsum(dO ⊙ O)), per key tile, P = e^{S−m}/l recomputed:
//   dV_j = Σ_heads Pᵀ·dO;  dP = dO·V_jᵀ;  dS = P ⊙ (dP − D)·scale
//   dQ += dS·K_j;  dK_j = Σ_heads dSᵀ·Q
// dK_j and dV_j sum over the r query heads of the group inside the contraction.
//
// Under a soft cap c (Gemma 2) S = c·tanh(scale·Q·K_jᵀ/c) in both programs, and dS is
// multiplied by 1 − tanh²(·).
//
// Packed rows (documents): query i of batch row b also needs key j >= first[b, i], its
// document's first token; the [B·T] first keys are one more input of both programs.
//
// Domain check (forward, as the CPU): a visible score that is NaN or +inf, else a query row
// without a finite visible score, naming the first such (batch·head) item; the program returns
// the flag and the runtime raises it at the next sync point.

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Dims = std::vector<std::size_t>;

constexpr std::size_t maximum_tile = 64;
constexpr const char* negative_infinity = "0xFF800000";
constexpr const char* positive_infinity = "0x7F800000";

// The shared steps (program.hpp) plus the key-tile moves of the attention programs.
class AttentionSteps final : public Steps {
  public:
    using Steps::Steps;

    // x [B,H,T,d] zero-padded along axis 2 to `padded`.
    std::string pad_time(const std::string& x, const Dims& shape, std::size_t padded) {
        if (shape[2] == padded) {
            return x;
        }
        Dims to = shape;
        to[2] = padded;
        const std::string zero = splat("0.0", {});
        return p_.let("stablehlo.pad " + x + ", " + zero + ", low = [0, 0, 0, 0], high = [0, 0, " +
                      std::to_string(padded - shape[2]) + ", 0], interior = [0, 0, 0, 0] : (" +
                      tensor_type(shape) + ", tensor<f32>) -> " + tensor_type(to));
    }
    // x [B,H,Tp,d] -> [B,H,T,d].
    std::string unpad_time(const std::string& x, const Dims& shape, std::size_t time) {
        if (shape[2] == time) {
            return x;
        }
        Dims to = shape;
        to[2] = time;
        return p_.let("\"stablehlo.slice\"(" + x + ") {start_indices = array<i64: 0, 0, 0, 0>, " +
                      "limit_indices = " + i64_array(to) +
                      ", strides = array<i64: 1, 1, 1, 1>} : (" + tensor_type(shape) + ") -> " +
                      tensor_type(to));
    }
    // The key tile of x [B,H,Tp,d] starting at key `start` (tensor<i32>).
    std::string key_tile(const std::string& x, const Dims& shape, const std::string& start,
                         std::size_t tile) {
        const std::string zero = splat("0", {}, "i32");
        Dims to = shape;
        to[2] = tile;
        return p_.let("stablehlo.dynamic_slice " + x + ", " + zero + ", " + zero + ", " + start +
                      ", " + zero + ", sizes = " + integer_list(to) + " : (" + tensor_type(shape) +
                      ", tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> " +
                      tensor_type(to));
    }
    // x [B,H,Tp,d] with the tile [B,H,tile,d] written at key `start`.
    std::string write_tile(const std::string& x, const Dims& shape, const std::string& tile_value,
                           const Dims& tile_shape, const std::string& start) {
        const std::string zero = splat("0", {}, "i32");
        return p_.let("stablehlo.dynamic_update_slice " + x + ", " + tile_value + ", " + zero +
                      ", " + zero + ", " + start + ", " + zero + " : (" + tensor_type(shape) +
                      ", " + tensor_type(tile_shape) +
                      ", tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> " +
                      tensor_type(shape));
    }
};

// A while loop counting `counter` from 0 to `trip_count` (static). `carried` are the loop's
// other values (initial name, type); `body` receives the counter and the carried values
// (block arguments) and returns the carried values' next state. Returns the final values.
template <typename Body>
std::vector<std::string> counted_loop(
    AttentionSteps& s, std::size_t trip_count,
    const std::vector<std::pair<std::string, std::string>>& carried, Body body) {
    ProgramText& p = s.program();
    const std::string start = s.splat("0", {}, "i32");
    const std::string results = p.fresh();
    const std::string counter = p.fresh();
    std::vector<std::string> arguments;
    std::string header = results + ":" + std::to_string(carried.size() + 1) +
                         " = stablehlo.while(" + counter + " = " + start;
    std::string types = "tensor<i32>";
    for (const auto& [initial, type] : carried) {
        arguments.push_back(p.fresh());
        header += ", " + arguments.back() + " = " + initial;
        types += ", " + type;
    }
    p.line(header + ") : " + types);
    p.line("cond {");
    const std::string limit = s.splat(std::to_string(trip_count), {}, "i32");
    const std::string more = s.compare("LT", counter, limit, {}, "i32");
    p.line("  stablehlo.return " + more + " : tensor<i1>");
    p.line("} do {");
    std::vector<std::string> next = body(counter, arguments);
    const std::string one = s.splat("1", {}, "i32");
    const std::string next_counter = s.binary("add", counter, one, {}, "i32");
    std::string returned = "  stablehlo.return " + next_counter;
    for (const std::string& value : next) {
        returned += ", " + value;
    }
    p.line(returned + " : " + types);
    p.line("}");
    std::vector<std::string> finals;
    for (std::size_t i = 0; i < carried.size(); ++i) {
        finals.push_back(results + "#" + std::to_string(i + 1));
    }
    return finals;
}

// The geometry of one call: Q [B,Hq,T,d] viewed as [B,Hkv,r,T,d]; K, V [B,Hkv,T,d].
struct Geometry {
    std::size_t batch;
    std::size_t query_heads;
    std::size_t key_heads;
    std::size_t time;
    std::size_t width;
    std::size_t group;   // r = Hq/Hkv
    std::size_t tile;    // keys per loop step
    std::size_t tiles;   // loop steps
    std::size_t window;  // 0: dense causal
    float softcap;       // 0: none
    bool packed;         // packed rows: a [B,T] first-key input bounds each query's keys

    [[nodiscard]] std::size_t padded_time() const { return tile * tiles; }
    [[nodiscard]] Dims query() const { return {batch, key_heads, group, time, width}; }
    [[nodiscard]] Dims key() const { return {batch, key_heads, time, width}; }
    [[nodiscard]] Dims padded_key() const { return {batch, key_heads, padded_time(), width}; }
    [[nodiscard]] Dims key_tile() const { return {batch, key_heads, tile, width}; }
    [[nodiscard]] Dims scores() const { return {batch, key_heads, group, time, tile}; }
    [[nodiscard]] Dims rows() const { return {batch, key_heads, group, time}; }
    [[nodiscard]] Dims items() const { return {batch, key_heads, group}; }
    [[nodiscard]] std::size_t item_count() const { return batch * query_heads; }
    [[nodiscard]] std::size_t query_count() const { return item_count() * time * width; }
    [[nodiscard]] std::size_t key_count() const { return batch * key_heads * time * width; }
    [[nodiscard]] std::size_t row_count() const { return item_count() * time; }

    [[nodiscard]] std::string key_text(std::string_view operation, float scale) const {
        return std::string(operation) + "/" + std::to_string(batch) + "x" +
               std::to_string(query_heads) + "x" + std::to_string(key_heads) + "x" +
               std::to_string(time) + "x" + std::to_string(width) + "/w" + std::to_string(window) +
               "/s" + float_literal(scale) + "/c" + float_literal(softcap) +
               (packed ? "/packed" : "");
    }
};

Geometry geometry_of(const Tensor& query, const Tensor& key,
                     const tensor_ops::FlashAttentionOptions& options) {
    Geometry g{};
    g.batch = query.shape()[0];
    g.query_heads = query.shape()[1];
    g.key_heads = key.shape()[1];
    g.time = query.shape()[2];
    g.width = query.shape()[3];
    g.group = g.query_heads / g.key_heads;
    g.tile = std::min(g.time, maximum_tile);
    g.tiles = (g.time + g.tile - 1) / g.tile;
    g.window = options.window;
    g.softcap = options.softcap;
    g.packed = options.documents != nullptr;
    return g;
}

// Packed rows: each query's first visible key, t − its position inside its document, as a
// [B·T] f32 input on the device (exact: positions are far below 2^24).
Tensor first_keys_of(const tensor_ops::FlashAttentionOptions& options, ExecutionBackend backend) {
    const tensor_ops::PackedDocuments& documents = *options.documents;
    std::vector<float> first(documents.positions.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
        const std::size_t t = i % documents.time;
        first[i] = static_cast<float>(t - documents.positions[i]);
    }
    return Tensor({first.size()}, first, backend);
}

// The program's [B,T] i32 first keys from its [B·T] f32 parameter (declared here, in order).
std::string first_keys_parameter(ProgramText& program, AttentionSteps& s, const Geometry& g) {
    const Dims flat = {g.batch * g.time};
    const Dims rows = {g.batch, g.time};
    const std::string value = s.reshape(program.parameter(tensor_type(flat)), flat, rows);
    return program.let("stablehlo.convert " + value + " : (" + tensor_type(rows) + ") -> " +
                       tensor_type(rows, "i32"));
}

// The visible mask [B,Hkv,r,T,tile] of the key tile starting at `start` (tensor<i32>): key
// j visible from query i when j <= i and (window 0 or j + W > i), and, in packed rows, j >=
// first[b, i] (`first_keys` [B,T] i32; empty: unpacked). Padded keys (j >= T) are never
// visible.
std::string visible_mask(AttentionSteps& s, const Geometry& g, const std::string& start,
                         const std::string& first_keys) {
    const Dims plane = {g.time, g.tile};
    const std::string query_index = s.iota(0, plane);
    const std::string key_offset = s.iota(1, plane);
    const std::string key_index =
        s.binary("add", key_offset, s.broadcast(start, {}, plane, {}, "i32"), plane, "i32");
    std::string visible = s.compare("LE", key_index, query_index, plane, "i32");
    if (g.window != 0) {
        const std::string reach = s.binary(
            "add", key_index, s.splat(std::to_string(g.window), plane, "i32"), plane, "i32");
        visible = s.binary("and", visible, s.compare("GT", reach, query_index, plane, "i32"), plane,
                           "i1");
    }
    if (first_keys.empty())
        return s.broadcast(visible, plane, g.scores(), {3, 4}, "i1");
    const std::string key_b = s.broadcast(key_index, plane, g.scores(), {3, 4}, "i32");
    const std::string first_b =
        s.broadcast(first_keys, {g.batch, g.time}, g.scores(), {0, 3}, "i32");
    return s.binary("and", s.broadcast(visible, plane, g.scores(), {3, 4}, "i1"),
                    s.compare("GE", key_b, first_b, g.scores(), "i32"), g.scores(), "i1");
}

// S = scale·Q·K_jᵀ for the key tile (unmasked) [B,Hkv,r,T,tile].
std::string tile_scores(AttentionSteps& s, const Geometry& g, const std::string& query,
                        const std::string& key_tile, float scale) {
    const std::string products =
        s.dot(query, g.query(), key_tile, g.key_tile(), {0, 1}, {4}, {3}, g.scores());
    return s.binary("multiply", products, s.splat(scale, g.scores()), g.scores());
}

// c·tanh(S/c) of raw scores S under the soft cap c, or S unchanged without one. With a cap and
// `tanh_of`, tanh(S/c) is left there too (the backward's 1 − tanh² needs it).
std::string capped(AttentionSteps& s, const Geometry& g, const std::string& scores,
                   std::string* tanh_of = nullptr) {
    if (g.softcap == 0.0F) {
        return scores;
    }
    const std::string t = s.unary(
        "tanh", s.binary("multiply", scores, s.splat(1.0F / g.softcap, g.scores()), g.scores()),
        g.scores());
    if (tanh_of != nullptr) {
        *tanh_of = t;
    }
    return s.binary("multiply", t, s.splat(g.softcap, g.scores()), g.scores());
}

std::exception_ptr bad_scores(std::size_t item, bool no_finite) {
    std::ostringstream message;
    message << "flash attention: (batch·head) " << item
            << (no_finite ? " has a query row with no finite visible score"
                          : " has a visible score that is NaN or +inf");
    return std::make_exception_ptr(std::domain_error(message.str()));
}

class PjrtAttention final : public AttentionCapability {
  public:
    explicit PjrtAttention(const Context& context) : context_(context) {}

    // inp Q [B,Hq,T,d], K, V [B,Hkv,T,d] -> context [B,Hq,T,d], m, l [B,Hq,T]
    void flash_forward(const Tensor& query, const Tensor& key, const Tensor& value, float scale,
                       const tensor_ops::FlashAttentionOptions& options, Tensor& context,
                       Tensor& row_max, Tensor& row_sum) const override {
        const Geometry g = geometry_of(query, key, options);
        auto text = [&] {
            ProgramText program;
            AttentionSteps s(program);
            const std::string q_flat = program.parameter(tensor_type({g.query_count()}));
            const std::string k_flat = program.parameter(tensor_type({g.key_count()}));
            const std::string v_flat = program.parameter(tensor_type({g.key_count()}));
            const std::string q = s.reshape(q_flat, {g.query_count()}, g.query());
            const std::string k =
                s.pad_time(s.reshape(k_flat, {g.key_count()}, g.key()), g.key(), g.padded_time());
            const std::string v =
                s.pad_time(s.reshape(v_flat, {g.key_count()}, g.key()), g.key(), g.padded_time());
            const std::string first = g.packed ? first_keys_parameter(program, s, g) : "";
            const std::vector<std::pair<std::string, std::string>> carried = {
                {s.splat(negative_infinity, g.rows()), tensor_type(g.rows())},
                {s.splat("0.0", g.rows()), tensor_type(g.rows())},
                {s.splat("0.0", g.query()), tensor_type(g.query())},
                {s.splat("false", g.items(), "i1"), tensor_type(g.items(), "i1")}};
            const std::vector<std::string> finals = counted_loop(
                s, g.tiles, carried,
                [&](const std::string& counter, const std::vector<std::string>& state) {
                    const std::string& m = state[0];
                    const std::string& l = state[1];
                    const std::string& acc = state[2];
                    const std::string& bad = state[3];
                    const std::string start = s.binary(
                        "multiply", counter, s.splat(std::to_string(g.tile), {}, "i32"), {}, "i32");
                    const std::string key_tile = s.key_tile(k, g.padded_key(), start, g.tile);
                    const std::string value_tile = s.key_tile(v, g.padded_key(), start, g.tile);
                    const std::string scores = tile_scores(s, g, q, key_tile, scale);
                    const std::string visible = visible_mask(s, g, start, first);
                    // A visible NaN or +inf score marks its (batch, head) item.
                    const std::string is_nan = s.compare("NE", scores, scores, g.scores());
                    const std::string is_inf =
                        s.compare("EQ", scores, s.splat(positive_infinity, g.scores()), g.scores());
                    const std::string bad_score =
                        s.binary("and", s.binary("or", is_nan, is_inf, g.scores(), "i1"), visible,
                                 g.scores(), "i1");
                    const std::string bad_next =
                        s.binary("or", bad, s.reduce("or", bad_score, g.scores(), {3, 4}, "i1"),
                                 g.items(), "i1");
                    // The cap (Gemma 2) after the NaN/+inf check, which it would hide.
                    const std::string masked =
                        s.select(visible, capped(s, g, scores),
                                 s.splat(negative_infinity, g.scores()), g.scores());
                    const std::string tile_max = s.reduce("maximum", masked, g.scores(), {4});
                    const std::string new_max = s.binary("maximum", m, tile_max, g.rows());
                    // Nothing visible yet (new max −inf): subtract 0 so every term is e^{−inf}.
                    const std::string empty =
                        s.compare("EQ", new_max, s.splat(negative_infinity, g.rows()), g.rows());
                    const std::string shift =
                        s.select(empty, s.splat("0.0", g.rows()), new_max, g.rows());
                    const std::string weights =
                        s.unary("exponential",
                                s.binary("subtract", masked,
                                         s.broadcast(shift, g.rows(), g.scores(), {0, 1, 2, 3}),
                                         g.scores()),
                                g.scores());
                    const std::string correction =
                        s.unary("exponential", s.binary("subtract", m, shift, g.rows()), g.rows());
                    const std::string l_next =
                        s.binary("add", s.binary("multiply", l, correction, g.rows()),
                                 s.reduce("add", weights, g.scores(), {4}), g.rows());
                    const std::string update = s.dot(weights, g.scores(), value_tile, g.key_tile(),
                                                     {0, 1}, {4}, {2}, g.query());
                    const std::string acc_next = s.binary(
                        "add",
                        s.binary("multiply", acc,
                                 s.broadcast(correction, g.rows(), g.query(), {0, 1, 2, 3}),
                                 g.query()),
                        update, g.query());
                    return std::vector<std::string>{new_max, l_next, acc_next, bad_next};
                });
            const std::string& m = finals[0];
            const std::string& l = finals[1];
            const std::string& acc = finals[2];
            const std::string& bad = finals[3];
            // O = acc / l on rows with a finite maximum; rows without one keep acc (zeros).
            const std::string no_row =
                s.compare("EQ", m, s.splat(negative_infinity, g.rows()), g.rows());
            const std::string inverse = s.binary("divide", s.splat(1.0F, g.rows()), l, g.rows());
            const std::string factor = s.select(no_row, s.splat(1.0F, g.rows()), inverse, g.rows());
            const std::string out = s.binary(
                "multiply", acc, s.broadcast(factor, g.rows(), g.query(), {0, 1, 2, 3}), g.query());
            // Flag positions: [0, items) NaN/+inf items, then [items, 2·items) empty rows.
            const std::string empty_item = s.reduce("or", no_row, g.rows(), {3}, "i1");
            const std::size_t items = g.item_count();
            const std::string checks =
                program.let("stablehlo.concatenate " + s.reshape(bad, g.items(), {items}, "i1") +
                            ", " + s.reshape(empty_item, g.items(), {items}, "i1") +
                            ", dim = 0 : (" + tensor_type({items}, "i1") + ", " +
                            tensor_type({items}, "i1") + ") -> " + tensor_type({2 * items}, "i1"));
            const std::size_t check_shape[] = {2 * items};
            const std::string flag = first_violation_flag(program, checks, check_shape);
            const std::pair<std::string, std::string> results[] = {
                {program.flatten(out, g.query()), tensor_type({g.query_count()})},
                {program.flatten(m, g.rows()), tensor_type({g.row_count()})},
                {program.flatten(l, g.rows()), tensor_type({g.row_count()})},
                {flag, tensor_type({1}, "i32")}};
            return program.finish(results);
        };
        std::vector<BufferPointer> inputs = {buffer_of(query), buffer_of(key), buffer_of(value)};
        Tensor first_keys;
        if (g.packed) {
            first_keys = first_keys_of(options, query.backend());
            inputs.push_back(buffer_of(first_keys));
        }
        std::vector<BufferPointer> results =
            run(context_, g.key_text("flash_forward", scale), text, inputs,
                std::vector<Output>{{ElementType::F32, g.query_count()},
                                    {ElementType::F32, g.row_count()},
                                    {ElementType::F32, g.row_count()},
                                    {ElementType::S32, 1}});
        give(context_, context, results[0]);
        give(context_, row_max, results[1]);
        give(context_, row_sum, results[2]);
        const std::size_t items = g.item_count();
        defer_check(context_, results[3], [items](std::size_t position) {
            return position < items ? bad_scores(position, false)
                                    : bad_scores(position - items, true);
        });
    }

    void flash_backward(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& context, const Tensor& row_max, const Tensor& row_sum,
                        const Tensor& upstream, float scale,
                        const tensor_ops::FlashAttentionOptions& options, Tensor& query_gradient,
                        Tensor& key_gradient, Tensor& value_gradient) const override {
        const Geometry g = geometry_of(query, key, options);
        auto text = [&] {
            ProgramText program;
            AttentionSteps s(program);
            const Dims query_flat = {g.query_count()};
            const Dims key_flat = {g.key_count()};
            const Dims rows_flat = {g.row_count()};
            const std::string q =
                s.reshape(program.parameter(tensor_type(query_flat)), query_flat, g.query());
            const std::string k =
                s.pad_time(s.reshape(program.parameter(tensor_type(key_flat)), key_flat, g.key()),
                           g.key(), g.padded_time());
            const std::string v =
                s.pad_time(s.reshape(program.parameter(tensor_type(key_flat)), key_flat, g.key()),
                           g.key(), g.padded_time());
            const std::string o =
                s.reshape(program.parameter(tensor_type(query_flat)), query_flat, g.query());
            const std::string m =
                s.reshape(program.parameter(tensor_type(rows_flat)), rows_flat, g.rows());
            const std::string l =
                s.reshape(program.parameter(tensor_type(rows_flat)), rows_flat, g.rows());
            const std::string d_o =
                s.reshape(program.parameter(tensor_type(query_flat)), query_flat, g.query());
            const std::string first = g.packed ? first_keys_parameter(program, s, g) : "";
            // D = rowsum(dO ⊙ O) [B,Hkv,r,T]; 1/l as the CPU's inverse.
            const std::string row_dots =
                s.reduce("add", s.binary("multiply", d_o, o, g.query()), g.query(), {4});
            const std::string inverse = s.binary("divide", s.splat(1.0F, g.rows()), l, g.rows());
            const Dims to_scores = {0, 1, 2, 3};
            const std::string m_b = s.broadcast(m, g.rows(), g.scores(), to_scores);
            const std::string inverse_b = s.broadcast(inverse, g.rows(), g.scores(), to_scores);
            const std::string row_dots_b = s.broadcast(row_dots, g.rows(), g.scores(), to_scores);
            const std::vector<std::pair<std::string, std::string>> carried = {
                {s.splat("0.0", g.query()), tensor_type(g.query())},
                {s.splat("0.0", g.padded_key()), tensor_type(g.padded_key())},
                {s.splat("0.0", g.padded_key()), tensor_type(g.padded_key())}};
            const std::vector<std::string> finals = counted_loop(
                s, g.tiles, carried,
                [&](const std::string& counter, const std::vector<std::string>& state) {
                    const std::string& dq = state[0];
                    const std::string& dk = state[1];
                    const std::string& dv = state[2];
                    const std::string start = s.binary(
                        "multiply", counter, s.splat(std::to_string(g.tile), {}, "i32"), {}, "i32");
                    const std::string key_tile = s.key_tile(k, g.padded_key(), start, g.tile);
                    const std::string value_tile = s.key_tile(v, g.padded_key(), start, g.tile);
                    // Under a soft cap: S = c·tanh(raw/c), and dS carries 1 − tanh².
                    std::string cap_tanh;
                    const std::string scores_tile =
                        capped(s, g, tile_scores(s, g, q, key_tile, scale), &cap_tanh);
                    const std::string masked =
                        s.select(visible_mask(s, g, start, first), scores_tile,
                                 s.splat(negative_infinity, g.scores()), g.scores());
                    // P = e^{S−m}·(1/l)
                    const std::string p =
                        s.binary("multiply",
                                 s.unary("exponential",
                                         s.binary("subtract", masked, m_b, g.scores()), g.scores()),
                                 inverse_b, g.scores());
                    // dV_j = Σ_{heads, queries} Pᵀ·dO  [B,Hkv,tile,d]
                    const std::string dv_tile =
                        s.dot(p, g.scores(), d_o, g.query(), {0, 1}, {2, 3}, {2, 3}, g.key_tile());
                    // dP = dO·V_jᵀ; dS = P ⊙ (dP − D)·scale
                    const std::string dp = s.dot(d_o, g.query(), value_tile, g.key_tile(), {0, 1},
                                                 {4}, {3}, g.scores());
                    std::string ds = s.binary(
                        "multiply",
                        s.binary("multiply", p, s.binary("subtract", dp, row_dots_b, g.scores()),
                                 g.scores()),
                        s.splat(scale, g.scores()), g.scores());
                    if (g.softcap != 0.0F) {
                        const std::string slope = s.binary(
                            "subtract", s.splat(1.0F, g.scores()),
                            s.binary("multiply", cap_tanh, cap_tanh, g.scores()), g.scores());
                        ds = s.binary("multiply", ds, slope, g.scores());
                    }
                    // dQ += dS·K_j;  dK_j = Σ dSᵀ·Q
                    const std::string dq_next = s.binary(
                        "add", dq,
                        s.dot(ds, g.scores(), key_tile, g.key_tile(), {0, 1}, {4}, {2}, g.query()),
                        g.query());
                    const std::string dk_tile =
                        s.dot(ds, g.scores(), q, g.query(), {0, 1}, {2, 3}, {2, 3}, g.key_tile());
                    return std::vector<std::string>{
                        dq_next, s.write_tile(dk, g.padded_key(), dk_tile, g.key_tile(), start),
                        s.write_tile(dv, g.padded_key(), dv_tile, g.key_tile(), start)};
                });
            const std::string dk = s.unpad_time(finals[1], g.padded_key(), g.time);
            const std::string dv = s.unpad_time(finals[2], g.padded_key(), g.time);
            const std::pair<std::string, std::string> results[] = {
                {program.flatten(finals[0], g.query()), tensor_type(query_flat)},
                {program.flatten(dk, g.key()), tensor_type(key_flat)},
                {program.flatten(dv, g.key()), tensor_type(key_flat)}};
            return program.finish(results);
        };
        std::vector<BufferPointer> inputs = {
            buffer_of(query),   buffer_of(key),     buffer_of(value),   buffer_of(context),
            buffer_of(row_max), buffer_of(row_sum), buffer_of(upstream)};
        Tensor first_keys;
        if (g.packed) {
            first_keys = first_keys_of(options, query.backend());
            inputs.push_back(buffer_of(first_keys));
        }
        std::vector<BufferPointer> results =
            run(context_, g.key_text("flash_backward", scale), text, inputs,
                std::vector<Output>{{ElementType::F32, g.query_count()},
                                    {ElementType::F32, g.key_count()},
                                    {ElementType::F32, g.key_count()}});
        give(context_, query_gradient, results[0]);
        give(context_, key_gradient, results[1]);
        give(context_, value_gradient, results[2]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<AttentionCapability> make_attention(const Context& context) {
    return std::make_unique<PjrtAttention>(context);
}

}  // namespace riftco_transformer::detail::pjrt
