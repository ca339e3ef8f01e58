// CPU fused softmax cross-entropy: one pass for the row max, one for exp and its sum, one to
// write the base gradient; the loss is summed in double over fixed row blocks. Rows outside
// the time window, or unselected by a mask, are skipped and get an exactly zero gradient.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/backend/cpu/cpu_adapter.hpp"
#include "core/backend/cpu/cpu_storage.hpp"
#include "core/backend/cpu/parallel_for.hpp"
#include "core/backend/cpu/vector_math.hpp"

namespace riftco_transformer::detail {
namespace {
constexpr std::size_t loss_row_block = 16;
}  // namespace

void CpuLoss::cross_entropy(const Tensor& logits, const IndexTensor& target_ids, LossWindow window,
                            Tensor& loss, Tensor& gradient) const {
    // logits [B,T,V], window rows r = b·T + t, t in [offset, offset+count), N = B·count ->
    //   loss = −(1/N)·Σ_r (z_{r,y} − max_r − log Σ_j exp(z_rj − max_r))
    //   gradient[r] = (softmax(z_r) − onehot(y_r))/N on window rows, 0 on the others
    const std::size_t vocabulary = logits.shape().back();
    const std::size_t rows = logits.numel() / vocabulary;
    const std::size_t positions = rows / window.time_extent * window.count;
    const std::uint32_t* selected =
        window.selected != nullptr ? cpu_indices(*window.selected) : nullptr;
    const std::size_t averaged = selected != nullptr ? window.selected_count : positions;
    const float* z = cpu_data(logits);
    const std::uint32_t* targets = cpu_indices(target_ids);
    float* grad = cpu_output(gradient);
    // The n-th window position -> its row of logits.
    const auto row_of = [&window](std::size_t n) {
        return n / window.count * window.time_extent + window.offset + n % window.count;
    };
    if (positions != rows) {
        for (std::size_t b = 0; b < rows / window.time_extent; ++b) {
            float* batch_row = grad + b * window.time_extent * vocabulary;
            std::fill(batch_row, batch_row + window.offset * vocabulary, 0.0F);
            std::fill(batch_row + (window.offset + window.count) * vocabulary,
                      batch_row + window.time_extent * vocabulary, 0.0F);
        }
    }
    const auto inverse_count = static_cast<float>(1.0 / static_cast<double>(averaged));
    const std::size_t blocks = (positions + loss_row_block - 1) / loss_row_block;
    std::vector<double> block_loss(blocks, 0.0);
    FirstFailingRow non_finite_target;
    parallel_for(blocks, items_per_thread_for(loss_row_block * vocabulary * 3),
                 [&](std::size_t begin, std::size_t end) {
                     for (std::size_t block = begin; block < end; ++block) {
                         const std::size_t last = std::min(positions, (block + 1) * loss_row_block);
                         double total = 0.0;
                         for (std::size_t n = block * loss_row_block; n < last; ++n) {
                             const std::size_t r = row_of(n);
                             const float* row = z + r * vocabulary;
                             float* g = grad + r * vocabulary;
                             if (selected != nullptr && selected[r] == 0) {
                                 std::fill(g, g + vocabulary, 0.0F);
                                 continue;
                             }
                             const float target_logit = row[targets[r]];
                             if (!std::isfinite(target_logit)) {
                                 non_finite_target.record(r);
                                 continue;
                             }
                             const float max = row_max(row, vocabulary);
                             for (std::size_t j = 0; j < vocabulary; ++j)
                                 g[j] = fast_exp(row[j] - max);
                             const double sum = row_sum(g, vocabulary);
                             total += std::log(sum) + static_cast<double>(max) - target_logit;
                             const auto scale = static_cast<float>(1.0 / sum) * inverse_count;
                             for (std::size_t j = 0; j < vocabulary; ++j)
                                 g[j] *= scale;
                             g[targets[r]] -= inverse_count;
                         }
                         block_loss[block] = total;
                     }
                 });
    if (non_finite_target.any()) {
        const std::size_t n = non_finite_target.row();
        std::ostringstream message;
        message << "cross_entropy: logits at position " << n << ", target " << targets[n]
                << " is not finite (" << z[n * vocabulary + targets[n]] << ")";
        throw std::domain_error(message.str());
    }
    double total = 0.0;
    for (const double value : block_loss)
        total += value;
    const double mean_loss = total / static_cast<double>(averaged);
    if (!std::isfinite(mean_loss) || mean_loss > static_cast<double>(FLT_MAX)) {
        std::ostringstream message;
        message << "cross_entropy: mean loss " << mean_loss
                << " is not representable as a finite float";
        throw std::overflow_error(message.str());
    }
    cpu_output(loss)[0] = static_cast<float>(mean_loss);
}

}  // namespace riftco_transformer::detail
