// Allreduce bandwidth: our ProcessGroup::allreduce_sum (MPI_Allreduce under the deadline
// watchdog) beside a plain MPI_Allreduce loop, same sizes, same run, and our non-blocking
// start_allreduce_sum + wait (MPI_Iallreduce, what the gradient buckets use).
//
//   mpirun -n 2 --oversubscribe build/mpi/tests/mpi_allreduce_bench
//
// Per size: the median of 15 timed repetitions (after 3 warm-up ones), as the time of one
// in-place float32 sum over the world and as algorithm bandwidth (bytes / time). Rank 0
// prints; "ratio" is ours / plain in time (1.00 = the same speed).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "riftco_transformer/distributed/process_group.hpp"

using namespace riftco_transformer;

namespace {

template <typename Body>
double median_seconds(Body&& body) {
    std::vector<double> times;
    for (int repetition = 0; repetition < 18; ++repetition) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto start = std::chrono::steady_clock::now();
        body();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (repetition >= 3)
            times.push_back(seconds);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

}  // namespace

int main() {
    const auto group = create_process_group();  // initialises MPI
    const int rank = group->rank();
    if (rank == 0) {
        std::printf(
            "allreduce (float32 sum) over %d ranks: ours (MPI_Allreduce + watchdog) vs "
            "plain MPI_Allreduce\n",
            group->world_size());
        std::printf("%12s %12s %12s %10s %10s %7s %12s %7s\n", "bytes", "ours us", "plain us",
                    "ours GB/s", "plain GB/s", "ratio", "nonblock us", "ratio");
    }
    for (std::size_t bytes = 4096; bytes <= (std::size_t{64} << 20); bytes *= 4) {
        std::vector<float> values(bytes / sizeof(float), 1.0F);
        const double ours = median_seconds([&] { group->allreduce_sum(std::span<float>(values)); });
        const double plain = median_seconds([&] {
            MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT,
                          MPI_SUM, MPI_COMM_WORLD);
        });
        const double nonblocking =
            median_seconds([&] { group->start_allreduce_sum(std::span<float>(values))->wait(); });
        if (rank == 0) {
            std::printf("%12zu %12.1f %12.1f %10.2f %10.2f %7.2f %12.1f %7.2f\n", bytes, ours * 1e6,
                        plain * 1e6, static_cast<double>(bytes) / ours / 1e9,
                        static_cast<double>(bytes) / plain / 1e9, ours / plain, nonblocking * 1e6,
                        nonblocking / plain);
        }
    }
    return 0;
}
