#pragma once
// The global gradient norm ‖g‖ = √(Σ g²) over every scalar of every parameter
// (docs/ARCHITECTURE.md, 'Adam'): the algorithm Adam clips with, available for logging.

#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer {

// Accumulated in double as an overflow-safe scaled sum of squares (a running pair (scale,
// Σ(|x|/scale)²) with norm = scale·√sum), so gradients whose squares overflow float, or
// underflow it, still give the exact norm. A parameter backward never reached contributes
// zeros, and so does a frozen one (requires_gradient false: it has no gradient). An empty
// list has norm 0.
// Errors, with nothing changed: an empty Variable, a non-leaf or a parameter listed twice:
// std::invalid_argument; a gradient whose shape differs from its value, or any value or
// gradient on a backend other than the first parameter's: std::logic_error; a NaN or ±inf
// gradient element: std::domain_error naming the parameter and the element.
[[nodiscard]] double global_gradient_norm(const ParameterList& parameters);

}  // namespace riftco_transformer
