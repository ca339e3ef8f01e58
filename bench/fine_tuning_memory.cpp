// Memory and time of one fine-tuning step, full vs LoRA vs QLoRA, on the SMALL workload of
// the PyTorch yardstick (V=8192, D=512, H=8, N=6, F=2048, T=256, B=4) by default. Run one
// process per mode (tools/bench_fine_tuning_memory.py does, and prints the ratios): peak RSS
// is per process.
//
//   riftco_bench_fine_tuning_memory --mode full|lora|qlora [--steps N] [--time T] [--batch B]
//                                   [--config small|tiny]
//
// Prints one JSON object:
//   base_fp32_bytes            float32 bytes of the whole base model (every parameter)
//   base_resident_bytes        bytes the base holds now: dense parameters + packed payloads
//   packed_resident_bytes      QuantizedMemoryUsage::resident_payload_bytes (qlora)
//   packed_fp32_equivalent_bytes  the same weights in float32
//   trainable_parameters       scalars Adam updates
//   peak_rss_step_bytes        the process's peak RSS during the measured steps (VmHWM after
//                              resetting it with /proc/self/clear_refs), after a warm-up step
//   rss_before_step_bytes      VmRSS right before them
//   peak_live_tensor_bytes     CPU tensor storage high-water mark during the measured steps
//                              (cpu_memory_statistics: exact, independent of allocator caches)
//   seconds_per_step           median of the measured steps

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace {

using namespace riftco_transformer;

std::size_t status_kib(const char* field) {
    std::ifstream status("/proc/self/status");
    std::string line;
    const std::string prefix = std::string(field) + ":";
    while (std::getline(status, line)) {
        if (line.rfind(prefix, 0) == 0) {
            return std::stoull(line.substr(prefix.size()));
        }
    }
    throw std::runtime_error(std::string("no ") + field + " in /proc/self/status");
}

void reset_peak_rss() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // resets VmHWM to the current RSS (Linux >= 4.0)
}

std::size_t positive(const char* flag, const char* text) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end == text || *end != '\0' || value == 0) {
        throw std::invalid_argument(std::string(flag) + ": expected a positive integer");
    }
    return static_cast<std::size_t>(value);
}

}  // namespace

int main(int argc, char** argv) try {
    std::string mode;
    std::size_t steps = 2;
    std::size_t time = 256;
    std::size_t batch = 4;
    TransformerDimensions dims{8192, 256, 512, 8, 6, 2048};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--mode") {
            mode = argv[i + 1];
        } else if (flag == "--steps") {
            steps = positive("--steps", argv[i + 1]);
        } else if (flag == "--time") {
            time = positive("--time", argv[i + 1]);
        } else if (flag == "--batch") {
            batch = positive("--batch", argv[i + 1]);
        } else if (flag == "--config") {
            const std::string_view config = argv[i + 1];
            if (config == "tiny") {
                dims = {256, 128, 128, 4, 4, 512};
            } else if (config != "small") {
                throw std::invalid_argument("--config: small or tiny");
            }
        } else {
            throw std::invalid_argument("unknown flag " + std::string(flag));
        }
    }
    if (mode != "full" && mode != "lora" && mode != "qlora") {
        throw std::invalid_argument("--mode full|lora|qlora is required");
    }
    dims.maximum_context = std::max(dims.maximum_context, time);

    std::mt19937 generator(5489);
    DecoderOnlyTransformer model(dims, generator, 1e-5F, AttentionKind::Flash);
    const std::size_t base_fp32 = model.parameter_count() * sizeof(float);  // all dense
    if (mode == "qlora") {
        model.quantize_nf4(
            {.block_size = 64, .double_quantization = true, .scale_block_size = 256});
    }
    const QuantizedMemoryUsage packed = model.quantized_memory_usage();
    const std::size_t base_resident =
        model.parameter_count() * sizeof(float) + packed.resident_payload_bytes;
    if (mode != "full") {
        model.attach_lora({.rank = 8, .alpha = 16.0F, .targets = 0x7F});
    }
    const ParameterList trainable = mode == "full" ? model.parameters() : model.lora_parameters();
    std::size_t trainable_scalars = 0;
    for (const NamedParameter& named : trainable)
        trainable_scalars += named.parameter.value().numel();
    Adam adam(trainable, AdamOptions{.learning_rate = 1e-3});

    std::vector<std::uint32_t> tokens(batch * time);
    std::vector<std::uint32_t> targets(batch * time);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::uint32_t>((i * 7919) % dims.vocabulary_size);
        targets[i] = static_cast<std::uint32_t>((i * 7919 + 7919) % dims.vocabulary_size);
    }
    const auto step = [&] {
        Variable loss = cross_entropy(model.forward(tokens, {batch, time}), targets);
        loss.backward();
        adam.step();
        return loss.value().item();
    };
    step();  // warm-up: Adam moments and allocator pools exist from here on
    const std::size_t rss_before = status_kib("VmRSS") * 1024;
    reset_peak_rss();
    reset_cpu_peak_memory();
    std::vector<double> seconds;
    float loss = 0.0F;
    for (std::size_t s = 0; s < steps; ++s) {
        const auto start = std::chrono::steady_clock::now();
        loss = step();
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const std::size_t peak = status_kib("VmHWM") * 1024;
    const std::size_t peak_live = cpu_memory_statistics().peak_live_bytes;
    std::sort(seconds.begin(), seconds.end());
    std::printf(
        "{\"mode\": \"%s\", \"base_fp32_bytes\": %zu, \"base_resident_bytes\": %zu, "
        "\"packed_resident_bytes\": %zu, \"packed_fp32_equivalent_bytes\": %zu, "
        "\"trainable_parameters\": %zu, \"rss_before_step_bytes\": %zu, "
        "\"peak_rss_step_bytes\": %zu, \"peak_live_tensor_bytes\": %zu, \"seconds_per_step\": "
        "%.4f, \"final_loss\": %.5f}\n",
        mode.c_str(), base_fp32, base_resident, packed.resident_payload_bytes,
        packed.fp32_equivalent_bytes, trainable_scalars, rss_before, peak, peak_live,
        seconds[seconds.size() / 2], static_cast<double>(loss));
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "riftco_bench_fine_tuning_memory: %s\n", error.what());
    return 2;
}
