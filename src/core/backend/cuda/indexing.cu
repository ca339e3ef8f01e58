// Row gather and scatter-add kernels.
//
// scatter_add_rows is deterministic, without floating-point atomics: the ids are stably
// radix-sorted with their positions (CUB), so each destination row's sources form one run in
// index order; then one thread per (run, column) adds its run's upstream values into a float
// accumulator starting at 0, in index order — the CPU reference's arithmetic, so the result
// is bit-identical to it. A run is serial work: an id repeated k times costs k adds per column.

#include <cub/device/device_radix_sort.cuh>

#include <limits>
#include <stdexcept>
#include <string>

#include "core/backend/cuda/kernels.hpp"
#include "core/backend/cuda/launch.cuh"
#include "core/backend/cuda/row_kernels.hpp"

namespace riftco_transformer::detail::cuda {
namespace {

constexpr std::size_t scratch_alignment = 256;

std::size_t aligned(std::size_t bytes) {
    return (bytes + scratch_alignment - 1) / scratch_alignment * scratch_alignment;
}

__global__ void gather_kernel(const float* table, std::size_t rows, std::size_t width,
                              const std::uint32_t* ids, std::size_t count, float* out,
                              unsigned long long* first_failure) {
    const std::size_t total = count * width;
    for (std::size_t item = first_index(); item < total; item += grid_stride()) {
        const std::size_t i = item / width;
        const std::size_t column = item % width;
        const std::size_t row = ids[i];
        if (row >= rows) {
            if (column == 0) {
                atomicMin(first_failure, static_cast<unsigned long long>(i));
            }
            out[item] = 0.0F;
            continue;
        }
        out[item] = table[row * width + column];
    }
}

__global__ void iota_kernel(std::uint32_t* values, std::size_t count) {
    for (std::size_t i = first_index(); i < count; i += grid_stride()) {
        values[i] = static_cast<std::uint32_t>(i);
    }
}

// keys: the ids sorted (stably), positions: their index positions. One thread per (p, column)
// where p starts a run of equal keys.
__global__ void run_sum_kernel(const float* upstream, const std::uint32_t* keys,
                               const std::uint32_t* positions, std::size_t count, std::size_t rows,
                               std::size_t width, float* out, unsigned long long* first_failure) {
    const std::size_t total = count * width;
    for (std::size_t item = first_index(); item < total; item += grid_stride()) {
        const std::size_t p = item / width;
        const std::size_t column = item % width;
        const std::uint32_t row = keys[p];
        if (p > 0 && keys[p - 1] == row) {
            continue;  // not the start of a run
        }
        if (row >= rows) {
            if (column == 0) {
                // The run's first position is its smallest (the sort is stable).
                atomicMin(first_failure, static_cast<unsigned long long>(positions[p]));
            }
            continue;
        }
        float accumulator = 0.0F;
        for (std::size_t q = p; q < count && keys[q] == row; ++q) {
            accumulator += upstream[static_cast<std::size_t>(positions[q]) * width + column];
        }
        out[static_cast<std::size_t>(row) * width + column] = accumulator;
    }
}

// runtime_error "CUDA <what> failed: <error name>: <error text>" (runtime.hpp's check, which
// the kernels do not see).
void check_status(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
        throw std::runtime_error(std::string("CUDA ") + what + " failed: " +
                                 cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
    }
}

// Only the key bits an id can use: fewer radix passes for small tables.
int key_bits(std::uint32_t max_id) {
    int end_bit = 1;
    while (end_bit < 32 && (max_id >> end_bit) != 0U) {
        ++end_bit;
    }
    return end_bit;
}

// The sort's scratch for `count` keys of key_bits(max_id) bits (its size depends on both).
std::size_t sort_scratch_bytes(std::size_t count, std::uint32_t max_id) {
    std::size_t bytes = 0;
    check_status(
        ::cub::DeviceRadixSort::SortPairs(
            nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
            static_cast<std::uint32_t*>(nullptr), static_cast<const std::uint32_t*>(nullptr),
            static_cast<std::uint32_t*>(nullptr), static_cast<int>(count), 0, key_bits(max_id)),
        "cub::DeviceRadixSort::SortPairs (scratch size)");
    return bytes;
}

void require_int_count(std::size_t count) {
    if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
        throw std::length_error("scatter_add_rows: more than INT_MAX indices on CUDA");
    }
}

}  // namespace

void gather_rows(const float* table, std::size_t rows, std::size_t width, const std::uint32_t* ids,
                 std::size_t count, float* out, unsigned long long* first_failure,
                 cudaStream_t stream) {
    gather_kernel<<<blocks_for(count * width), threads_per_block, 0, stream>>>(
        table, rows, width, ids, count, out, first_failure);
    check_launch("gather_rows");
}

std::size_t scatter_add_scratch_bytes(std::size_t count, std::uint32_t max_id) {
    require_int_count(count);
    return 3 * aligned(count * sizeof(std::uint32_t)) + sort_scratch_bytes(count, max_id);
}

void scatter_add_rows(const float* upstream, const std::uint32_t* ids, std::size_t count,
                      std::uint32_t max_id, std::size_t rows, std::size_t width, float* out,
                      void* scratch, std::size_t scratch_bytes, unsigned long long* first_failure,
                      cudaStream_t stream) {
    require_int_count(count);
    check_status(cudaMemsetAsync(out, 0, rows * width * sizeof(float), stream),
                 "cudaMemsetAsync (scatter_add_rows)");
    auto* base = static_cast<unsigned char*>(scratch);
    const std::size_t id_bytes = aligned(count * sizeof(std::uint32_t));
    auto* positions_in = reinterpret_cast<std::uint32_t*>(base);
    auto* keys_out = reinterpret_cast<std::uint32_t*>(base + id_bytes);
    auto* positions_out = reinterpret_cast<std::uint32_t*>(base + 2 * id_bytes);
    void* sort_scratch = base + 3 * id_bytes;
    std::size_t sort_bytes = scratch_bytes - 3 * id_bytes;

    iota_kernel<<<blocks_for(count), threads_per_block, 0, stream>>>(positions_in, count);
    check_launch("scatter_add_rows (positions)");
    const int end_bit = key_bits(max_id);
    check_status(::cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, ids, keys_out,
                                                   positions_in, positions_out,
                                                   static_cast<int>(count), 0, end_bit, stream),
                 "cub::DeviceRadixSort::SortPairs");
    run_sum_kernel<<<blocks_for(count * width), threads_per_block, 0, stream>>>(
        upstream, keys_out, positions_out, count, rows, width, out, first_failure);
    check_launch("scatter_add_rows");
}

}  // namespace riftco_transformer::detail::cuda
