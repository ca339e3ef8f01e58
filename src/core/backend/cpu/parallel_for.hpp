#pragma once
// Row-parallel loops on the CPU backend's one shared pool (OpenMP). OpenBLAS (OpenMP build)
// runs on the same threads, and we never call it from inside a parallel region, so the two
// never oversubscribe the cores.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <mutex>

#include <omp.h>

#include "riftco_transformer/core/threading.hpp"

namespace riftco_transformer::detail {

// Calls body(begin, end) on disjoint chunks covering [0, count). Work below
// `minimum_items_per_thread` per thread stays on the calling thread. The first exception a
// chunk throws is rethrown after every chunk finished.
template <typename Body>
void parallel_for(std::size_t count, std::size_t minimum_items_per_thread, Body&& body) {
    if (count == 0) {
        return;
    }
    const std::size_t wanted = std::max<std::size_t>(1, minimum_items_per_thread);
    const std::size_t threads =
        std::min(cpu_thread_count(), std::max<std::size_t>(1, count / wanted));
    if (threads <= 1 || omp_in_parallel()) {
        body(std::size_t{0}, count);
        return;
    }
    std::exception_ptr failure;
    std::mutex failure_mutex;
#pragma omp parallel num_threads(static_cast <int>(threads))
    {
        const auto thread = static_cast<std::size_t>(omp_get_thread_num());
        const auto team = static_cast<std::size_t>(omp_get_num_threads());
        const std::size_t begin = count * thread / team;
        const std::size_t end = count * (thread + 1) / team;
        if (begin < end) {
            try {
                body(begin, end);
            } catch (...) {
                const std::lock_guard<std::mutex> lock(failure_mutex);
                if (!failure) {
                    failure = std::current_exception();
                }
            }
        }
    }
    if (failure) {
        std::rethrow_exception(failure);
    }
}

// Work per item in "float touches" -> the minimum items per thread that make threading pay.
[[nodiscard]] constexpr std::size_t items_per_thread_for(std::size_t floats_per_item) {
    constexpr std::size_t floats_per_thread = 1U << 15U;
    return std::max<std::size_t>(1, floats_per_thread / std::max<std::size_t>(1, floats_per_item));
}

}  // namespace riftco_transformer::detail
