// The AVX-512 (avx512f) inner loops of the NF4 kernels (nf4_kernels.hpp). Compiled with a
// target attribute, so the library needs no -march flag; avx512_nf4_kernels() returns them
// only when the processor reports avx512f.
//
// 32 elements = 16 code bytes: the bytes widen to 16 int32 lanes; the low nibble (element
// 2k) and the high nibble (2k+1) each index the 16-entry table with one permutexvar (it
// reads only the low 4 bits of an index), and two permutex2var interleave the two halves
// back into element order.

#include "core/backend/cpu/nf4_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RIFTCO_NF4_HAVE_AVX512 1
// GCC 12 flags the deliberately undefined source vectors inside its own AVX-512 intrinsic
// wrappers (_mm512_undefined_*) as maybe-uninitialized when they are inlined here.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <vector>

namespace riftco_transformer::detail {

#if defined(RIFTCO_NF4_HAVE_AVX512)
namespace {

#define RIFTCO_AVX512 __attribute__((target("avx512f")))

// The 32 table entries of elements [2k..2k+32) in element order; `bytes` points at code
// byte k. first: elements 0..15, second: 16..31.
RIFTCO_AVX512 inline void lookup32(const std::uint8_t* bytes, __m512 table, __m512& first,
                                   __m512& second) {
    const __m512i low =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
    const __m512i high = _mm512_srli_epi32(low, 4);
    const __m512 even = _mm512_permutexvar_ps(low, table);
    const __m512 odd = _mm512_permutexvar_ps(high, table);
    const __m512i interleave_first =
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i interleave_second =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    first = _mm512_permutex2var_ps(even, interleave_first, odd);
    second = _mm512_permutex2var_ps(even, interleave_second, odd);
}

RIFTCO_AVX512 inline __m512 codebook_vector() {
    return _mm512_loadu_ps(nf4_codebook.data());
}

RIFTCO_AVX512 void decode_range(const Nf4View& view, std::size_t begin, std::size_t count,
                                float* out) {
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
    const __m512 codebook = codebook_vector();
    const std::size_t end = begin + count;
    std::size_t i = begin;
    while (i < end) {
        const std::size_t block = i >> block_shift;
        const std::size_t block_end = std::min(end, (block + 1) * block_size);
        const float scale = view.block_scale(block);
        if (i % 2 == 1) {
            out[i - begin] = scale * nf4_codebook[view.code(i)];
            ++i;
        }
        const __m512 table = _mm512_mul_ps(_mm512_set1_ps(scale), codebook);  // ŝ·codebook
        for (; i + 32 <= block_end; i += 32) {
            __m512 first;
            __m512 second;
            lookup32(view.codes + i / 2, table, first, second);
            _mm512_storeu_ps(out + (i - begin), first);
            _mm512_storeu_ps(out + (i - begin) + 16, second);
        }
        for (; i < block_end; ++i) {
            out[i - begin] = scale * nf4_codebook[view.code(i)];
        }
    }
}

// Rows rows of x against W rows [o_begin, o_end): per block, Σ codebook·x in a vector,
// then one multiply-add by the block scale.
template <std::size_t Rows>
RIFTCO_AVX512 void gemv_forward_rows(const Nf4View& view, const float* x, std::size_t o_begin,
                                     std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
    const __m512 codebook = codebook_vector();
    for (std::size_t o = o_begin; o < o_end; ++o) {
        const std::size_t row_begin = o * in;
        const std::size_t row_end = row_begin + in;
        __m512 total[Rows];
        float scalar_total[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            total[r] = _mm512_setzero_ps();
            scalar_total[r] = 0.0F;
        }
        std::size_t i = row_begin;
        while (i < row_end) {
            const std::size_t block = i >> block_shift;
            const std::size_t block_end = std::min(row_end, (block + 1) * block_size);
            const float scale = view.block_scale(block);
            if (i % 2 == 1) {
                const float w = scale * nf4_codebook[view.code(i)];
                for (std::size_t r = 0; r < Rows; ++r) {
                    scalar_total[r] += w * x[r * in + (i - row_begin)];
                }
                ++i;
            }
            __m512 block_sum[Rows];
            for (std::size_t r = 0; r < Rows; ++r) {
                block_sum[r] = _mm512_setzero_ps();
            }
            for (; i + 32 <= block_end; i += 32) {
                __m512 first;
                __m512 second;
                lookup32(view.codes + i / 2, codebook, first, second);
                const std::size_t column = i - row_begin;
                for (std::size_t r = 0; r < Rows; ++r) {
                    const float* x_row = x + r * in + column;
                    block_sum[r] = _mm512_fmadd_ps(first, _mm512_loadu_ps(x_row), block_sum[r]);
                    block_sum[r] =
                        _mm512_fmadd_ps(second, _mm512_loadu_ps(x_row + 16), block_sum[r]);
                }
            }
            const __m512 scale_vector = _mm512_set1_ps(scale);
            for (std::size_t r = 0; r < Rows; ++r) {
                total[r] = _mm512_fmadd_ps(block_sum[r], scale_vector, total[r]);
            }
            for (; i < block_end; ++i) {
                const float w = scale * nf4_codebook[view.code(i)];
                for (std::size_t r = 0; r < Rows; ++r) {
                    scalar_total[r] += w * x[r * in + (i - row_begin)];
                }
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            y[r * out_features + o] = _mm512_reduce_add_ps(total[r]) + scalar_total[r];
        }
    }
}

// ŝ_b for blocks [first, first + count) into out (double-quantized scales, 16 at a time;
// the same float operations as decode_nf4_scale, so the values are identical).
RIFTCO_AVX512 void decode_scales(const Nf4View& view, std::size_t first, std::size_t count,
                                 float* out) {
    const __m512 offset = _mm512_set1_ps(view.scale_offset);
    const __m512 divisor = _mm512_set1_ps(127.0F);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 largest = _mm512_set1_ps(FLT_MAX);
    const __m512i bias = _mm512_set1_epi32(128);
    std::size_t j = 0;
    for (; j + 16 <= count; j += 16) {
        const std::size_t block = first + j;
        if ((block >> view.group_shift) != ((block + 15) >> view.group_shift)) {
            for (std::size_t k = 0; k < 16; ++k) {
                out[j + k] = view.block_scale(block + k);
            }
            continue;
        }
        const __m512i codes = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(view.scale_codes + block)));
        const __m512 steps = _mm512_cvtepi32_ps(_mm512_sub_epi32(codes, bias));
        const __m512 range = _mm512_set1_ps(view.scale_ranges[block >> view.group_shift]);
        const __m512 scale =
            _mm512_add_ps(offset, _mm512_div_ps(_mm512_mul_ps(range, steps), divisor));
        // max(scale, 0) returns 0 for NaN and -inf; min saturates +inf at FLT_MAX.
        _mm512_storeu_ps(out + j, _mm512_min_ps(_mm512_max_ps(scale, zero), largest));
    }
    for (; j < count; ++j) {
        out[j] = view.block_scale(first + j);
    }
}

// The forward GEMV when I % 128 == 0 (so every row starts a 128-element chunk and no block
// straddles a chunk unevenly). One 64-byte load holds 128 codes as 16 dwords; shifting it
// right by 4t puts, in the low nibble of dword j, the code of element 8j + t. So eight
// permutexvar give the codebook values of the chunk in "stride 8" order, and x is
// reordered once to match: x_strided[c + 16t + j] = x[c + 8j + t]. Lane j of a chunk lies in
// block (c + 8j)/B, so one vector of 16 scales per chunk applies them.
template <std::size_t Rows>
RIFTCO_AVX512 void gemv_forward_strided(const Nf4View& view, const float* x, std::size_t o_begin,
                                        std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
    std::vector<float> x_strided(Rows * in);
    for (std::size_t r = 0; r < Rows; ++r) {
        for (std::size_t c = 0; c < in; c += 128) {
            for (std::size_t t = 0; t < 8; ++t) {
                for (std::size_t j = 0; j < 16; ++j) {
                    x_strided[r * in + c + 16 * t + j] = x[r * in + c + 8 * j + t];
                }
            }
        }
    }
    // Lane j -> its block's offset from the chunk's first block.
    const std::size_t blocks_per_chunk = block_size >= 128 ? 1 : 128 / block_size;
    alignas(64) std::int32_t lane_block[16];
    for (std::size_t j = 0; j < 16; ++j) {
        lane_block[j] = static_cast<std::int32_t>(block_size >= 128 ? 0 : (8 * j) / block_size);
    }
    const __m512i lane_block_vector = _mm512_load_si512(lane_block);
    const auto scale_mask = static_cast<__mmask16>((1U << blocks_per_chunk) - 1U);
    const __m512 codebook = codebook_vector();
    std::vector<float> decoded_scales(view.layout.double_quantized ? in / 32 + 2 : 0);

    for (std::size_t o = o_begin; o < o_end; ++o) {
        const std::size_t row_begin = o * in;
        const std::size_t first_block = row_begin >> block_shift;
        const float* scales = view.scales + (view.layout.double_quantized ? 0 : first_block);
        if (view.layout.double_quantized) {
            const std::size_t last_block = (row_begin + in - 1) >> block_shift;
            decode_scales(view, first_block, last_block - first_block + 1, decoded_scales.data());
            scales = decoded_scales.data();
        }
        __m512 total[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            total[r] = _mm512_setzero_ps();
        }
        for (std::size_t c = 0; c < in; c += 128) {
            const __m512i packed = _mm512_loadu_si512(view.codes + (row_begin + c) / 2);
            // One chain of multiply-adds per chunk: chunks are independent, so out-of-order
            // execution overlaps their latencies and no extra adds are spent combining.
            __m512 chunk[Rows];
            for (std::size_t r = 0; r < Rows; ++r) {
                chunk[r] = _mm512_setzero_ps();
            }
            for (std::size_t t = 0; t < 8; ++t) {
                const __m512 values = _mm512_permutexvar_ps(
                    _mm512_srli_epi32(packed, static_cast<unsigned>(4 * t)), codebook);
                for (std::size_t r = 0; r < Rows; ++r) {
                    chunk[r] = _mm512_fmadd_ps(
                        values, _mm512_loadu_ps(x_strided.data() + r * in + c + 16 * t), chunk[r]);
                }
            }
            const std::size_t chunk_block = ((row_begin + c) >> block_shift) - first_block;
            // Lane scales: one block (B >= 128) is a broadcast, two (B = 64) a masked merge of
            // two broadcasts, four (B = 32) a permute of four loaded scales.
            __m512 lane_scales;
            if (blocks_per_chunk == 1) {
                lane_scales = _mm512_set1_ps(scales[chunk_block]);
            } else if (blocks_per_chunk == 2) {
                lane_scales = _mm512_mask_mov_ps(_mm512_set1_ps(scales[chunk_block]), 0xFF00,
                                                 _mm512_set1_ps(scales[chunk_block + 1]));
            } else {
                lane_scales = _mm512_permutexvar_ps(
                    lane_block_vector, _mm512_maskz_loadu_ps(scale_mask, scales + chunk_block));
            }
            for (std::size_t r = 0; r < Rows; ++r) {
                total[r] = _mm512_fmadd_ps(chunk[r], lane_scales, total[r]);
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            y[r * out_features + o] = _mm512_reduce_add_ps(total[r]);
        }
    }
}

template <std::size_t Rows>
RIFTCO_AVX512 void gemv_forward_dispatch(const Nf4View& view, const float* x, std::size_t o_begin,
                                         std::size_t o_end, float* y) {
    if (view.layout.in_features % 128 == 0) {
        gemv_forward_strided<Rows>(view, x, o_begin, o_end, y);
    } else {
        gemv_forward_rows<Rows>(view, x, o_begin, o_end, y);
    }
}

RIFTCO_AVX512 void gemv_forward(const Nf4View& view, const float* x, std::size_t rows,
                                std::size_t o_begin, std::size_t o_end, float* y) {
    switch (rows) {
        case 1:
            gemv_forward_dispatch<1>(view, x, o_begin, o_end, y);
            break;
        case 2:
            gemv_forward_dispatch<2>(view, x, o_begin, o_end, y);
            break;
        case 3:
            gemv_forward_dispatch<3>(view, x, o_begin, o_end, y);
            break;
        default:
            gemv_forward_dispatch<4>(view, x, o_begin, o_end, y);
            break;
    }
}

// dx[r, c_begin..c_end) += g[r, o]·deq(W)[o, c] over every W row o (dx zeroed first).
template <std::size_t Rows>
RIFTCO_AVX512 void gemv_backward_rows(const Nf4View& view, const float* g, std::size_t c_begin,
                                      std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
    const __m512 codebook = codebook_vector();
    for (std::size_t r = 0; r < Rows; ++r) {
        std::fill(dx + r * in + c_begin, dx + r * in + c_end, 0.0F);
    }
    for (std::size_t o = 0; o < out_features; ++o) {
        const std::size_t row_begin = o * in;
        const std::size_t segment_end = row_begin + c_end;
        float upstream[Rows];
        __m512 upstream_vector[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            upstream[r] = g[r * out_features + o];
            upstream_vector[r] = _mm512_set1_ps(upstream[r]);
        }
        std::size_t i = row_begin + c_begin;
        while (i < segment_end) {
            const std::size_t block = i >> block_shift;
            const std::size_t block_end = std::min(segment_end, (block + 1) * block_size);
            const float scale = view.block_scale(block);
            if (i % 2 == 1) {
                const float w = scale * nf4_codebook[view.code(i)];
                for (std::size_t r = 0; r < Rows; ++r) {
                    dx[r * in + (i - row_begin)] += upstream[r] * w;
                }
                ++i;
            }
            const __m512 table = _mm512_mul_ps(_mm512_set1_ps(scale), codebook);
            for (; i + 32 <= block_end; i += 32) {
                __m512 first;
                __m512 second;
                lookup32(view.codes + i / 2, table, first, second);
                const std::size_t column = i - row_begin;
                for (std::size_t r = 0; r < Rows; ++r) {
                    float* dx_row = dx + r * in + column;
                    _mm512_storeu_ps(dx_row, _mm512_fmadd_ps(upstream_vector[r], first,
                                                             _mm512_loadu_ps(dx_row)));
                    _mm512_storeu_ps(dx_row + 16, _mm512_fmadd_ps(upstream_vector[r], second,
                                                                  _mm512_loadu_ps(dx_row + 16)));
                }
            }
            for (; i < block_end; ++i) {
                const float w = scale * nf4_codebook[view.code(i)];
                for (std::size_t r = 0; r < Rows; ++r) {
                    dx[r * in + (i - row_begin)] += upstream[r] * w;
                }
            }
        }
    }
}

RIFTCO_AVX512 void gemv_backward(const Nf4View& view, const float* g, std::size_t rows,
                                 std::size_t c_begin, std::size_t c_end, float* dx) {
    switch (rows) {
        case 1:
            gemv_backward_rows<1>(view, g, c_begin, c_end, dx);
            break;
        case 2:
            gemv_backward_rows<2>(view, g, c_begin, c_end, dx);
            break;
        case 3:
            gemv_backward_rows<3>(view, g, c_begin, c_end, dx);
            break;
        default:
            gemv_backward_rows<4>(view, g, c_begin, c_end, dx);
            break;
    }
}

const Nf4KernelSet avx512_set{"avx512", decode_range, gemv_forward, gemv_backward};

}  // namespace

const Nf4KernelSet* avx512_nf4_kernels() noexcept {
    static const bool supported = __builtin_cpu_supports("avx512f") != 0;
    return supported ? &avx512_set : nullptr;
}

#else

const Nf4KernelSet* avx512_nf4_kernels() noexcept {
    return nullptr;
}

#endif

}  // namespace riftco_transformer::detail
