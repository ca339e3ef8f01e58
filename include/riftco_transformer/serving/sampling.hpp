#pragma once
// Choosing the next token from one position's logits (docs/ARCHITECTURE.md, 'Sampling'), at C
// speed. The rules are those of the Python package's reference samplers (serving/sampling.py),
// which compute the same ids from the same values: every quantity below is a double computed
// by the same operations in the same order (exp and log from the C library, no contraction
// into fused multiply-adds), so the two agree bit for bit and each is the other's oracle.
//
// With v the logits as doubles:
//   1. mask: an id whose mask byte is 0 is never drawn and takes no place in the top-k;
//   2. penalties: the repetition penalty (CTRL) over the distinct ids of the context,
//      v / r where v > 0, else v · r; then for each id generated c > 0 times (the context
//      after prompt_length), v −= presence + frequency · c;
//   3. greedy (temperature 0): the first maximum (the lowest id among equals), done;
//   4. top_k (0 = off): the k best candidates by (−v, id);
//   5. weights w = exp((v − h) / T), h the highest candidate value (its weight is 1);
//   6. top_p (1 = off): total = Σ w in ascending id order; the shortest prefix of the
//      candidates ranked by (−v, id) whose running sum (in that order) reaches top_p · total
//      (all of them when rounding keeps it short);
//   7. min_p (0 = off): the candidates with w ≥ min_p (the top weight being 1);
//   8. the draw: u = draw_unit(seed, draw_index) in [0, 1); walking the kept ids in ascending
//      order, the first whose running sum of w exceeds u · Σ w (same order); when rounding
//      leaves none, the last kept id of positive weight.
// Walking ids in ascending order (not ranked) makes a draw without top-k or top-p one pass
// over V with no sort.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace riftco_transformer {

struct SamplingOptions {
    double temperature = 0.0;         // 0: greedy; else finite and > 0
    std::size_t top_k = 0;            // 0: off; at most V
    double top_p = 1.0;               // (0, 1]
    double min_p = 0.0;               // [0, 1]
    double repetition_penalty = 1.0;  // finite and > 0
    double presence_penalty = 0.0;    // [−2, 2]
    double frequency_penalty = 0.0;   // [−2, 2]
    std::uint64_t seed = 0;
};

// std::invalid_argument naming the field and the value for anything outside the domains above.
void require_sampling_options(const SamplingOptions& options);

// The uniform number in [0, 1) of a seed's draw_index-th draw: the top 53 bits of splitmix64's
// output for the state seed + (draw_index + 1) · 0x9E3779B97F4A7C15, times 2^−53.
[[nodiscard]] double draw_unit(std::uint64_t seed, std::uint64_t draw_index) noexcept;

struct SamplingInput {
    std::span<const float> logits;           // V finite values
    std::span<const std::uint32_t> context;  // every id seen so far (prompt, then generated)
    std::size_t prompt_length = 0;           // <= context.size()
    std::span<const std::uint8_t> mask;      // empty, or V bytes (0: ruled out)
    std::uint64_t draw_index = 0;
};

// The chosen id. std::invalid_argument: empty logits, a non-finite logit or an id of the
// context >= V (each named with its index), prompt_length > context size, a mask of another
// length or one that allows nothing, top_k > V; plus require_sampling_options.
[[nodiscard]] std::uint32_t sample_token(const SamplingInput& input,
                                         const SamplingOptions& options);

// The log-softmax of the raw logits at `token` (h + log Σ exp(v − h), summed in ascending id
// order), and the `top_count` most likely ids with theirs (ranked by (−v, id)).
struct TokenLogProbabilities {
    double log_probability = 0.0;
    std::vector<std::uint32_t> top_ids;
    std::vector<double> top_log_probabilities;
};
// std::invalid_argument: empty or non-finite logits, token >= V, top_count > V.
[[nodiscard]] TokenLogProbabilities token_log_probabilities(std::span<const float> logits,
                                                            std::uint32_t token,
                                                            std::size_t top_count);

// One row of a batched step's sampling (sample_rows): the row's inputs (logits are the row of
// the batch, cut to `vocabulary_limit` ids when that is nonzero: a padded vocabulary) and what
// it wants back.
struct RowSampling {
    SamplingInput input;  // input.logits is filled by sample_rows
    SamplingOptions options;
    std::size_t vocabulary_limit = 0;  // 0: every id of the row
    bool sample = true;                // false: the row only fed tokens
    bool log_probability = false;
    std::size_t top_count = 0;
};
struct RowSample {
    bool finite = true;   // false: the row's logits were not all finite (no id)
    bool failed = false;  // true: sampling ran out of memory (no id)
    std::uint32_t token = 0;
    TokenLogProbabilities log_probabilities;
};

// Checks every row's inputs against rows of `vocabulary` logits, before anything runs (so a
// batched step can refuse them before it changes a session): the rules of sample_token and
// token_log_probabilities except finiteness, named with the row. std::invalid_argument.
void require_row_samplings(std::span<const RowSampling> rows, std::size_t vocabulary);

// Samples every row of `logits` ([rows.size(), vocabulary], host) that asks, in parallel over
// rows (OpenMP). A row whose logits are not all finite gets finite = false, one whose sampling
// ran out of memory failed = true; nothing throws. The rows must have passed
// require_row_samplings.
[[nodiscard]] std::vector<RowSample> sample_rows(std::span<const float> logits,
                                                 std::size_t vocabulary,
                                                 std::span<const RowSampling> rows);

}  // namespace riftco_transformer
