// The few-row kernel of gemv.hpp. Rows of B are processed in groups of NB (4 when m <= 4,
// else 2), so MA·NB <= 16 vector accumulators stay in registers; each step over k loads one
// vector of every A row and of every B row of the group and issues MA·NB fused multiply-adds.
// The k tail is masked (AVX-512) or finished in scalar code. Inner loops exist for AVX-512
// and AVX2+FMA (target attributes, chosen at run time) and in portable C++.
//
// Streaming B is the whole cost, so two things keep the memory system busy:
// * the vector loops prefetch B a fixed distance ahead of the loads (one cache line per B row
//   of the group per k step, so the prefetches advance exactly as fast as the loads on dense
//   rows). The hardware prefetchers stop at each 4 KiB page and weights in small pages pay a
//   page walk and a ramp-up per page; the software stream crosses pages ahead of time;
// * each thread streams one contiguous part of B, claimed a chunk at a time from a shared
//   cursor; a thread that finishes early takes the remaining chunks of the others, so a
//   thread slowed by the other core's traffic (or by the machine) does not hold the team at
//   the closing barrier.

#include "core/backend/cpu/gemv.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "riftco_transformer/core/threading.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RIFTCO_GEMV_X86 1
#include <immintrin.h>
#endif

namespace riftco_transformer::detail {
namespace {

// How far ahead of the loads the vector loops prefetch B, in bytes: two 4 KiB pages, enough
// to cover a DRAM miss at the rate two cores stream (8 KiB measured best of 4-32 KiB on
// SmolLM2-135M's projections; 4 KiB is too short to help).
constexpr std::size_t prefetch_distance = std::size_t{8} << 10U;

// The prefetch cursor of one group: the next line to prefetch, and where B's part that this
// thread streams ends (nothing past it is prefetched).
struct Prefetch {
    const char* next;
    const char* end;
};

// One group: c[i·ldc + r] = Σ_k a[i·lda + k]·b[r·ldb + k] for i < MA, r < NB. The portable
// loop leaves prefetching to the hardware.
template <int MA, int NB>
void portable_group(const float* a, std::size_t lda, const float* b, std::size_t ldb, std::size_t k,
                    float* c, std::size_t ldc, Prefetch /*prefetch*/) {
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

// NB lines of B ahead (one per row of the group and k step), up to the end of the part.
template <int NB>
inline void prefetch_lines(Prefetch& prefetch) {
    for (int r = 0; r < NB; ++r) {
        if (prefetch.next < prefetch.end) {
            _mm_prefetch(prefetch.next, _MM_HINT_T0);
        }
        prefetch.next += 64;
    }
}

template <int MA, int NB>
RIFTCO_AVX512 void avx512_group(const float* a, std::size_t lda, const float* b, std::size_t ldb,
                                std::size_t k, float* c, std::size_t ldc, Prefetch prefetch) {
    __m512 acc[MA][NB];
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            acc[i][r] = _mm512_setzero_ps();
        }
    }
    std::size_t kk = 0;
    for (; kk + 16 <= k; kk += 16) {
        prefetch_lines<NB>(prefetch);
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
                            std::size_t k, float* c, std::size_t ldc, Prefetch prefetch) {
    __m256 acc[MA][NB];
    for (int i = 0; i < MA; ++i) {
        for (int r = 0; r < NB; ++r) {
            acc[i][r] = _mm256_setzero_ps();
        }
    }
    std::size_t kk = 0;
    for (; kk + 8 <= k; kk += 8) {
        if (kk % 16 == 0) {
            prefetch_lines<NB>(prefetch);  // a 64-byte line per row every two 8-float steps
        }
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
                             float*, std::size_t, Prefetch);

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
    gemv_rows_many({&g, 1}, kernel);
}

void gemv_rows_many(std::span<const GemmArguments> problems, GemvKernel kernel) {
    if (problems.empty()) {
        return;
    }
    Isa isa = detected_isa();
    if (kernel == GemvKernel::Portable) {
        isa = Isa::Portable;
    } else if (kernel == GemvKernel::Avx2) {
        isa = Isa::Avx2;
    } else if (kernel == GemvKernel::Avx512) {
        isa = Isa::Avx512;
    }
    const Kernels kernels = kernels_for_rows(problems.front().m, isa);
    // Work units, problem after problem: a problem's full groups of NB B rows, then its
    // remaining single rows. Unit u of problem p starts at its B row first_row(p, u); a unit's
    // outputs are c[i, its rows], so units write disjoint outputs and each output is one
    // kernel call's fixed-order sum, whichever thread runs it.
    struct Problem {
        const GemmArguments* g;
        std::size_t groups;
        std::size_t first_unit;  // of the whole pass
        std::size_t units;
    };
    constexpr std::size_t inline_problems = 4;
    Problem inline_storage[inline_problems];
    std::vector<Problem> heap_storage;
    std::span<Problem> list(inline_storage, std::min(problems.size(), inline_problems));
    if (problems.size() > inline_problems) {
        heap_storage.resize(problems.size());
        list = heap_storage;
    }
    std::size_t units = 0;
    std::size_t b_floats = 0;
    for (std::size_t p = 0; p < problems.size(); ++p) {
        const GemmArguments& g = problems[p];
        const std::size_t groups = g.n / kernels.group;
        list[p] = {&g, groups, units, groups + (g.n % kernels.group)};
        units += list[p].units;
        b_floats += g.n * g.k;
    }
    const auto locate = [&](std::size_t unit) -> const Problem& {
        std::size_t p = 0;
        while (unit >= list[p].first_unit + list[p].units)
            ++p;
        return list[p];
    };
    const auto first_row = [&](const Problem& problem, std::size_t local) {
        return local < problem.groups ? local * kernels.group
                                      : problem.groups * kernels.group + (local - problem.groups);
    };
    const auto row_address = [&](const Problem& problem, std::size_t local) {
        return reinterpret_cast<const char*>(problem.g->b) +
               first_row(problem, local) * problem.g->ldb * sizeof(float);
    };
    // Runs units [begin, end) (of the whole pass), prefetching up to the end of the part
    // they belong to or of their problem's B, whichever comes first.
    const auto run = [&](std::size_t begin, std::size_t end, std::size_t part_end) {
        for (std::size_t unit = begin; unit < end; ++unit) {
            const Problem& problem = locate(unit);
            const GemmArguments& g = *problem.g;
            const std::size_t local = unit - problem.first_unit;
            const std::size_t n0 = first_row(problem, local);
            const float* b = g.b + n0 * g.ldb;
            const std::size_t stop_local =
                std::min(part_end, problem.first_unit + problem.units) - problem.first_unit;
            const Prefetch prefetch{row_address(problem, local) + prefetch_distance,
                                    row_address(problem, stop_local)};
            if (local < problem.groups) {
                kernels.full(g.a, g.lda, b, g.ldb, g.k, g.c + n0, g.ldc, prefetch);
            } else {
                kernels.single(g.a, g.lda, b, g.ldb, g.k, g.c + n0, g.ldc, prefetch);
            }
        }
    };

    // Threads as parallel_for would pick them: about 2^15 floats of B per thread at least.
    const std::size_t unit_floats =
        std::max<std::size_t>(1, b_floats / std::max<std::size_t>(1, units));
    const std::size_t minimum_units =
        std::max<std::size_t>(1, (std::size_t{1} << 15U) / unit_floats);
    const std::size_t threads =
        std::min(cpu_thread_count(), std::max<std::size_t>(1, units / minimum_units));
    if (threads <= 1 || omp_in_parallel()) {
        run(0, units, units);
        return;
    }

    // Part t = units [units·t/T, units·(t+1)/T), claimed in chunks of about 32 KiB of B from
    // its cursor: first by thread t, front to back, then by any thread that ran out of work.
    struct alignas(64) Part {
        std::atomic<std::size_t> next{0};
        std::size_t end = 0;
    };
    std::vector<Part> parts(threads);
    for (std::size_t t = 0; t < threads; ++t) {
        parts[t].next.store(units * t / threads, std::memory_order_relaxed);
        parts[t].end = units * (t + 1) / threads;
    }
    const std::size_t chunk =
        std::max<std::size_t>(1, (std::size_t{32} << 10U) / (unit_floats * sizeof(float)));
#pragma omp parallel num_threads(static_cast <int>(threads))
    {
        // Every part is visited by every thread, so all are done even with a smaller team.
        const auto thread = static_cast<std::size_t>(omp_get_thread_num());
        for (std::size_t offset = 0; offset < threads; ++offset) {
            Part& part = parts[(thread + offset) % threads];
            for (;;) {
                const std::size_t begin = part.next.fetch_add(chunk, std::memory_order_relaxed);
                if (begin >= part.end) {
                    break;
                }
                run(begin, std::min(begin + chunk, part.end), part.end);
            }
        }
    }
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
