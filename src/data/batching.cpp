#include "riftco_transformer/data/batching.hpp"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace riftco_transformer {

std::uint64_t uniform_index(std::mt19937_64& generator, std::uint64_t bound) {
    if (bound == 0) {
        throw std::invalid_argument("uniform_index: bound is 0");
    }
    // Largest multiple of bound that fits: draws at or above it are rejected.
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                                std::numeric_limits<std::uint64_t>::max() % bound;
    std::uint64_t draw = generator();
    while (draw >= limit)
        draw = generator();
    return draw % bound;
}

WindowBatchSource::WindowBatchSource(std::vector<std::vector<std::uint32_t>> sequences,
                                     std::size_t batch_size, std::size_t context_size,
                                     std::uint64_t seed, WindowSampling sampling)
    : batch_size_(batch_size), context_size_(context_size), sampling_(sampling), generator_(seed) {
    if (batch_size == 0 || context_size == 0) {
        std::ostringstream message;
        message << "WindowBatchSource: batch_size " << batch_size << " and context_size "
                << context_size << " must be positive";
        throw std::invalid_argument(message.str());
    }
    if (sampling != WindowSampling::WindowUniform && sampling != WindowSampling::ExampleUniform) {
        throw std::invalid_argument("WindowBatchSource: unknown sampling value " +
                                    std::to_string(static_cast<std::uint32_t>(sampling)));
    }
    for (auto& sequence : sequences) {
        if (sequence.size() >= context_size + 1) {
            first_window_.push_back(total_windows_);
            total_windows_ += sequence.size() - context_size;
            sequences_.push_back(std::move(sequence));
        }
    }
    if (sequences_.empty()) {
        std::ostringstream message;
        message << "WindowBatchSource: no sequence has at least context_size + 1 = "
                << context_size + 1 << " tokens";
        throw std::invalid_argument(message.str());
    }
}

WindowBatchSource::WindowBatchSource(std::vector<std::uint32_t> tokens, std::size_t batch_size,
                                     std::size_t context_size, std::uint64_t seed)
    : WindowBatchSource(std::vector<std::vector<std::uint32_t>>{std::move(tokens)}, batch_size,
                        context_size, seed, WindowSampling::WindowUniform) {}

TrainingBatch WindowBatchSource::next() {
    TrainingBatch batch;
    batch.batch_size = batch_size_;
    batch.context_size = context_size_;
    batch.inputs.resize(batch_size_ * context_size_);
    batch.targets.resize(batch_size_ * context_size_);
    for (std::size_t row = 0; row < batch_size_; ++row) {
        std::size_t sequence_index = 0;
        std::uint64_t start = 0;
        if (sampling_ == WindowSampling::WindowUniform) {
            const std::uint64_t window = uniform_index(generator_, total_windows_);
            // The sequence whose window range holds `window`.
            sequence_index = static_cast<std::size_t>(
                std::upper_bound(first_window_.begin(), first_window_.end(), window) -
                first_window_.begin() - 1);
            start = window - first_window_[sequence_index];
        } else {
            sequence_index = static_cast<std::size_t>(uniform_index(generator_, sequences_.size()));
            start = uniform_index(generator_, sequences_[sequence_index].size() - context_size_);
        }
        const std::uint32_t* window_begin = sequences_[sequence_index].data() + start;
        std::copy_n(window_begin, context_size_,
                    batch.inputs.begin() + static_cast<std::ptrdiff_t>(row * context_size_));
        std::copy_n(window_begin + 1, context_size_,
                    batch.targets.begin() + static_cast<std::ptrdiff_t>(row * context_size_));
    }
    ++batches_emitted_;
    return batch;
}

std::vector<TrainingBatch> fixed_batches(BatchSource& source, std::size_t count) {
    std::vector<TrainingBatch> batches;
    batches.reserve(count);
    for (std::size_t i = 0; i < count; ++i)
        batches.push_back(source.next());
    return batches;
}

}  // namespace riftco_transformer
