// The PJRT attention, paged-attention and quantized-linear capabilities on a real plugin
// (XLA's CPU plugin in CI), each against the CPU reference through the public API: flash
// attention forward and backward (grouped-query heads 4:2 and 4:1, sliding windows, T not a
// multiple of the key tile, T = 1) and its deferred domain errors; both attention kinds
// through autograd; paged decode attention over page tables (several requests of different
// lengths, grouped heads, windows), its deferred error and its compile-once key, and KV
// writes into the pools; NF4 products for both scale encodings and the exact payload.
//
// Tolerances (|device − cpu| <= absolute + relative·|cpu|), inputs of unit size:
// - flash forward (context, row max, row sum): 1e-6 + 1e-6. Both sides run float32 with the
//   same online-softmax recurrence over the same key tiles; they differ in the order of the
//   d-term dot products and of the row sums (blocked GEMM vs XLA's dot) and in exp (ours vs
//   XLA's, a few ulps). Measured: below 2.3e-7 (row sums of up to 150 terms <= 1).
// - flash backward: 3e-6 + 3e-6. dK, dV sum over up to T queries and r heads in another
//   order than the CPU's head-by-head shares; measured below 7e-7.
// - paged decode: 5e-7 + 5e-7 (the CPU's fast kernel normalises once at the end, the device
//   rescales per chunk of 64 positions); measured below 7e-8.
// - NF4 products: 3e-5 + 3e-5, the bound the CPU kernels meet against a double oracle
//   (test_quantized_linear). The decoded weights are bit-identical (the same float products
//   ŝ·codebook); only the K-term float dot products (K up to 4096, sums up to ~55) round in
//   another order. Measured below 1e-5.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/adapter.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/quantized_weight.hpp"
#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/paged_attention.hpp"
#include "riftco_transformer/core/tensor_ops/quantized_linear.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "support/pjrt_support.hpp"

namespace riftco_transformer {
namespace {

using test::close_to;
using test::pjrt_test_backend;
using test::uniform_values;

constexpr double flash_forward_tolerance = 1e-6;
constexpr double flash_backward_tolerance = 3e-6;
constexpr double paged_tolerance = 5e-7;
constexpr double nf4_tolerance = 3e-5;

class PjrtAttention : public ::testing::Test {
  protected:
    void SetUp() override { RIFTCO_REQUIRE_PJRT_DEVICE(); }
    ExecutionBackend device = pjrt_test_backend();
};

// ---- flash attention ------------------------------------------------------------------------

struct FlashCase {
    std::size_t batch;
    std::size_t query_heads;
    std::size_t key_heads;
    std::size_t time;
    std::size_t width;
    std::size_t window;
};

std::string describe(const FlashCase& c) {
    return "B=" + std::to_string(c.batch) + " Hq=" + std::to_string(c.query_heads) +
           " Hkv=" + std::to_string(c.key_heads) + " T=" + std::to_string(c.time) +
           " d=" + std::to_string(c.width) + " W=" + std::to_string(c.window);
}

// Packed rows: each row's document lengths (summing to T); empty: unpacked.
using DocumentLengths = std::vector<std::vector<std::size_t>>;

std::shared_ptr<const tensor_ops::PackedDocuments> packed(const FlashCase& c,
                                                          const DocumentLengths& documents) {
    if (documents.empty())
        return nullptr;
    std::vector<std::uint32_t> positions;
    for (const auto& row : documents) {
        for (const std::size_t length : row) {
            for (std::size_t p = 0; p < length; ++p)
                positions.push_back(static_cast<std::uint32_t>(p));
        }
    }
    return tensor_ops::packed_documents("test", positions, c.batch, c.time);
}

void expect_flash_parity(ExecutionBackend device, const FlashCase& c, float softcap = 0.0F,
                         const DocumentLengths& documents = {}) {
    SCOPED_TRACE(describe(c) + " cap=" + std::to_string(softcap) +
                 (documents.empty() ? "" : " packed"));
    const Shape query_shape = {c.batch, c.query_heads, c.time, c.width};
    const Shape key_shape = {c.batch, c.key_heads, c.time, c.width};
    const std::size_t query_count = c.batch * c.query_heads * c.time * c.width;
    const std::size_t key_count = c.batch * c.key_heads * c.time * c.width;
    const std::vector<float> q = uniform_values(query_count, -1.0F, 1.0F, 101);
    const std::vector<float> k = uniform_values(key_count, -1.0F, 1.0F, 102);
    const std::vector<float> v = uniform_values(key_count, -1.0F, 1.0F, 103);
    const std::vector<float> g = uniform_values(query_count, -1.0F, 1.0F, 104);
    const tensor_ops::FlashAttentionOptions options{
        .window = c.window, .softcap = softcap, .documents = packed(c, documents)};

    const Tensor q_cpu(query_shape, q, ExecutionBackend::Cpu);
    const Tensor k_cpu(key_shape, k, ExecutionBackend::Cpu);
    const Tensor v_cpu(key_shape, v, ExecutionBackend::Cpu);
    const Tensor q_device(query_shape, q, device);
    const Tensor k_device(key_shape, k, device);
    const Tensor v_device(key_shape, v, device);

    const auto reference = tensor_ops::flash_attention(q_cpu, k_cpu, v_cpu, options);
    const auto result = tensor_ops::flash_attention(q_device, k_device, v_device, options);
    EXPECT_EQ(result.context.backend(), device);
    EXPECT_TRUE(close_to(result.context.to_host(), reference.context.to_host(),
                         flash_forward_tolerance, flash_forward_tolerance))
        << "context";
    EXPECT_TRUE(close_to(result.row_max.to_host(), reference.row_max.to_host(),
                         flash_forward_tolerance, flash_forward_tolerance))
        << "row max";
    EXPECT_TRUE(close_to(result.row_sum.to_host(), reference.row_sum.to_host(),
                         flash_forward_tolerance, flash_forward_tolerance))
        << "row sum";

    const auto reference_gradients = tensor_ops::flash_attention_backward(
        q_cpu, k_cpu, v_cpu, reference, Tensor(query_shape, g, ExecutionBackend::Cpu));
    const auto gradients = tensor_ops::flash_attention_backward(
        q_device, k_device, v_device, result, Tensor(query_shape, g, device));
    EXPECT_EQ(gradients.key.shape(), key_shape);
    EXPECT_TRUE(close_to(gradients.query.to_host(), reference_gradients.query.to_host(),
                         flash_backward_tolerance, flash_backward_tolerance))
        << "dQ";
    EXPECT_TRUE(close_to(gradients.key.to_host(), reference_gradients.key.to_host(),
                         flash_backward_tolerance, flash_backward_tolerance))
        << "dK";
    EXPECT_TRUE(close_to(gradients.value.to_host(), reference_gradients.value.to_host(),
                         flash_backward_tolerance, flash_backward_tolerance))
        << "dV";
}

TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceForMultiHeadAttention) {
    expect_flash_parity(device, {2, 3, 3, 64, 8, 0});  // exactly one key tile
    expect_flash_parity(device, {1, 2, 2, 5, 4, 0});   // T below the tile size
}

TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceWhenTIsNotAMultipleOfTheTile) {
    expect_flash_parity(device, {1, 2, 2, 70, 8, 0});
    expect_flash_parity(device, {2, 1, 1, 129, 4, 0});
}

TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceForGroupedQueryHeads) {
    expect_flash_parity(device, {2, 4, 2, 70, 8, 0});    // 4:2
    expect_flash_parity(device, {1, 4, 1, 130, 16, 0});  // 4:1, three key tiles
}

TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceUnderASlidingWindow) {
    expect_flash_parity(device, {1, 4, 2, 100, 8, 17});
    expect_flash_parity(device, {2, 2, 1, 150, 4, 64});  // the window ends on a tile boundary
    expect_flash_parity(device, {1, 2, 2, 9, 4, 1});     // each query sees only itself
    expect_flash_parity(device, {1, 2, 2, 9, 4, 40});    // W >= T: dense
}

// Gemma 2's attention-logit soft cap in both programs (a cap of 0.5 bites on these scores).
TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceUnderASoftCap) {
    expect_flash_parity(device, {1, 4, 2, 100, 8, 17}, 0.5F);
    expect_flash_parity(device, {2, 2, 2, 70, 8, 0}, 50.0F);
}

// Packed rows: documents that start and end inside key tiles and across them, with grouped
// heads, a window and a soft cap; the first-key bound is one more program input.
TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceForPackedRows) {
    const DocumentLengths documents = {{70, 3, 77}, {40, 110}};
    expect_flash_parity(device, {2, 4, 2, 150, 8, 0}, 0.0F, documents);
    expect_flash_parity(device, {2, 4, 2, 150, 8, 17}, 0.0F, documents);
    expect_flash_parity(device, {2, 2, 2, 150, 8, 0}, 0.5F, documents);
    expect_flash_parity(device, {1, 2, 1, 9, 4, 0}, 0.0F, {{1, 1, 7}});  // one-token documents
}

TEST_F(PjrtAttention, FlashAttentionMatchesTheReferenceForOnePosition) {
    expect_flash_parity(device, {2, 3, 3, 1, 8, 0});
    expect_flash_parity(device, {1, 4, 2, 1, 8, 3});
}

// Both attention kinds through the public API (autograd and nn): flash runs this backend's
// attention capability, the materialized kind composes the matmul and causal-softmax
// capabilities. Forward and gradients of Σ context ⊙ weights, against the CPU.
TEST_F(PjrtAttention, BothAttentionKindsMatchTheReferenceThroughThePublicApi) {
    const detail::BackendAdapter* adapter = detail::find_backend_adapter(device);
    ASSERT_NE(adapter, nullptr);
    if (adapter->matmul() == nullptr || adapter->softmax() == nullptr ||
        adapter->reduction() == nullptr || adapter->elementwise() == nullptr) {
        GTEST_SKIP() << "materialized attention needs this backend's matmul, softmax, "
                        "reduction and elementwise capabilities";
    }
    const Shape shape = {2, 2, 70, 8};
    const std::size_t count = 2 * 2 * 70 * 8;
    const std::vector<float> q = uniform_values(count, -1.0F, 1.0F, 121);
    const std::vector<float> k = uniform_values(count, -1.0F, 1.0F, 122);
    const std::vector<float> v = uniform_values(count, -1.0F, 1.0F, 123);
    const std::vector<float> weights = uniform_values(count, -1.0F, 1.0F, 124);
    struct Run {
        std::vector<float> context, dq, dk, dv;
    };
    const auto run = [&](ExecutionBackend backend, AttentionKind kind) {
        Variable query(Tensor(shape, q, backend));
        Variable key(Tensor(shape, k, backend));
        Variable value(Tensor(shape, v, backend));
        const Variable context = causal_attention(query, key, value, kind);
        sum(context * Variable(Tensor(shape, weights, backend), false)).backward();
        return Run{context.value().to_host(), query.gradient().to_host(), key.gradient().to_host(),
                   value.gradient().to_host()};
    };
    const Run reference = run(ExecutionBackend::Cpu, AttentionKind::Flash);
    for (const AttentionKind kind : {AttentionKind::Flash, AttentionKind::Materialized}) {
        SCOPED_TRACE(kind == AttentionKind::Flash ? "flash" : "materialized");
        const Run result = run(device, kind);
        EXPECT_TRUE(close_to(result.context, reference.context, flash_forward_tolerance,
                             flash_forward_tolerance));
        EXPECT_TRUE(
            close_to(result.dq, reference.dq, flash_backward_tolerance, flash_backward_tolerance));
        EXPECT_TRUE(
            close_to(result.dk, reference.dk, flash_backward_tolerance, flash_backward_tolerance));
        EXPECT_TRUE(
            close_to(result.dv, reference.dv, flash_backward_tolerance, flash_backward_tolerance));
    }
}

// The forward's domain errors wait for the sync point and carry the CPU's message.
template <typename Mutate>
void expect_same_flash_error(ExecutionBackend device, Mutate mutate) {
    const Shape query_shape = {2, 4, 6, 4};
    const Shape key_shape = {2, 2, 6, 4};
    std::vector<float> q = uniform_values(2 * 4 * 6 * 4, -1.0F, 1.0F, 111);
    std::vector<float> k = uniform_values(2 * 2 * 6 * 4, -1.0F, 1.0F, 112);
    const std::vector<float> v = uniform_values(2 * 2 * 6 * 4, -1.0F, 1.0F, 113);
    mutate(q, k);
    std::string reference_message;
    try {
        static_cast<void>(tensor_ops::flash_attention(Tensor(query_shape, q, ExecutionBackend::Cpu),
                                                      Tensor(key_shape, k, ExecutionBackend::Cpu),
                                                      Tensor(key_shape, v, ExecutionBackend::Cpu)));
        FAIL() << "the CPU reference accepted the input";
    } catch (const std::domain_error& error) {
        reference_message = error.what();
    }
    const Tensor q_device(query_shape, q, device);
    tensor_ops::FlashAttentionResult result;
    ASSERT_NO_THROW(result = tensor_ops::flash_attention(q_device, Tensor(key_shape, k, device),
                                                         Tensor(key_shape, v, device)));
    try {
        static_cast<void>(result.context.to_host());
        FAIL() << "the sync point did not raise the deferred error";
    } catch (const std::domain_error& error) {
        EXPECT_EQ(std::string(error.what()), reference_message);
    }
    // Raised once; the input is unchanged.
    std::vector<float> q_after;
    ASSERT_NO_THROW(q_after = q_device.to_host());
    EXPECT_EQ(std::memcmp(q_after.data(), q.data(), q.size() * sizeof(float)), 0);
}

TEST_F(PjrtAttention, FlashAttentionRaisesAVisibleNanScoreAtTheSyncPointLikeTheReference) {
    // A NaN score in item 7 (batch 1, query head 3) and ±inf scores in item 5: the first item
    // with a NaN or +inf is named.
    expect_same_flash_error(device, [](std::vector<float>& q, std::vector<float>&) {
        q[((1 * 4 + 3) * 6 + 4) * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
        q[((1 * 4 + 1) * 6 + 2) * 4 + 0] = std::numeric_limits<float>::infinity();
    });
}

TEST_F(PjrtAttention, FlashAttentionRaisesARowWithoutAFiniteScoreAtTheSyncPointLikeTheReference) {
    // Batch 1, query head 2 (item 6), time 0 sees only key 0 of key head 1, and their score
    // overflows to −inf.
    expect_same_flash_error(device, [](std::vector<float>& q, std::vector<float>& k) {
        for (std::size_t i = 0; i < 4; ++i) {
            q[((1 * 4 + 2) * 6 + 0) * 4 + i] = 1e30F;
            k[((1 * 2 + 1) * 6 + 0) * 4 + i] = -1e30F;
        }
    });
}

// ---- paged decode attention -----------------------------------------------------------------

using tensor_ops::PagedAttentionRequest;
using tensor_ops::PagedSlot;

// Pools [P,Hkv,S,d] of random values on both backends and page tables that scatter each
// request over shuffled physical pages (request r uses pages_per_request consecutive entries
// of one shuffled permutation, so no two requests share a page).
struct PagedCase {
    std::size_t pages;
    std::size_t pool_heads;
    std::size_t page_size;
    std::size_t width;
    std::size_t query_heads;
    std::vector<std::size_t> lengths;
};

struct PagedInputs {
    std::vector<float> query;
    std::vector<float> keys;
    std::vector<float> values;
    std::vector<std::vector<std::uint32_t>> tables;
    Shape query_shape;
    Shape pool_shape;

    [[nodiscard]] std::vector<PagedAttentionRequest> requests(
        const std::vector<std::size_t>& lengths) const {
        std::vector<PagedAttentionRequest> result;
        for (std::size_t r = 0; r < lengths.size(); ++r) {
            result.push_back({tables[r], lengths[r]});
        }
        return result;
    }
};

PagedInputs paged_inputs(const PagedCase& c, unsigned seed) {
    PagedInputs in;
    const std::size_t requests = c.lengths.size();
    in.query_shape = {requests, c.query_heads, 1, c.width};
    in.pool_shape = {c.pages, c.pool_heads, c.page_size, c.width};
    const std::size_t pool_count = c.pages * c.pool_heads * c.page_size * c.width;
    in.query = uniform_values(requests * c.query_heads * c.width, -1.0F, 1.0F, seed);
    in.keys = uniform_values(pool_count, -1.0F, 1.0F, seed + 1);
    in.values = uniform_values(pool_count, -1.0F, 1.0F, seed + 2);
    std::vector<std::uint32_t> permutation(c.pages);
    std::iota(permutation.begin(), permutation.end(), 0U);
    std::shuffle(permutation.begin(), permutation.end(), std::mt19937(seed + 3));
    std::size_t next = 0;
    for (const std::size_t length : c.lengths) {
        const std::size_t used = (length + c.page_size - 1) / c.page_size;
        std::vector<std::uint32_t> table(
            permutation.begin() + static_cast<std::ptrdiff_t>(next),
            permutation.begin() + static_cast<std::ptrdiff_t>(next + used));
        table.push_back(permutation[0]);  // a spare entry past the length is never read
        in.tables.push_back(std::move(table));
        next += used;
    }
    return in;
}

void expect_paged_parity(ExecutionBackend device, const PagedCase& c, std::size_t window,
                         float softcap = 0.0F) {
    SCOPED_TRACE("Hq=" + std::to_string(c.query_heads) + " Hkv=" + std::to_string(c.pool_heads) +
                 " S=" + std::to_string(c.page_size) + " W=" + std::to_string(window) +
                 " cap=" + std::to_string(softcap));
    const PagedInputs in = paged_inputs(c, 201);
    const auto requests = in.requests(c.lengths);
    const tensor_ops::PagedAttentionOptions options{.window = window, .softcap = softcap};
    const Tensor reference = tensor_ops::paged_decode_attention(
        Tensor(in.query_shape, in.query, ExecutionBackend::Cpu),
        Tensor(in.pool_shape, in.keys, ExecutionBackend::Cpu),
        Tensor(in.pool_shape, in.values, ExecutionBackend::Cpu), requests, 0.0F, options);
    const Tensor result = tensor_ops::paged_decode_attention(
        Tensor(in.query_shape, in.query, device), Tensor(in.pool_shape, in.keys, device),
        Tensor(in.pool_shape, in.values, device), requests, 0.0F, options);
    EXPECT_EQ(result.backend(), device);
    EXPECT_TRUE(close_to(result.to_host(), reference.to_host(), paged_tolerance, paged_tolerance));
}

// Three requests of different lengths: inside one page, across a chunk of 64 positions, and
// over several chunks.
const PagedCase multi_head = {32, 4, 8, 8, 4, {5, 70, 150}};
const PagedCase grouped_two = {32, 2, 16, 8, 4, {1, 33, 150}};     // 4:2
const PagedCase grouped_four = {20, 2, 16, 16, 8, {100, 17, 64}};  // 8:2, groups of 4

TEST_F(PjrtAttention, PagedDecodeMatchesTheReferenceForRequestsOfDifferentLengths) {
    expect_paged_parity(device, multi_head, 0);
}

TEST_F(PjrtAttention, PagedDecodeMatchesTheReferenceForGroupedQueryHeads) {
    expect_paged_parity(device, grouped_two, 0);
    expect_paged_parity(device, grouped_four, 0);
}

TEST_F(PjrtAttention, PagedDecodeMatchesTheReferenceUnderASlidingWindow) {
    expect_paged_parity(device, multi_head, 10);
    expect_paged_parity(device, grouped_two, 65);    // longer than a chunk
    expect_paged_parity(device, grouped_four, 1);    // only the newest position
    expect_paged_parity(device, grouped_four, 500);  // W >= every length: dense
}

TEST_F(PjrtAttention, PagedDecodeMatchesTheReferenceUnderASoftCap) {
    expect_paged_parity(device, multi_head, 0, 0.5F);
    expect_paged_parity(device, grouped_four, 10, 0.5F);
}

TEST_F(PjrtAttention, PagedDecodeRecompilesNeitherForLongerRequestsNorForOtherPages) {
#if RIFTCO_TRANSFORMER_HAVE_PJRT
    const PagedCase c = {32, 2, 16, 8, 4, {40, 90}};
    PagedInputs in = paged_inputs(c, 211);
    const Tensor query(in.query_shape, in.query, device);
    const Tensor keys(in.pool_shape, in.keys, device);
    const Tensor values(in.pool_shape, in.values, device);
    static_cast<void>(
        tensor_ops::paged_decode_attention(query, keys, values, in.requests({40, 90})));
    const auto before = test::pjrt_statistics();
    // Longer requests (6 -> 7 pages, within the same power-of-two table width) and the two
    // requests' pages swapped: the same program.
    static_cast<void>(
        tensor_ops::paged_decode_attention(query, keys, values, in.requests({48, 112})));
    std::swap(in.tables[0], in.tables[1]);
    const Tensor swapped =
        tensor_ops::paged_decode_attention(query, keys, values, in.requests({112, 48}));
    EXPECT_EQ(test::pjrt_statistics().compiles, before.compiles);
    const Tensor reference = tensor_ops::paged_decode_attention(
        Tensor(in.query_shape, in.query, ExecutionBackend::Cpu),
        Tensor(in.pool_shape, in.keys, ExecutionBackend::Cpu),
        Tensor(in.pool_shape, in.values, ExecutionBackend::Cpu), in.requests({112, 48}));
    EXPECT_TRUE(close_to(swapped.to_host(), reference.to_host(), paged_tolerance, paged_tolerance));
#else
    GTEST_SKIP() << "statistics need the PJRT adapter";
#endif
}

TEST_F(PjrtAttention, WrittenKeyValueRowsMatchTheReferenceAndCopiesKeepTheOldPool) {
    const PagedCase c = {12, 2, 8, 8, 4, {20, 9}};
    const PagedInputs in = paged_inputs(c, 221);
    // Two new rows per request: positions 20, 21 and 9, 10 through the page tables.
    const std::vector<std::size_t> grown = {22, 11};
    std::vector<PagedSlot> slots;
    for (const auto& [request, position] :
         std::vector<std::pair<std::size_t, std::size_t>>{{0, 20}, {0, 21}, {1, 9}, {1, 10}}) {
        slots.push_back({in.tables[request][position / c.page_size],
                         static_cast<std::uint32_t>(position % c.page_size)});
    }
    const Shape row_shape = {slots.size(), c.pool_heads, 1, c.width};
    const std::vector<float> new_keys = uniform_values(4 * c.pool_heads * c.width, -1, 1, 222);
    const std::vector<float> new_values = uniform_values(4 * c.pool_heads * c.width, -1, 1, 223);

    Tensor cpu_keys(in.pool_shape, in.keys, ExecutionBackend::Cpu);
    Tensor cpu_values(in.pool_shape, in.values, ExecutionBackend::Cpu);
    tensor_ops::write_paged_key_value(cpu_keys, cpu_values,
                                      Tensor(row_shape, new_keys, ExecutionBackend::Cpu),
                                      Tensor(row_shape, new_values, ExecutionBackend::Cpu), slots);
    Tensor device_keys(in.pool_shape, in.keys, device);
    Tensor device_values(in.pool_shape, in.values, device);
    const Tensor keys_before = device_keys;
    tensor_ops::write_paged_key_value(device_keys, device_values,
                                      Tensor(row_shape, new_keys, device),
                                      Tensor(row_shape, new_values, device), slots);
    // A copy is exact on both sides.
    EXPECT_TRUE(close_to(device_keys.to_host(), cpu_keys.to_host(), 0.0, 0.0));
    EXPECT_TRUE(close_to(device_values.to_host(), cpu_values.to_host(), 0.0, 0.0));
    EXPECT_TRUE(close_to(keys_before.to_host(), in.keys, 0.0, 0.0)) << "a copy saw the write";

    const auto requests = in.requests(grown);
    const Tensor reference = tensor_ops::paged_decode_attention(
        Tensor(in.query_shape, in.query, ExecutionBackend::Cpu), cpu_keys, cpu_values, requests);
    const Tensor result = tensor_ops::paged_decode_attention(
        Tensor(in.query_shape, in.query, device), device_keys, device_values, requests);
    EXPECT_TRUE(close_to(result.to_host(), reference.to_host(), paged_tolerance, paged_tolerance));
}

TEST_F(PjrtAttention, PagedDecodeRaisesAPositiveInfiniteScoreAtTheSyncPointLikeTheReference) {
    const PagedCase c = {12, 2, 8, 8, 4, {20, 30}};
    PagedInputs in = paged_inputs(c, 231);
    // Request 1, query head 3 (pool head 1): huge query; positions 12 and 25 hold huge keys,
    // so their scores overflow to +inf and the first, 12, is named.
    for (std::size_t i = 0; i < c.width; ++i) {
        in.query[(1 * c.query_heads + 3) * c.width + i] = 1e30F;
    }
    for (const std::size_t position : {25U, 12U}) {
        const std::size_t page = in.tables[1][position / c.page_size];
        for (std::size_t i = 0; i < c.width; ++i) {
            in.keys[((page * c.pool_heads + 1) * c.page_size + position % c.page_size) * c.width +
                    i] = 1e30F;
        }
    }
    const auto requests = in.requests(c.lengths);
    std::string reference_message;
    try {
        static_cast<void>(tensor_ops::paged_decode_attention(
            Tensor(in.query_shape, in.query, ExecutionBackend::Cpu),
            Tensor(in.pool_shape, in.keys, ExecutionBackend::Cpu),
            Tensor(in.pool_shape, in.values, ExecutionBackend::Cpu), requests));
        FAIL() << "the CPU reference accepted the input";
    } catch (const std::domain_error& error) {
        reference_message = error.what();
    }
    Tensor result;
    ASSERT_NO_THROW(result = tensor_ops::paged_decode_attention(
                        Tensor(in.query_shape, in.query, device),
                        Tensor(in.pool_shape, in.keys, device),
                        Tensor(in.pool_shape, in.values, device), requests));
    try {
        static_cast<void>(result.to_host());
        FAIL() << "the sync point did not raise the deferred error";
    } catch (const std::domain_error& error) {
        EXPECT_EQ(std::string(error.what()), reference_message);
    }
    EXPECT_NO_THROW(static_cast<void>(result.to_host()));
}

// ---- NF4 quantized linear -------------------------------------------------------------------

struct Nf4Case {
    std::size_t rows;
    std::size_t in;
    std::size_t out;
    std::size_t block_size;
    bool double_quantized;
    std::size_t scale_block_size;
};

std::string describe(const Nf4Case& c) {
    return "rows=" + std::to_string(c.rows) + " in=" + std::to_string(c.in) +
           " out=" + std::to_string(c.out) + " B=" + std::to_string(c.block_size) +
           (c.double_quantized ? " DQ C=" + std::to_string(c.scale_block_size) : " legacy");
}

// A weight quantized on the CPU and the same payload uploaded to the device.
struct Nf4Weights {
    QuantizedWeight cpu;
    QuantizedWeight device;
};

Nf4Weights nf4_weights(ExecutionBackend device, const Nf4Case& c) {
    const Tensor source({c.out, c.in}, uniform_values(c.out * c.in, -0.8F, 0.8F, 301),
                        ExecutionBackend::Cpu);
    QuantizedWeight cpu = QuantizedWeight::quantize(
        source, Nf4Options{c.block_size, c.double_quantized,
                           c.double_quantized ? c.scale_block_size : nf4_default_scale_block_size});
    QuantizedWeight on_device =
        QuantizedWeight::from_packed_nf4(cpu.copy_payload_to_host(), device);
    return {std::move(cpu), std::move(on_device)};
}

void expect_nf4_parity(ExecutionBackend device, const Nf4Case& c) {
    SCOPED_TRACE(describe(c));
    const Nf4Weights weights = nf4_weights(device, c);
    const std::vector<float> x = uniform_values(c.rows * c.in, -1.0F, 1.0F, 302);
    const Tensor y =
        tensor_ops::quantized_linear(Tensor({c.rows, c.in}, x, device), weights.device);
    EXPECT_EQ(y.backend(), device);
    EXPECT_EQ(y.shape(), (Shape{c.rows, c.out}));
    EXPECT_TRUE(close_to(
        y.to_host(),
        tensor_ops::quantized_linear(Tensor({c.rows, c.in}, x, ExecutionBackend::Cpu), weights.cpu)
            .to_host(),
        nf4_tolerance, nf4_tolerance))
        << "forward";
    const std::vector<float> g = uniform_values(c.rows * c.out, -1.0F, 1.0F, 303);
    const Tensor dx = tensor_ops::quantized_linear_input_backward(
        Tensor({c.rows, c.out}, g, device), weights.device);
    EXPECT_EQ(dx.shape(), (Shape{c.rows, c.in}));
    EXPECT_TRUE(close_to(dx.to_host(),
                         tensor_ops::quantized_linear_input_backward(
                             Tensor({c.rows, c.out}, g, ExecutionBackend::Cpu), weights.cpu)
                             .to_host(),
                         nf4_tolerance, nf4_tolerance))
        << "input backward";
}

const Nf4Case legacy_cases[] = {
    {1, 192, 5, 128, false, 0},    // blocks spanning rows
    {1, 100, 37, 64, false, 0},    // in not a multiple of B
    {37, 201, 130, 32, false, 0},  // odd in: rows start on a high nibble
    {3, 256, 5, 4096, false, 0},   // one block for everything (M = 1)
    {4, 1024, 700, 64, false, 0},  // several panels each way, a partial last one
};

const Nf4Case double_quantized_cases[] = {
    {1, 256, 64, 64, true, 256},
    {3, 33, 5, 32, true, 32},    // odd N: the last byte's high nibble is unused
    {2, 128, 9, 512, true, 32},  // blocks spanning four rows
    {1, 1, 1, 32, true, 32},
    {2, 4096, 150, 64, true, 256},  // two row panels forward
    {4, 1024, 700, 64, true, 256},  // a partial last scale group (M = 11200, C = 256)
};

TEST_F(PjrtAttention, Nf4ProductsMatchTheReferenceWithLegacyScales) {
    for (const Nf4Case& c : legacy_cases) {
        expect_nf4_parity(device, c);
    }
}

TEST_F(PjrtAttention, Nf4ProductsMatchTheReferenceWithDoubleQuantizedScales) {
    for (const Nf4Case& c : double_quantized_cases) {
        expect_nf4_parity(device, c);
    }
}

TEST_F(PjrtAttention, Nf4ForwardFlattensLeadingDimensions) {
    const Nf4Weights weights = nf4_weights(device, {6, 64, 24, 32, true, 32});
    const std::vector<float> x = uniform_values(2 * 3 * 64, -1.0F, 1.0F, 304);
    const Tensor y = tensor_ops::quantized_linear(Tensor({2, 3, 64}, x, device), weights.device);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 24}));
    EXPECT_TRUE(close_to(
        y.to_host(),
        tensor_ops::quantized_linear(Tensor({2, 3, 64}, x, ExecutionBackend::Cpu), weights.cpu)
            .to_host(),
        nf4_tolerance, nf4_tolerance));
}

// Scale codes whose decode leaves [0, FLT_MAX]: μ + (t·(q − 128))/127 below 0 becomes 0 and
// above FLT_MAX becomes FLT_MAX, as on the CPU (inputs small enough that no product
// overflows).
TEST_F(PjrtAttention, Nf4DoubleQuantizedScalesClampLikeTheReference) {
    PackedNf4Payload payload;
    payload.out_features = 4;
    payload.in_features = 32;
    payload.block_size = 32;
    payload.double_quantized = true;
    payload.scale_block_size = 32;
    payload.codes.resize(64);
    for (std::size_t i = 0; i < payload.codes.size(); ++i) {
        payload.codes[i] = static_cast<std::uint8_t>((i * 37U + 11U) & 0xFFU);
    }
    payload.scale_codes = {0, 255, 128, 200};  // −128·t/127, +127·t/127, 0, +72·t/127
    payload.scale_ranges = {3.0e38F};
    payload.scale_offset = 3.0e38F;
    const QuantizedWeight cpu = QuantizedWeight::from_packed_nf4(payload, ExecutionBackend::Cpu);
    const QuantizedWeight on_device = QuantizedWeight::from_packed_nf4(payload, device);
    const std::vector<float> x = uniform_values(2 * 32, -1e-3F, 1e-3F, 305);
    EXPECT_TRUE(close_to(
        tensor_ops::quantized_linear(Tensor({2, 32}, x, device), on_device).to_host(),
        tensor_ops::quantized_linear(Tensor({2, 32}, x, ExecutionBackend::Cpu), cpu).to_host(), 0.0,
        nf4_tolerance));
    const std::vector<float> g = uniform_values(2 * 4, -1e-3F, 1e-3F, 306);
    EXPECT_TRUE(close_to(
        tensor_ops::quantized_linear_input_backward(Tensor({2, 4}, g, device), on_device).to_host(),
        tensor_ops::quantized_linear_input_backward(Tensor({2, 4}, g, ExecutionBackend::Cpu), cpu)
            .to_host(),
        0.0, nf4_tolerance));
}

// The bits of each float (so −0 and NaN payloads count).
std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
    std::vector<std::uint32_t> bits;
    for (const float value : values) {
        bits.push_back(std::bit_cast<std::uint32_t>(value));
    }
    return bits;
}

void expect_same_payload(const PackedNf4Payload& a, const PackedNf4Payload& b) {
    EXPECT_EQ(a.out_features, b.out_features);
    EXPECT_EQ(a.in_features, b.in_features);
    EXPECT_EQ(a.block_size, b.block_size);
    EXPECT_EQ(a.double_quantized, b.double_quantized);
    EXPECT_EQ(a.scale_block_size, b.scale_block_size);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(bits_of(a.scales), bits_of(b.scales));
    EXPECT_EQ(a.scale_codes, b.scale_codes);
    EXPECT_EQ(bits_of(a.scale_ranges), bits_of(b.scale_ranges));
    EXPECT_EQ(std::bit_cast<std::uint32_t>(a.scale_offset),
              std::bit_cast<std::uint32_t>(b.scale_offset));
}

TEST_F(PjrtAttention, Nf4PayloadsComeBackExactlyAndOnlyThePayloadIsResident) {
    for (const Nf4Case& c : {Nf4Case{1, 33, 5, 32, true, 32}, Nf4Case{1, 100, 37, 64, false, 0}}) {
        SCOPED_TRACE(describe(c));
        const Nf4Weights weights = nf4_weights(device, c);
        EXPECT_EQ(weights.device.backend(), device);
        const PackedNf4Payload original = weights.cpu.copy_payload_to_host();
        expect_same_payload(weights.device.copy_payload_to_host(), original);
        // Through QuantizedWeight::to both ways as well.
        expect_same_payload(weights.cpu.to(device).to(ExecutionBackend::Cpu).copy_payload_to_host(),
                            original);
        // The device holds the payload's bytes and nothing more (no float32 copy).
        const QuantizedMemoryUsage usage = weights.device.memory_usage();
        EXPECT_EQ(usage.resident_payload_bytes, usage.logical_payload_bytes);
        EXPECT_LT(usage.resident_payload_bytes, usage.fp32_equivalent_bytes);
    }
}

TEST_F(PjrtAttention, PackedRowLookupIsRefusedNamingTheBackend) {
    const QuantizedWeight table =
        QuantizedWeight::quantize(Tensor({4, 64}, std::vector<float>(256, 0.5F), device));
    try {
        static_cast<void>(tensor_ops::quantized_gather_rows(
            table, IndexTensor({1}, std::vector<std::uint32_t>{2}, device)));
        ADD_FAILURE() << "the PJRT adapter looked up a packed row";
    } catch (const std::runtime_error& error) {
        EXPECT_NE(std::string(error.what()).find("cannot look up rows of a packed weight"),
                  std::string::npos)
            << error.what();
    }
}

TEST_F(PjrtAttention, GgufBlockWeightsAreRefusedNamingTheBackendAndTheFormat) {
    // The PJRT adapter stores NF4 only: a block-format weight is refused by name, never kept
    // as float32 behind the caller's back.
    const QuantizedWeight cpu = QuantizedWeight::quantize_blocks(
        Tensor({4, 64}, std::vector<float>(256, 0.25F)), WeightFormat::q8_0);
    for (const auto& attempt : {std::function<void()>([&] { static_cast<void>(cpu.to(device)); }),
                                std::function<void()>([&] {
                                    static_cast<void>(QuantizedWeight::from_packed_blocks(
                                        cpu.copy_blocks_to_host(), device));
                                })}) {
        try {
            attempt();
            ADD_FAILURE() << "a q8_0 weight was accepted by the PJRT adapter";
        } catch (const std::runtime_error& error) {
            const std::string text = error.what();
            EXPECT_NE(text.find("lacks the q8_0 weight format"), std::string::npos) << text;
            EXPECT_NE(text.find(std::string(execution_backend_name(device))), std::string::npos)
                << text;
        }
    }
}

}  // namespace
}  // namespace riftco_transformer
