#pragma once
// Deferred device errors and the host-read counter (see adapter.hpp, "Sync points").

#include <exception>
#include <string_view>

#include "riftco_transformer/core/backend.hpp"

namespace riftco_transformer::detail {

// Records a value-domain error an asynchronous kernel of `backend` found. The first one
// recorded since the last sync point of that backend wins; later ones are dropped (the
// outputs after the first failure are unspecified anyway).
void defer_error(ExecutionBackend backend, std::exception_ptr error) noexcept;

// A sync point of `backend`: counts one host read, then rethrows (and clears) the deferred
// error, if any, with its original category and message.
void synchronize(ExecutionBackend backend);

}  // namespace riftco_transformer::detail
