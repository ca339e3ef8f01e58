// The AVX-512 (avx512f + f16c) inner loops of the GGUF block kernels (block_kernels.hpp).
// Compiled with a target attribute, so the library needs no -march flag;
// avx512_block_kernels() returns them only when the processor reports both features.
//
// A 32-element chunk becomes two vectors (elements 0..15 and 16..31). q8_0's int8 codes widen
// to int32 and are scaled; the 4- and 5-bit formats instead build a table of the block's (or
// sub-block's) 16 or 32 possible values once and look each code up in it (vpermps, which
// reads only an index's low four bits; a second, masked lookup where a 5-bit code's fifth bit
// is set), so a weight costs a lookup instead of a convert and a multiply; q6_k's 64 values scale
// as q8_0's. Every value is rounded exactly as the host dequantizer (block_decode.hpp) rounds it.

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

// 16 bfloat16 values as float32 (their bits << 16).
RIFTCO_AVX512 inline __m512 bf16_vector(const std::uint8_t* bytes) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes))), 16));
}

// 0, 1, ..., 15 as floats: the codes a 16-entry table is built over.
RIFTCO_AVX512 inline __m512 code_values() {
    return _mm512_setr_ps(0.0F, 1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F, 7.0F, 8.0F, 9.0F, 10.0F, 11.0F,
                          12.0F, 13.0F, 14.0F, 15.0F);
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
    if constexpr (Format == WeightFormat::f16) {
        first = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
        second = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32)));
    } else if constexpr (Format == WeightFormat::bf16) {
        first = bf16_vector(block);
        second = bf16_vector(block + 32);
    } else if constexpr (Format == WeightFormat::q8_0) {
        const __m512 d = half_vector(block);
        const __m512i low =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
        const __m512i high =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18)));
        first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(low));
        second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(high));
    } else if constexpr (Format == WeightFormat::q4_0 || Format == WeightFormat::q4_1) {
        // A 16-entry table of the block's values (d·(n − 8), or d·n + m), rounded as the host
        // decoder rounds them, then looked up by code: vpermps reads only an index's low four
        // bits, so the widened bytes index the low nibbles and bytes >> 4 the high ones.
        const __m512 d = half_vector(block);
        __m512 table;
        if constexpr (Format == WeightFormat::q4_0) {
            table = _mm512_mul_ps(d, _mm512_sub_ps(code_values(), _mm512_set1_ps(8.0F)));
        } else {
            table = _mm512_add_ps(_mm512_mul_ps(d, code_values()), half_vector(block + 2));
        }
        constexpr std::size_t codes = Format == WeightFormat::q4_0 ? 2 : 4;
        const __m512i bytes = bytes16(block + codes);
        first = _mm512_permutexvar_ps(bytes, table);
        second = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    } else if constexpr (Format == WeightFormat::q5_0) {
        // 32 values d·(n − 16) in two tables of 16: each lane looks its nibble up in the
        // first, then, where qh's bit j (lane j; j + 16 for the second vector) is set, in the
        // second instead.
        const __m512 d = half_vector(block);
        const __m512 low_table =
            _mm512_mul_ps(d, _mm512_sub_ps(code_values(), _mm512_set1_ps(16.0F)));
        const __m512 high_table = _mm512_mul_ps(d, code_values());
        std::uint32_t qh;
        std::memcpy(&qh, block + 2, sizeof(qh));
        const __m512i low = bytes16(block + 6);
        const __m512i high = _mm512_srli_epi32(low, 4);
        first = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(low, low_table),
                                           static_cast<__mmask16>(qh & 0xFFFFU), low, high_table);
        second = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(high, low_table),
                                            static_cast<__mmask16>(qh >> 16U), high, high_table);
    } else if constexpr (Format == WeightFormat::q4_k || Format == WeightFormat::q5_k) {
        // The chunk's values (d·sc)·n − dmin·m as tables (16 for q4_k, 32 for q5_k), looked
        // up by code as for q4_0 and q5_0.
        const KScalePair pair = k_scale_pair(block + 4, sub);
        const __m512 scale =
            _mm512_set1_ps(block_dispatch::half_scalar(block) * static_cast<float>(pair.scale));
        const __m512 offset =
            _mm512_set1_ps(block_dispatch::half_scalar(block + 2) * static_cast<float>(pair.min));
        const __m512 low_table = _mm512_sub_ps(_mm512_mul_ps(scale, code_values()), offset);
        constexpr std::size_t codes = Format == WeightFormat::q5_k ? 48 : 16;
        const std::uint8_t* qs = block + codes + 32 * (sub / 2);
        const unsigned shift = (sub % 2) * 4U;
        const __m512i low = shift_right(bytes16(qs), shift);
        const __m512i high = shift_right(bytes16(qs + 16), shift);
        if constexpr (Format == WeightFormat::q4_k) {
            first = _mm512_permutexvar_ps(low, low_table);
            second = _mm512_permutexvar_ps(high, low_table);
        } else {
            const __m512 high_table = _mm512_sub_ps(
                _mm512_mul_ps(scale, _mm512_add_ps(code_values(), _mm512_set1_ps(16.0F))), offset);
            const __m512i bit = _mm512_set1_epi32(static_cast<int>(1U << sub));
            first = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(low, low_table),
                                               _mm512_test_epi32_mask(bytes16(block + 16), bit),
                                               low, high_table);
            second = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(high, low_table),
                                                _mm512_test_epi32_mask(bytes16(block + 32), bit),
                                                high, high_table);
        }
    } else {  // q6_k
        const float d = block_dispatch::half_scalar(block + 208);
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
        const std::uint8_t* block =
            block_dispatch::chunk_block<Format>(view.blocks, begin + done, sub);
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
            const std::uint8_t* blocks = block_dispatch::chunk_block<Format>(row, c, sub);
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
            const std::uint8_t* block = block_dispatch::chunk_block<Format>(row, c, sub);
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
        const std::uint8_t* block = block_dispatch::chunk_block<Format>(view.blocks, c, sub);
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
