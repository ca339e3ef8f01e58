#pragma once
// The C ABI boundary: every exported function runs its body inside guarded(), which clears the
// thread's error text, catches every exception and maps it to a status
// (docs/ARCHITECTURE.md, 'The C ABI'):
//   BackendUnavailableError -> RT_STATUS_BACKEND_UNAVAILABLE
//   std::invalid_argument, std::domain_error -> RT_STATUS_INVALID_ARGUMENT
//   std::out_of_range -> RT_STATUS_OUT_OF_RANGE
//   std::overflow_error -> RT_STATUS_OVERFLOW
//   std::bad_alloc -> RT_STATUS_OUT_OF_MEMORY
//   any other std::exception (logic_error: stale/consumed graph, pinned model) ->
//     RT_STATUS_RUNTIME_ERROR
//   anything else -> RT_STATUS_UNKNOWN_ERROR
// The message is "<function>: <what()>", truncated to 1023 bytes.
// Also here: argument checks shared by every family, and the two output protocols (size-
// prefixed structs, the (out, capacity, *required) variable-size output).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "riftco_transformer/c_api.h"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer::c_api {

void clear_last_error() noexcept;
rt_status report_current_exception(const char* function) noexcept;
// The calling thread's text ("" when the last status-returning call succeeded).
const char* last_error() noexcept;

template <typename Body>
rt_status guarded(const char* function, Body&& body) noexcept {
    clear_last_error();
    try {
        body();
        return RT_STATUS_OK;
    } catch (...) {
        return report_current_exception(function);
    }
}

// Throws std::invalid_argument("<argument> is NULL") for a null pointer.
template <typename Pointer>
void require_pointer(const Pointer* pointer, const char* argument) {
    if (pointer == nullptr) {
        throw std::invalid_argument(std::string(argument) + " is NULL");
    }
}

// Handles: a NULL handle is an invalid argument naming it.
template <typename Handle>
Handle& require_handle(Handle* handle, const char* argument) {
    require_pointer(handle, argument);
    return *handle;
}

// An input array of `count` elements: NULL only with count 0.
template <typename Element>
std::span<const Element> input_array(const Element* data, std::uint64_t count,
                                     const char* argument) {
    if (data == nullptr && count != 0) {
        throw std::invalid_argument(std::string(argument) + " is NULL but its count is " +
                                    std::to_string(count));
    }
    // NOLINTNEXTLINE(bugprone-sizeof-expression): Element may be a pointer (an array of them).
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(Element)) {
        throw std::overflow_error(std::string(argument) + " count " + std::to_string(count) +
                                  " exceeds the address space");
    }
    if (count == 0) {
        return {};
    }
    return {data, static_cast<std::size_t>(count)};
}

// Writes one scalar output: `out` must not be NULL (std::invalid_argument naming it). The value
// is computed, and its handle checked, before out is; nothing is written on any failure.
template <typename Value>
void set_output(Value* out, std::type_identity_t<Value> value, const char* argument) {
    require_pointer(out, argument);
    *out = value;
}

// A known backend value (else std::invalid_argument); availability is not checked here.
ExecutionBackend backend_from_value(std::int32_t value, const char* argument);

// Variable-size output protocol (header "Conventions"), the one place it is decided: validates
// out/capacity, sets *required = count, and returns false for a size query (out == NULL) or
// true when the caller should now write `count` elements to out; a capacity below count is
// std::out_of_range with out untouched. Call only after every input has been validated.
bool begin_output(const void* out, std::uint64_t capacity, std::uint64_t* required,
                  std::size_t count);

template <typename Element>
void write_output(std::span<const Element> elements, Element* out, std::uint64_t capacity,
                  std::uint64_t* required) {
    if (begin_output(out, capacity, required, elements.size())) {
        std::copy(elements.begin(), elements.end(), out);
    }
}

// Text with its terminating NUL.
void write_text(std::string_view text, char* out, std::uint64_t capacity, std::uint64_t* required);

// A tensor's values through the same protocol, copied straight from backend storage.
void write_tensor_values(const Tensor& tensor, float* out, std::uint64_t capacity,
                         std::uint64_t* required);
void write_shape(const Shape& shape, std::uint64_t* out, std::uint64_t capacity,
                 std::uint64_t* required);

// Size-prefixed structs. `minimum` is the first published size of the struct: a declared
// size below it is std::invalid_argument. Only the prefix both sides know is touched.
void require_struct_size(std::uint64_t declared, std::size_t minimum, const char* argument);

// *_init: writes the defaults into the caller's declared prefix and keeps its struct_size.
template <typename Struct>
void initialise_struct(Struct* destination, std::uint64_t declared, std::size_t minimum,
                       const Struct& defaults, const char* argument) {
    require_pointer(destination, argument);
    require_struct_size(declared, minimum, argument);
    const auto bytes = static_cast<std::size_t>(std::min<std::uint64_t>(declared, sizeof(Struct)));
    std::memcpy(static_cast<void*>(destination), &defaults, bytes);
    destination->struct_size = declared;
}

// Reads a caller's struct: the declared prefix over the defaults.
template <typename Struct>
Struct read_struct(const Struct* source, std::size_t minimum, const Struct& defaults,
                   const char* argument) {
    require_pointer(source, argument);
    require_struct_size(source->struct_size, minimum, argument);
    Struct result = defaults;
    const auto bytes =
        static_cast<std::size_t>(std::min<std::uint64_t>(source->struct_size, sizeof(Struct)));
    std::memcpy(static_cast<void*>(&result), source, bytes);
    return result;
}

// Writes an output struct into the caller's declared prefix (its struct_size is kept).
template <typename Struct>
void write_struct(Struct* destination, const Struct& value, std::size_t minimum,
                  const char* argument) {
    require_pointer(destination, argument);
    require_struct_size(destination->struct_size, minimum, argument);
    const std::uint64_t declared = destination->struct_size;
    const auto bytes = static_cast<std::size_t>(std::min<std::uint64_t>(declared, sizeof(Struct)));
    std::memcpy(static_cast<void*>(destination), &value, bytes);
    destination->struct_size = declared;
}

// A uint64 count or dimension as std::size_t (std::overflow_error if it does not fit).
std::size_t to_size(std::uint64_t value, const char* argument);

// A uint32 0/1 field as bool; anything else: std::invalid_argument "<argument>: must be 0 or 1,
// not <value>".
bool flag_from_value(std::uint32_t value, const char* argument);

}  // namespace riftco_transformer::c_api
