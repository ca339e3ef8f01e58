// The MPI process group (RIFTCO_TRANSFORMER_ENABLE_MPI=ON): MPI_COMM_WORLD of the launch.
//
// Every collective is the non-blocking MPI call, polled with MPI_Test until it completes or
// the group's timeout passes (polling backs off from busy to 1 ms sleeps, so a waiting rank
// does not burn its core). A timeout marks the group broken and throws DistributedError; at
// process exit a broken group calls MPI_Abort (which ends every rank of the job) instead of
// MPI_Finalize, which could wait forever for the rank that failed.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

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

class MpiProcessGroup final : public ProcessGroup {
  public:
    explicit MpiProcessGroup(std::chrono::milliseconds timeout) : timeout_(timeout) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }

    [[nodiscard]] int rank() const noexcept override { return rank_; }
    [[nodiscard]] int world_size() const noexcept override { return size_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return timeout_; }

    void barrier() override {
        begin("barrier");
        MPI_Request request = MPI_REQUEST_NULL;
        check("barrier", MPI_Ibarrier(MPI_COMM_WORLD, &request));
        wait("barrier", request);
    }

    void broadcast(std::span<float> values, int root) override {
        broadcast_raw("broadcast", values.data(), values.size(), MPI_FLOAT, root);
    }
    void broadcast(std::span<std::uint8_t> bytes, int root) override {
        broadcast_raw("broadcast", bytes.data(), bytes.size(), MPI_UINT8_T, root);
    }

    void allreduce_sum(std::span<float> values) override {
        allreduce_raw(values.data(), values.size(), MPI_FLOAT);
    }
    void allreduce_sum(std::span<double> values) override {
        allreduce_raw(values.data(), values.size(), MPI_DOUBLE);
    }

    [[nodiscard]] std::vector<std::uint64_t> allgather(std::uint64_t value) override {
        begin("allgather");
        std::vector<std::uint64_t> values(static_cast<std::size_t>(size_));
        MPI_Request request = MPI_REQUEST_NULL;
        check("allgather", MPI_Iallgather(&value, 1, MPI_UINT64_T, values.data(), 1,
                                          MPI_UINT64_T, MPI_COMM_WORLD, &request));
        wait("allgather", request);
        return values;
    }

  private:
    void begin(const char* operation) const {
        if (runtime().broken) {
            throw DistributedError(std::string(operation) + " on rank " + std::to_string(rank_) +
                                   ": the process group is broken by an earlier failure");
        }
    }

    void check(const char* operation, int code) const {
        if (code != MPI_SUCCESS) {
            runtime().broken = true;
            throw DistributedError(std::string(operation) + " on rank " + std::to_string(rank_) +
                                   " failed: " + error_text(code));
        }
    }

    // Polls `request` until done or the deadline.
    void wait(const char* operation, MPI_Request& request) const {
        const auto start = std::chrono::steady_clock::now();
        const auto deadline = start + timeout_;
        for (std::size_t polls = 0;; ++polls) {
            int done = 0;
            check(operation, MPI_Test(&request, &done, MPI_STATUS_IGNORE));
            if (done)
                return;
            const auto now = std::chrono::steady_clock::now();
            if (now >= deadline) {
                runtime().broken = true;
                const double seconds = std::chrono::duration<double>(timeout_).count();
                std::fprintf(stderr,
                             "riftco_transformer: rank %d of %d: %s did not complete within %.3g "
                             "s (a rank failed, stopped, or runs a different program)\n",
                             rank_, size_, operation, seconds);
                throw DistributedError(std::string(operation) + " on rank " +
                                       std::to_string(rank_) + " of " + std::to_string(size_) +
                                       " timed out after " + std::to_string(timeout_.count()) +
                                       " ms: a rank failed, stopped, or runs a different program");
            }
            // Spin briefly (collectives on one host finish in microseconds), then sleep.
            if (polls > 2000)
                std::this_thread::sleep_for(std::chrono::microseconds(polls > 20000 ? 1000 : 50));
        }
    }

    void broadcast_raw(const char* operation, void* data, std::size_t count, MPI_Datatype type,
                       int root) {
        if (root < 0 || root >= size_) {
            throw std::invalid_argument(std::string(operation) + ": root " + std::to_string(root) +
                                        " is not a rank of a world of " + std::to_string(size_));
        }
        begin(operation);
        // MPI counts are int: large buffers go in pieces (the same on every rank).
        constexpr std::size_t piece = std::size_t{1} << 30;
        const std::size_t element = type == MPI_FLOAT ? 4 : 1;
        for (std::size_t at = 0; at < count; at += piece) {
            const std::size_t n = std::min(piece, count - at);
            MPI_Request request = MPI_REQUEST_NULL;
            check(operation, MPI_Ibcast(static_cast<char*>(data) + at * element,
                                        static_cast<int>(n), type, root, MPI_COMM_WORLD,
                                        &request));
            wait(operation, request);
        }
    }

    void allreduce_raw(void* data, std::size_t count, MPI_Datatype type) {
        begin("allreduce");
        constexpr std::size_t piece = std::size_t{1} << 28;
        const std::size_t element = type == MPI_DOUBLE ? 8 : 4;
        for (std::size_t at = 0; at < count; at += piece) {
            const std::size_t n = std::min(piece, count - at);
            MPI_Request request = MPI_REQUEST_NULL;
            check("allreduce",
                  MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + at * element,
                                 static_cast<int>(n), type, MPI_SUM, MPI_COMM_WORLD, &request));
            wait("allreduce", request);
        }
    }

    std::chrono::milliseconds timeout_;
    int rank_ = 0;
    int size_ = 1;
};

}  // namespace

std::unique_ptr<ProcessGroup> create_mpi_process_group(const ProcessGroupOptions& options) {
    MpiRuntime& state = runtime();
    std::call_once(state.once, [&state] {
        int initialised = 0;
        MPI_Initialized(&initialised);
        if (initialised)
            return;  // the application owns MPI
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
