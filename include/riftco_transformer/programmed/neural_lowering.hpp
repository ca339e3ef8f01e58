#pragma once
// Neural lowering (docs/ARCHITECTURE.md, 'Programmed models'): a multilinear map as a
// differentiable network.
//
// Strategies compute the same map in different shapes of network:
//   linear            arity 1:  y = T·x                                   (one linear layer)
//   linear_attention  arity 2:  A = Σ over the key input of T, then y = A·q (an attention-like
//                               product with identity kernel and no softmax; the query is
//                               the input on T's axis attention_query_axis, 1 or 2)
//   dense             any arity: successive contractions, last input first; arity 0 is the
//                               constant T broadcast over the leading shape
//   auto              linear for arity 1, linear_attention for arity 2, dense otherwise
// An explicit strategy that cannot run the map's arity is rejected, or with
// UnsupportedLoweringPolicy::DenseFallback lowered as dense.
//
// The coefficients are T in float32: compiled (T itself; ExactFloat32 rejects any element that
// does not round-trip through float, Rounded keeps the largest |float(t) − t|) or seeded
// random U(±scale). They are a frozen leaf (no gradient, not a parameter) or, trainable, the
// parameter "coefficients".

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/nn/module.hpp"
#include "riftco_transformer/programmed/multilinear_map.hpp"

namespace riftco_transformer {

// Values are the C ABI's (never renumbered).
enum class LoweringStrategy : std::uint32_t {
    Auto = 0,
    Dense = 1,
    Linear = 2,
    LinearAttention = 3
};
enum class UnsupportedLoweringPolicy : std::uint32_t { Reject = 0, DenseFallback = 1 };
enum class CoefficientPrecision : std::uint32_t { ExactFloat32 = 0, Rounded = 1 };
enum class CoefficientInitialization : std::uint32_t { Compiled = 0, RandomUniform = 1 };

struct NeuralLoweringConfig {
    LoweringStrategy strategy = LoweringStrategy::Auto;
    UnsupportedLoweringPolicy unsupported = UnsupportedLoweringPolicy::Reject;
    CoefficientPrecision precision = CoefficientPrecision::ExactFloat32;
    CoefficientInitialization initialization = CoefficientInitialization::Compiled;
    float random_scale = 0.02F;  // RandomUniform: U(−scale, scale); finite and > 0
    std::uint32_t random_seed = 42;
    bool trainable = false;
    std::size_t max_coefficient_elements = std::size_t{1} << 24;
    std::optional<std::size_t> attention_query_axis =
        std::nullopt;  // unset: axis 1 (linear_attention)
};

class LoweredMultilinearMap final : public Module {
  public:
    // Copies and lowers `map` on `backend`. std::invalid_argument: an unknown enum value; a
    // strategy that cannot run the arity under Reject (names both); attention_query_axis set
    // for another strategy or not 1 or 2; random_scale not finite and > 0; max_coefficient_
    // elements 0; an element that is not exactly a float under ExactFloat32, or beyond float
    // range under either precision (named by flat index). std::overflow_error: more elements
    // than max_coefficient_elements.
    LoweredMultilinearMap(const MultilinearMap& map, const NeuralLoweringConfig& config,
                          ExecutionBackend backend);

    // inputs: one per argument, each `leading` + [d_i] (identical leading shapes, rank >= 1)
    // -> `leading` + [O]. Arity 0 takes no inputs and broadcasts T over `leading`. A wrong
    // count or shape: std::invalid_argument naming the input.
    [[nodiscard]] Variable forward(std::span<const Variable> inputs, const Shape& leading) const;

    [[nodiscard]] LoweringStrategy strategy() const noexcept { return strategy_; }  // resolved
    [[nodiscard]] std::size_t attention_query_axis() const noexcept { return query_axis_; }
    // Largest |float(t) − t| over the compiled coefficients (0 when exact or random).
    [[nodiscard]] double max_rounding_error() const noexcept { return max_rounding_error_; }
    [[nodiscard]] const Variable& coefficients() const noexcept { return coefficients_; }
    [[nodiscard]] std::size_t output_dimension() const noexcept { return output_dimension_; }
    [[nodiscard]] const std::vector<std::size_t>& input_dimensions() const noexcept {
        return input_dimensions_;
    }

  protected:
    // Frozen coefficients are not a parameter: they move here.
    void prepare_transfer(ExecutionBackend backend,
                          std::vector<std::function<void()>>& commits) override;

  private:
    std::size_t output_dimension_;
    std::vector<std::size_t> input_dimensions_;
    LoweringStrategy strategy_;
    std::size_t query_axis_ = 1;
    double max_rounding_error_ = 0.0;
    Variable coefficients_;  // [O, d_1, ..., d_k]
};

// "auto", "dense", "linear", "linear_attention".
[[nodiscard]] const char* lowering_strategy_name(LoweringStrategy strategy);

}  // namespace riftco_transformer
