#include "riftco_transformer/serving/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

// Every double below must be what the Python reference computes: this file is compiled with
// -ffp-contract=off (src/serving/sources.cmake), so no a·b + c becomes a fused multiply-add.

namespace riftco_transformer {
namespace {

constexpr const char* sample_operation = "sample_token";

[[noreturn]] void invalid(const std::string& message) {
    throw std::invalid_argument(std::string(sample_operation) + ": " + message);
}

std::string text(double value) {
    std::ostringstream out;
    out.precision(17);
    out << value;
    return out.str();
}

void require_finite_logits(std::span<const float> logits, const char* operation) {
    if (logits.empty()) {
        throw std::invalid_argument(std::string(operation) + ": logits is empty");
    }
    for (std::size_t i = 0; i < logits.size(); ++i) {
        if (!std::isfinite(logits[i])) {
            throw std::invalid_argument(std::string(operation) + ": logits[" + std::to_string(i) +
                                        "] = " + text(logits[i]) + " is not finite");
        }
    }
}

// Ranked by (−v, id): the higher value first, the lower id first among equals.
struct RankOrder {
    const std::vector<double>* values;
    bool operator()(std::uint32_t a, std::uint32_t b) const {
        const double x = (*values)[a];
        const double y = (*values)[b];
        return x > y || (x == y && a < b);
    }
};

}  // namespace

void require_sampling_options(const SamplingOptions& o) {
    if (!(std::isfinite(o.temperature) && o.temperature >= 0.0)) {
        invalid("temperature " + text(o.temperature) + " must be finite and >= 0 (0: greedy)");
    }
    if (!(o.top_p > 0.0 && o.top_p <= 1.0)) {
        invalid("top_p " + text(o.top_p) + " must be in (0, 1]");
    }
    if (!(o.min_p >= 0.0 && o.min_p <= 1.0)) {
        invalid("min_p " + text(o.min_p) + " must be in [0, 1]");
    }
    if (!(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0.0)) {
        invalid("repetition_penalty " + text(o.repetition_penalty) + " must be finite and > 0");
    }
    if (!(o.presence_penalty >= -2.0 && o.presence_penalty <= 2.0)) {
        invalid("presence_penalty " + text(o.presence_penalty) + " must be in [-2, 2]");
    }
    if (!(o.frequency_penalty >= -2.0 && o.frequency_penalty <= 2.0)) {
        invalid("frequency_penalty " + text(o.frequency_penalty) + " must be in [-2, 2]");
    }
    if (o.temperature == 0.0 && (o.top_k != 0 || o.top_p != 1.0 || o.min_p != 0.0)) {
        invalid("temperature 0 is greedy decoding, which takes no top_k, top_p or min_p");
    }
}

double draw_unit(std::uint64_t seed, std::uint64_t draw_index) noexcept {
    std::uint64_t z = seed + (draw_index + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
    z ^= z >> 31U;
    return static_cast<double>(z >> 11U) * 0x1.0p-53;
}

std::uint32_t sample_token(const SamplingInput& input, const SamplingOptions& options) {
    require_sampling_options(options);
    require_finite_logits(input.logits, sample_operation);
    const std::size_t vocabulary = input.logits.size();
    if (input.prompt_length > input.context.size()) {
        invalid("prompt_length " + std::to_string(input.prompt_length) + " exceeds the " +
                std::to_string(input.context.size()) + " context ids");
    }
    for (std::size_t i = 0; i < input.context.size(); ++i) {
        if (input.context[i] >= vocabulary) {
            invalid("context[" + std::to_string(i) + "] = " + std::to_string(input.context[i]) +
                    " is outside the vocabulary of " + std::to_string(vocabulary) + " logits");
        }
    }
    const bool masked = !input.mask.empty();
    if (masked && input.mask.size() != vocabulary) {
        invalid("the mask has " + std::to_string(input.mask.size()) + " entries for " +
                std::to_string(vocabulary) + " logits");
    }
    if (options.top_k > vocabulary) {
        invalid("top_k " + std::to_string(options.top_k) + " exceeds the vocabulary size " +
                std::to_string(vocabulary));
    }

    // 2. Penalties, in double.
    std::vector<double> values(input.logits.begin(), input.logits.end());
    if (options.repetition_penalty != 1.0) {
        std::vector<bool> seen(vocabulary, false);
        for (const std::uint32_t id : input.context) {
            if (!seen[id]) {
                seen[id] = true;
                const double v = values[id];
                values[id] =
                    v > 0.0 ? v / options.repetition_penalty : v * options.repetition_penalty;
            }
        }
    }
    if (options.presence_penalty != 0.0 || options.frequency_penalty != 0.0) {
        std::unordered_map<std::uint32_t, std::size_t> counts;
        for (std::size_t i = input.prompt_length; i < input.context.size(); ++i) {
            ++counts[input.context[i]];
        }
        for (const auto& [id, count] : counts) {
            const double penalty =
                options.presence_penalty + options.frequency_penalty * static_cast<double>(count);
            values[id] -= penalty;
        }
    }

    // 1. The candidates: the allowed ids, ascending.
    std::vector<std::uint32_t> candidates;
    candidates.reserve(masked ? 0 : vocabulary);
    for (std::size_t id = 0; id < vocabulary; ++id) {
        if (!masked || input.mask[id] != 0) {
            candidates.push_back(static_cast<std::uint32_t>(id));
        }
    }
    if (candidates.empty()) {
        invalid("the token mask allows no token");
    }

    // 3. Greedy: the first maximum.
    if (options.temperature == 0.0) {
        std::uint32_t best = candidates[0];
        for (const std::uint32_t id : candidates) {
            if (values[id] > values[best]) {
                best = id;
            }
        }
        return best;
    }

    const RankOrder rank{&values};
    // 4. Top-k, back in ascending id order.
    if (options.top_k != 0 && options.top_k < candidates.size()) {
        std::nth_element(candidates.begin(),
                         candidates.begin() + static_cast<std::ptrdiff_t>(options.top_k - 1),
                         candidates.end(), rank);
        candidates.resize(options.top_k);
        std::sort(candidates.begin(), candidates.end());
    }

    // 5. Weights.
    double highest = values[candidates[0]];
    for (const std::uint32_t id : candidates) {
        highest = std::max(highest, values[id]);
    }
    std::vector<double> weights(vocabulary, 0.0);
    for (const std::uint32_t id : candidates) {
        weights[id] = std::exp((values[id] - highest) / options.temperature);
    }

    // 6. Top-p: the shortest ranked prefix reaching top_p · total, found by sorting a growing
    // head of the ranking (the first m of a full ranking, so the running sums are the same).
    if (options.top_p < 1.0) {
        double total = 0.0;
        for (const std::uint32_t id : candidates) {
            total += weights[id];
        }
        const double target = options.top_p * total;
        std::vector<std::uint32_t> ranked = candidates;
        std::size_t head = std::min<std::size_t>(64, ranked.size());
        std::size_t kept = ranked.size();
        for (;;) {
            if (head < ranked.size()) {
                std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(head),
                                 ranked.end(), rank);
            }
            std::sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(head), rank);
            double cumulative = 0.0;
            std::size_t end = 0;
            while (end < head) {
                cumulative += weights[ranked[end++]];
                if (cumulative >= target) {
                    break;
                }
            }
            if (cumulative >= target) {
                kept = end;
                break;
            }
            if (head == ranked.size()) {
                break;  // rounding: the running sum fell just short; keep every candidate
            }
            head = std::min(ranked.size(), head * 4);
        }
        ranked.resize(kept);
        std::sort(ranked.begin(), ranked.end());
        candidates = std::move(ranked);
    }

    // 7. Min-p (the top weight is exactly 1).
    if (options.min_p > 0.0) {
        std::erase_if(candidates,
                      [&](std::uint32_t id) { return !(weights[id] >= options.min_p); });
    }

    // 8. The draw, walking ids in ascending order.
    double sum = 0.0;
    for (const std::uint32_t id : candidates) {
        sum += weights[id];
    }
    const double threshold = draw_unit(options.seed, input.draw_index) * sum;
    double cumulative = 0.0;
    std::uint32_t last_positive = candidates[0];
    for (const std::uint32_t id : candidates) {
        cumulative += weights[id];
        if (cumulative > threshold) {
            return id;
        }
        if (weights[id] > 0.0) {
            last_positive = id;
        }
    }
    return last_positive;
}

TokenLogProbabilities token_log_probabilities(std::span<const float> logits, std::uint32_t token,
                                              std::size_t top_count) {
    constexpr const char* operation = "token_log_probabilities";
    require_finite_logits(logits, operation);
    const std::size_t vocabulary = logits.size();
    if (token >= vocabulary) {
        throw std::invalid_argument(std::string(operation) + ": token " + std::to_string(token) +
                                    " is outside the vocabulary of " + std::to_string(vocabulary));
    }
    if (top_count > vocabulary) {
        throw std::invalid_argument(std::string(operation) + ": top_count " +
                                    std::to_string(top_count) + " exceeds the vocabulary of " +
                                    std::to_string(vocabulary));
    }
    double highest = logits[0];
    for (const float value : logits) {
        highest = std::max(highest, double{value});
    }
    double total = 0.0;
    for (const float value : logits) {
        total += std::exp(double{value} - highest);
    }
    const double normaliser = highest + std::log(total);
    TokenLogProbabilities result;
    result.log_probability = double{logits[token]} - normaliser;
    if (top_count != 0) {
        const std::vector<double> values(logits.begin(), logits.end());
        std::vector<std::uint32_t> ids(vocabulary);
        for (std::size_t id = 0; id < vocabulary; ++id) {
            ids[id] = static_cast<std::uint32_t>(id);
        }
        std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(top_count),
                          ids.end(), RankOrder{&values});
        ids.resize(top_count);
        result.top_log_probabilities.reserve(top_count);
        for (const std::uint32_t id : ids) {
            result.top_log_probabilities.push_back(values[id] - normaliser);
        }
        result.top_ids = std::move(ids);
    }
    return result;
}

void require_row_samplings(std::span<const RowSampling> rows, std::size_t vocabulary) {
    for (std::size_t r = 0; r < rows.size(); ++r) {
        const RowSampling& row = rows[r];
        const std::string name = "rows[" + std::to_string(r) + "]";
        const std::size_t limit = row.vocabulary_limit == 0 ? vocabulary : row.vocabulary_limit;
        if (limit > vocabulary) {
            throw std::invalid_argument(name + ": vocabulary_limit " + std::to_string(limit) +
                                        " exceeds the " + std::to_string(vocabulary) + " logits");
        }
        if (row.top_count > limit) {
            throw std::invalid_argument(name + ": top_count " + std::to_string(row.top_count) +
                                        " exceeds the vocabulary of " + std::to_string(limit));
        }
        if (!row.sample) {
            continue;
        }
        // sample_token's rules on a stand-in row of finite logits.
        try {
            require_sampling_options(row.options);
            if (row.input.prompt_length > row.input.context.size()) {
                invalid("prompt_length " + std::to_string(row.input.prompt_length) +
                        " exceeds the " + std::to_string(row.input.context.size()) +
                        " context ids");
            }
            for (std::size_t i = 0; i < row.input.context.size(); ++i) {
                if (row.input.context[i] >= limit) {
                    invalid("context[" + std::to_string(i) +
                            "] = " + std::to_string(row.input.context[i]) +
                            " is outside the vocabulary of " + std::to_string(limit) + " logits");
                }
            }
            if (!row.input.mask.empty()) {
                if (row.input.mask.size() != limit) {
                    invalid("the mask has " + std::to_string(row.input.mask.size()) +
                            " entries for " + std::to_string(limit) + " logits");
                }
                if (std::find_if(row.input.mask.begin(), row.input.mask.end(),
                                 [](std::uint8_t b) { return b != 0; }) == row.input.mask.end()) {
                    invalid("the token mask allows no token");
                }
            }
            if (row.options.top_k > limit) {
                invalid("top_k " + std::to_string(row.options.top_k) +
                        " exceeds the vocabulary size " + std::to_string(limit));
            }
        } catch (const std::invalid_argument& error) {
            throw std::invalid_argument(name + ": " + error.what());
        }
    }
}

std::vector<RowSample> sample_rows(std::span<const float> logits, std::size_t vocabulary,
                                   std::span<const RowSampling> rows) {
    std::vector<RowSample> results(rows.size());
    const auto count = static_cast<std::ptrdiff_t>(rows.size());
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
    for (std::ptrdiff_t r = 0; r < count; ++r) {
        const RowSampling& row = rows[static_cast<std::size_t>(r)];
        RowSample& result = results[static_cast<std::size_t>(r)];
        const std::size_t limit = row.vocabulary_limit == 0 ? vocabulary : row.vocabulary_limit;
        const std::span<const float> values =
            logits.subspan(static_cast<std::size_t>(r) * vocabulary, limit);
        result.finite =
            std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
        if (!result.finite || !row.sample) {
            continue;
        }
        try {  // the rows were checked: only allocation can fail here
            SamplingInput input = row.input;
            input.logits = values;
            result.token = sample_token(input, row.options);
            if (row.log_probability || row.top_count != 0) {
                result.log_probabilities =
                    token_log_probabilities(values, result.token, row.top_count);
            }
        } catch (...) {  // std::bad_alloc: reported, never thrown out of the parallel region
            result.failed = true;
        }
    }
    return results;
}

}  // namespace riftco_transformer
