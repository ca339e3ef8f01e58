#pragma once
// Raw tensor operations (no autograd). Every function validates shapes, backends and
// arguments first, then calls exactly one backend capability; results are new tensors on the
// inputs' backend. Error categories follow docs/ARCHITECTURE.md, 'Error categories':
//   std::invalid_argument  shape/rank/backend/argument mismatch
//   std::out_of_range      bad axis or index
//   std::domain_error      values outside an operation's domain (found by the kernel)
//   std::overflow_error    sizes or results that do not fit
//   std::logic_error       a singular (moved-from) tensor used as input
//   std::runtime_error     the backend is unavailable or lacks the capability

#include "riftco_transformer/core/tensor_ops/attention.hpp"
#include "riftco_transformer/core/tensor_ops/elementwise.hpp"
#include "riftco_transformer/core/tensor_ops/indexing.hpp"
#include "riftco_transformer/core/tensor_ops/layout.hpp"
#include "riftco_transformer/core/tensor_ops/loss.hpp"
#include "riftco_transformer/core/tensor_ops/matmul.hpp"
#include "riftco_transformer/core/tensor_ops/normalization.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"
#include "riftco_transformer/core/tensor_ops/quantized_linear.hpp"
#include "riftco_transformer/core/tensor_ops/reduction.hpp"
#include "riftco_transformer/core/tensor_ops/softmax.hpp"
