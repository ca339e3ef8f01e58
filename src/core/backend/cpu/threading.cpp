#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/backend/cpu/block_kernels.hpp"
#include "core/backend/cpu/gemm.hpp"
#include "core/backend/cpu/nf4_kernels.hpp"
#include "riftco_transformer/core/threading.hpp"

namespace riftco_transformer {
namespace {

constexpr const char* thread_count_variable = "RIFTCO_TRANSFORMER_NUM_THREADS";

// 0 until the first query resolves the environment (or an explicit override).
std::atomic<std::size_t> configured_thread_count{0};
std::once_flag environment_once;
std::string environment_error;  // set once, under environment_once

std::size_t hardware_threads() {
    const unsigned reported = std::thread::hardware_concurrency();
    return reported == 0 ? 1 : reported;
}

void apply(std::size_t thread_count) {
    configured_thread_count.store(thread_count);
    detail::gemm_set_thread_count(thread_count);
}

void resolve_environment() {
    const char* text = std::getenv(thread_count_variable);
    if (text == nullptr || *text == '\0') {
        apply(hardware_threads());
        return;
    }
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value <= 0 || value > 4096) {
        environment_error = std::string("cpu_thread_count: ") + thread_count_variable + "='" +
                            text + "' is not a positive integer thread count (1..4096)";
        return;
    }
    apply(static_cast<std::size_t>(value));
}

}  // namespace

std::size_t cpu_thread_count() {
    std::size_t count = configured_thread_count.load(std::memory_order_relaxed);
    if (count != 0) {
        return count;
    }
    std::call_once(environment_once, resolve_environment);
    count = configured_thread_count.load();
    if (count == 0) {
        throw std::invalid_argument(environment_error);
    }
    return count;
}

void set_cpu_thread_count(std::size_t thread_count) {
    if (thread_count == 0 || thread_count > 4096) {
        throw std::invalid_argument("set_cpu_thread_count: thread_count " +
                                    std::to_string(thread_count) + " is not in 1..4096");
    }
    std::call_once(environment_once, [] {});  // an explicit choice wins over the environment
    apply(thread_count);
}

std::string cpu_info() {
    return std::string("gemm=") + detail::gemm_implementation_name() + "; packed=nf4 " +
           detail::active_nf4_kernels().name + ", q8_0/q4_0/q4_1/q5_0/q4_k/q5_k/q6_k/f16/bf16 " +
           detail::active_block_kernels().name + "; threads=" + std::to_string(cpu_thread_count());
}

}  // namespace riftco_transformer
