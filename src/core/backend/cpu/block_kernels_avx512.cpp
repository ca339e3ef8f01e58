// The AVX-512 (avx512f + f16c) inner loops of the GGUF block kernels (block_kernels.hpp).
// Compiled with a target attribute, so the library needs no -march flag;
// avx512_block_kernels() returns them only when the processor reports both features.
//
// A block's 32 weights become two vectors (elements 0..15 and 16..31): q8_0's int8 codes
// widen to int32; q4_0/q4_1's 16 bytes widen once, the low nibbles giving the first vector
// and the high nibbles the second. Each lane is then d·q (q4_1: d·n, then + m), rounded
// exactly as the host dequantizer rounds it.

#include "core/backend/cpu/block_kernel_dispatch.hpp"
#include "core/backend/cpu/block_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RIFTCO_BLOCK_HAVE_AVX512 1
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace riftco_transformer::detail {

#if defined(RIFTCO_BLOCK_HAVE_AVX512)
namespace {

#define RIFTCO_AVX512 __attribute__((target("avx512f,f16c")))

RIFTCO_AVX512 inline __m512 half_vector(const std::uint8_t* bytes) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes, sizeof(bits));
    return _mm512_set1_ps(_cvtsh_ss(bits));
}

template <WeightFormat Format>
RIFTCO_AVX512 inline void decode32(const std::uint8_t* block, __m512& first, __m512& second) {
    const __m512 d = half_vector(block);
    if constexpr (Format == WeightFormat::q8_0) {
        const __m512i low =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
        const __m512i high =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18)));
        first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(low));
        second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(high));
    } else {
        constexpr std::size_t codes = Format == WeightFormat::q4_1 ? 4 : 2;
        const __m512i bytes =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + codes)));
        __m512i low = _mm512_and_si512(bytes, _mm512_set1_epi32(15));
        __m512i high = _mm512_srli_epi32(bytes, 4);
        if constexpr (Format == WeightFormat::q4_0) {
            low = _mm512_sub_epi32(low, _mm512_set1_epi32(8));
            high = _mm512_sub_epi32(high, _mm512_set1_epi32(8));
        }
        first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(low));
        second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(high));
        if constexpr (Format == WeightFormat::q4_1) {
            const __m512 m = half_vector(block + 2);
            first = _mm512_add_ps(first, m);
            second = _mm512_add_ps(second, m);
        }
    }
}

template <WeightFormat Format>
RIFTCO_AVX512 void decode_range_of(const BlockView& view, std::size_t begin, std::size_t count,
                                   float* out) {
    std::size_t done = 0;
    if (begin % gguf_block_elements != 0) {  // a partial head block: the host decoder
        done = std::min(count, gguf_block_elements - begin % gguf_block_elements);
        dequantize_block_range(view, begin, {out, done});
    }
    for (; done + gguf_block_elements <= count; done += gguf_block_elements) {
        const std::uint8_t* block =
            view.blocks + (begin + done) / gguf_block_elements * view.block_bytes;
        __m512 first;
        __m512 second;
        decode32<Format>(block, first, second);
        _mm512_storeu_ps(out + done, first);
        _mm512_storeu_ps(out + done + 16, second);
    }
    if (done < count) {
        dequantize_block_range(view, begin + done, {out + done, count - done});
    }
}

// Bytes ahead of the block being read that the matrix-vector loop prefetches: 8 KB measured
// best on SmolLM2 (Q4_0 decode 92-104 tok/s without, 143-150 at 2 KB, 149-155 at 8 KB; a prefetch
// past the end of the matrix is harmless: it never faults).
constexpr std::size_t prefetch_distance = 8192;

// Rows x rows at once; two accumulators per row (even and odd blocks) to halve the chains.
template <WeightFormat Format, std::size_t Rows>
RIFTCO_AVX512 void gemv_forward_rows(const BlockView& view, const float* x, std::size_t o_begin,
                                     std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    for (std::size_t o = o_begin; o < o_end; ++o) {
        const std::uint8_t* row = view.blocks + o * view.row_bytes;
        __m512 even[Rows];
        __m512 odd[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            even[r] = _mm512_setzero_ps();
            odd[r] = _mm512_setzero_ps();
        }
        std::size_t c = 0;
        for (; c + 2 * gguf_block_elements <= in; c += 2 * gguf_block_elements) {
            __m512 w0;
            __m512 w1;
            __m512 w2;
            __m512 w3;
            const std::uint8_t* blocks = row + (c / gguf_block_elements) * view.block_bytes;
            // The rows are contiguous: fetch the stream a few rows ahead, so that each new
            // matrix (a few hundred KB) does not wait for the hardware prefetcher to ramp up.
            _mm_prefetch(reinterpret_cast<const char*>(blocks + prefetch_distance), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(blocks + prefetch_distance + 64),
                         _MM_HINT_T0);
            decode32<Format>(blocks, w0, w1);
            decode32<Format>(blocks + view.block_bytes, w2, w3);
            for (std::size_t r = 0; r < Rows; ++r) {
                const float* xr = x + r * in + c;
                even[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), even[r]);
                odd[r] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xr + 32), odd[r]);
                even[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), even[r]);
                odd[r] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xr + 48), odd[r]);
            }
        }
        if (c < in) {  // one block left
            __m512 w0;
            __m512 w1;
            decode32<Format>(row + (c / gguf_block_elements) * view.block_bytes, w0, w1);
            for (std::size_t r = 0; r < Rows; ++r) {
                const float* xr = x + r * in + c;
                even[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), even[r]);
                odd[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), odd[r]);
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            y[r * out_features + o] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r]));
        }
    }
}

// dx[r, c..c+32) = Σ_o g[r, o]·w[o, c..c+32) for each 32-column block in [c_begin, c_end).
template <WeightFormat Format, std::size_t Rows>
RIFTCO_AVX512 void gemv_backward_rows(const BlockView& view, const float* g, std::size_t c_begin,
                                      std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    for (std::size_t c = c_begin; c < c_end; c += gguf_block_elements) {
        __m512 first[Rows];
        __m512 second[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            first[r] = _mm512_setzero_ps();
            second[r] = _mm512_setzero_ps();
        }
        const std::uint8_t* block = view.blocks + (c / gguf_block_elements) * view.block_bytes;
        for (std::size_t o = 0; o < out_features; ++o, block += view.row_bytes) {
            __m512 w0;
            __m512 w1;
            decode32<Format>(block, w0, w1);
            for (std::size_t r = 0; r < Rows; ++r) {
                const __m512 upstream = _mm512_set1_ps(g[r * out_features + o]);
                first[r] = _mm512_fmadd_ps(upstream, w0, first[r]);
                second[r] = _mm512_fmadd_ps(upstream, w1, second[r]);
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            _mm512_storeu_ps(dx + r * in + c, first[r]);
            _mm512_storeu_ps(dx + r * in + c + 16, second[r]);
        }
    }
}

// The inner loops, for the shared switches (block_kernel_dispatch.hpp).
struct Loops {
    template <WeightFormat Format>
    static void decode_range(const BlockView& view, std::size_t begin, std::size_t count,
                             float* out) {
        decode_range_of<Format>(view, begin, count, out);
    }
    template <WeightFormat Format, std::size_t Rows>
    static void gemv_forward(const BlockView& view, const float* x, std::size_t o_begin,
                             std::size_t o_end, float* y) {
        gemv_forward_rows<Format, Rows>(view, x, o_begin, o_end, y);
    }
    template <WeightFormat Format, std::size_t Rows>
    static void gemv_backward(const BlockView& view, const float* g, std::size_t c_begin,
                              std::size_t c_end, float* dx) {
        gemv_backward_rows<Format, Rows>(view, g, c_begin, c_end, dx);
    }
};

const BlockKernelSet avx512_set = block_dispatch::block_kernel_set<Loops>("avx512");

}  // namespace

const BlockKernelSet* avx512_block_kernels() noexcept {
    static const bool supported = __builtin_cpu_supports("avx512f") != 0 && cpu_has_f16c();
    return supported ? &avx512_set : nullptr;
}

#else

const BlockKernelSet* avx512_block_kernels() noexcept {
    return nullptr;
}

#endif

}  // namespace riftco_transformer::detail
