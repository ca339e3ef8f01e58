#pragma once
// What an optimizer needs of its parameters beyond Variable's value semantics: the live
// value and gradient tensors of each leaf, so that one batched request reads and updates
// every parameter in place (no parameter is copied per step), and the effects of such an
// update. For optim/ and code like it; everything else uses Variable.

#include <string_view>

#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

// A window onto the graph node behind a variable handle (valid while any handle of it lives).
struct LeafView {
    Tensor& value;
    Tensor& gradient;  // singular until a backward pass reached the leaf
    bool leaf;         // false for an operation's result
    bool requires_gradient;
    std::string_view operation;  // the producing operation of a non-leaf ("" for a leaf)
    const void* identity;        // equal for two handles of one variable
};

// The view of a defined variable (std::logic_error naming `operation` otherwise).
[[nodiscard]] LeafView leaf_view(const Variable& variable, std::string_view operation);

// After an in-place update of a leaf's value: a new version, so graphs that read the old
// value fail at backward with std::logic_error, and no gradient (as Variable::set_value).
void mark_leaf_updated(const Variable& leaf);

}  // namespace riftco_transformer
