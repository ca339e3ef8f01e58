#pragma once
// Where Adam's moments live (docs/ARCHITECTURE.md, 'Adam'): pages of the flat scalar order,
// each inside one parameter.

#include <cstddef>
#include <span>
#include <vector>

#include "riftco_transformer/optim/adam_options.hpp"

namespace riftco_transformer::detail {

struct MomentPageExtent {
    std::size_t parameter = 0;  // index in the parameter list
    std::size_t offset = 0;     // first element of that parameter the page covers
    std::size_t count = 0;      // elements in the page (> 0)
};

// Contiguous: one page per parameter covering all of it. Paged: ceil(numel / page_size)
// pages per parameter, in order, the last one shorter; a page never crosses two parameters.
// element_counts are each > 0; page_size > 0.
[[nodiscard]] std::vector<MomentPageExtent> moment_page_extents(
    std::span<const std::size_t> element_counts, AdamStateStorage storage, std::size_t page_size);

// N = Σ element_counts, checking that N and the state payload 2·N·sizeof(float) bytes fit in
// std::size_t (std::overflow_error otherwise).
[[nodiscard]] std::size_t checked_state_value_count(std::span<const std::size_t> element_counts);

}  // namespace riftco_transformer::detail
