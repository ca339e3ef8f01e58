// The few-row kernel of gemv.hpp. Rows of B are processed in groups of NB (4 when m <= 4,
// else 2), so MA·NB <= 16 vector accumulators stay in registers; each step over k loads one
// vector of every A row and of every B row of the group and issues MA·NB fused multiply-adds.
// The k tail is masked (AVX-512) or finished in scalar code. Inner loops exist for AVX-512
// and AVX2+FMA (target attributes, chosen at run time) and in portable C++.

#include "core/backend/cpu/gemv.hpp"

#include <algorithm>
#include <cstdint>

#include "core/backend/cpu/parallel_for.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RIFTCO_GEMV_X86 1
#include <immintrin.h>
#endif

namespace riftco_transformer::detail {
namespace {

// One group: c[i·ldc + r] = Σ_k a[i·lda + k]·b[r·ldb + k] for i < MA, r < NB.
template <int MA, int NB>
void portable_group(const float* a, std::size_t lda, const float* b, std::size_t ldb, std::size_t k,
                    float* c, std::size_t ldc) {
    constexpr std::size_t lanes = 8;
    float acc[MA][NB][lanes] = {};
    std::size_t kk = 0;
    for (; kk + lanes <= k; kk += lanes) {
        for (int r = 0; r < NB; ++r) {
            const float* br = b + static_cast<std::size_t>(r) * ldb + kk;
            for (int i = 0; i < MA; ++i) {
                const float* ai = a + static_cast<std::size_t>(i) * lda + kk;
                for (std::size_t l = 0; l < lanes; ++l) {
                    acc[i][r][l] += ai[l] * br[l];
                }
            }
        }
    }
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            float sum = 0.0F;
            for (std::size_t t = kk; t < k; ++t) {
                sum += a[static_cast<std::size_t>(i) * lda + t] *
                       b[static_cast<std::size_t>(r) * ldb + t];
            }
            for (std::size_t l = 0; l < lanes; ++l) {
                sum += acc[i][r][l];
            }
            c[static_cast<std::size_t>(i) * ldc + static_cast<std::size_t>(r)] = sum;
        }
    }
}

#if defined(RIFTCO_GEMV_X86)

#define RIFTCO_AVX512 __attribute__((target("avx512f")))
#define RIFTCO_AVX2 __attribute__((target("avx2,fma")))

template <int MA, int NB>
RIFTCO_AVX512 void avx512_group(const float* a, std::size_t lda, const float* b, std::size_t ldb,
                                std::size_t k, float* c, std::size_t ldc) {
    __m512 acc[MA][NB];
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            acc[i][r] = _mm512_setzero_ps();
        }
    }
    std::size_t kk = 0;
    for (; kk + 16 <= k; kk += 16) {
        __m512 bv[NB];
        for (int r = 0; r < NB; ++r) {
            bv[r] = _mm512_loadu_ps(b + static_cast<std::size_t>(r) * ldb + kk);
        }
        for (int i = 0; i < MA; ++i) {
            const __m512 av = _mm512_loadu_ps(a + static_cast<std::size_t>(i) * lda + kk);
            for (int r = 0; r < NB; ++r) {
                acc[i][r] = _mm512_fmadd_ps(av, bv[r], acc[i][r]);
            }
        }
    }
    if (kk < k) {
        const auto mask = static_cast<__mmask16>((1U << (k - kk)) - 1U);
        __m512 bv[NB];
        for (int r = 0; r < NB; ++r) {
            bv[r] = _mm512_maskz_loadu_ps(mask, b + static_cast<std::size_t>(r) * ldb + kk);
        }
        for (int i = 0; i < MA; ++i) {
            const __m512 av =
                _mm512_maskz_loadu_ps(mask, a + static_cast<std::size_t>(i) * lda + kk);
            for (int r = 0; r < NB; ++r) {
                acc[i][r] = _mm512_fmadd_ps(av, bv[r], acc[i][r]);
            }
        }
    }
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            // Lanes summed in a fixed order (GCC 12's _mm512_reduce_add_ps trips
            // -Wuninitialized under a target attribute).
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, acc[i][r]);
            float sum = 0.0F;
            for (const float lane : lanes) {
                sum += lane;
            }
            c[static_cast<std::size_t>(i) * ldc + static_cast<std::size_t>(r)] = sum;
        }
    }
}

RIFTCO_AVX2 inline float avx2_sum(__m256 v) {
    const __m128 low = _mm256_castps256_ps128(v);
    const __m128 high = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(low, high);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

template <int MA, int NB>
RIFTCO_AVX2 void avx2_group(const float* a, std::size_t lda, const float* b, std::size_t ldb,
                            std::size_t k, float* c, std::size_t ldc) {
    __m256 acc[MA][NB];
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            acc[i][r] = _mm256_setzero_ps();
        }
    }
    std::size_t kk = 0;
    for (; kk + 8 <= k; kk += 8) {
        __m256 bv[NB];
        for (int r = 0; r < NB; ++r) {
            bv[r] = _mm256_loadu_ps(b + static_cast<std::size_t>(r) * ldb + kk);
        }
        for (int i = 0; i < MA; ++i) {
            const __m256 av = _mm256_loadu_ps(a + static_cast<std::size_t>(i) * lda + kk);
            for (int r = 0; r < NB; ++r) {
                acc[i][r] = _mm256_fmadd_ps(av, bv[r], acc[i][r]);
            }
        }
    }
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            float sum = avx2_sum(acc[i][r]);
            for (std::size_t t = kk; t < k; ++t) {
                sum += a[static_cast<std::size_t>(i) * lda + t] *
                       b[static_cast<std::size_t>(r) * ldb + t];
            }
            c[static_cast<std::size_t>(i) * ldc + static_cast<std::size_t>(r)] = sum;
        }
    }
}

#endif

enum class Isa { Portable, Avx2, Avx512 };

Isa detected_isa() noexcept {
#if defined(RIFTCO_GEMV_X86)
    static const Isa isa = [] {
        if (__builtin_cpu_supports("avx512f")) {
            return Isa::Avx512;
        }
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            return Isa::Avx2;
        }
        return Isa::Portable;
    }();
    return isa;
#else
    return Isa::Portable;
#endif
}

using GroupKernel = void (*)(const float*, std::size_t, const float*, std::size_t, std::size_t,
                             float*, std::size_t);

template <int MA, int NB>
GroupKernel group_kernel(Isa isa) {
#if defined(RIFTCO_GEMV_X86)
    if (isa == Isa::Avx512) {
        return &avx512_group<MA, NB>;
    }
    if (isa == Isa::Avx2) {
        return &avx2_group<MA, NB>;
    }
#endif
    static_cast<void>(isa);
    return &portable_group<MA, NB>;
}

// The kernels for m rows of A: a full group of NB B rows, and the 1-row remainder.
struct Kernels {
    GroupKernel full;
    GroupKernel single;
    std::size_t group;
};

template <int MA>
Kernels kernels_for(Isa isa) {
    constexpr int NB = MA <= 4 ? 4 : 2;
    return {group_kernel<MA, NB>(isa), group_kernel<MA, 1>(isa), static_cast<std::size_t>(NB)};
}

Kernels kernels_for_rows(std::size_t m, Isa isa) {
    switch (m) {
        case 1:
            return kernels_for<1>(isa);
        case 2:
            return kernels_for<2>(isa);
        case 3:
            return kernels_for<3>(isa);
        case 4:
            return kernels_for<4>(isa);
        case 5:
            return kernels_for<5>(isa);
        case 6:
            return kernels_for<6>(isa);
        case 7:
            return kernels_for<7>(isa);
        default:
            return kernels_for<8>(isa);
    }
}

}  // namespace

bool gemv_applies(const GemmArguments& g) noexcept {
    return !g.transpose_a && g.transpose_b && g.m >= 1 && g.m <= gemv_max_rows && g.k > 0 &&
           g.n * g.k >= (std::size_t{1} << 16U);
}

bool gemv_kernel_supported(GemvKernel kernel) noexcept {
    const Isa isa = detected_isa();
    switch (kernel) {
        case GemvKernel::Detected:
        case GemvKernel::Portable:
            return true;
        case GemvKernel::Avx2:
            return isa == Isa::Avx2 || isa == Isa::Avx512;
        case GemvKernel::Avx512:
            return isa == Isa::Avx512;
    }
    return false;
}

void gemv_rows(const GemmArguments& g, GemvKernel kernel) {
    Isa isa = detected_isa();
    if (kernel == GemvKernel::Portable) {
        isa = Isa::Portable;
    } else if (kernel == GemvKernel::Avx2) {
        isa = Isa::Avx2;
    } else if (kernel == GemvKernel::Avx512) {
        isa = Isa::Avx512;
    }
    const Kernels kernels = kernels_for_rows(g.m, isa);
    const std::size_t groups = g.n / kernels.group;
    // Output rows are computed by column group into a small per-group buffer (c is [m, n]
    // with ldc; a group's outputs are c[i, n0..n0+NB)), so each group writes its own columns.
    const std::size_t units = groups + (g.n % kernels.group);  // full groups, then single rows
    parallel_for(
        units, items_per_thread_for(g.k * kernels.group), [&](std::size_t begin, std::size_t end) {
            for (std::size_t unit = begin; unit < end; ++unit) {
                if (unit < groups) {
                    const std::size_t n0 = unit * kernels.group;
                    kernels.full(g.a, g.lda, g.b + n0 * g.ldb, g.ldb, g.k, g.c + n0, g.ldc);
                } else {
                    const std::size_t n0 = groups * kernels.group + (unit - groups);
                    kernels.single(g.a, g.lda, g.b + n0 * g.ldb, g.ldb, g.k, g.c + n0, g.ldc);
                }
            }
        });
}

const char* gemv_kernel_name() noexcept {
    switch (detected_isa()) {
        case Isa::Avx512:
            return "avx512";
        case Isa::Avx2:
            return "avx2";
        case Isa::Portable:
            break;
    }
    return "portable";
}

}  // namespace riftco_transformer::detail
