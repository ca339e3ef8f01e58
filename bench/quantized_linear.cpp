// NF4 quantized linear against dense float32 GEMM through the same seam (detail::gemm), on the
// same shapes, in one run. Prints the time of each side, which kernel each side ran, and the
// ratios the acceptance targets are stated in:
//   forward        (tokens=512, in=4096, out=4096): dense time / NF4 time >= 0.7
//   decode forward (tokens=1,   in=4096, out=4096): dense time / NF4 time >= 3
//   input backward (tokens=512, in=4096, out=4096): dense time / NF4 time >= 0.7
// A report, not a test: the exit status is 0 unless something failed to run.
//
//   RIFTCO_TRANSFORMER_NUM_THREADS=2 build/release/bench/riftco_bench_quantized_linear
// Dense and NF4 calls alternate; the best and the median of each side are printed, and the
// ratios use the best (the least disturbed sample on a shared machine).
//   options: --repetitions N (default 7), --kernels auto|avx512|avx2|portable (the NF4 kernel
//   set; a set this CPU lacks is an error), --portable (= --kernels portable), --legacy-scales
//   (fp32 block scales instead of double-quantized), --tokens T --in I --out O (the prefill
//   shape)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/nf4_kernels.hpp"
#include "riftco_transformer/core/tensor_ops/quantized_linear.hpp"
#include "riftco_transformer/core/threading.hpp"

namespace rt = riftco_transformer;

namespace {

struct Timing {
    double best = 0.0;    // seconds
    double median = 0.0;  // seconds
};

Timing summarize(std::vector<double> times) {
    std::sort(times.begin(), times.end());
    return {times.front(), times[times.size() / 2]};
}

// Times `first` and `second` alternately (after one warm-up call each), so a load change on
// a shared machine hits both sides alike.
std::pair<Timing, Timing> time_alternately(int repetitions, const std::function<void()>& first,
                                           const std::function<void()>& second) {
    first();
    second();
    std::vector<double> first_times;
    std::vector<double> second_times;
    const auto seconds_of = [](const std::function<void()>& run) {
        const auto start = std::chrono::steady_clock::now();
        run();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    for (int i = 0; i < repetitions; ++i) {
        first_times.push_back(seconds_of(first));
        second_times.push_back(seconds_of(second));
    }
    return {summarize(first_times), summarize(second_times)};
}

std::vector<float> random_values(std::size_t count, unsigned seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> distribution(0.0F, 0.05F);
    std::vector<float> values(count);
    for (float& value : values) {
        value = distribution(generator);
    }
    return values;
}

struct Comparison {
    const char* label;
    std::size_t tokens;
    bool input_backward;
    double target;
};

}  // namespace

int main(int argc, char** argv) {
    int repetitions = 7;
    rt::Nf4Options options;  // B=64, double-quantized scales with C=256
    std::size_t tokens = 512;
    std::size_t in = 4096;
    std::size_t out = 4096;
    for (int i = 1; i < argc; ++i) {
        const std::string argument = argv[i];
        const auto next = [&]() -> std::size_t {
            return i + 1 < argc ? std::strtoull(argv[++i], nullptr, 10) : 0;
        };
        if (argument == "--repetitions") {
            repetitions = std::max(1, static_cast<int>(next()));
        } else if (argument == "--legacy-scales") {
            options.double_quantization = false;
        } else if (argument == "--portable") {
            rt::detail::set_nf4_kernel_choice(rt::detail::Nf4KernelChoice::Portable);
        } else if (argument == "--kernels" && i + 1 < argc) {
            const std::string name = argv[++i];
            rt::detail::Nf4KernelChoice choice = rt::detail::Nf4KernelChoice::Automatic;
            if (name == "avx512") {
                choice = rt::detail::Nf4KernelChoice::Avx512;
            } else if (name == "avx2") {
                choice = rt::detail::Nf4KernelChoice::Avx2;
            } else if (name == "portable") {
                choice = rt::detail::Nf4KernelChoice::Portable;
            } else if (name != "auto") {
                std::fprintf(stderr, "unknown --kernels %s (auto|avx512|avx2|portable)\n",
                             name.c_str());
                return 2;
            }
            if (rt::detail::nf4_kernel_set_if_supported(choice) == nullptr) {
                std::fprintf(stderr, "--kernels %s: this CPU (or build) lacks that set\n",
                             name.c_str());
                return 2;
            }
            rt::detail::set_nf4_kernel_choice(choice);
        } else if (argument == "--tokens") {
            tokens = next();
        } else if (argument == "--in") {
            in = next();
        } else if (argument == "--out") {
            out = next();
        } else {
            std::fprintf(stderr, "unknown argument %s\n", argument.c_str());
            return 2;
        }
    }

    std::printf("threads: %zu\n", rt::cpu_thread_count());
    std::printf("dense kernel: %s\n", rt::detail::gemm_implementation_name());
    std::printf("nf4 kernel set: %s\n", rt::detail::active_nf4_kernels().name);
    const rt::Tensor dense_weight({out, in}, random_values(out * in, 1));
    const std::vector<float> dense_host = dense_weight.to_host();
    const rt::QuantizedWeight nf4 = rt::QuantizedWeight::quantize(dense_weight, options);
    std::printf(
        "nf4 weight: [%zu, %zu], block %zu, %s scales (C=%zu), payload %zu bytes "
        "(fp32 %zu)\n",
        out, in, nf4.block_size(),
        nf4.uses_double_quantized_scales() ? "double-quantized" : "legacy fp32",
        nf4.scale_quantization_block_size(), nf4.memory_usage().logical_payload_bytes,
        nf4.memory_usage().fp32_equivalent_bytes);

    const Comparison comparisons[] = {
        {"forward", tokens, false, 0.7},
        {"forward (decode)", 1, false, 3.0},
        {"input backward", tokens, true, 0.7},
    };
    for (const Comparison& c : comparisons) {
        const std::size_t k_dense = c.input_backward ? out : in;
        const std::size_t n_dense = c.input_backward ? in : out;
        const rt::Tensor input({c.tokens, k_dense}, random_values(c.tokens * k_dense, 2));
        const std::vector<float> input_host = input.to_host();
        std::vector<float> dense_result(c.tokens * n_dense);
        // Dense: forward X[T,I]·W[O,I]ᵀ; input backward G[T,O]·W[O,I].
        const auto dense = [&] {
            rt::detail::GemmArguments g;
            g.transpose_b = !c.input_backward;
            g.m = c.tokens;
            g.n = n_dense;
            g.k = k_dense;
            g.a = input_host.data();
            g.lda = k_dense;
            g.b = dense_host.data();
            g.ldb = in;
            g.c = dense_result.data();
            g.ldc = n_dense;
            rt::detail::gemm(g);
        };
        const auto quantized = [&] {
            const rt::Tensor result =
                c.input_backward ? rt::tensor_ops::quantized_linear_input_backward(input, nf4)
                                 : rt::tensor_ops::quantized_linear(input, nf4);
            static_cast<void>(result);
        };
        const auto [dense_time, nf4_time] = time_alternately(repetitions, dense, quantized);
        const double flops = 2.0 * static_cast<double>(c.tokens * in * out);
        const double ratio = dense_time.best / nf4_time.best;
        const double median_ratio = dense_time.median / nf4_time.median;
        std::printf("\n%s: tokens=%zu in=%zu out=%zu\n", c.label, c.tokens, in, out);
        std::printf("  dense fp32 : best %9.3f ms (%7.1f GFLOP/s), median %9.3f ms  [%s]\n",
                    dense_time.best * 1e3, flops / dense_time.best * 1e-9, dense_time.median * 1e3,
                    rt::detail::gemm_implementation_name());
        std::printf(
            "  nf4        : best %9.3f ms (%7.1f GFLOP/s), median %9.3f ms  [%s]\n",
            nf4_time.best * 1e3, flops / nf4_time.best * 1e-9, nf4_time.median * 1e3,
            rt::detail::nf4_kernel_description(nf4.storage().layout(), c.tokens, c.input_backward)
                .c_str());
        std::printf("  dense/nf4 time: best %.2fx, median %.2fx (target >= %.1fx on best: %s)\n",
                    ratio, median_ratio, c.target, ratio >= c.target ? "met" : "NOT met");
    }
    return 0;
}
