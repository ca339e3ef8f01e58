#include "c_api/boundary.hpp"

#include <array>
#include <exception>
#include <new>
#include <vector>

namespace riftco_transformer::c_api {
namespace {

constexpr std::size_t error_capacity = 1024;  // 1023 bytes of text and the NUL
thread_local std::array<char, error_capacity> last_error_text{};

void set_last_error(const char* function, std::string_view detail) noexcept {
    std::string_view prefix(function);
    std::size_t length = 0;
    const auto append = [&](std::string_view piece) {
        const std::size_t count = std::min(piece.size(), error_capacity - 1 - length);
        std::memcpy(last_error_text.data() + length, piece.data(), count);
        length += count;
    };
    append(prefix);
    append(": ");
    append(detail);
    last_error_text[length] = '\0';
}

}  // namespace

void clear_last_error() noexcept {
    last_error_text[0] = '\0';
}

rt_status report_current_exception(const char* function) noexcept {
    try {
        throw;
    } catch (const BackendUnavailableError& error) {
        set_last_error(function, error.what());
        return RT_STATUS_BACKEND_UNAVAILABLE;
    } catch (const std::invalid_argument& error) {
        set_last_error(function, error.what());
        return RT_STATUS_INVALID_ARGUMENT;
    } catch (const std::domain_error& error) {
        set_last_error(function, error.what());
        return RT_STATUS_INVALID_ARGUMENT;
    } catch (const std::out_of_range& error) {
        set_last_error(function, error.what());
        return RT_STATUS_OUT_OF_RANGE;
    } catch (const std::overflow_error& error) {
        set_last_error(function, error.what());
        return RT_STATUS_OVERFLOW;
    } catch (const std::bad_alloc&) {
        set_last_error(function, "out of memory");
        return RT_STATUS_OUT_OF_MEMORY;
    } catch (const std::exception& error) {
        set_last_error(function, error.what());
        return RT_STATUS_RUNTIME_ERROR;
    } catch (...) {
        set_last_error(function, "unknown non-standard exception");
        return RT_STATUS_UNKNOWN_ERROR;
    }
}

const char* last_error() noexcept {
    return last_error_text.data();
}

ExecutionBackend backend_from_value(std::int32_t value, const char* argument) {
    if (value < RT_BACKEND_CPU || value > RT_BACKEND_PJRT) {
        throw std::invalid_argument(std::string(argument) + ": unknown backend value " +
                                    std::to_string(value));
    }
    return static_cast<ExecutionBackend>(value);
}

void write_text(std::string_view text, char* out, std::uint64_t capacity, std::uint64_t* required) {
    std::vector<char> with_terminator(text.begin(), text.end());
    with_terminator.push_back('\0');
    write_output<char>(with_terminator, out, capacity, required);
}

bool begin_output(const void* out, std::uint64_t capacity, std::uint64_t* required,
                  std::size_t count) {
    require_pointer(required, "required");
    if (out == nullptr && capacity != 0) {
        throw std::invalid_argument("out is NULL but capacity is " + std::to_string(capacity));
    }
    *required = count;
    if (out == nullptr) {
        return false;
    }
    if (capacity < count) {
        throw std::out_of_range("capacity " + std::to_string(capacity) + " is below the " +
                                std::to_string(count) + " elements required");
    }
    return true;
}

void write_tensor_values(const Tensor& tensor, float* out, std::uint64_t capacity,
                         std::uint64_t* required) {
    if (begin_output(out, capacity, required, tensor.numel())) {
        tensor.copy_to_host(std::span<float>(out, tensor.numel()));
    }
}

void write_shape(const Shape& shape, std::uint64_t* out, std::uint64_t capacity,
                 std::uint64_t* required) {
    std::vector<std::uint64_t> dimensions(shape.begin(), shape.end());
    write_output<std::uint64_t>(dimensions, out, capacity, required);
}

void require_struct_size(std::uint64_t declared, std::size_t minimum, const char* argument) {
    if (declared < minimum) {
        throw std::invalid_argument(std::string(argument) + "->struct_size " +
                                    std::to_string(declared) + " is below the minimum " +
                                    std::to_string(minimum));
    }
}

bool flag_from_value(std::uint32_t value, const char* argument) {
    if (value > 1) {
        throw std::invalid_argument(std::string(argument) + ": must be 0 or 1, not " +
                                    std::to_string(value));
    }
    return value == 1;
}

std::size_t to_size(std::uint64_t value, const char* argument) {
    if (value > std::numeric_limits<std::size_t>::max()) {
        throw std::overflow_error(std::string(argument) + " " + std::to_string(value) +
                                  " does not fit in size_t");
    }
    return static_cast<std::size_t>(value);
}

}  // namespace riftco_transformer::c_api
