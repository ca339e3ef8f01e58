#pragma once
// Parameters are trainable leaves: a Variable created with requires_gradient = true is a
// shared handle on its leaf node, so a module, an optimizer and a parameter list can all hold
// the same parameter and each outlive the others. Lists are ordered: the order is a contract
// used by optimizers, state capture and artifacts.

#include <string>
#include <vector>

#include "riftco_transformer/core/autograd/variable.hpp"

namespace riftco_transformer {

struct NamedParameter {
    std::string name;    // dot-qualified, e.g. "blocks.0.attention.query.weight"
    Variable parameter;  // a leaf that requires gradients
};

using ParameterList = std::vector<NamedParameter>;

}  // namespace riftco_transformer
