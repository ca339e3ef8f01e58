// Autograd memory report: how many bytes of CPU tensor storage an MLP training step keeps
// and adds, with and without one checkpoint per layer (cpu_memory_statistics: live bytes of
// tensor storage, requested sizes, and their high-water mark).
//
// Model: L = 6 layers h_{l+1} = gelu(h_l·W_l + b_l), W_l [1024,1024], batch 512, and
// loss = cross_entropy(h_L, targets) over 1024 classes. One activation A = 512·1024·4 = 2 MiB.
//
// Figures printed per variant:
//   parameters           bytes of every W_l and b_l
//   saved activations    live bytes after forward − before forward
//   peak extra backward  peak live bytes during backward − live before backward
//   live after backward  live bytes after backward − before forward, loss handle still held
//   after dropping loss  the same once the loss handle is released (= leaf gradients)
//   ratio                peak extra backward / saved activations
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/memory.hpp"

namespace {

using namespace riftco_transformer;

constexpr std::size_t batch = 512;
constexpr std::size_t width = 1024;  // also the number of classes
constexpr std::size_t layer_count = 6;

// Deterministic values in [lo, hi) (a small LCG; reproducible everywhere).
std::vector<float> pseudo_random(std::size_t count, float lo, float hi, std::uint32_t seed) {
    std::vector<float> values(count);
    std::uint32_t state = seed;
    for (float& value : values) {
        state = state * 1664525U + 1013904223U;
        value = lo + (hi - lo) * static_cast<float>(state >> 8U) / 16777216.0F;
    }
    return values;
}

struct Model {
    Variable input;
    std::vector<Variable> weights;
    std::vector<Variable> biases;
    std::vector<std::uint32_t> targets;

    Model() : input(Tensor({batch, width}, pseudo_random(batch * width, -1.0F, 1.0F, 7U)), false) {
        for (std::size_t l = 0; l < layer_count; ++l) {
            const auto seed = static_cast<std::uint32_t>(100 + 2 * l);
            weights.emplace_back(
                Tensor({width, width}, pseudo_random(width * width, -0.05F, 0.05F, seed)));
            biases.emplace_back(Tensor({width}, pseudo_random(width, -0.1F, 0.1F, seed + 1)));
        }
        targets.resize(batch);
        for (std::size_t i = 0; i < batch; ++i)
            targets[i] = static_cast<std::uint32_t>((i * 37) % width);
    }

    [[nodiscard]] Variable layer(std::size_t l, const Variable& h) const {
        return gelu(matmul(h, weights[l]) + broadcast_to(biases[l], {batch, width}));
    }

    [[nodiscard]] Variable loss(bool checkpoint_layers) const {
        Variable h = input;
        for (std::size_t l = 0; l < layer_count; ++l) {
            if (checkpoint_layers) {
                const Variable dependencies[] = {weights[l], biases[l]};
                h = checkpoint(h, dependencies,
                               [this, l](const Variable& x) { return layer(l, x); });
            } else {
                h = layer(l, h);
            }
        }
        return cross_entropy(h, targets);
    }

    [[nodiscard]] std::size_t parameter_bytes() const {
        std::size_t total = 0;
        for (std::size_t l = 0; l < layer_count; ++l) {
            total += (weights[l].value().numel() + biases[l].value().numel()) * sizeof(float);
        }
        return total;
    }

    void clear_gradients() {
        for (std::size_t l = 0; l < layer_count; ++l) {
            weights[l].zero_gradient();
            biases[l].zero_gradient();
        }
    }
};

std::size_t live_bytes() {
    return cpu_memory_statistics().live_bytes;
}

double mib(std::size_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

void report(Model& model, bool checkpoint_layers) {
    model.clear_gradients();
    const auto start = std::chrono::steady_clock::now();
    const std::size_t before_forward = live_bytes();
    Variable loss = model.loss(checkpoint_layers);
    const std::size_t before_backward = live_bytes();
    const std::size_t saved = before_backward - before_forward;
    reset_cpu_peak_memory();
    loss.backward();
    const std::size_t peak_extra = cpu_memory_statistics().peak_live_bytes - before_backward;
    const std::size_t after_backward = live_bytes() - before_forward;
    const float loss_value = loss.value().item();
    loss = Variable();
    const std::size_t after_dropping = live_bytes() - before_forward;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::printf("%s\n", checkpoint_layers ? "checkpoint per layer" : "plain graph");
    std::printf("  loss                  %.6f (step %.2f s)\n", static_cast<double>(loss_value),
                seconds);
    std::printf("  parameters            %12zu B  %8.2f MiB\n", model.parameter_bytes(),
                mib(model.parameter_bytes()));
    std::printf("  saved activations     %12zu B  %8.2f MiB\n", saved, mib(saved));
    std::printf("  peak extra backward   %12zu B  %8.2f MiB\n", peak_extra, mib(peak_extra));
    std::printf("  live after backward   %12zu B  %8.2f MiB  (loss handle held)\n", after_backward,
                mib(after_backward));
    std::printf("  after dropping loss   %12zu B  %8.2f MiB  (leaf gradients)\n", after_dropping,
                mib(after_dropping));
    std::printf("  peak extra / saved    %12.3f\n",
                static_cast<double>(peak_extra) / static_cast<double>(saved));
    std::printf("  saved + peak extra    %12zu B  %8.2f MiB\n", saved + peak_extra,
                mib(saved + peak_extra));
}

}  // namespace

int main() {
    constexpr std::size_t activation = batch * width * sizeof(float);
    std::printf(
        "autograd memory report: MLP %zu layers, batch %zu, width %zu, gelu, "
        "cross_entropy over %zu classes\n",
        layer_count, batch, width, width);
    std::printf("one activation A = %zu B (%.2f MiB)\n\n", activation, mib(activation));
    Model model;
    report(model, false);
    std::printf("\n");
    report(model, true);
    return 0;
}
