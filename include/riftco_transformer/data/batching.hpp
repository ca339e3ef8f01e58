#pragma once
// Next-token training windows (docs/ARCHITECTURE.md, 'Training windows').
//
// A window of context T starting at s is inputs = c[s, s+T) and targets = c[s+1, s+T]. A
// sequence of N tokens has N − T valid starts (N >= T + 1 is required). Rows are sampled
// uniformly and independently, with replacement, by a private generator seeded separately
// from model initialisation, so the same tokens, sizes and seed give the same batches on every
// platform (the integer draws are ours, not std::uniform_int_distribution's).

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace riftco_transformer {

struct TrainingBatch {
    std::size_t batch_size = 0;
    std::size_t context_size = 0;
    std::vector<std::uint32_t> inputs;   // [batch_size, context_size], row-major
    std::vector<std::uint32_t> targets;  // inputs shifted by one token
};

// A uniform integer in [0, bound) from raw 64-bit draws (rejection sampling, no modulo bias).
[[nodiscard]] std::uint64_t uniform_index(std::mt19937_64& generator, std::uint64_t bound);

class BatchSource {
  public:
    virtual ~BatchSource() = default;
    [[nodiscard]] virtual TrainingBatch next() = 0;
    [[nodiscard]] virtual std::size_t batch_size() const noexcept = 0;
    [[nodiscard]] virtual std::size_t context_size() const noexcept = 0;
};

// How windows are drawn from several sequences.
enum class WindowSampling : std::uint32_t {
    WindowUniform = 0,   // uniform over every window of every sequence
    ExampleUniform = 1,  // a sequence uniformly, then a window uniformly inside it
};

// Windows never cross sequence boundaries; sequences shorter than T + 1 are dropped.
// batch_size or context_size 0: std::invalid_argument; no usable sequence:
// std::invalid_argument ("at least context_size + 1 tokens").
class WindowBatchSource final : public BatchSource {
  public:
    WindowBatchSource(std::vector<std::vector<std::uint32_t>> sequences, std::size_t batch_size,
                      std::size_t context_size, std::uint64_t seed,
                      WindowSampling sampling = WindowSampling::WindowUniform);
    // One flat sequence (RandomWindowBatchSource).
    WindowBatchSource(std::vector<std::uint32_t> tokens, std::size_t batch_size,
                      std::size_t context_size, std::uint64_t seed);

    [[nodiscard]] TrainingBatch next() override;
    [[nodiscard]] std::size_t batch_size() const noexcept override { return batch_size_; }
    [[nodiscard]] std::size_t context_size() const noexcept override { return context_size_; }
    [[nodiscard]] std::uint64_t window_count() const noexcept { return total_windows_; }
    [[nodiscard]] std::uint64_t batches_emitted() const noexcept { return batches_emitted_; }

  private:
    std::vector<std::vector<std::uint32_t>> sequences_;  // usable ones only
    std::vector<std::uint64_t> first_window_;            // prefix sums of window counts
    std::uint64_t total_windows_ = 0;
    std::size_t batch_size_;
    std::size_t context_size_;
    WindowSampling sampling_;
    std::mt19937_64 generator_;
    std::uint64_t batches_emitted_ = 0;
};

// `count` batches drawn from `source` (a deterministic evaluation set when the source has its
// own seed).
[[nodiscard]] std::vector<TrainingBatch> fixed_batches(BatchSource& source, std::size_t count);

}  // namespace riftco_transformer
