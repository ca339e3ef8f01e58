#pragma once
// Multilinear maps (docs/ARCHITECTURE.md, 'Programmed models'): the fixed programs a
// program-augmented model runs.
//
// A map of arity k with output dimension O and input dimensions d_1..d_k is a tensor
// T ∈ R^{O×d_1×…×d_k}, stored output-major (row-major over [O, d_1, ..., d_k]), acting as
//   y_o = Σ_{j_1..j_k} T[o, j_1, ..., j_k] · x^(1)_{j_1} · … · x^(k)_{j_k}
// (arity 0: the constant y = T). Maps are immutable values in host double precision; models
// copy and lower them at construction and never borrow them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace riftco_transformer {

// The most elements (O·Πd_i) a map may have: 2^24 doubles (128 MiB), checked before anything
// is allocated.
inline constexpr std::size_t max_multilinear_map_elements = std::size_t{1} << 24;

class MultilinearMap {
  public:
    // The map from every element, output-major. std::invalid_argument: output_dimension 0, an
    // input dimension 0 (named by index), a value count other than O·Πd_i, a non-finite value
    // (named by flat index). std::overflow_error: O·Πd_i overflows or exceeds
    // max_multilinear_map_elements.
    [[nodiscard]] static MultilinearMap from_dense(std::size_t output_dimension,
                                                   std::vector<std::size_t> input_dimensions,
                                                   std::span<const double> values);
    // The map from its non-zero elements at flat output-major indices (any order). The same
    // shape rules, and std::invalid_argument for: index and value counts that differ, an index
    // past the element count (std::out_of_range), a repeated index, an explicit zero, a
    // non-finite value. No entries: the zero map.
    [[nodiscard]] static MultilinearMap from_sparse(std::size_t output_dimension,
                                                    std::vector<std::size_t> input_dimensions,
                                                    std::span<const std::uint64_t> indices,
                                                    std::span<const double> values);

    [[nodiscard]] std::size_t output_dimension() const noexcept { return output_dimension_; }
    [[nodiscard]] const std::vector<std::size_t>& input_dimensions() const noexcept {
        return input_dimensions_;
    }
    [[nodiscard]] std::size_t arity() const noexcept { return input_dimensions_.size(); }
    [[nodiscard]] std::size_t element_count() const noexcept { return values_.size(); }
    // Every element, output-major.
    [[nodiscard]] std::span<const double> values() const noexcept { return values_; }
    [[nodiscard]] std::size_t nonzero_count() const noexcept;

    // y for one input vector per argument (sizes d_i), in double: the reference the lowered
    // networks are checked against. Wrong count or size: std::invalid_argument.
    [[nodiscard]] std::vector<double> evaluate(std::span<const std::vector<double>> inputs) const;

  private:
    MultilinearMap(std::size_t output_dimension, std::vector<std::size_t> input_dimensions,
                   std::vector<double> values)
        : output_dimension_(output_dimension),
          input_dimensions_(std::move(input_dimensions)),
          values_(std::move(values)) {}

    std::size_t output_dimension_;
    std::vector<std::size_t> input_dimensions_;
    std::vector<double> values_;
};

// O·Πd_i after the shape rules above ("<operation>: ..." messages), before any allocation.
[[nodiscard]] std::size_t checked_multilinear_element_count(
    const char* operation, std::size_t output_dimension,
    std::span<const std::size_t> input_dimensions, std::size_t limit);

}  // namespace riftco_transformer
