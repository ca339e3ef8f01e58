#include "optim/moment_layout.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace riftco_transformer::detail {

std::vector<MomentPageExtent> moment_page_extents(std::span<const std::size_t> element_counts,
                                                  AdamStateStorage storage, std::size_t page_size) {
    std::vector<MomentPageExtent> pages;
    for (std::size_t parameter = 0; parameter < element_counts.size(); ++parameter) {
        const std::size_t count = element_counts[parameter];
        if (storage == AdamStateStorage::Contiguous) {
            pages.push_back({parameter, 0, count});
            continue;
        }
        for (std::size_t offset = 0; offset < count;
             offset += std::min(page_size, count - offset)) {
            pages.push_back({parameter, offset, std::min(page_size, count - offset)});
        }
    }
    return pages;
}

std::size_t checked_state_value_count(std::span<const std::size_t> element_counts) {
    constexpr std::size_t limit = std::numeric_limits<std::size_t>::max();
    constexpr std::size_t bytes_per_value = 2 * sizeof(float);  // one first and one second moment
    std::size_t total = 0;
    for (const std::size_t count : element_counts) {
        if (count > limit - total) {
            throw std::overflow_error(
                "Adam: the parameters hold more scalars than std::size_t "
                "can count");
        }
        total += count;
    }
    if (total > limit / bytes_per_value) {
        throw std::overflow_error("Adam: the moment state of " + std::to_string(total) +
                                  " scalars (2·N·4 bytes) overflows std::size_t");
    }
    return total;
}

}  // namespace riftco_transformer::detail
