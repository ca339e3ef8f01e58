// The parts of distributed/process_group.hpp that need no MPI: the single-process group and
// DataParallel (which talks to any ProcessGroup). The MPI group is mpi_process_group.cpp,
// compiled only with RIFTCO_TRANSFORMER_ENABLE_MPI=ON.

#include "riftco_transformer/distributed/process_group.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "riftco_transformer/core/tensor.hpp"

namespace riftco_transformer {

namespace detail {
#if RIFTCO_TRANSFORMER_HAVE_MPI
std::unique_ptr<ProcessGroup> create_mpi_process_group(const ProcessGroupOptions& options);
#endif
}  // namespace detail

namespace {

class SingleProcessGroup final : public ProcessGroup {
  public:
    [[nodiscard]] int rank() const noexcept override { return 0; }
    [[nodiscard]] int world_size() const noexcept override { return 1; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override {
        return std::chrono::milliseconds(0);
    }
    void barrier() override {}
    void broadcast(std::span<float>, int root) override { require_root(root); }
    void broadcast(std::span<std::uint8_t>, int root) override { require_root(root); }
    void allreduce_sum(std::span<float>) override {}
    void allreduce_sum(std::span<double>) override {}
    [[nodiscard]] std::vector<std::uint64_t> allgather(std::uint64_t value) override {
        return {value};
    }

  private:
    static void require_root(int root) {
        if (root != 0) {
            throw std::invalid_argument("broadcast: root " + std::to_string(root) +
                                        " is not a rank of a world of 1");
        }
    }
};

// FNV-1a over bytes.
class Fnv1a {
  public:
    void add(const void* data, std::size_t size) {
        const auto* bytes = static_cast<const unsigned char*>(data);
        for (std::size_t i = 0; i < size; ++i) {
            hash_ = (hash_ ^ bytes[i]) * 1099511628211ULL;
        }
    }
    void add(std::uint64_t value) { add(&value, sizeof value); }
    void add(const std::string& text) {
        add(text.size());
        add(text.data(), text.size());
    }
    [[nodiscard]] std::uint64_t value() const noexcept { return hash_; }

  private:
    std::uint64_t hash_ = 14695981039346656037ULL;
};

std::uint64_t layout_hash(const ParameterList& parameters) {
    Fnv1a hash;
    hash.add(parameters.size());
    for (const NamedParameter& named : parameters) {
        hash.add(named.name);
        const Shape& shape = named.parameter.value().shape();
        hash.add(shape.size());
        for (const std::size_t dimension : shape)
            hash.add(dimension);
    }
    return hash.value();
}

std::string describe_layout(const ParameterList& parameters) {
    std::size_t total = 0;
    for (const NamedParameter& named : parameters)
        total += named.parameter.value().numel();
    std::ostringstream text;
    text << parameters.size() << " parameters, " << total << " values";
    if (!parameters.empty()) {
        text << ", first " << parameters.front().name << " "
             << shape_to_string(parameters.front().parameter.value().shape()) << ", last "
             << parameters.back().name << " "
             << shape_to_string(parameters.back().parameter.value().shape());
    }
    return text.str();
}

class Stopwatch {
  public:
    explicit Stopwatch(double& total) : total_(total) {}
    ~Stopwatch() {
        total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    Stopwatch(const Stopwatch&) = delete;
    Stopwatch& operator=(const Stopwatch&) = delete;

  private:
    double& total_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

bool distributed_compiled_in() noexcept {
    return RIFTCO_TRANSFORMER_HAVE_MPI != 0;
}

std::unique_ptr<ProcessGroup> create_process_group(const ProcessGroupOptions& options) {
    if (options.timeout.count() <= 0) {
        throw std::invalid_argument("create_process_group: timeout must be > 0 ms, got " +
                                    std::to_string(options.timeout.count()));
    }
#if RIFTCO_TRANSFORMER_HAVE_MPI
    return detail::create_mpi_process_group(options);
#else
    throw DistributedError(
        "create_process_group: distributed support is not compiled in (build with "
        "RIFTCO_TRANSFORMER_ENABLE_MPI=ON, the `mpi` preset)");
#endif
}

std::unique_ptr<ProcessGroup> create_single_process_group() {
    return std::make_unique<SingleProcessGroup>();
}

DataParallel::DataParallel(ProcessGroup& group, std::size_t bucket_bytes)
    : group_(group), bucket_bytes_(bucket_bytes) {
    if (bucket_bytes < sizeof(float)) {
        throw std::invalid_argument("DataParallel: bucket_bytes must be at least 4, got " +
                                    std::to_string(bucket_bytes));
    }
}

void DataParallel::check_layout(const ParameterList& parameters) {
    const Stopwatch watch(seconds_);
    const std::vector<std::uint64_t> hashes = group_.allgather(layout_hash(parameters));
    communicated_ += hashes.size() * sizeof(std::uint64_t);
    for (std::size_t rank = 1; rank < hashes.size(); ++rank) {
        if (hashes[rank] != hashes[0]) {
            throw DistributedError(
                "data parallel: rank " + std::to_string(rank) +
                " has different parameter names or shapes than rank 0 (every rank must build "
                "the same model; this rank " +
                std::to_string(group_.rank()) + " has " + describe_layout(parameters) + ")");
        }
    }
}

void DataParallel::synchronize_parameters(const ParameterList& parameters) {
    check_layout(parameters);
    if (group_.world_size() == 1)
        return;
    const Stopwatch watch(seconds_);
    std::vector<float> host;
    for (const NamedParameter& named : parameters) {
        Variable parameter = named.parameter;
        Tensor value = parameter.value();
        host.resize(value.numel());
        value.copy_to_host(host);
        group_.broadcast(std::span<float>(host), 0);
        communicated_ += host.size() * sizeof(float);
        if (group_.rank() != 0) {
            value.copy_from_host(host);
            parameter.set_value(std::move(value));
        }
    }
}

double DataParallel::reduce_gradients(const ParameterList& parameters, double local_weight) {
    if (!std::isfinite(local_weight) || local_weight < 0.0) {
        throw std::invalid_argument(
            "DataParallel::reduce_gradients: local_weight must be "
            "finite and >= 0, got " +
            std::to_string(local_weight));
    }
    const Stopwatch watch(seconds_);
    double total = local_weight;
    group_.allreduce_sum(std::span<double>(&total, 1));
    communicated_ += sizeof(double);
    if (!(total > 0.0)) {
        throw DistributedError("DataParallel::reduce_gradients: the ranks' weights sum to " +
                               std::to_string(total) + " (no target counted on any rank)");
    }
    const auto factor = static_cast<float>(local_weight / total);
    // Buckets: consecutive gradients copied straight into one host buffer of at most
    // bucket_bytes, scaled and summed over the ranks in one collective, and copied back; a
    // gradient larger than a bucket is reduced through its own buffer in bucket-sized pieces.
    const std::size_t capacity = bucket_bytes_ / sizeof(float);
    std::size_t trainable_values = 0;
    for (const NamedParameter& named : parameters) {
        if (named.parameter.requires_gradient())
            trainable_values += named.parameter.value().numel();
    }
    std::vector<float> bucket(std::min(capacity, trainable_values));
    struct Member {
        std::size_t index;
        std::size_t offset;
        std::size_t count;
    };
    std::vector<Member> members;
    std::size_t filled = 0;
    const auto reduce = [&](std::span<float> values) {
        for (float& value : values)
            value *= factor;
        for (std::size_t begin = 0; begin < values.size(); begin += capacity) {
            const std::size_t count = std::min(capacity, values.size() - begin);
            group_.allreduce_sum(values.subspan(begin, count));
            communicated_ += count * sizeof(float);
        }
    };
    const auto write_back = [&](std::size_t index, std::span<const float> values) {
        Variable parameter = parameters[index].parameter;
        Tensor gradient = parameter.gradient();
        gradient.copy_from_host(values);
        parameter.set_gradient(std::move(gradient));
    };
    const auto flush = [&] {
        if (filled == 0)
            return;
        reduce(std::span<float>(bucket.data(), filled));
        for (const Member& member : members)
            write_back(member.index,
                       std::span<const float>(bucket.data() + member.offset, member.count));
        members.clear();
        filled = 0;
    };
    for (std::size_t index = 0; index < parameters.size(); ++index) {
        const Variable& parameter = parameters[index].parameter;
        if (!parameter.requires_gradient())
            continue;
        const Tensor gradient = parameter.gradient();  // zeros when backward did not reach it
        const std::size_t count = gradient.numel();
        if (count > capacity) {
            flush();
            std::vector<float> values(count);
            gradient.copy_to_host(values);
            reduce(std::span<float>(values));
            write_back(index, values);
            continue;
        }
        if (filled + count > capacity)
            flush();
        gradient.copy_to_host(std::span<float>(bucket.data() + filled, count));
        members.push_back({index, filled, count});
        filled += count;
    }
    flush();
    return total;
}

std::pair<std::size_t, std::size_t> DataParallel::shard(std::size_t global_rows) const {
    const auto world = static_cast<std::size_t>(group_.world_size());
    if (global_rows == 0 || global_rows % world != 0) {
        throw std::invalid_argument(
            "data parallel: the global batch of " + std::to_string(global_rows) +
            " rows is not a positive multiple of the world size " + std::to_string(world));
    }
    const std::size_t rows = global_rows / world;
    const auto rank = static_cast<std::size_t>(group_.rank());
    return {rank * rows, (rank + 1) * rows};
}

std::uint64_t DataParallel::parameter_hash(const ParameterList& parameters) {
    Fnv1a hash;
    for (const NamedParameter& named : parameters) {
        const std::vector<float> values = named.parameter.value().to_host();
        hash.add(values.data(), values.size() * sizeof(float));
    }
    return hash.value();
}

}  // namespace riftco_transformer
