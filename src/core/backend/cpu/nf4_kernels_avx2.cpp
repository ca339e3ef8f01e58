// The AVX2 + FMA inner loops of the NF4 kernels (nf4_kernels.hpp), for processors without
// AVX-512. Compiled with a target attribute, so the library needs no -march flag;
// avx2_nf4_kernels() returns them only when the processor reports avx2 and fma. (A
// -march=native build compiles this file with -mno-avx512f, so on an AVX-512 build machine it
// still holds only what an AVX2 processor can run.)
//
// Two codebook lookups:
// - lookup8 / lookup16 (panel decoder, and the GEMVs when I % 64 != 0): 8 codes, one per
//   32-bit lane in its low 4 bits (the bits above are ignored); each 8-entry half of the
//   16-entry table is read with one permutevar8x32 (it reads the low 3 bits), and bit 3,
//   shifted into the sign bit, picks the half with one blendv. The table may be ŝ·codebook.
// - lookup64 (the decode GEMV and the decode-shape input backward when I % 64 == 0): 64 codes
//   through byte planes of the codebook with shuffle_epi8 and unpacks, in-lane shuffles that
//   cost about a third fewer instructions per element and issue on two ports on many cores;
//   its output order is not element order, so x (forward) or the dx accumulator (backward)
//   is kept in that order instead.

#include "core/backend/cpu/nf4_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RIFTCO_NF4_HAVE_AVX2 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <vector>

namespace riftco_transformer::detail {

#if defined(RIFTCO_NF4_HAVE_AVX2)
namespace {

#define RIFTCO_AVX2 __attribute__((target("avx2,fma")))

// The codebook (or ŝ·codebook) as its entries 0..7 (low) and 8..15 (high).
struct Table {
    __m256 low;
    __m256 high;
};

RIFTCO_AVX2 inline Table scaled_codebook(float scale) {
    const __m256 factor = _mm256_set1_ps(scale);
    return {_mm256_mul_ps(factor, _mm256_loadu_ps(nf4_codebook.data())),
            _mm256_mul_ps(factor, _mm256_loadu_ps(nf4_codebook.data() + 8))};
}

RIFTCO_AVX2 inline Table plain_codebook() {
    return {_mm256_loadu_ps(nf4_codebook.data()), _mm256_loadu_ps(nf4_codebook.data() + 8)};
}

// table[lane & 15] per lane.
RIFTCO_AVX2 inline __m256 lookup8(__m256i codes, const Table& table) {
    const __m256 from_low = _mm256_permutevar8x32_ps(table.low, codes);
    const __m256 from_high = _mm256_permutevar8x32_ps(table.high, codes);
    return _mm256_blendv_ps(from_low, from_high, _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28)));
}

// The table entries of elements [2k, 2k + 16) in element order; `bytes` points at code byte k.
// first: elements 0..7, second: 8..15. The nibbles are interleaved as bytes (low nibble of
// byte k, then its high nibble); each byte keeps junk above its 4 code bits, which lookup8
// ignores.
RIFTCO_AVX2 inline void lookup16(const std::uint8_t* bytes, const Table& table, __m256& first,
                                 __m256& second) {
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
    const __m128i nibbles = _mm_unpacklo_epi8(packed, _mm_srli_epi16(packed, 4));
    first = lookup8(_mm256_cvtepu8_epi32(nibbles), table);
    second = lookup8(_mm256_cvtepu8_epi32(_mm_srli_si128(nibbles, 8)), table);
}

RIFTCO_AVX2 inline float horizontal_sum(__m256 values) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(values), _mm256_extractf128_ps(values, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
}

RIFTCO_AVX2 void decode_range(const Nf4View& view, std::size_t begin, std::size_t count,
                              float* out) {
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
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
        const Table table = scaled_codebook(scale);  // the same float products as the scalar
        for (; i + 16 <= block_end; i += 16) {
            __m256 first;
            __m256 second;
            lookup16(view.codes + i / 2, table, first, second);
            _mm256_storeu_ps(out + (i - begin), first);
            _mm256_storeu_ps(out + (i - begin) + 8, second);
        }
        for (; i < block_end; ++i) {
            out[i - begin] = scale * nf4_codebook[view.code(i)];
        }
    }
}

// Rows rows of x against W rows [o_begin, o_end), any I: per block, Σ codebook·x in a
// vector, then one multiply-add by the block scale.
template <std::size_t Rows>
RIFTCO_AVX2 void gemv_forward_rows(const Nf4View& view, const float* x, std::size_t o_begin,
                                   std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
    const Table codebook = plain_codebook();
    for (std::size_t o = o_begin; o < o_end; ++o) {
        const std::size_t row_begin = o * in;
        const std::size_t row_end = row_begin + in;
        __m256 total[Rows];
        float scalar_total[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            total[r] = _mm256_setzero_ps();
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
            __m256 block_sum[Rows];
            for (std::size_t r = 0; r < Rows; ++r) {
                block_sum[r] = _mm256_setzero_ps();
            }
            for (; i + 16 <= block_end; i += 16) {
                __m256 first;
                __m256 second;
                lookup16(view.codes + i / 2, codebook, first, second);
                const std::size_t column = i - row_begin;
                for (std::size_t r = 0; r < Rows; ++r) {
                    const float* x_row = x + r * in + column;
                    block_sum[r] = _mm256_fmadd_ps(first, _mm256_loadu_ps(x_row), block_sum[r]);
                    block_sum[r] =
                        _mm256_fmadd_ps(second, _mm256_loadu_ps(x_row + 8), block_sum[r]);
                }
            }
            const __m256 scale_vector = _mm256_set1_ps(scale);
            for (std::size_t r = 0; r < Rows; ++r) {
                total[r] = _mm256_fmadd_ps(block_sum[r], scale_vector, total[r]);
            }
            for (; i < block_end; ++i) {
                const float w = scale * nf4_codebook[view.code(i)];
                for (std::size_t r = 0; r < Rows; ++r) {
                    scalar_total[r] += w * x[r * in + (i - row_begin)];
                }
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            y[r * out_features + o] = horizontal_sum(total[r]) + scalar_total[r];
        }
    }
}

// ŝ_b for blocks [first, first + count) into out (double-quantized scales, 8 at a time; the
// same float operations as decode_nf4_scale, so the values are identical).
RIFTCO_AVX2 void decode_scales(const Nf4View& view, std::size_t first, std::size_t count,
                               float* out) {
    const __m256 offset = _mm256_set1_ps(view.scale_offset);
    const __m256 divisor = _mm256_set1_ps(127.0F);
    const __m256 zero = _mm256_setzero_ps();
    const __m256 largest = _mm256_set1_ps(FLT_MAX);
    const __m256i bias = _mm256_set1_epi32(128);
    std::size_t j = 0;
    for (; j + 8 <= count; j += 8) {
        const std::size_t block = first + j;
        if ((block >> view.group_shift) != ((block + 7) >> view.group_shift)) {
            for (std::size_t k = 0; k < 8; ++k) {
                out[j + k] = view.block_scale(block + k);
            }
            continue;
        }
        const __m256i codes = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(view.scale_codes + block)));
        const __m256 steps = _mm256_cvtepi32_ps(_mm256_sub_epi32(codes, bias));
        const __m256 range = _mm256_set1_ps(view.scale_ranges[block >> view.group_shift]);
        const __m256 scale =
            _mm256_add_ps(offset, _mm256_div_ps(_mm256_mul_ps(range, steps), divisor));
        // max(scale, 0) returns 0 for NaN and -inf; min saturates +inf at FLT_MAX.
        _mm256_storeu_ps(out + j, _mm256_min_ps(_mm256_max_ps(scale, zero), largest));
    }
    for (; j < count; ++j) {
        out[j] = view.block_scale(first + j);
    }
}

// The codebook split into its four bytes: plane[k] holds byte k (little-endian) of entry v at
// byte v of both 128-bit lanes, so one shuffle_epi8 looks up 32 codes' byte k at once.
struct CodebookBytes {
    __m256i plane[4];
};

RIFTCO_AVX2 inline CodebookBytes codebook_bytes() {
    alignas(32) std::uint8_t bytes[4][32];
    for (std::size_t v = 0; v < 16; ++v) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &nf4_codebook[v], sizeof bits);
        for (std::size_t k = 0; k < 4; ++k) {
            bytes[k][v] = bytes[k][v + 16] = static_cast<std::uint8_t>(bits >> (8 * k));
        }
    }
    CodebookBytes table;
    for (std::size_t k = 0; k < 4; ++k) {
        table.plane[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes[k]));
    }
    return table;
}

// The codebook values of the 64 elements whose codes are the 32 bytes of `packed`, as eight
// vectors in "byte-plane" order: the four bytes of each value are looked up by four
// shuffle_epi8 and put together by unpack_epi8 / unpack_epi16 (in-lane shuffles, which many
// AVX2 cores issue on two ports, unlike permutevar8x32). Lane j of values[4h + m] holds element
// 2·(16·(j / 4) + 4m + j % 4) + h (h = 0: low nibbles, 1: high nibbles); values are exact.
RIFTCO_AVX2 inline void lookup64(__m256i packed, const CodebookBytes& table, __m256 values[8]) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i index[2] = {_mm256_and_si256(packed, nibble),
                              _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble)};
    for (std::size_t h = 0; h < 2; ++h) {
        const __m256i byte0 = _mm256_shuffle_epi8(table.plane[0], index[h]);
        const __m256i byte1 = _mm256_shuffle_epi8(table.plane[1], index[h]);
        const __m256i byte2 = _mm256_shuffle_epi8(table.plane[2], index[h]);
        const __m256i byte3 = _mm256_shuffle_epi8(table.plane[3], index[h]);
        const __m256i low01 = _mm256_unpacklo_epi8(byte0, byte1);
        const __m256i high01 = _mm256_unpackhi_epi8(byte0, byte1);
        const __m256i low23 = _mm256_unpacklo_epi8(byte2, byte3);
        const __m256i high23 = _mm256_unpackhi_epi8(byte2, byte3);
        values[4 * h + 0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(low01, low23));
        values[4 * h + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(low01, low23));
        values[4 * h + 2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(high01, high23));
        values[4 * h + 3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(high01, high23));
    }
}

// Lane j of lookup64's values[q] -> its element in the 64-element chunk.
inline std::size_t plane_element(std::size_t q, std::size_t j) {
    return 2 * (16 * (j / 4) + 4 * (q % 4) + j % 4) + q / 4;
}

// The forward GEMV when I % 64 == 0 (every row starts a 64-element chunk), with lookup64: x is
// reordered once per call to match, x_planes[c + 8q + j] = x[c + plane_element(q, j)] (Rows·I
// floats, kept in cache across the W rows). Lanes 0..3 hold
// elements of the chunk's first half, 4..7 of its second (B >= 32, so a chunk lies in one
// block or in two halves of two).
template <std::size_t Rows>
RIFTCO_AVX2 void gemv_forward_planes(const Nf4View& view, const float* x, std::size_t o_begin,
                                     std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const unsigned block_shift = view.block_shift;
    std::vector<float> x_planes(Rows * in);
    for (std::size_t r = 0; r < Rows; ++r) {
        for (std::size_t c = 0; c < in; c += 64) {
            for (std::size_t q = 0; q < 8; ++q) {
                for (std::size_t j = 0; j < 8; ++j) {
                    x_planes[r * in + c + 8 * q + j] = x[r * in + c + plane_element(q, j)];
                }
            }
        }
    }
    const bool two_blocks_per_chunk = view.layout.block_size == 32;
    const CodebookBytes codebook = codebook_bytes();
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
        __m256 total[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            total[r] = _mm256_setzero_ps();
        }
        for (std::size_t c = 0; c < in; c += 64) {
            __m256 values[8];
            lookup64(_mm256_loadu_si256(
                         reinterpret_cast<const __m256i*>(view.codes + (row_begin + c) / 2)),
                     codebook, values);
            for (std::size_t r = 0; r < Rows; ++r) {
                const float* x_chunk = x_planes.data() + r * in + c;
                // Two chains per chunk, so the multiply-add latency is not the limit.
                __m256 even = _mm256_mul_ps(values[0], _mm256_loadu_ps(x_chunk));
                __m256 odd = _mm256_mul_ps(values[1], _mm256_loadu_ps(x_chunk + 8));
                for (std::size_t q = 2; q < 8; q += 2) {
                    even = _mm256_fmadd_ps(values[q], _mm256_loadu_ps(x_chunk + 8 * q), even);
                    odd = _mm256_fmadd_ps(values[q + 1], _mm256_loadu_ps(x_chunk + 8 * q + 8), odd);
                }
                const std::size_t chunk_block = ((row_begin + c) >> block_shift) - first_block;
                const __m256 lane_scales =
                    two_blocks_per_chunk
                        ? _mm256_blend_ps(_mm256_set1_ps(scales[chunk_block]),
                                          _mm256_set1_ps(scales[chunk_block + 1]), 0xF0)
                        : _mm256_set1_ps(scales[chunk_block]);
                total[r] = _mm256_fmadd_ps(_mm256_add_ps(even, odd), lane_scales, total[r]);
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            y[r * out_features + o] = horizontal_sum(total[r]);
        }
    }
}

template <std::size_t Rows>
RIFTCO_AVX2 void gemv_forward_dispatch(const Nf4View& view, const float* x, std::size_t o_begin,
                                       std::size_t o_end, float* y) {
    if (view.layout.in_features % 64 == 0) {
        gemv_forward_planes<Rows>(view, x, o_begin, o_end, y);
    } else {
        gemv_forward_rows<Rows>(view, x, o_begin, o_end, y);
    }
}

RIFTCO_AVX2 void gemv_forward(const Nf4View& view, const float* x, std::size_t rows,
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

// dx[r, c_begin..c_end) = Σ_o g[r, o]·deq(W)[o, c] (dx zeroed first, then one pass over W rows).
template <std::size_t Rows>
RIFTCO_AVX2 void gemv_backward_rows(const Nf4View& view, const float* g, std::size_t c_begin,
                                    std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const std::size_t block_size = view.layout.block_size;
    const unsigned block_shift = view.block_shift;
    for (std::size_t r = 0; r < Rows; ++r) {
        std::fill(dx + r * in + c_begin, dx + r * in + c_end, 0.0F);
    }
    for (std::size_t o = 0; o < out_features; ++o) {
        const std::size_t row_begin = o * in;
        const std::size_t segment_end = row_begin + c_end;
        float upstream[Rows];
        __m256 upstream_vector[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            upstream[r] = g[r * out_features + o];
            upstream_vector[r] = _mm256_set1_ps(upstream[r]);
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
            const Table table = scaled_codebook(scale);
            for (; i + 16 <= block_end; i += 16) {
                __m256 first;
                __m256 second;
                lookup16(view.codes + i / 2, table, first, second);
                const std::size_t column = i - row_begin;
                for (std::size_t r = 0; r < Rows; ++r) {
                    float* dx_row = dx + r * in + column;
                    _mm256_storeu_ps(dx_row, _mm256_fmadd_ps(upstream_vector[r], first,
                                                             _mm256_loadu_ps(dx_row)));
                    _mm256_storeu_ps(dx_row + 8, _mm256_fmadd_ps(upstream_vector[r], second,
                                                                 _mm256_loadu_ps(dx_row + 8)));
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

// The input backward GEMV when I % 64 == 0 and c_begin % 32 == 0 (the driver's chunks): the
// whole 64-column chunks of [c_begin, c_end) go through lookup64, accumulated in its order in a
// buffer of Rows·width floats and put in column order at the end; a last 32-column piece goes
// through gemv_backward_rows. A chunk starts on a multiple of 32, so its halves (lanes 0..3 and
// 4..7) each lie in one block (B >= 32).
template <std::size_t Rows>
RIFTCO_AVX2 void gemv_backward_planes(const Nf4View& view, const float* g, std::size_t c_begin,
                                      std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    const unsigned block_shift = view.block_shift;
    const std::size_t width = (c_end - c_begin) / 64 * 64;
    if (c_begin + width < c_end) {
        gemv_backward_rows<Rows>(view, g, c_begin + width, c_end, dx);
    }
    if (width == 0) {
        return;
    }
    std::vector<float> accumulated(Rows * width, 0.0F);
    std::vector<float> decoded_scales(view.layout.double_quantized ? width / 32 + 2 : 0);
    const CodebookBytes codebook = codebook_bytes();
    for (std::size_t o = 0; o < out_features; ++o) {
        const std::size_t segment_begin = o * in + c_begin;
        const std::size_t first_block = segment_begin >> block_shift;
        const float* scales = view.scales + (view.layout.double_quantized ? 0 : first_block);
        if (view.layout.double_quantized) {
            const std::size_t last_block = (segment_begin + width - 1) >> block_shift;
            decode_scales(view, first_block, last_block - first_block + 1, decoded_scales.data());
            scales = decoded_scales.data();
        }
        __m256 upstream[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            upstream[r] = _mm256_set1_ps(g[r * out_features + o]);
        }
        for (std::size_t c = 0; c < width; c += 64) {
            const std::size_t start = segment_begin + c;
            const __m256 lane_scales = _mm256_blend_ps(
                _mm256_set1_ps(scales[(start >> block_shift) - first_block]),
                _mm256_set1_ps(scales[((start + 32) >> block_shift) - first_block]), 0xF0);
            __m256 values[8];
            lookup64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(view.codes + start / 2)),
                     codebook, values);
            for (std::size_t r = 0; r < Rows; ++r) {
                const __m256 factor = _mm256_mul_ps(upstream[r], lane_scales);  // g·ŝ per lane
                float* chunk = accumulated.data() + r * width + c;
                for (std::size_t q = 0; q < 8; ++q) {
                    _mm256_storeu_ps(
                        chunk + 8 * q,
                        _mm256_fmadd_ps(factor, values[q], _mm256_loadu_ps(chunk + 8 * q)));
                }
            }
        }
    }
    for (std::size_t r = 0; r < Rows; ++r) {
        for (std::size_t c = 0; c < width; c += 64) {
            for (std::size_t q = 0; q < 8; ++q) {
                for (std::size_t j = 0; j < 8; ++j) {
                    dx[r * in + c_begin + c + plane_element(q, j)] =
                        accumulated[r * width + c + 8 * q + j];
                }
            }
        }
    }
}

template <std::size_t Rows>
RIFTCO_AVX2 void gemv_backward_dispatch(const Nf4View& view, const float* g, std::size_t c_begin,
                                        std::size_t c_end, float* dx) {
    if (view.layout.in_features % 64 == 0 && c_begin % 32 == 0) {
        gemv_backward_planes<Rows>(view, g, c_begin, c_end, dx);
    } else {
        gemv_backward_rows<Rows>(view, g, c_begin, c_end, dx);
    }
}

RIFTCO_AVX2 void gemv_backward(const Nf4View& view, const float* g, std::size_t rows,
                               std::size_t c_begin, std::size_t c_end, float* dx) {
    switch (rows) {
        case 1:
            gemv_backward_dispatch<1>(view, g, c_begin, c_end, dx);
            break;
        case 2:
            gemv_backward_dispatch<2>(view, g, c_begin, c_end, dx);
            break;
        case 3:
            gemv_backward_dispatch<3>(view, g, c_begin, c_end, dx);
            break;
        default:
            gemv_backward_dispatch<4>(view, g, c_begin, c_end, dx);
            break;
    }
}

const Nf4KernelSet avx2_set{"avx2", decode_range, gemv_forward, gemv_backward};

}  // namespace

const Nf4KernelSet* avx2_nf4_kernels() noexcept {
    static const bool supported =
        __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
    return supported ? &avx2_set : nullptr;
}

#else

const Nf4KernelSet* avx2_nf4_kernels() noexcept {
    return nullptr;
}

#endif

}  // namespace riftco_transformer::detail
