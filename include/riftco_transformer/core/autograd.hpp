#pragma once
// Reverse-mode autograd: Variable, differentiable operations, custom_gradient, checkpoint.

#include "riftco_transformer/core/autograd/custom_gradient.hpp"
#include "riftco_transformer/core/autograd/operations.hpp"
#include "riftco_transformer/core/autograd/variable.hpp"
