// The AVX-512 (avx512f + f16c) inner loops of the GGUF block kernels (block_kernels.hpp).
// Compiled with a target attribute, so the library needs no -march flag;
// avx512_block_kernels() returns them only when the processor reports both features.
//
// A 32-element chunk becomes two vectors (elements 0..15 and 16..31): q8_0's int8 codes
// widen to int32; q4_0/q4_1/q5_0's 16 bytes widen once, the low nibbles giving the first
// vector and the high nibbles the second (q5_0's fifth bits added under a mask); the K
// formats widen their chunk's codes and take its sub-block scales. Each lane is rounded
// exactly as the host dequantizer (block_decode.hpp) rounds it.

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

RIFTCO_AVX512 inline __m512i bytes16(const std::uint8_t* bytes) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
}

RIFTCO_AVX512 inline __m512i shift_right(__m512i v, unsigned shift) {
    return _mm512_srl_epi32(v, _mm_cvtsi32_si128(static_cast<int>(shift)));
}

// Chunk `sub` (elements 32·sub .. 32·sub + 31; 0 for the 32-element formats) of `block` as two
// vectors, elements 0..15 and 16..31, rounded as block_decode.hpp rounds them.
template <WeightFormat Format>
RIFTCO_AVX512 inline void decode32(const std::uint8_t* block, std::size_t sub, __m512& first,
                                   __m512& second) {
    const __m512i nibble = _mm512_set1_epi32(15);
    if constexpr (Format == WeightFormat::q8_0) {
        const __m512 d = half_vector(block);
        const __m512i low =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
        const __m512i high =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18)));
        first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(low));
        second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(high));
    } else if constexpr (Format == WeightFormat::q4_0 || Format == WeightFormat::q4_1 ||
                         Format == WeightFormat::q5_0) {
        const __m512 d = half_vector(block);
        constexpr std::size_t codes =
            Format == WeightFormat::q4_0 ? 2 : (Format == WeightFormat::q4_1 ? 4 : 6);
        const __m512i bytes = bytes16(block + codes);
        __m512i low = _mm512_and_si512(bytes, nibble);
        __m512i high = _mm512_srli_epi32(bytes, 4);
        if constexpr (Format == WeightFormat::q4_0) {
            low = _mm512_sub_epi32(low, _mm512_set1_epi32(8));
            high = _mm512_sub_epi32(high, _mm512_set1_epi32(8));
        } else if constexpr (Format == WeightFormat::q5_0) {
            std::uint32_t qh;
            std::memcpy(&qh, block + 2, sizeof(qh));
            const __m512i sixteen = _mm512_set1_epi32(16);
            // bit j of qh is bit 4 of element j: add 16 where it is set, then subtract 16
            low = _mm512_mask_add_epi32(low, static_cast<__mmask16>(qh & 0xFFFFU), low, sixteen);
            high = _mm512_mask_add_epi32(high, static_cast<__mmask16>(qh >> 16U), high, sixteen);
            low = _mm512_sub_epi32(low, sixteen);
            high = _mm512_sub_epi32(high, sixteen);
        }
        first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(low));
        second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(high));
        if constexpr (Format == WeightFormat::q4_1) {
            const __m512 m = half_vector(block + 2);
            first = _mm512_add_ps(first, m);
            second = _mm512_add_ps(second, m);
        }
    } else if constexpr (Format == WeightFormat::q4_k || Format == WeightFormat::q5_k) {
        const KScalePair pair = k_scale_pair(block + 4, sub);
        const __m512 scale = _mm512_set1_ps(block_half_at(block) * static_cast<float>(pair.scale));
        const __m512 offset =
            _mm512_set1_ps(block_half_at(block + 2) * static_cast<float>(pair.min));
        constexpr std::size_t codes = Format == WeightFormat::q5_k ? 48 : 16;
        const std::uint8_t* qs = block + codes + 32 * (sub / 2);
        const unsigned shift = (sub % 2) * 4U;
        __m512i low = _mm512_and_si512(shift_right(bytes16(qs), shift), nibble);
        __m512i high = _mm512_and_si512(shift_right(bytes16(qs + 16), shift), nibble);
        if constexpr (Format == WeightFormat::q5_k) {
            const __m512i bit = _mm512_set1_epi32(static_cast<int>(1U << sub));
            const __m512i sixteen = _mm512_set1_epi32(16);
            low = _mm512_mask_add_epi32(low, _mm512_test_epi32_mask(bytes16(block + 16), bit), low,
                                        sixteen);
            high = _mm512_mask_add_epi32(high, _mm512_test_epi32_mask(bytes16(block + 32), bit),
                                         high, sixteen);
        }
        first = _mm512_sub_ps(_mm512_mul_ps(scale, _mm512_cvtepi32_ps(low)), offset);
        second = _mm512_sub_ps(_mm512_mul_ps(scale, _mm512_cvtepi32_ps(high)), offset);
    } else {  // q6_k
        const float d = block_half_at(block + 208);
        const Q6Chunk chunk = q6_chunk(block, sub);
        const __m512i two_bits = _mm512_set1_epi32(3);
        const __m512i thirty_two = _mm512_set1_epi32(32);
        __m512i q[2];
        for (std::size_t h = 0; h < 2; ++h) {
            const __m512i low =
                _mm512_and_si512(shift_right(bytes16(chunk.low + 16 * h), chunk.low_shift), nibble);
            const __m512i high = _mm512_and_si512(
                shift_right(bytes16(chunk.high + 16 * h), chunk.high_shift), two_bits);
            q[h] = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), thirty_two);
        }
        first = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(chunk.scales[0])),
                              _mm512_cvtepi32_ps(q[0]));
        second = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(chunk.scales[1])),
                               _mm512_cvtepi32_ps(q[1]));
    }
}

// The block holding column c of `row`, and the chunk of it c starts (c a multiple of 32).
template <WeightFormat Format>
inline const std::uint8_t* chunk_block(const std::uint8_t* row, std::size_t c,
                                       std::size_t& sub) noexcept {
    constexpr std::size_t elements = gguf_format_block_elements(Format);
    sub = (c % elements) / gguf_block_elements;
    return row + (c / elements) * gguf_block_bytes(Format);
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
        std::size_t sub = 0;
        const std::uint8_t* block = chunk_block<Format>(view.blocks, begin + done, sub);
        __m512 first;
        __m512 second;
        decode32<Format>(block, sub, first, second);
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
            std::size_t sub = 0;
            const std::uint8_t* blocks = chunk_block<Format>(row, c, sub);
            // The rows are contiguous: fetch the stream a few rows ahead, so that each new
            // matrix (a few hundred KB) does not wait for the hardware prefetcher to ramp up.
            _mm_prefetch(reinterpret_cast<const char*>(blocks + prefetch_distance), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(blocks + prefetch_distance + 64),
                         _MM_HINT_T0);
            decode32<Format>(blocks, sub, w0, w1);
            if constexpr (gguf_format_block_elements(Format) == gguf_block_elements) {
                decode32<Format>(blocks + view.block_bytes, 0, w2, w3);
            } else {  // c is a multiple of 64: chunk sub + 1 is in the same block
                decode32<Format>(blocks, sub + 1, w2, w3);
            }
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
            std::size_t sub = 0;
            const std::uint8_t* block = chunk_block<Format>(row, c, sub);
            decode32<Format>(block, sub, w0, w1);
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
        std::size_t sub = 0;
        const std::uint8_t* block = chunk_block<Format>(view.blocks, c, sub);
        for (std::size_t o = 0; o < out_features; ++o, block += view.row_bytes) {
            __m512 w0;
            __m512 w1;
            decode32<Format>(block, sub, w0, w1);
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
