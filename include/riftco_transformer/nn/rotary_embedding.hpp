#pragma once
// Rotary position embedding (RoPE), split-half ("rotate_half") form (spec ENGINE §12).
//
// For a head vector x of even width d and position p, with i < d/2:
//   angle_i = p · θ^(−2i/d)                       computed in double, cos/sin rounded to float
//   y_i       = x_i·cos_i − x_{i+d/2}·sin_i
//   y_{i+d/2} = x_{i+d/2}·cos_i + x_i·sin_i
// The VJP is the transposed rotation (dx_i = g_i·cos + g_{i+d/2}·sin, dx_{i+d/2} =
// g_{i+d/2}·cos − g_i·sin); here it falls out of the composition below, which is built from
// slice, multiply, subtract/add and concatenate, so every backend that runs those runs RoPE.
//
// GGUF stores llama-family query/key weights permuted for the interleaved (adjacent-pair)
// form; interchange/llama_import undoes that permutation so this one form serves every model.

#include <cstddef>
#include <span>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

// cos and sin of every (row, frequency) pair: [rows, d/2] each, row r at positions[r].
struct RotaryTables {
    Tensor cosine;
    Tensor sine;
};

// The one home of RoPE's argument rules: head_width even and > 0, theta finite and > 0
// (std::invalid_argument naming `operation` and the value).
void require_rotary_arguments(const char* operation, std::size_t head_width, double theta);

// Tables for the given positions (one row each, in order) on `backend`. An empty position
// list: std::invalid_argument.
[[nodiscard]] RotaryTables rotary_tables(std::span<const std::size_t> positions,
                                         std::size_t head_width, double theta,
                                         ExecutionBackend backend);

// x [B,H,T,d] with tables of T rows: every batch row and head uses position row t.
// x [R,H,1,d] with tables of R rows: row r uses table row r (the decode form).
// Any other shape pairing: std::invalid_argument.
[[nodiscard]] Variable apply_rotary_embedding(const Variable& x, const RotaryTables& tables);

}  // namespace riftco_transformer
