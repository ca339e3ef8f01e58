// Memory frugality of the autograd layer (docs/ARCHITECTURE.md, 'Autograd': gradients only on
// leaves, intermediates freed as consumed, frozen leaves pruned), measured with the CPU backend's
// exact accounting of live tensor storage (cpu_memory_statistics: requested bytes).
//
// The model: an 8-layer MLP, batch B = 1024, width D = 128,
//   h_{l+1} = gelu(h_l·W_l + broadcast(b_l)),  loss = cross_entropy(h_8, targets) over D classes.
// One activation A = B·D·4 bytes = 512 KiB. Each layer's forward leaves four A-sized node
// values alive (matmul, broadcast_to, add, gelu; the rules' captures share that storage), and
// cross_entropy keeps its base gradient (one more A): saved ≈ 33 A ≈ 16.5 MiB.
// Parameters: 8·(D·D + D)·4 bytes ≈ 516 KiB ≈ 1 A.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <vector>

#include "riftco_transformer/core/autograd.hpp"
#include "riftco_transformer/core/memory.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

constexpr std::size_t batch = 1024;
constexpr std::size_t width = 128;
constexpr std::size_t layer_count = 8;
constexpr std::size_t activation_bytes = batch * width * sizeof(float);  // A = 512 KiB

std::size_t live_bytes() {
    return cpu_memory_statistics().live_bytes;
}

std::size_t bytes_of(const Variable& leaf) {
    return leaf.value().numel() * sizeof(float);
}

class MlpMemory : public ::testing::Test {
  public:
    void SetUp() override {
        for (std::size_t l = 0; l < layer_count; ++l) {
            const auto seed = static_cast<std::uint32_t>(100 + 2 * l);
            weights.emplace_back(
                Tensor({width, width}, testing::pseudo_random(width * width, -0.15F, 0.15F, seed)));
            biases.emplace_back(
                Tensor({width}, testing::pseudo_random(width, -0.1F, 0.1F, seed + 1)));
        }
        targets.resize(batch);
        for (std::size_t i = 0; i < batch; ++i)
            targets[i] = static_cast<std::uint32_t>(i % width);
    }

    [[nodiscard]] Variable layer(std::size_t l, const Variable& h) const {
        return gelu(matmul(h, weights[l]) + broadcast_to(biases[l], {batch, width}));
    }

    [[nodiscard]] Variable forward(bool checkpoint_layers = false) const {
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
            total += bytes_of(weights[l]) + bytes_of(biases[l]);
        }
        return total;
    }

    // The data: not differentiable, so no input gradient is ever allocated.
    Variable input{Tensor({batch, width}, testing::pseudo_random(batch* width, -1.0F, 1.0F, 7U)),
                   false};
    std::vector<Variable> weights;
    std::vector<Variable> biases;
    std::vector<std::uint32_t> targets;
};

// One forward + backward, measured in phases.
struct Phases {
    std::size_t saved = 0;           // live after forward − live before forward
    std::size_t backward_extra = 0;  // peak during backward − live before backward
    std::size_t after_backward = 0;  // live after backward (loss handle alive) − before forward
    std::size_t after_dropping_loss = 0;  // same, after the loss handle is released
};

// `explicit_seed`: backward(ones) instead of backward() (whose implicit seed the loss rule may
// rely on being 1).
Phases measure(MlpMemory& model, BackwardOptions options = {}, bool checkpoint_layers = false,
               bool explicit_seed = false) {
    // Start without gradient buffers, so that the phases see every gradient allocated.
    for (std::size_t l = 0; l < layer_count; ++l) {
        if (model.weights[l].requires_gradient())
            model.weights[l].zero_gradient();
        if (model.biases[l].requires_gradient())
            model.biases[l].zero_gradient();
    }
    Phases phases;
    const Tensor ones = Tensor::full(Shape{}, 1.0F);  // the loss's shape: a scalar
    const std::size_t before_forward = live_bytes();
    Variable loss = model.forward(checkpoint_layers);
    const std::size_t before_backward = live_bytes();
    phases.saved = before_backward - before_forward;
    reset_cpu_peak_memory();
    if (explicit_seed) {
        loss.backward(ones, options);
    } else {
        loss.backward(options);
    }
    phases.backward_extra = cpu_memory_statistics().peak_live_bytes - before_backward;
    phases.after_backward = live_bytes() - before_forward;
    loss = Variable();
    phases.after_dropping_loss = live_bytes() - before_forward;
    std::cout << "[ memory   ] saved " << phases.saved << " B, backward extra "
              << phases.backward_extra << " B, after backward " << phases.after_backward
              << " B, after dropping the loss " << phases.after_dropping_loss << " B\n";
    return phases;
}

}  // namespace

TEST_F(MlpMemory, ForwardSavesAboutFourActivationsPerLayer) {
    const Phases phases = measure(*this);
    // 33 A expected (see the header comment); allow the scalar loss and small statistics.
    EXPECT_GE(phases.saved, 33 * activation_bytes);
    EXPECT_LE(phases.saved, 33 * activation_bytes + 64 * 1024);
}

TEST_F(MlpMemory, BackwardPeakIsFarBelowTheSavedActivations) {
    const Phases phases = measure(*this);
    // With intermediates freed as consumed, the extra memory of backward is the parameter
    // gradients (≈ 1 A) plus the gradients in flight: the upstream of the node being
    // processed, its result(s) and a temporary of the rule — a handful of A at once,
    // whatever the depth. Budget: parameters + 6 A ≈ 3.5 MiB. A design that kept every
    // intermediate gradient until the end would need ≈ `saved` (33 A ≈ 16.5 MiB) more.
    const std::size_t budget = parameter_bytes() + 6 * activation_bytes;
    EXPECT_LE(phases.backward_extra, budget);
    EXPECT_LT(phases.backward_extra, phases.saved / 4);
    // The peak is at least what is live when backward returns: the saved tensors it has not
    // released (the loss handle holds the loss) and the leaf gradients it publishes. (Not the
    // leaf gradients on top of everything saved: the saved tensors go as the pass proceeds.)
    EXPECT_GE(phases.backward_extra + phases.saved, phases.after_backward);
    EXPECT_GE(phases.after_backward, parameter_bytes());
}

TEST_F(MlpMemory, UnderTheImplicitSeedTheLossPassesItsGradientOnWithoutScalingCopies) {
    // backward() seeds with 1, which the cross-entropy rule knows without reading it: it hands
    // on its saved gradient instead of multiplying it by a broadcast copy of the upstream (two
    // A-sized tensors). The gradients are the same bits either way.
    const Phases scaled = measure(*this, {}, false, true);
    std::vector<std::vector<float>> scaled_gradients;
    for (std::size_t l = 0; l < layer_count; ++l) {
        scaled_gradients.push_back(weights[l].gradient().to_host());
        scaled_gradients.push_back(biases[l].gradient().to_host());
    }
    const Phases implicit = measure(*this);
    for (std::size_t l = 0; l < layer_count; ++l) {
        EXPECT_EQ(weights[l].gradient().to_host(), scaled_gradients[2 * l]) << l;
        EXPECT_EQ(biases[l].gradient().to_host(), scaled_gradients[2 * l + 1]) << l;
    }
    EXPECT_EQ(implicit.saved, scaled.saved);
    // The scaled pass peaks at its two copies (2 A); the other peaks at about 1 A later on
    // (the leaf gradients, while the saved tensors go): a saving of one A, less a few bytes of
    // scalars.
    EXPECT_GE(scaled.backward_extra, 2 * activation_bytes);
    EXPECT_GE(scaled.backward_extra + 64, implicit.backward_extra + activation_bytes);
}

TEST_F(MlpMemory, ConsumedGraphReleasesSavedActivationsWhileTheLossHandleIsAlive) {
    const Phases phases = measure(*this);
    // Left after a non-retained pass: the parameter gradients (plus at most one stray
    // activation-sized tensor of slack), not the 33 A the forward pass saved.
    EXPECT_GE(phases.after_backward, parameter_bytes());
    EXPECT_LE(phases.after_backward, parameter_bytes() + activation_bytes);
}

TEST_F(MlpMemory, DroppingTheLossHandleLeavesExactlyTheLeafGradients) {
    const Phases phases = measure(*this);
    EXPECT_EQ(phases.after_dropping_loss, parameter_bytes());
}

TEST_F(MlpMemory, FrozenParameterGradientIsNeverAllocated) {
    constexpr std::size_t frozen = 3;
    weights[frozen].set_requires_gradient(false);
    reset_autograd_counters();
    const Phases phases = measure(*this);
    EXPECT_EQ(autograd_counters().matmul_right_gradients, layer_count - 1);
    EXPECT_FALSE(weights[frozen].requires_gradient());
    // Every other parameter got its gradient; the frozen weight's D·D·4 bytes are absent.
    EXPECT_EQ(phases.after_dropping_loss, parameter_bytes() - bytes_of(weights[frozen]));
    for (std::size_t l = 0; l < layer_count; ++l) {
        if (l != frozen) {
            EXPECT_TRUE(weights[l].has_gradient()) << "layer " << l;
        }
    }
    weights[frozen].set_requires_gradient(true);
    EXPECT_FALSE(weights[frozen].has_gradient());
}

TEST_F(MlpMemory, FreezingEveryWeightLeavesOnlyTheBiasGradients) {
    for (Variable& weight : weights)
        weight.set_requires_gradient(false);
    reset_autograd_counters();
    const Phases phases = measure(*this);
    EXPECT_EQ(autograd_counters().matmul_right_gradients, 0U);
    std::size_t bias_bytes = 0;
    for (const Variable& bias : biases)
        bias_bytes += bytes_of(bias);
    EXPECT_EQ(phases.after_dropping_loss, bias_bytes);
}

TEST_F(MlpMemory, RetainedGraphKeepsTheSavedActivationsAlive) {
    const std::size_t before_forward = live_bytes();
    Variable loss = forward();
    const std::size_t saved = live_bytes() - before_forward;
    loss.backward({.retain_graph = true});
    EXPECT_GE(live_bytes() - before_forward, saved + parameter_bytes());
    // ... so it can be differentiated again, to the same gradients.
    const std::vector<float> first = weights[0].gradient().to_host();
    loss.backward();
    EXPECT_TRUE(testing::bit_identical(weights[0].gradient().to_host(), first));
}

TEST_F(MlpMemory, CheckpointedLayersSaveOnlyTheirOutputs) {
    const Phases plain = measure(*this);
    const Phases checkpointed = measure(*this, {}, true);
    // Per layer only the output value (1 A instead of 4 A) stays: 8 A + the loss's 1 A.
    EXPECT_LE(checkpointed.saved, 9 * activation_bytes + 64 * 1024);
    EXPECT_LT(checkpointed.saved, plain.saved / 3);
    // Backward replays one layer at a time: on top of the leaf gradients it holds that
    // layer's replayed activations (4 A) and the replay's gradients in flight (a few A).
    EXPECT_LE(checkpointed.backward_extra, parameter_bytes() + 8 * activation_bytes);
    // Overall the peak (saved + backward extra) at least halves: ≈ 15 A against ≈ 35 A.
    EXPECT_LT(checkpointed.saved + checkpointed.backward_extra,
              (plain.saved + plain.backward_extra) / 2);
    EXPECT_EQ(checkpointed.after_dropping_loss, parameter_bytes());
}

TEST(CheckpointMemory, ForwardKeepsOnlyTheOutputOfTheCheckpointedBlock) {
    // A block of six [256,256] operations on a 256 KiB input: only its output survives.
    constexpr std::size_t rows = 256;
    constexpr std::size_t columns = 256;
    constexpr std::size_t tensor_bytes = rows * columns * sizeof(float);
    const Variable x(Tensor({rows, columns}, testing::pseudo_random(rows * columns)));
    const Variable w(Tensor({columns, columns}, testing::pseudo_random(columns * columns)));
    const auto block = [&w](const Variable& input) {
        return gelu(gelu(matmul(gelu(matmul(input, w)), w)) * input) + input;
    };
    const std::size_t before_plain = live_bytes();
    Variable plain = block(x);
    const std::size_t plain_saved = live_bytes() - before_plain;
    plain = Variable();
    const std::size_t before = live_bytes();
    const Variable dependencies[] = {w};
    Variable checkpointed = checkpoint(x, dependencies, block);
    EXPECT_EQ(live_bytes() - before, tensor_bytes);
    EXPECT_GE(plain_saved, 6 * tensor_bytes);
}

}  // namespace riftco_transformer
