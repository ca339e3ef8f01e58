// Kernel benchmarks for the CPU backend (Google Benchmark).
//
// GEMM reports GFLOP/s (2·M·N·K per call); memory-bound kernels report bytes_per_second,
// counting every input read once and every output written once (the minimum traffic), so
// they can be compared with BM_MemoryCopy, a plain std::memcpy from the same run.
// Inputs are built once outside the timed loop; each timed call includes the allocation of
// its result tensor, as every caller of tensor_ops pays it. Work is multithreaded, so every
// benchmark is timed in real (wall) time.
//
// Threads: the library reads RIFTCO_TRANSFORMER_NUM_THREADS itself (see threading.hpp);
// tools/bench_kernels_vs_numpy.py sets it together with OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS. The run's context records the thread count, the GEMM implementation
// and, when OpenBLAS is linked, its kernel family and the file that was loaded.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/backend/cpu/gemm.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"

// OpenBLAS introspection, weak so that a build with the blocked GEMM fallback (no OpenBLAS
// linked) still links: the pointers are then null.
extern "C" {
[[gnu::weak]] char* openblas_get_corename(void);
[[gnu::weak]] char* openblas_get_config(void);
[[gnu::weak]] int openblas_get_parallel(void);
[[gnu::weak]] int openblas_get_num_threads(void);
}

namespace {

using riftco_transformer::Shape;
using riftco_transformer::Tensor;
namespace tensor_ops = riftco_transformer::tensor_ops;

constexpr std::size_t float_bytes = sizeof(float);
constexpr std::size_t eight_mebi_floats = std::size_t{8} << 20U;  // 32 MiB of float32

// Row-major float32 tensor with values drawn uniformly from [low, high) (fixed seed).
Tensor random_tensor(const Shape& shape, std::uint32_t seed, float low = -1.0F, float high = 1.0F) {
    std::size_t count = 1;
    for (const std::size_t dimension : shape)
        count *= dimension;
    std::vector<float> values(count);
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> distribution(low, high);
    for (float& value : values)
        value = distribution(generator);
    return Tensor(shape, std::span<const float>(values));
}

void set_bytes_per_call(benchmark::State& state, std::size_t bytes_per_call) {
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_call) * state.iterations());
}

// ---------------------------------------------------------------------------------------------
// GEMM: left [M,K] · right [K,N] -> [M,N]; 2·M·N·K floating-point operations per call.
void BM_Matmul(benchmark::State& state) {
    const auto m = static_cast<std::size_t>(state.range(0));
    const auto n = static_cast<std::size_t>(state.range(1));
    const auto k = static_cast<std::size_t>(state.range(2));
    const Tensor left = random_tensor({m, k}, 1);
    const Tensor right = random_tensor({k, n}, 2);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor product = tensor_ops::matmul(left, right);
        benchmark::DoNotOptimize(product);
    }
    const double giga_flops_per_call =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * 1e-9;
    state.counters["GFLOP/s"] = benchmark::Counter(
        giga_flops_per_call * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Matmul)
    ->Args({1024, 1024, 1024})
    ->Args({512, 768, 3072})
    ->Args({512, 3072, 768})
    ->Args({2048, 2048, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---------------------------------------------------------------------------------------------
// Memory-bound references.

// std::memcpy of 64 MiB between two pre-touched buffers; bytes = read + write.
void BM_MemoryCopy(benchmark::State& state) {
    constexpr std::size_t bytes = std::size_t{64} << 20U;
    std::vector<char> source(bytes, 1);
    std::vector<char> destination(bytes, 0);
    for ([[maybe_unused]] const auto& iteration : state) {
        std::memcpy(destination.data(), source.data(), bytes);
        benchmark::DoNotOptimize(destination.data());
        benchmark::ClobberMemory();
    }
    set_bytes_per_call(state, 2 * bytes);
}
BENCHMARK(BM_MemoryCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same 64 MiB copy split into one contiguous chunk per library thread (threads are
// started inside the timed loop, ~tens of µs against milliseconds of copying): what the
// multithreaded kernels could reach.
void BM_MemoryCopyThreaded(benchmark::State& state) {
    constexpr std::size_t bytes = std::size_t{64} << 20U;
    const std::size_t thread_count = riftco_transformer::cpu_thread_count();
    std::vector<char> source(bytes, 1);
    std::vector<char> destination(bytes, 0);
    for ([[maybe_unused]] const auto& iteration : state) {
        std::vector<std::jthread> workers;
        workers.reserve(thread_count);
        for (std::size_t t = 0; t < thread_count; ++t) {
            const std::size_t begin = bytes * t / thread_count;
            const std::size_t end = bytes * (t + 1) / thread_count;
            workers.emplace_back([&, begin, end] {
                std::memcpy(destination.data() + begin, source.data() + begin, end - begin);
            });
        }
        workers.clear();  // joins
        benchmark::DoNotOptimize(destination.data());
        benchmark::ClobberMemory();
    }
    set_bytes_per_call(state, 2 * bytes);
    state.counters["threads"] = static_cast<double>(thread_count);
}
BENCHMARK(BM_MemoryCopyThreaded)->Unit(benchmark::kMillisecond)->UseRealTime();

// Tensor::to_host of 8M floats into a new std::vector; bytes = read + write.
void BM_TensorCopy(benchmark::State& state) {
    const Tensor x = random_tensor({eight_mebi_floats}, 3);
    for ([[maybe_unused]] const auto& iteration : state) {
        std::vector<float> host = x.to_host();
        benchmark::DoNotOptimize(host.data());
    }
    set_bytes_per_call(state, 2 * eight_mebi_floats * float_bytes);
}
BENCHMARK(BM_TensorCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

// Tensor::copy_to_host of 8M floats into a pre-touched buffer: to_host without the allocation.
void BM_TensorCopyIntoBuffer(benchmark::State& state) {
    const Tensor x = random_tensor({eight_mebi_floats}, 3);
    std::vector<float> host(eight_mebi_floats, 0.0F);
    for ([[maybe_unused]] const auto& iteration : state) {
        x.copy_to_host(host);
        benchmark::DoNotOptimize(host.data());
        benchmark::ClobberMemory();
    }
    set_bytes_per_call(state, 2 * eight_mebi_floats * float_bytes);
}
BENCHMARK(BM_TensorCopyIntoBuffer)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---------------------------------------------------------------------------------------------
// Memory-bound kernels on transformer shapes.

// add: x [8M] + y [8M] -> [8M]; reads 2·N, writes N floats.
void BM_Add(benchmark::State& state) {
    const Tensor left = random_tensor({eight_mebi_floats}, 4);
    const Tensor right = random_tensor({eight_mebi_floats}, 5);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor total = tensor_ops::add(left, right);
        benchmark::DoNotOptimize(total);
    }
    set_bytes_per_call(state, 3 * eight_mebi_floats * float_bytes);
}
BENCHMARK(BM_Add)->Unit(benchmark::kMillisecond)->UseRealTime();

// sum over `axis` of x [4096, 768]: axis 0 -> [768] (a bias gradient), axis 1 -> [4096].
void BM_SumAxis(benchmark::State& state) {
    constexpr std::size_t rows = 4096;
    constexpr std::size_t width = 768;
    const auto axis = static_cast<std::size_t>(state.range(0));
    const Tensor x = random_tensor({rows, width}, 6);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor total = tensor_ops::sum(x, axis);
        benchmark::DoNotOptimize(total);
    }
    const std::size_t outputs = axis == 0 ? width : rows;
    set_bytes_per_call(state, (rows * width + outputs) * float_bytes);
}
BENCHMARK(BM_SumAxis)
    ->ArgName("axis")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// softmax over the last axis: x [4096, 1024] -> [4096, 1024]; reads N, writes N floats.
void BM_Softmax(benchmark::State& state) {
    constexpr std::size_t rows = 4096;
    constexpr std::size_t width = 1024;
    const Tensor x = random_tensor({rows, width}, 7, -4.0F, 4.0F);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor probabilities = tensor_ops::softmax(x, 1);
        benchmark::DoNotOptimize(probabilities);
    }
    set_bytes_per_call(state, 2 * rows * width * float_bytes);
}
BENCHMARK(BM_Softmax)->Unit(benchmark::kMillisecond)->UseRealTime();

// causal softmax: scores [B=4, H=8, T=256, T=256] -> probabilities, scale 0.125 (1/√64);
// the whole tensor counted as read once and written once.
void BM_CausalSoftmax(benchmark::State& state) {
    const Shape shape{4, 8, 256, 256};
    const Tensor scores = random_tensor(shape, 8, -4.0F, 4.0F);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor probabilities = tensor_ops::causal_softmax(scores, 0.125F);
        benchmark::DoNotOptimize(probabilities);
    }
    set_bytes_per_call(state, 2 * scores.numel() * float_bytes);
}
BENCHMARK(BM_CausalSoftmax)->Unit(benchmark::kMillisecond)->UseRealTime();

constexpr std::size_t layer_norm_rows = 4096;  // B·T positions
constexpr std::size_t layer_norm_width = 768;  // D

// layer_norm: x [4096, 768], scale [768], bias [768] -> y [4096, 768], mean [4096],
// inverse_deviation [4096].
void BM_LayerNorm(benchmark::State& state) {
    const Tensor x = random_tensor({layer_norm_rows, layer_norm_width}, 9);
    const Tensor scale = random_tensor({layer_norm_width}, 10, 0.5F, 1.5F);
    const Tensor bias = random_tensor({layer_norm_width}, 11);
    for ([[maybe_unused]] const auto& iteration : state) {
        tensor_ops::LayerNormResult result = tensor_ops::layer_norm(x, scale, bias);
        benchmark::DoNotOptimize(result);
    }
    const std::size_t elements = layer_norm_rows * layer_norm_width;
    set_bytes_per_call(state,
                       (2 * elements + 2 * layer_norm_width + 2 * layer_norm_rows) * float_bytes);
}
BENCHMARK(BM_LayerNorm)->Unit(benchmark::kMillisecond)->UseRealTime();

// layer_norm_backward: reads x, upstream [4096, 768], scale [768], mean and
// inverse_deviation [4096]; writes dx [4096, 768], dscale and dbias [768].
void BM_LayerNormBackward(benchmark::State& state) {
    const Tensor x = random_tensor({layer_norm_rows, layer_norm_width}, 12);
    const Tensor scale = random_tensor({layer_norm_width}, 13, 0.5F, 1.5F);
    const Tensor bias = random_tensor({layer_norm_width}, 14);
    const Tensor upstream = random_tensor({layer_norm_rows, layer_norm_width}, 15);
    const tensor_ops::LayerNormResult forward = tensor_ops::layer_norm(x, scale, bias);
    for ([[maybe_unused]] const auto& iteration : state) {
        tensor_ops::LayerNormGradients gradients = tensor_ops::layer_norm_backward(
            x, scale, forward.mean, forward.inverse_deviation, upstream);
        benchmark::DoNotOptimize(gradients);
    }
    const std::size_t elements = layer_norm_rows * layer_norm_width;
    set_bytes_per_call(state,
                       (3 * elements + 3 * layer_norm_width + 2 * layer_norm_rows) * float_bytes);
}
BENCHMARK(BM_LayerNormBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// gelu (exact erf): x [8M] -> [8M]; reads N, writes N floats.
void BM_Gelu(benchmark::State& state) {
    const Tensor x = random_tensor({eight_mebi_floats}, 16, -4.0F, 4.0F);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor activated = tensor_ops::gelu(x);
        benchmark::DoNotOptimize(activated);
    }
    set_bytes_per_call(state, 2 * eight_mebi_floats * float_bytes);
}
BENCHMARK(BM_Gelu)->Unit(benchmark::kMillisecond)->UseRealTime();

// gelu_backward: x, upstream [8M] -> [8M]; reads 2·N, writes N floats.
void BM_GeluBackward(benchmark::State& state) {
    const Tensor x = random_tensor({eight_mebi_floats}, 17, -4.0F, 4.0F);
    const Tensor upstream = random_tensor({eight_mebi_floats}, 18);
    for ([[maybe_unused]] const auto& iteration : state) {
        Tensor gradient = tensor_ops::gelu_backward(x, upstream);
        benchmark::DoNotOptimize(gradient);
    }
    set_bytes_per_call(state, 3 * eight_mebi_floats * float_bytes);
}
BENCHMARK(BM_GeluBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// cross_entropy: logits [N=2048, V=8192], targets [2048] (uint32) -> loss [], gradient
// [2048, 8192]; reads logits and targets, writes the gradient and the loss.
void BM_CrossEntropy(benchmark::State& state) {
    constexpr std::size_t positions = 2048;
    constexpr std::size_t vocabulary = 8192;
    const Tensor logits = random_tensor({positions, vocabulary}, 19, -4.0F, 4.0F);
    std::vector<std::uint32_t> targets(positions);
    std::mt19937 generator(20);
    std::uniform_int_distribution<std::uint32_t> token(0, vocabulary - 1);
    for (std::uint32_t& target : targets)
        target = token(generator);
    for ([[maybe_unused]] const auto& iteration : state) {
        tensor_ops::CrossEntropyResult result = tensor_ops::cross_entropy(logits, targets);
        benchmark::DoNotOptimize(result);
    }
    set_bytes_per_call(state, 2 * positions * vocabulary * float_bytes +
                                  positions * sizeof(std::uint32_t) + float_bytes);
}
BENCHMARK(BM_CrossEntropy)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---------------------------------------------------------------------------------------------
// Run context.

// Path of the mapped file whose name contains `fragment` ("" when none is mapped).
std::string mapped_library_path(const std::string& fragment) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        const std::size_t slash = line.find('/');
        if (slash != std::string::npos && line.find(fragment, slash) != std::string::npos) {
            return line.substr(slash);
        }
    }
    return "";
}

void add_run_context() {
    // cpu_thread_count() resolves RIFTCO_TRANSFORMER_NUM_THREADS and hands it to the BLAS.
    const std::size_t thread_count = riftco_transformer::cpu_thread_count();
    benchmark::AddCustomContext("riftco_cpu_threads", std::to_string(thread_count));
    benchmark::AddCustomContext("riftco_gemm",
                                riftco_transformer::detail::gemm_implementation_name());
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    benchmark::AddCustomContext("OPENBLAS_CORETYPE",
                                coretype != nullptr ? coretype : "(unset: autodetected)");
    if (openblas_get_corename != nullptr) {
        benchmark::AddCustomContext("openblas_corename", openblas_get_corename());
    }
    if (openblas_get_config != nullptr) {
        benchmark::AddCustomContext("openblas_config", openblas_get_config());
    }
    if (openblas_get_parallel != nullptr) {
        constexpr const char* models[] = {"sequential", "pthreads", "openmp"};
        const int model = openblas_get_parallel();
        benchmark::AddCustomContext("openblas_parallel",
                                    model >= 0 && model <= 2 ? models[model] : "unknown");
    }
    if (openblas_get_num_threads != nullptr) {
        benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
    }
    const std::string openblas_path = mapped_library_path("libopenblas");
    if (!openblas_path.empty()) {
        benchmark::AddCustomContext("openblas_library", openblas_path);
    }
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 1;
    }
    try {
        add_run_context();
    } catch (const std::exception& error) {
        std::cerr << "riftco_bench_kernels: " << error.what() << '\n';
        return 1;
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
