// Training-step time on the PJRT backend beside our CPU backend, in the same process, and
// where the PJRT step's time goes (compiling, launching programs, copies and waits), with the
// compile count, the cache hit rate and the host<->device bytes per step.
//
//   riftco_bench_pjrt_training_step [--model tiny|small] [--steps N] [--backend pjrt|tpu]
//
// The PJRT identity loads RIFTCO_TRANSFORMER_PJRT_PLUGIN (pjrt) or RIFTCO_TRANSFORMER_TPU_LIBRARY
// (tpu). Both sides run the same model, batches and optimizer; the first step of each is a
// warm-up (it compiles on PJRT) and is reported on its own.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"
#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace {

using namespace riftco_transformer;

struct Workload {
    TransformerDimensions dimensions;
    std::size_t batch;
    std::size_t context;
};

Workload workload(const std::string& name) {
    if (name == "tiny") {
        return {{.vocabulary_size = 27,
                 .maximum_context = 16,
                 .model_width = 32,
                 .head_count = 4,
                 .block_count = 2,
                 .feed_forward_width = 64},
                4,
                16};
    }
    if (name == "small") {
        return {{.vocabulary_size = 512,
                 .maximum_context = 128,
                 .model_width = 128,
                 .head_count = 4,
                 .block_count = 4,
                 .feed_forward_width = 512},
                8,
                128};
    }
    throw std::invalid_argument("--model must be tiny or small (got '" + name + "')");
}

std::vector<std::uint32_t> tokens(std::size_t count, std::size_t vocabulary, unsigned seed) {
    std::mt19937 generator(seed);
    std::vector<std::uint32_t> ids(count);
    for (auto& id : ids) {
        id = static_cast<std::uint32_t>(generator() % vocabulary);
    }
    return ids;
}

struct Timing {
    double first_seconds = 0;
    double step_seconds = 0;  // mean over the steps after the first
    float last_loss = 0;
};

// `after_first_step` runs once the first (compiling, uploading) step is done.
Timing run(ExecutionBackend backend, const Workload& w, int steps,
           const std::function<void()>& after_first_step) {
    const ScopedExecutionBackend on(backend);
    std::mt19937 generator(7);
    DecoderOnlyTransformer model(w.dimensions, generator);
    Adam adam(model.parameters(), AdamOptions{.learning_rate = 1e-3});
    Timing timing;
    for (int step = 0; step < steps; ++step) {
        const auto inputs = tokens(w.batch * w.context, w.dimensions.vocabulary_size,
                                   100U + static_cast<unsigned>(step));
        const auto targets = tokens(w.batch * w.context, w.dimensions.vocabulary_size,
                                    200U + static_cast<unsigned>(step));
        const auto start = std::chrono::steady_clock::now();
        Variable loss = cross_entropy(model.forward(inputs, {w.batch, w.context}), targets);
        loss.backward();
        adam.step();
        timing.last_loss = loss.value().item();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        (step == 0 ? timing.first_seconds : timing.step_seconds) += seconds;
        if (step == 0) {
            after_first_step();
        }
    }
    timing.step_seconds /= std::max(1, steps - 1);
    return timing;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_name = "tiny";
    int steps = 20;
    ExecutionBackend device = ExecutionBackend::Pjrt;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const std::string value = argv[i + 1];
        if (flag == "--model") {
            model_name = value;
        } else if (flag == "--steps") {
            steps = std::max(2, std::atoi(value.c_str()));
        } else if (flag == "--backend") {
            device = value == "tpu" ? ExecutionBackend::Tpu : ExecutionBackend::Pjrt;
        } else {
            std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
            return 2;
        }
    }
    try {
        const Workload w = workload(model_name);
        if (!execution_backend_available(device)) {
            std::printf("skipped: %s is unavailable: %s\n",
                        std::string(execution_backend_name(device)).c_str(),
                        std::string(execution_backend_unavailability_reason(device)).c_str());
            return 0;
        }
        const detail::pjrt::Runtime* runtime = detail::pjrt::loaded_runtime(device);
        const Timing cpu = run(ExecutionBackend::Cpu, w, steps, [] {});
        const auto start = runtime->statistics();
        detail::pjrt::RuntimeStatistics before;
        const Timing on_device = run(device, w, steps, [&] { before = runtime->statistics(); });
        const auto after = runtime->statistics();
        const double n = steps - 1;  // the steps after the first
        std::printf(
            "model %s (B=%zu T=%zu D=%zu N=%zu), %d steps, %zu CPU threads; PJRT platform "
            "'%s', API 0.%d\n",
            model_name.c_str(), w.batch, w.context, w.dimensions.model_width,
            w.dimensions.block_count, steps, cpu_thread_count(), runtime->platform_name().c_str(),
            runtime->api_minor());
        std::printf("cpu : first step %.3f s, then %.2f ms/step (last loss %.4f)\n",
                    cpu.first_seconds, 1e3 * cpu.step_seconds, cpu.last_loss);
        std::printf(
            "%-4s: first step %.3f s, then %.2f ms/step (last loss %.4f); %.2fx the CPU "
            "step time\n",
            std::string(execution_backend_name(device)).c_str(), on_device.first_seconds,
            1e3 * on_device.step_seconds, on_device.last_loss,
            on_device.step_seconds / cpu.step_seconds);
        std::printf(
            "first step: %llu programs compiled in %.3f s, %.0f bytes to device (the "
            "model's initial values and the batch)\n",
            static_cast<unsigned long long>(before.compiles - start.compiles),
            before.compile_seconds - start.compile_seconds,
            static_cast<double>(before.bytes_to_device - start.bytes_to_device));
        std::printf(
            "each later step: %llu programs compiled, %.0f program runs (%.1f ms inside "
            "Execute), cache hit rate %.1f%%\n",
            static_cast<unsigned long long>(after.compiles - before.compiles),
            static_cast<double>(after.executions - before.executions) / n,
            1e3 * (after.execute_seconds - before.execute_seconds) / n,
            100.0 * static_cast<double>(after.cache_hits - before.cache_hits) /
                static_cast<double>(after.cache_hits - before.cache_hits + after.compiles -
                                    before.compiles));
        std::printf(
            "each later step: %.0f bytes to device in %.1f uploads (%.2f ms), %.0f bytes to host "
            "in %.1f downloads (%.2f ms incl. waiting for the device)\n",
            static_cast<double>(after.bytes_to_device - before.bytes_to_device) / n,
            static_cast<double>(after.uploads - before.uploads) / n,
            1e3 * (after.upload_seconds - before.upload_seconds) / n,
            static_cast<double>(after.bytes_to_host - before.bytes_to_host) / n,
            static_cast<double>(after.downloads - before.downloads) / n,
            1e3 * (after.download_seconds - before.download_seconds) / n);
    } catch (const std::exception& error) {
        std::fprintf(stderr, "error: %s\n", error.what());
        return 1;
    }
    return 0;
}
