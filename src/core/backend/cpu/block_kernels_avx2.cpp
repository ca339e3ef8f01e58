// The AVX2 + FMA + F16C inner loops of the GGUF block kernels (block_kernels.hpp), compiled
// with a target attribute; avx2_block_kernels() returns them only when the processor reports
// all three features. A 32-element chunk becomes four 8-lane vectors, rounded exactly as the
// host dequantizer (block_decode.hpp) rounds them.

#include "core/backend/cpu/block_kernel_dispatch.hpp"
#include "core/backend/cpu/block_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RIFTCO_BLOCK_HAVE_AVX2 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace riftco_transformer::detail {

#if defined(RIFTCO_BLOCK_HAVE_AVX2)
namespace {

#define RIFTCO_AVX2 __attribute__((target("avx2,fma,f16c")))

RIFTCO_AVX2 inline __m256 half_vector(const std::uint8_t* bytes) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes, sizeof(bits));
    return _mm256_set1_ps(_cvtsh_ss(bits));
}

RIFTCO_AVX2 inline __m256i bytes8(const std::uint8_t* bytes) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
}

RIFTCO_AVX2 inline __m256i shift_right(__m256i v, unsigned shift) {
    return _mm256_srl_epi32(v, _mm_cvtsi32_si128(static_cast<int>(shift)));
}

// w[0..3] = elements 0..7, 8..15, 16..23, 24..31 of chunk `sub` of the block (elements
// 32·sub .. 32·sub + 31; 0 for the 32-element formats).
template <WeightFormat Format>
RIFTCO_AVX2 inline void decode32(const std::uint8_t* block, std::size_t sub, __m256 w[4]) {
    const __m256i nibble = _mm256_set1_epi32(15);
    __m256i q[4];
    if constexpr (Format == WeightFormat::f16) {
        for (std::size_t k = 0; k < 4; ++k) {
            w[k] =
                _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * k)));
        }
    } else if constexpr (Format == WeightFormat::bf16) {
        for (std::size_t k = 0; k < 4; ++k) {
            w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * k))),
                16));
        }
    } else if constexpr (Format == WeightFormat::q8_0) {
        const __m256 d = half_vector(block);
        for (std::size_t k = 0; k < 4; ++k) {
            q[k] = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * k)));
            w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q[k]));
        }
    } else if constexpr (Format == WeightFormat::q4_0 || Format == WeightFormat::q4_1 ||
                         Format == WeightFormat::q5_0) {
        const __m256 d = half_vector(block);
        constexpr std::size_t codes =
            Format == WeightFormat::q4_0 ? 2 : (Format == WeightFormat::q4_1 ? 4 : 6);
        const __m256i first = bytes8(block + codes);
        const __m256i second = bytes8(block + codes + 8);
        q[0] = _mm256_and_si256(first, nibble);
        q[1] = _mm256_and_si256(second, nibble);
        q[2] = _mm256_srli_epi32(first, 4);
        q[3] = _mm256_srli_epi32(second, 4);
        if constexpr (Format == WeightFormat::q4_0) {
            for (__m256i& code : q) {
                code = _mm256_sub_epi32(code, _mm256_set1_epi32(8));
            }
        } else if constexpr (Format == WeightFormat::q5_0) {
            std::uint32_t qh;
            std::memcpy(&qh, block + 2, sizeof(qh));
            // element 8k + i has its fifth bit at bit 8k + i of qh
            const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            for (std::size_t k = 0; k < 4; ++k) {
                const __m256i bits = _mm256_and_si256(
                    _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh >> (8 * k))), lanes),
                    _mm256_set1_epi32(1));
                q[k] = _mm256_sub_epi32(_mm256_or_si256(q[k], _mm256_slli_epi32(bits, 4)),
                                        _mm256_set1_epi32(16));
            }
        }
        for (std::size_t k = 0; k < 4; ++k) {
            w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q[k]));
        }
        if constexpr (Format == WeightFormat::q4_1) {
            const __m256 m = half_vector(block + 2);
            for (std::size_t k = 0; k < 4; ++k) {
                w[k] = _mm256_add_ps(w[k], m);
            }
        }
    } else if constexpr (Format == WeightFormat::q4_k || Format == WeightFormat::q5_k) {
        const KScalePair pair = k_scale_pair(block + 4, sub);
        const __m256 scale =
            _mm256_set1_ps(block_dispatch::half_scalar(block) * static_cast<float>(pair.scale));
        const __m256 offset =
            _mm256_set1_ps(block_dispatch::half_scalar(block + 2) * static_cast<float>(pair.min));
        constexpr std::size_t codes = Format == WeightFormat::q5_k ? 48 : 16;
        const std::uint8_t* qs = block + codes + 32 * (sub / 2);
        const unsigned shift = (sub % 2) * 4U;
        for (std::size_t k = 0; k < 4; ++k) {
            q[k] = _mm256_and_si256(shift_right(bytes8(qs + 8 * k), shift), nibble);
            if constexpr (Format == WeightFormat::q5_k) {
                const __m256i bits = _mm256_and_si256(
                    shift_right(bytes8(block + 16 + 8 * k), static_cast<unsigned>(sub)),
                    _mm256_set1_epi32(1));
                q[k] = _mm256_or_si256(q[k], _mm256_slli_epi32(bits, 4));
            }
            w[k] = _mm256_sub_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(q[k])), offset);
        }
    } else {  // q6_k
        const float d = block_dispatch::half_scalar(block + 208);
        const Q6Chunk chunk = q6_chunk(block, sub);
        for (std::size_t k = 0; k < 4; ++k) {
            const __m256i low =
                _mm256_and_si256(shift_right(bytes8(chunk.low + 8 * k), chunk.low_shift), nibble);
            const __m256i high = _mm256_and_si256(
                shift_right(bytes8(chunk.high + 8 * k), chunk.high_shift), _mm256_set1_epi32(3));
            q[k] = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)),
                                    _mm256_set1_epi32(32));
            const std::size_t half = k / 2;  // elements 0..15 take the first scale
            const __m256 scale = _mm256_set1_ps(d * static_cast<float>(chunk.scales[half]));
            w[k] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(q[k]));
        }
    }
}

RIFTCO_AVX2 inline float horizontal_sum(__m256 v) {
    const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

template <WeightFormat Format>
RIFTCO_AVX2 void decode_range_of(const BlockView& view, std::size_t begin, std::size_t count,
                                 float* out) {
    std::size_t done = 0;
    if (begin % gguf_block_elements != 0) {  // a partial head block: the host decoder
        done = std::min(count, gguf_block_elements - begin % gguf_block_elements);
        dequantize_block_range(view, begin, {out, done});
    }
    for (; done + gguf_block_elements <= count; done += gguf_block_elements) {
        __m256 w[4];
        std::size_t sub = 0;
        const std::uint8_t* block =
            block_dispatch::chunk_block<Format>(view.blocks, begin + done, sub);
        decode32<Format>(block, sub, w);
        for (std::size_t k = 0; k < 4; ++k) {
            _mm256_storeu_ps(out + done + 8 * k, w[k]);
        }
    }
    if (done < count) {
        dequantize_block_range(view, begin + done, {out + done, count - done});
    }
}

// Bytes ahead of the block being read that the matrix-vector loop prefetches (harmless past
// the end of the matrix: a prefetch never faults).
constexpr std::size_t prefetch_distance = 8192;

template <WeightFormat Format, std::size_t Rows>
RIFTCO_AVX2 void gemv_forward_rows(const BlockView& view, const float* x, std::size_t o_begin,
                                   std::size_t o_end, float* y) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    for (std::size_t o = o_begin; o < o_end; ++o) {
        const std::uint8_t* row = view.blocks + o * view.row_bytes;
        __m256 low[Rows];
        __m256 high[Rows];
        for (std::size_t r = 0; r < Rows; ++r) {
            low[r] = _mm256_setzero_ps();
            high[r] = _mm256_setzero_ps();
        }
        for (std::size_t c = 0; c < in; c += gguf_block_elements) {
            __m256 w[4];
            std::size_t sub = 0;
            const std::uint8_t* block = block_dispatch::chunk_block<Format>(row, c, sub);
            // The rows are contiguous: fetch the stream ahead (as the AVX-512 loop does).
            _mm_prefetch(reinterpret_cast<const char*>(block + prefetch_distance), _MM_HINT_T0);
            decode32<Format>(block, sub, w);
            for (std::size_t r = 0; r < Rows; ++r) {
                const float* xr = x + r * in + c;
                low[r] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), low[r]);
                high[r] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), high[r]);
                low[r] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), low[r]);
                high[r] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), high[r]);
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            y[r * out_features + o] = horizontal_sum(_mm256_add_ps(low[r], high[r]));
        }
    }
}

template <WeightFormat Format, std::size_t Rows>
RIFTCO_AVX2 void gemv_backward_rows(const BlockView& view, const float* g, std::size_t c_begin,
                                    std::size_t c_end, float* dx) {
    const std::size_t in = view.layout.in_features;
    const std::size_t out_features = view.layout.out_features;
    for (std::size_t c = c_begin; c < c_end; c += gguf_block_elements) {
        __m256 total[Rows][4];
        for (std::size_t r = 0; r < Rows; ++r) {
            for (std::size_t k = 0; k < 4; ++k) {
                total[r][k] = _mm256_setzero_ps();
            }
        }
        std::size_t sub = 0;
        const std::uint8_t* block = block_dispatch::chunk_block<Format>(view.blocks, c, sub);
        for (std::size_t o = 0; o < out_features; ++o, block += view.row_bytes) {
            __m256 w[4];
            decode32<Format>(block, sub, w);
            for (std::size_t r = 0; r < Rows; ++r) {
                const __m256 upstream = _mm256_set1_ps(g[r * out_features + o]);
                for (std::size_t k = 0; k < 4; ++k) {
                    total[r][k] = _mm256_fmadd_ps(upstream, w[k], total[r][k]);
                }
            }
        }
        for (std::size_t r = 0; r < Rows; ++r) {
            for (std::size_t k = 0; k < 4; ++k) {
                _mm256_storeu_ps(dx + r * in + c + 8 * k, total[r][k]);
            }
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

const BlockKernelSet avx2_set = block_dispatch::block_kernel_set<Loops>("avx2");

}  // namespace

const BlockKernelSet* avx2_block_kernels() noexcept {
    static const bool supported =
        __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0 && cpu_has_f16c();
    return supported ? &avx2_set : nullptr;
}

#else

const BlockKernelSet* avx2_block_kernels() noexcept {
    return nullptr;
}

#endif

}  // namespace riftco_transformer::detail
