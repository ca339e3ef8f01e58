// ABI version, status names, the thread's error text, and backend queries.

#include "c_api/boundary.hpp"
#include "riftco_transformer/core/threading.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

extern "C" {

uint32_t rt_abi_version(void) {
    return RT_ABI_VERSION;
}

const char* rt_status_string(rt_status status) {
    switch (status) {
        case RT_STATUS_OK:
            return "ok";
        case RT_STATUS_INVALID_ARGUMENT:
            return "invalid_argument";
        case RT_STATUS_OUT_OF_RANGE:
            return "out_of_range";
        case RT_STATUS_OVERFLOW:
            return "overflow";
        case RT_STATUS_BACKEND_UNAVAILABLE:
            return "backend_unavailable";
        case RT_STATUS_OUT_OF_MEMORY:
            return "out_of_memory";
        case RT_STATUS_RUNTIME_ERROR:
            return "runtime_error";
        case RT_STATUS_UNKNOWN_ERROR:
            return "unknown_error";
        default:
            return "unrecognized status";
    }
}

const char* rt_last_error(void) {
    return last_error();
}

rt_status rt_backend_is_available(int32_t backend, int32_t* out_available) {
    return guarded(__func__, [&] {
        const ExecutionBackend value = backend_from_value(backend, "backend");
        require_pointer(out_available, "out_available");
        *out_available = execution_backend_available(value) ? 1 : 0;
    });
}

rt_status rt_backend_name(int32_t backend, char* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const ExecutionBackend value = backend_from_value(backend, "backend");
        write_text(execution_backend_name(value), out, capacity, required);
    });
}

rt_status rt_backend_unavailability_reason(int32_t backend, char* out, uint64_t capacity,
                                           uint64_t* required) {
    return guarded(__func__, [&] {
        const ExecutionBackend value = backend_from_value(backend, "backend");
        write_text(execution_backend_unavailability_reason(value), out, capacity, required);
    });
}

rt_status rt_cpu_info(char* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] { write_text(cpu_info(), out, capacity, required); });
}

}  // extern "C"
