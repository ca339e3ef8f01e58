// PJRT paged decode attention (tensor_ops/paged_attention.hpp; the CPU reference is
// cpu/paged_attention.cpp). One program per call shape walks every request's visible
// positions t = first_r .. length_r − 1 in chunks of `chunk` positions with the online
// softmax (running max m, sum l, context accumulator), inside a `stablehlo.while` whose trip
// count is a runtime value, so a growing request does not recompile:
//   t = first_r + c·chunk + i (past length_r: masked);  page = table_r[t / S], slot t % S
//   K_c, V_c [R,chunk,Hkv,d] = gather(pool, (page, slot))     (in-program, one chunk at a time)
//   s = scale·q·K_cᵀ [R,Hkv,r,chunk];  m' = max(m, max s);  l = l·e^{m−m'} + Σ e^{s−m'}
//   acc = acc·e^{m−m'} + e^{s−m'}·V_c;  context = acc / l
// Under a soft cap c (Gemma 2; a constant of the program) s becomes c·tanh(s/c) after the
// NaN/+inf check and before the softmax.
// The query is viewed as [R,Hkv,r,d] (query head h = g·r + j reads pool head g), and the
// products are dot_generals batched over (request, pool head): no repeated head.
//
// The host data of a call (page tables, first visible positions, lengths, chunk count) goes up
// as one small s32 buffer; page tables are padded to a power-of-two page count, the only
// host-dependent extent in the program's key.
//
// Domain check (as the CPU): a visible score that is NaN or +inf, naming the first (request,
// head, position) in that order and the score. The program returns, per (request, head), the
// first such position and its score, and the flag of the first such pair.
//
// write_key_value scatters the rows into both pools in one program and gives the pool tensors
// the program's fresh buffers: copies of a pool keep the old buffer.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Dims = std::vector<std::size_t>;

constexpr std::size_t chunk = 64;
constexpr const char* negative_infinity = "0xFF800000";
constexpr const char* positive_infinity = "0x7F800000";
constexpr std::int32_t no_position = std::numeric_limits<std::int32_t>::max();

// The shared steps (program.hpp) plus the page-table slices of the decode program.
class PagedSteps final : public Steps {
  public:
    using Steps::Steps;

    // Elements [start, start + count) of a rank-1 s32 array of `total`.
    std::string slice(const std::string& x, std::size_t total, std::size_t start,
                      std::size_t count) {
        return p_.let("\"stablehlo.slice\"(" + x +
                      ") {start_indices = array<i64: " + std::to_string(start) +
                      ">, limit_indices = array<i64: " + std::to_string(start + count) +
                      ">, strides = array<i64: 1>} : (" + tensor_type({total}, "i32") + ") -> " +
                      tensor_type({count}, "i32"));
    }
};

// The call's geometry: query [R,Hq,1,d] viewed as [R,Hkv,r,d]; pools [P,Hkv,S,d].
struct Geometry {
    std::size_t requests;
    std::size_t query_heads;
    std::size_t pool_heads;
    std::size_t group;  // r = Hq/Hkv
    std::size_t pages;
    std::size_t page_size;
    std::size_t width;
    std::size_t table_pages;  // page-table columns (a power of two)
    float softcap;            // 0: none

    [[nodiscard]] Dims query() const { return {requests, pool_heads, group, width}; }
    [[nodiscard]] Dims pool() const { return {pages, pool_heads, page_size, width}; }
    [[nodiscard]] Dims rows() const { return {requests, pool_heads, group}; }
    [[nodiscard]] Dims scores() const { return {requests, pool_heads, group, chunk}; }
    [[nodiscard]] Dims gathered() const { return {requests, chunk, pool_heads, width}; }
    [[nodiscard]] Dims positions() const { return {requests, chunk}; }
    [[nodiscard]] std::size_t query_count() const { return requests * query_heads * width; }
    [[nodiscard]] std::size_t pool_count() const { return pages * pool_heads * page_size * width; }
    [[nodiscard]] std::size_t pair_count() const { return requests * query_heads; }
    // The s32 host data: tables [R, table_pages], first [R], length [R], chunk count [1].
    [[nodiscard]] std::size_t host_count() const { return requests * (table_pages + 2) + 1; }
};

// The decode program (see the file comment). Parameters: query, key pool, value pool, host
// data (s32), scale [1]; results: context, flag, first bad position and score per pair.
std::string decode_program(const Geometry& g) {
    ProgramText program;
    PagedSteps s(program);
    const std::string query_flat = program.parameter(tensor_type({g.query_count()}));
    const std::string key_flat = program.parameter(tensor_type({g.pool_count()}));
    const std::string value_flat = program.parameter(tensor_type({g.pool_count()}));
    const std::string host = program.parameter(tensor_type({g.host_count()}, "i32"));
    const std::string scale_flat = program.parameter("tensor<1xf32>");
    const std::string q = s.reshape(query_flat, {g.query_count()}, g.query());
    const std::string key_pool = s.reshape(key_flat, {g.pool_count()}, g.pool());
    const std::string value_pool = s.reshape(value_flat, {g.pool_count()}, g.pool());
    const std::size_t table_count = g.requests * g.table_pages;
    const std::string tables = s.reshape(s.slice(host, g.host_count(), 0, table_count),
                                         {table_count}, {g.requests, g.table_pages}, "i32");
    const std::string firsts = s.slice(host, g.host_count(), table_count, g.requests);
    const std::string lengths = s.slice(host, g.host_count(), table_count + g.requests, g.requests);
    const std::string trip_count =
        s.reshape(s.slice(host, g.host_count(), table_count + 2 * g.requests, 1), {1}, {}, "i32");
    const std::string scale = s.broadcast(scale_flat, {1}, g.scores(), {3});

    const Dims positions = g.positions();
    const Dims scores = g.scores();
    const Dims rows = g.rows();
    const Dims to_scores = {0, 1, 2};
    const std::string firsts_b = s.broadcast(firsts, {g.requests}, positions, {0}, "i32");
    const std::string lengths_b = s.broadcast(lengths, {g.requests}, positions, {0}, "i32");
    const std::string request_index = s.iota(0, {g.requests, chunk, 1});
    const std::string offsets = s.iota(1, positions);
    const std::string page_size = s.splat(std::to_string(g.page_size), positions, "i32");

    ProgramText& p = program;
    const std::string start = s.splat("0", {}, "i32");
    const std::string m0 = s.splat(negative_infinity, rows);
    const std::string l0 = s.splat("0.0", rows);
    const std::string acc0 = s.splat("0.0", g.query());
    const std::string first0 = s.splat(std::to_string(no_position), rows, "i32");
    const std::string score0 = s.splat("0.0", rows);
    const std::string results = p.fresh();
    const std::string c = p.fresh();
    const std::string m = p.fresh();
    const std::string l = p.fresh();
    const std::string acc = p.fresh();
    const std::string first_bad = p.fresh();
    const std::string bad_score = p.fresh();
    const std::string types = "tensor<i32>, " + tensor_type(rows) + ", " + tensor_type(rows) +
                              ", " + tensor_type(g.query()) + ", " + tensor_type(rows, "i32") +
                              ", " + tensor_type(rows);
    p.line(results + ":6 = stablehlo.while(" + c + " = " + start + ", " + m + " = " + m0 + ", " +
           l + " = " + l0 + ", " + acc + " = " + acc0 + ", " + first_bad + " = " + first0 + ", " +
           bad_score + " = " + score0 + ") : " + types);
    p.line("cond {");
    p.line("  stablehlo.return " + s.compare("LT", c, trip_count, {}, "i32") + " : tensor<i1>");
    p.line("} do {");
    {
        // t = first + c·chunk + i; past the length: masked, read at `first` instead.
        const std::string base =
            s.binary("multiply", c, s.splat(std::to_string(chunk), {}, "i32"), {}, "i32");
        const std::string t =
            s.binary("add", s.binary("add", firsts_b, offsets, positions, "i32"),
                     s.broadcast(base, {}, positions, {}, "i32"), positions, "i32");
        const std::string valid = s.compare("LT", t, lengths_b, positions, "i32");
        const std::string read_at = s.select(valid, t, firsts_b, positions, "i32");
        const std::string logical_page = s.binary("divide", read_at, page_size, positions, "i32");
        const std::string slot = s.binary("remainder", read_at, page_size, positions, "i32");
        const Dims column = {g.requests, chunk, 1};
        const Dims pair = {g.requests, chunk, 2};
        const std::string table_index =
            p.let("stablehlo.concatenate " + request_index + ", " +
                  s.reshape(logical_page, positions, column, "i32") + ", dim = 2 : (" +
                  tensor_type(column, "i32") + ", " + tensor_type(column, "i32") + ") -> " +
                  tensor_type(pair, "i32"));
        const std::string page = p.let(
            "\"stablehlo.gather\"(" + tables + ", " + table_index +
            ") {dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], "
            "start_index_map = [0, 1], index_vector_dim = 2>, slice_sizes = array<i64: 1, 1>} "
            ": (" +
            tensor_type({g.requests, g.table_pages}, "i32") + ", " + tensor_type(pair, "i32") +
            ") -> " + tensor_type(positions, "i32"));
        const std::string pool_index =
            p.let("stablehlo.concatenate " + s.reshape(page, positions, column, "i32") + ", " +
                  s.reshape(slot, positions, column, "i32") + ", dim = 2 : (" +
                  tensor_type(column, "i32") + ", " + tensor_type(column, "i32") + ") -> " +
                  tensor_type(pair, "i32"));
        const auto gather_rows = [&](const std::string& pool) {
            return p.let("\"stablehlo.gather\"(" + pool + ", " + pool_index +
                         ") {dimension_numbers = #stablehlo.gather<offset_dims = [2, 3], "
                         "collapsed_slice_dims = [0, 2], start_index_map = [0, 2], "
                         "index_vector_dim = 2>, slice_sizes = array<i64: 1, " +
                         std::to_string(g.pool_heads) + ", 1, " + std::to_string(g.width) +
                         ">} : (" + tensor_type(g.pool()) + ", " + tensor_type(pair, "i32") +
                         ") -> " + tensor_type(g.gathered()));
        };
        const std::string keys = gather_rows(key_pool);
        const std::string values = gather_rows(value_pool);
        // s = scale·q·K_cᵀ [R,Hkv,r,chunk]
        const std::string products =
            s.dot(q, g.query(), keys, g.gathered(), {0, 1}, {0, 2}, {3}, {3}, scores);
        const std::string score = s.binary("multiply", products, scale, scores);
        const std::string visible = s.broadcast(valid, positions, scores, {0, 3}, "i1");
        const std::string t_b = s.broadcast(t, positions, scores, {0, 3}, "i32");
        // The first visible NaN or +inf of each pair, and its score.
        const std::string bad =
            s.binary("and",
                     s.binary("or", s.compare("NE", score, score, scores),
                              s.compare("EQ", score, s.splat(positive_infinity, scores), scores),
                              scores, "i1"),
                     visible, scores, "i1");
        const std::string none = s.splat(std::to_string(no_position), scores, "i32");
        const std::string chunk_first =
            s.reduce_last("minimum", s.select(bad, t_b, none, scores, "i32"), scores,
                          std::to_string(no_position), "i32");
        const std::string at_first =
            s.binary("and", bad,
                     s.compare("EQ", t_b, s.broadcast(chunk_first, rows, scores, to_scores, "i32"),
                               scores, "i32"),
                     scores, "i1");
        const std::string chunk_score = s.reduce_last(
            "maximum", s.select(at_first, score, s.splat(negative_infinity, scores), scores),
            scores, negative_infinity);
        const std::string earlier = s.compare(
            "NE", first_bad, s.splat(std::to_string(no_position), rows, "i32"), rows, "i32");
        const std::string first_next = s.select(earlier, first_bad, chunk_first, rows, "i32");
        const std::string score_next = s.select(earlier, bad_score, chunk_score, rows);
        // Online softmax over the chunk (nothing visible yet: shift by 0, every term e^{−inf}).
        const std::string scored =
            g.softcap == 0.0F
                ? score
                : s.binary("multiply",
                           s.unary("tanh",
                                   s.binary("multiply", score, s.splat(1.0F / g.softcap, scores),
                                            scores),
                                   scores),
                           s.splat(g.softcap, scores), scores);
        const std::string masked =
            s.select(visible, scored, s.splat(negative_infinity, scores), scores);
        const std::string new_max = s.binary(
            "maximum", m, s.reduce_last("maximum", masked, scores, negative_infinity), rows);
        const std::string empty = s.compare("EQ", new_max, s.splat(negative_infinity, rows), rows);
        const std::string shift = s.select(empty, s.splat("0.0", rows), new_max, rows);
        const std::string weights = s.exponential(
            s.binary("subtract", masked, s.broadcast(shift, rows, scores, to_scores), scores),
            scores);
        const std::string correction = s.exponential(s.binary("subtract", m, shift, rows), rows);
        const std::string l_next = s.binary("add", s.binary("multiply", l, correction, rows),
                                            s.reduce_last("add", weights, scores, "0.0"), rows);
        const std::string update =
            s.dot(weights, scores, values, g.gathered(), {0, 1}, {0, 2}, {3}, {1}, g.query());
        const std::string acc_next =
            s.binary("add",
                     s.binary("multiply", acc, s.broadcast(correction, rows, g.query(), to_scores),
                              g.query()),
                     update, g.query());
        const std::string c_next = s.binary("add", c, s.splat("1", {}, "i32"), {}, "i32");
        p.line("  stablehlo.return " + c_next + ", " + new_max + ", " + l_next + ", " + acc_next +
               ", " + first_next + ", " + score_next + " : " + types);
    }
    p.line("}");
    const std::string l_final = results + "#2";
    const std::string acc_final = results + "#3";
    const std::string first_final = results + "#4";
    const std::string score_final = results + "#5";
    // context = acc·(1/l)
    const std::string inverse = s.binary("divide", s.splat("1.0", rows), l_final, rows);
    const std::string context = s.binary(
        "multiply", acc_final, s.broadcast(inverse, rows, g.query(), to_scores), g.query());
    const std::string any_bad = s.compare(
        "NE", first_final, s.splat(std::to_string(no_position), rows, "i32"), rows, "i32");
    const std::string flag = first_violation_flag(program, any_bad, rows);
    const std::size_t pairs = g.pair_count();
    const std::pair<std::string, std::string> outputs[] = {
        {program.flatten(context, g.query()), tensor_type({g.query_count()})},
        {flag, tensor_type({1}, "i32")},
        {program.flatten(first_final, rows, "i32"), tensor_type({pairs}, "i32")},
        {program.flatten(score_final, rows), tensor_type({pairs})}};
    return program.finish(outputs);
}

// The first position a request of `length` sees under `window` (0: no window).
std::size_t first_visible(std::size_t length, std::size_t window) {
    return window == 0 || window >= length ? 0 : length - window;
}

std::size_t power_of_two_at_least(std::size_t value) {
    return std::bit_ceil(std::max<std::size_t>(value, 1));
}

std::exception_ptr bad_score_error(std::size_t request, std::size_t head, std::size_t position,
                                   float score) {
    std::ostringstream message;
    message << "paged_decode_attention: score of request " << request << ", head " << head
            << ", position " << position << " is " << score << " (NaN and +inf are rejected)";
    return std::make_exception_ptr(std::domain_error(message.str()));
}

class PjrtPagedAttention final : public PagedAttentionCapability {
  public:
    explicit PjrtPagedAttention(const Context& context) : context_(context) {}

    // query [R,Hq,1,d], pools [P,Hkv,S,d] -> context [R,Hq,1,d]
    void decode_attention(const Tensor& query, const Tensor& key_pool, const Tensor& value_pool,
                          std::span<const tensor_ops::PagedAttentionRequest> requests, float scale,
                          const tensor_ops::PagedAttentionOptions& options,
                          Tensor& context) const override {
        Geometry g{};
        g.requests = query.shape()[0];
        g.query_heads = query.shape()[1];
        g.pages = key_pool.shape()[0];
        g.pool_heads = key_pool.shape()[1];
        g.page_size = key_pool.shape()[2];
        g.width = key_pool.shape()[3];
        g.group = g.query_heads / g.pool_heads;
        g.softcap = options.softcap;
        std::size_t needed_pages = 1;
        std::size_t longest = 1;
        for (const auto& request : requests) {
            needed_pages = std::max(needed_pages, (request.length + g.page_size - 1) / g.page_size);
            longest =
                std::max(longest, request.length - first_visible(request.length, options.window));
        }
        g.table_pages = power_of_two_at_least(needed_pages);
        // tables (unused columns: page 0), first visible positions, lengths, chunk count.
        std::vector<std::int32_t> host(g.host_count(), 0);
        for (std::size_t r = 0; r < requests.size(); ++r) {
            const auto& request = requests[r];
            const std::size_t used = (request.length + g.page_size - 1) / g.page_size;
            for (std::size_t page = 0; page < used; ++page) {
                host[r * g.table_pages + page] =
                    static_cast<std::int32_t>(request.page_table[page]);
            }
            host[g.requests * g.table_pages + r] =
                static_cast<std::int32_t>(first_visible(request.length, options.window));
            host[g.requests * (g.table_pages + 1) + r] = static_cast<std::int32_t>(request.length);
        }
        host.back() = static_cast<std::int32_t>((longest + chunk - 1) / chunk);
        const std::string key = "paged_decode_attention/" + std::to_string(g.requests) + "x" +
                                std::to_string(g.query_heads) + "/" + shape_key(key_pool.shape()) +
                                "/t" + std::to_string(g.table_pages) +
                                (g.softcap != 0.0F ? "/c" + float_literal(g.softcap) : "");
        const BufferPointer host_buffer =
            context_.runtime->upload(ElementType::S32, host.data(), host.size());
        std::vector<BufferPointer> results =
            run(context_, key, [&] { return decode_program(g); },
                {buffer_of(query), buffer_of(key_pool), buffer_of(value_pool), host_buffer,
                 scalar_buffer(context_, scale)},
                {{ElementType::F32, g.query_count()},
                 {ElementType::S32, 1},
                 {ElementType::S32, g.pair_count()},
                 {ElementType::F32, g.pair_count()}});
        give(context_, context, results[0]);
        const Context& device = context_;
        const std::size_t heads = g.query_heads;
        defer_check(
            context_, results[1],
            [&device, heads, positions = results[2], scores = results[3]](std::size_t pair) {
                std::vector<std::int32_t> first(positions->element_count());
                device.runtime->download(*positions, first.data());
                return bad_score_error(pair / heads, pair % heads,
                                       static_cast<std::size_t>(first.at(pair)),
                                       read_element(device, scores, pair));
            });
    }

    // pools[slot_r.page, :, slot_r.offset, :] = rows r of key and value ([R,Hkv,1,d])
    void write_key_value(Tensor& key_pool, Tensor& value_pool, const Tensor& key,
                         const Tensor& value,
                         std::span<const tensor_ops::PagedSlot> slots) const override {
        const Dims pool(key_pool.shape().begin(), key_pool.shape().end());
        const std::size_t rows = key.shape()[0];
        const std::size_t pool_count = key_pool.numel();
        const Dims row_shape = {rows, pool[1], pool[3]};
        const std::size_t row_count = key.numel();
        std::vector<std::int32_t> targets(2 * rows);
        for (std::size_t r = 0; r < rows; ++r) {
            targets[2 * r] = static_cast<std::int32_t>(slots[r].page);
            targets[2 * r + 1] = static_cast<std::int32_t>(slots[r].offset);
        }
        auto text = [&] {
            ProgramText program;
            const std::string key_flat = program.parameter(tensor_type({pool_count}));
            const std::string value_flat = program.parameter(tensor_type({pool_count}));
            const std::string key_rows = program.parameter(tensor_type({row_count}));
            const std::string value_rows = program.parameter(tensor_type({row_count}));
            const std::string target_flat = program.parameter(tensor_type({2 * rows}, "i32"));
            const Dims flat_pool = {pool_count};
            const Dims flat_rows = {row_count};
            const Dims target_shape = {rows, 2};
            const std::string target =
                program.reshape(target_flat, Dims{2 * rows}, target_shape, "i32");
            const auto scatter = [&](const std::string& pool_flat, const std::string& rows_flat) {
                const std::string updated = program.fresh();
                const std::string old_value = program.fresh();
                const std::string new_value = program.fresh();
                program.line(updated + " = \"stablehlo.scatter\"(" +
                             program.reshape(pool_flat, flat_pool, pool) + ", " + target + ", " +
                             program.reshape(rows_flat, flat_rows, row_shape) + ") ({");
                program.line("  ^bb0(" + old_value + ": tensor<f32>, " + new_value +
                             ": tensor<f32>):");
                program.line("    stablehlo.return " + new_value + " : tensor<f32>");
                program.line(
                    "}) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1, "
                    "2], inserted_window_dims = [0, 2], scatter_dims_to_operand_dims = [0, 2], "
                    "index_vector_dim = 1>, indices_are_sorted = false, unique_indices = true} "
                    ": (" +
                    tensor_type(pool) + ", " + tensor_type(target_shape, "i32") + ", " +
                    tensor_type(row_shape) + ") -> " + tensor_type(pool));
                return program.flatten(updated, pool);
            };
            const std::string keys = scatter(key_flat, key_rows);
            const std::string values = scatter(value_flat, value_rows);
            const std::pair<std::string, std::string> outputs[] = {
                {keys, tensor_type(flat_pool)}, {values, tensor_type(flat_pool)}};
            return program.finish(outputs);
        };
        const std::string program_key =
            "paged_write_key_value/" + shape_key(key_pool.shape()) + "/" + std::to_string(rows);
        const BufferPointer target_buffer =
            context_.runtime->upload(ElementType::S32, targets.data(), targets.size());
        std::vector<BufferPointer> results =
            run(context_, program_key, text,
                {buffer_of(key_pool), buffer_of(value_pool), buffer_of(key), buffer_of(value),
                 target_buffer},
                {{ElementType::F32, pool_count}, {ElementType::F32, pool_count}});
        give(context_, key_pool, results[0]);
        give(context_, value_pool, results[1]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<PagedAttentionCapability> make_paged_attention(const Context& context) {
    return std::make_unique<PjrtPagedAttention>(context);
}

}  // namespace riftco_transformer::detail::pjrt
