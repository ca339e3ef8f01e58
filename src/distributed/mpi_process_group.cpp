// The MPI process group (RIFTCO_TRANSFORMER_ENABLE_MPI=ON): MPI_COMM_WORLD of the launch.
//
// Collectives are MPI's own calls: the blocking ones (its tuned algorithms) and, for the
// gradient buckets that backward overlaps, MPI_Iallreduce, whose progress is driven by
// test() calls between backward's steps and by the final wait(). Their deadline is kept by a
// watchdog thread: each
// collective arms it with the group's timeout and disarms it on return. A blocked MPI call
// cannot be interrupted, so when a deadline passes the watchdog prints which collective on
// which rank timed out and ends the process with exit status 3; the launcher (mpirun) then
// ends every other rank of the job, whose own collectives could never complete. The watchdog
// calls no MPI function, so the thread level stays SERIALIZED.
//
// An MPI error code (MPI_ERRORS_RETURN is set on the world) is a DistributedError; it marks
// the group broken (later collectives throw at once) and makes the exit handler end the job
// with MPI_Abort instead of waiting in MPI_Finalize for a rank that failed.

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "riftco_transformer/distributed/process_group.hpp"

namespace riftco_transformer::detail {
namespace {

// MPI is initialised once per process, by whichever group comes first; the exit handler
// finalises it (or aborts the job when a collective failed).
struct MpiRuntime {
    std::once_flag once;
    bool initialised_here = false;
    bool broken = false;
    std::string init_error;
};

MpiRuntime& runtime() {
    static MpiRuntime state;
    return state;
}

void at_exit() {
    MpiRuntime& state = runtime();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return;
    if (state.broken) {
        std::fflush(stdout);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (state.initialised_here)
        MPI_Finalize();
}

std::string error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
        return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<std::size_t>(length));
}

// Ends the process when an armed deadline passes (see the file comment). Arming and
// disarming are two atomic stores, so a collective of a few microseconds pays nothing for
// its deadline; the thread checks ten times a second (more often for timeouts under a
// second), which is the precision of the deadline.
class Watchdog {
  public:
    Watchdog(std::chrono::milliseconds timeout, int rank, int size)
        : timeout_(timeout),
          period_(std::clamp(timeout / 10, std::chrono::milliseconds(1),
                             std::chrono::milliseconds(100))),
          rank_(rank),
          size_(size),
          thread_([this] { run(); }) {}

    ~Watchdog() {
        {
            const std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        stop_.notify_all();
        thread_.join();
    }

    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    void arm(const char* operation) noexcept {
        operation_.store(operation, std::memory_order_relaxed);
        deadline_.store(now_ns() + timeout_ns(), std::memory_order_release);
    }

    void disarm() noexcept { deadline_.store(0, std::memory_order_release); }

  private:
    static std::int64_t now_ns() noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }
    [[nodiscard]] std::int64_t timeout_ns() const noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count();
    }

    void run() {
        std::unique_lock lock(mutex_);
        while (!stop_.wait_for(lock, period_, [this] { return stopping_; })) {
            const std::int64_t deadline = deadline_.load(std::memory_order_acquire);
            if (deadline == 0 || now_ns() < deadline)
                continue;
            std::fprintf(stderr,
                         "riftco_transformer: rank %d of %d: %s timed out after %lld ms: a rank "
                         "failed, stopped, or runs a different program; ending this rank (the "
                         "launcher ends the others)\n",
                         rank_, size_, operation_.load(std::memory_order_relaxed),
                         static_cast<long long>(timeout_.count()));
            std::fflush(stdout);
            std::fflush(stderr);
            std::_Exit(3);
        }
    }

    std::chrono::milliseconds timeout_;
    std::chrono::milliseconds period_;
    int rank_;
    int size_;
    std::atomic<std::int64_t> deadline_{0};  // steady-clock ns; 0 while disarmed
    std::atomic<const char*> operation_{"collective"};
    std::mutex mutex_;
    std::condition_variable stop_;
    bool stopping_ = false;
    std::thread thread_;  // last: started once everything it reads exists
};

class MpiProcessGroup;

// One MPI_Iallreduce per piece of at most `piece` values (MPI counts are int).
class MpiPendingCollective final : public PendingCollective {
  public:
    MpiPendingCollective(MpiProcessGroup& group, std::vector<MPI_Request> requests)
        : group_(group), requests_(std::move(requests)) {}
    ~MpiPendingCollective() override {
        try {
            wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): documented: errors are dropped here
        }
    }
    MpiPendingCollective(const MpiPendingCollective&) = delete;
    MpiPendingCollective& operator=(const MpiPendingCollective&) = delete;

    [[nodiscard]] bool test() override;
    void wait() override;

  private:
    MpiProcessGroup& group_;
    std::vector<MPI_Request> requests_;
    bool finished_ = false;
};

class MpiProcessGroup final : public ProcessGroup {
  public:
    explicit MpiProcessGroup(std::chrono::milliseconds timeout)
        : timeout_(timeout),
          rank_(world_rank()),
          size_(world_size_of()),
          watchdog_(timeout, rank_, size_) {}

    [[nodiscard]] int rank() const noexcept override { return rank_; }
    [[nodiscard]] int world_size() const noexcept override { return size_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return timeout_; }

    void barrier() override {
        run("barrier", [] { return MPI_Barrier(MPI_COMM_WORLD); });
    }

    void broadcast(std::span<float> values, int root) override {
        broadcast_raw(values.data(), values.size(), sizeof(float), MPI_FLOAT, root);
    }
    void broadcast(std::span<std::uint8_t> bytes, int root) override {
        broadcast_raw(bytes.data(), bytes.size(), 1, MPI_UINT8_T, root);
    }

    void allreduce_sum(std::span<float> values) override {
        allreduce_raw(values.data(), values.size(), sizeof(float), MPI_FLOAT);
    }
    void allreduce_sum(std::span<double> values) override {
        allreduce_raw(values.data(), values.size(), sizeof(double), MPI_DOUBLE);
    }

    [[nodiscard]] std::vector<std::uint64_t> allgather(std::uint64_t value) override {
        std::vector<std::uint64_t> values(static_cast<std::size_t>(size_));
        run("allgather", [&] {
            return MPI_Allgather(&value, 1, MPI_UINT64_T, values.data(), 1, MPI_UINT64_T,
                                 MPI_COMM_WORLD);
        });
        return values;
    }

    void allgather(std::span<const float> mine, std::span<float> all,
                   std::span<const std::size_t> counts) override {
        if (counts.size() != static_cast<std::size_t>(size_)) {
            throw std::invalid_argument("allgather: " + std::to_string(counts.size()) +
                                        " counts for a world of " + std::to_string(size_));
        }
        std::vector<int> sizes(counts.size());
        std::vector<int> displacements(counts.size());
        std::size_t total = 0;
        for (std::size_t r = 0; r < counts.size(); ++r) {
            if (counts[r] > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
                total + counts[r] > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
                throw std::invalid_argument("allgather: more than 2^31 - 1 values (rank " +
                                            std::to_string(r) + ")");
            }
            sizes[r] = static_cast<int>(counts[r]);
            displacements[r] = static_cast<int>(total);
            total += counts[r];
        }
        if (mine.size() != counts[static_cast<std::size_t>(rank_)] || all.size() != total) {
            throw std::invalid_argument(
                "allgather: this rank gives " + std::to_string(mine.size()) + " values (counts[" +
                std::to_string(rank_) +
                "] = " + std::to_string(counts[static_cast<std::size_t>(rank_)]) + ") into " +
                std::to_string(all.size()) + " (Σ counts = " + std::to_string(total) + ")");
        }
        run("allgather", [&] {
            return MPI_Allgatherv(mine.data(), sizes[static_cast<std::size_t>(rank_)], MPI_FLOAT,
                                  all.data(), sizes.data(), displacements.data(), MPI_FLOAT,
                                  MPI_COMM_WORLD);
        });
    }

    [[nodiscard]] std::unique_ptr<PendingCollective> start_allreduce_sum(
        std::span<float> values) override {
        std::vector<MPI_Request> requests;
        requests.reserve(values.size() / piece + 1);
        try {
            for (std::size_t at = 0; at < values.size(); at += piece) {
                const std::size_t n = std::min(piece, values.size() - at);
                MPI_Request request = MPI_REQUEST_NULL;
                run("allreduce (start)", [&] {
                    return MPI_Iallreduce(MPI_IN_PLACE, values.data() + at, static_cast<int>(n),
                                          MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
                });
                requests.push_back(request);
            }
        } catch (...) {
            // The pieces already started still complete (the peers take part in them).
            static_cast<void>(MpiPendingCollective(*this, std::move(requests)));
            throw;
        }
        return std::make_unique<MpiPendingCollective>(*this, std::move(requests));
    }

    // One MPI call under the watchdog (the collectives above, and a pending collective's
    // test and wait); an error code is a DistributedError.
    template <typename Call>
    void run(const char* operation, Call&& call) {
        if (runtime().broken) {
            throw DistributedError(std::string(operation) + " on rank " + std::to_string(rank_) +
                                   ": the process group is broken by an earlier failure");
        }
        watchdog_.arm(operation);
        const int code = call();
        watchdog_.disarm();
        if (code != MPI_SUCCESS) {
            runtime().broken = true;
            throw DistributedError(std::string(operation) + " on rank " + std::to_string(rank_) +
                                   " of " + std::to_string(size_) + " failed: " + error_text(code));
        }
    }

  private:
    static int world_rank() {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        return rank;
    }
    static int world_size_of() {
        int size = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        return size;
    }

    // MPI counts are int: large buffers go in pieces (the same pieces on every rank).
    static constexpr std::size_t piece = std::size_t{1} << 28;

    void broadcast_raw(void* data, std::size_t count, std::size_t element, MPI_Datatype type,
                       int root) {
        if (root < 0 || root >= size_) {
            throw std::invalid_argument("broadcast: root " + std::to_string(root) +
                                        " is not a rank of a world of " + std::to_string(size_));
        }
        for (std::size_t at = 0; at < count; at += piece) {
            const std::size_t n = std::min(piece, count - at);
            run("broadcast", [&] {
                return MPI_Bcast(static_cast<char*>(data) + at * element, static_cast<int>(n), type,
                                 root, MPI_COMM_WORLD);
            });
        }
    }

    void allreduce_raw(void* data, std::size_t count, std::size_t element, MPI_Datatype type) {
        for (std::size_t at = 0; at < count; at += piece) {
            const std::size_t n = std::min(piece, count - at);
            run("allreduce", [&] {
                return MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(data) + at * element,
                                     static_cast<int>(n), type, MPI_SUM, MPI_COMM_WORLD);
            });
        }
    }

    std::chrono::milliseconds timeout_;
    int rank_;
    int size_;
    Watchdog watchdog_;
};

bool MpiPendingCollective::test() {
    if (finished_)
        return true;
    int done = 0;
    group_.run("allreduce (test)", [&] {
        return MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                           MPI_STATUSES_IGNORE);
    });
    finished_ = done != 0;
    return finished_;
}

void MpiPendingCollective::wait() {
    if (finished_)
        return;
    finished_ = true;  // a failed wait is not retried (the group is broken then)
    group_.run("allreduce (wait)", [&] {
        return MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                           MPI_STATUSES_IGNORE);
    });
}

}  // namespace

std::unique_ptr<ProcessGroup> create_mpi_process_group(const ProcessGroupOptions& options) {
    MpiRuntime& state = runtime();
    std::call_once(state.once, [&state] {
        int initialised = 0;
        MPI_Initialized(&initialised);
        if (initialised)
            return;  // the application owns MPI
        // Open MPI's default non-blocking allreduce for a few ranks (binomial) runs large
        // buckets 2-2.7x slower than its blocking one here; Rabenseifner's (reduce-scatter then
        // allgather) matches it (tests/distributed/mpi_allreduce_bench.cpp). A value the user
        // set wins; other MPI implementations ignore the variable.
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
        int provided = 0;
        const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
        if (code != MPI_SUCCESS) {
            state.init_error = "MPI_Init_thread failed: " + error_text(code);
            return;
        }
        state.initialised_here = true;
        // Errors come back as codes (turned into DistributedError) instead of aborting.
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        std::atexit(at_exit);
    });
    if (!state.init_error.empty())
        throw DistributedError("create_process_group: " + state.init_error);
    return std::make_unique<MpiProcessGroup>(options.timeout);
}

}  // namespace riftco_transformer::detail
