// One GPT training step (forward, cross-entropy, backward, Adam) timed from C++: the
// reference that tools/bench_python_vs_cpp.py compares the Python-driven step against.
// Prints one JSON object: {"seconds_per_step": [...], "final_loss": ..., "parameter_tensors":
// N, "host_reads_per_step": [...]} (host reads: the optimizer's one and loss.item()).
//
//   riftco_bench_train_step [--steps N] [--warmup W] [--attention flash|materialized]
//                           [--vocab V] [--width D] [--heads H] [--blocks N]
//                           [--feed-forward F] [--context T] [--batch B]
// Defaults are the TINY workload of the PyTorch yardstick (256/128/4/4/512, T=128, B=8).
// Tokens of step s at flat position i: (i·7919 + s·31) mod V; targets are the tokens shifted
// by one position (the Python side builds the same arrays).

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/index_tensor.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/optim/adam.hpp"

namespace {

using namespace riftco_transformer;

struct Options {
    std::size_t steps = 20;
    std::size_t warmup = 3;
    AttentionKind attention = AttentionKind::Flash;
    TransformerDimensions dimensions{256, 128, 128, 4, 4, 512};
    std::size_t batch = 8;
};

std::size_t positive(std::string_view flag, const char* text) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end == text || *end != '\0' || value == 0) {
        throw std::invalid_argument(std::string(flag) + ": expected a positive integer, got '" +
                                    text + "'");
    }
    return static_cast<std::size_t>(value);
}

Options parse(int argc, char** argv) {
    Options options;
    for (int index = 1; index < argc; index += 2) {
        const std::string_view flag = argv[index];
        if (index + 1 >= argc) {
            throw std::invalid_argument(std::string(flag) + ": missing value");
        }
        const char* value = argv[index + 1];
        if (flag == "--steps") {
            options.steps = positive(flag, value);
        } else if (flag == "--warmup") {
            options.warmup = std::strtoull(value, nullptr, 10);
        } else if (flag == "--attention") {
            const std::string_view kind = value;
            if (kind != "flash" && kind != "materialized") {
                throw std::invalid_argument("--attention: flash or materialized");
            }
            options.attention =
                kind == "flash" ? AttentionKind::Flash : AttentionKind::Materialized;
        } else if (flag == "--vocab") {
            options.dimensions.vocabulary_size = positive(flag, value);
        } else if (flag == "--width") {
            options.dimensions.model_width = positive(flag, value);
        } else if (flag == "--heads") {
            options.dimensions.head_count = positive(flag, value);
        } else if (flag == "--blocks") {
            options.dimensions.block_count = positive(flag, value);
        } else if (flag == "--feed-forward") {
            options.dimensions.feed_forward_width = positive(flag, value);
        } else if (flag == "--context") {
            options.dimensions.maximum_context = positive(flag, value);
        } else if (flag == "--batch") {
            options.batch = positive(flag, value);
        } else {
            throw std::invalid_argument("unknown flag " + std::string(flag));
        }
    }
    return options;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options options = parse(argc, argv);
        const TransformerDimensions& d = options.dimensions;
        std::mt19937 generator(7);
        DecoderOnlyTransformer model(d, generator, 1e-5F, options.attention);
        Adam optimizer(model.parameters(), AdamOptions{});
        const std::size_t time = d.maximum_context;
        const std::size_t count = options.batch * time;
        std::vector<std::uint32_t> tokens(count);
        std::vector<std::uint32_t> targets(count);
        std::vector<double> seconds;
        std::vector<std::uint64_t> host_reads;  // per timed step: the optimizer's + loss.item()
        float loss_value = 0.0F;
        for (std::size_t step = 0; step < options.warmup + options.steps; ++step) {
            for (std::size_t i = 0; i < count; ++i) {
                tokens[i] = static_cast<std::uint32_t>((i * 7919 + step * 31) % d.vocabulary_size);
                targets[i] =
                    static_cast<std::uint32_t>(((i + 1) * 7919 + step * 31) % d.vocabulary_size);
            }
            const std::uint64_t reads_before = host_read_count();
            const auto start = std::chrono::steady_clock::now();
            Variable logits = model.forward(tokens, Shape{options.batch, time});
            Variable loss = cross_entropy(logits, targets);
            loss.backward();
            optimizer.step();
            loss_value = loss.value().item();
            const auto stop = std::chrono::steady_clock::now();
            if (step >= options.warmup) {
                seconds.push_back(std::chrono::duration<double>(stop - start).count());
                host_reads.push_back(host_read_count() - reads_before);
            }
        }
        std::printf("{\"seconds_per_step\": [");
        for (std::size_t i = 0; i < seconds.size(); ++i) {
            std::printf("%s%.6f", i == 0 ? "" : ", ", seconds[i]);
        }
        std::printf(
            "], \"final_loss\": %.6f, \"parameter_tensors\": %zu, \"host_reads_per_step\": [",
            static_cast<double>(loss_value), model.parameters().size());
        for (std::size_t i = 0; i < host_reads.size(); ++i) {
            std::printf("%s%llu", i == 0 ? "" : ", ",
                        static_cast<unsigned long long>(host_reads[i]));
        }
        std::printf("]}\n");
        return 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "riftco_bench_train_step: %s\n", error.what());
        return 1;
    }
}
