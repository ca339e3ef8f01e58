// The parts of distributed/process_group.hpp that need no MPI: the single-process group and
// DataParallel (which talks to any ProcessGroup). The MPI group is mpi_process_group.cpp,
// compiled only with RIFTCO_TRANSFORMER_ENABLE_MPI=ON.

#include "riftco_transformer/distributed/process_group.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "core/backend/cpu/cpu_storage.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
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
    void allgather(std::span<const float> mine, std::span<float> all,
                   std::span<const std::size_t> counts) override {
        if (counts.size() != 1 || mine.size() != counts[0] || all.size() != counts[0]) {
            throw std::invalid_argument(
                "allgather: a world of 1 needs one count equal to both buffers' sizes (" +
                std::to_string(counts.size()) + " counts, " + std::to_string(mine.size()) +
                " and " + std::to_string(all.size()) + " values)");
        }
        std::copy(mine.begin(), mine.end(), all.begin());
    }
    [[nodiscard]] std::unique_ptr<PendingCollective> start_allreduce_sum(
        std::span<float>) override {
        return std::make_unique<Finished>();
    }

  private:
    class Finished final : public PendingCollective {
      public:
        [[nodiscard]] bool test() override { return true; }
        void wait() override {}
    };
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
    : group_(group), bucket_bytes_(sizeof(float)) {
    set_bucket_bytes(bucket_bytes);
}

void DataParallel::set_bucket_bytes(std::size_t bucket_bytes) {
    if (bucket_bytes < sizeof(float)) {
        throw std::invalid_argument("DataParallel: bucket_bytes must be at least 4, got " +
                                    std::to_string(bucket_bytes));
    }
    bucket_bytes_ = bucket_bytes;
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

// One step's bucketed reduction (see reduce_gradients): the plan, the buckets' pending
// collectives and which parameters are in. ready() takes a parameter's final gradient;
// finish() supplies the ones never reached, waits and writes the averages back.
//
// A parameter of at least `in_place_values` has buckets of its own (pieces of at most a
// bucket when it is larger), and when its gradient is a CPU tensor they are reduced in the
// gradient's own memory: no copy in, no copy out. Smaller ones are packed into shared host
// buckets. Where a bucket's values live does not change what is summed, so every path (CPU
// or not, overlapped or not) runs the same collectives on the same values.
class DataParallel::Reduction {
  public:
    static constexpr std::size_t in_place_values = std::size_t{1} << 18;  // 1 MiB of floats

    Reduction(DataParallel& owner, const ParameterList& parameters, float factor)
        : owner_(owner), parameters_(parameters), factor_(factor) {
        const std::size_t capacity = owner.bucket_bytes_ / sizeof(float);
        pieces_.resize(parameters.size());
        std::size_t filled = 0;
        std::size_t members = 0;
        std::size_t buffers = 0;
        const auto close = [&] {  // the open bucket gets index buckets_.size()
            if (filled > 0)
                buckets_.push_back({filled, members, buffers++});
            filled = 0;
            members = 0;
        };
        for (std::size_t index = parameters.size(); index-- > 0;) {
            const Variable& parameter = parameters[index].parameter;
            if (!parameter.requires_gradient())
                continue;
            const std::size_t count = parameter.value().numel();
            if (count == 0)
                continue;  // nothing to average
            if (count >= std::min(capacity, in_place_values)) {
                close();
                for (std::size_t at = 0; at < count; at += capacity) {
                    const std::size_t n = std::min(capacity, count - at);
                    pieces_[index].push_back({buckets_.size(), at, 0, n});
                    buckets_.push_back({n, 1, Bucket::own});
                }
                continue;
            }
            if (filled + count > capacity)
                close();
            pieces_[index].push_back({buckets_.size(), 0, filled, count});
            filled += count;
            ++members;
        }
        close();
        // One leaf listed twice would be scaled and summed twice, in one buffer at once.
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            if (!pieces_[i].empty() &&
                !index_.emplace(parameters[i].parameter.node().get(), i).second) {
                throw std::invalid_argument("DataParallel: parameter '" + parameters[i].name +
                                            "' is listed twice");
            }
        }
        owner.buffers_.resize(std::max(owner.buffers_.size(), buffers));
        for (const Bucket& bucket : buckets_) {
            if (bucket.buffer != Bucket::own)
                owner.buffers_[bucket.buffer].resize(bucket.size);
        }
        seen_.assign(parameters.size(), false);
    }

    // The parameter index of a leaf the reduction averages, or none.
    [[nodiscard]] std::optional<std::size_t> index_of(const Variable& leaf) const {
        const auto found = index_.find(leaf.node().get());
        return found == index_.end() ? std::nullopt : std::optional(found->second);
    }

    // `gradient` is the value the parameter publishes (or already holds): an own-bucket
    // parameter on the CPU is scaled and reduced inside it.
    void ready(std::size_t index, Tensor& gradient) {
        const Stopwatch watch(owner_.seconds_);
        if (seen_[index] || pieces_[index].empty())
            return;
        seen_[index] = true;
        const std::vector<Piece>& pieces = pieces_[index];
        Bucket& first = buckets_[pieces[0].bucket];
        if (first.buffer == Bucket::own && gradient.backend() == ExecutionBackend::Cpu) {
            // Unique storage first: a gradient shared with another tensor is copied, so the
            // reduction never shows through anything else.
            float* values = detail::cpu_values_for_write(gradient);
            for (const Piece& piece : pieces) {
                Bucket& bucket = buckets_[piece.bucket];
                bucket.values = std::span<float>(values + piece.parameter_offset, piece.count);
                bucket.keep = gradient;  // the memory stays alive until the bucket finished
                scale(bucket);
            }
        } else {
            const std::vector<float> host = gradient.to_host();
            for (const Piece& piece : pieces) {
                Bucket& bucket = buckets_[piece.bucket];
                const std::span<float> out = bucket.buffer == Bucket::own
                                                 ? own_copy(bucket)
                                                 : std::span<float>(owner_.buffers_[bucket.buffer])
                                                       .subspan(piece.bucket_offset, piece.count);
                std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(piece.parameter_offset),
                            piece.count, out.begin());
                for (float& value : out)
                    value *= factor_;
                if (bucket.buffer != Bucket::own)
                    bucket.values = owner_.buffers_[bucket.buffer];
                --bucket.missing;
            }
        }
        start_ready();
        // Drive the buckets in flight (MPI progresses a non-blocking collective inside calls).
        for (; finished_ < started_; ++finished_) {
            if (!buckets_[finished_].pending->test())
                break;
        }
    }

    void finish() {
        for (std::size_t index = parameters_.size(); index-- > 0;) {
            if (seen_[index] || pieces_[index].empty())
                continue;
            // Never reached by this backward: its published gradient, zeros when it has none.
            const Variable& parameter = parameters_[index].parameter;
            const LeafView leaf = leaf_view(parameter, "DataParallel");
            if (leaf.gradient.is_singular())
                leaf.gradient = Tensor::zeros(leaf.value.shape(), leaf.value.backend());
            ready(index, leaf.gradient);
        }
        const Stopwatch watch(owner_.seconds_);
        for (Bucket& bucket : buckets_)
            bucket.pending->wait();
        for (std::size_t index = 0; index < parameters_.size(); ++index) {
            const std::vector<Piece>& pieces = pieces_[index];
            if (pieces.empty() || !buckets_[pieces[0].bucket].keep.is_singular())
                continue;  // reduced in place: the published gradient holds the average
            // A new tensor from the buckets: writing into the leaf's gradient would first
            // clone it (its storage is shared with the leaf), a second pass over every value.
            Variable parameter = parameters_[index].parameter;
            const Tensor& value = parameter.value();
            std::vector<float> values(value.numel());
            for (const Piece& piece : pieces) {
                const std::span<const float> reduced =
                    std::span<const float>(buckets_[piece.bucket].values)
                        .subspan(
                            buckets_[piece.bucket].buffer == Bucket::own ? 0 : piece.bucket_offset,
                            piece.count);
                std::copy(reduced.begin(), reduced.end(),
                          values.begin() + static_cast<std::ptrdiff_t>(piece.parameter_offset));
            }
            parameter.set_gradient(Tensor(value.shape(), values, value.backend()));
        }
    }

  private:
    struct Piece {
        std::size_t bucket;
        std::size_t parameter_offset;  // the piece's first value in the parameter
        std::size_t bucket_offset;     // and in a shared bucket
        std::size_t count;
    };
    struct Bucket {
        static constexpr std::size_t own = static_cast<std::size_t>(-1);
        std::size_t size;
        std::size_t missing;        // members not yet in
        std::size_t buffer;         // index into the owner's shared buffers, or `own`
        std::span<float> values{};  // what the collective sums, once every member is in
        Tensor keep{};              // the gradient reduced in place (alive until finished)
        std::vector<float> copy{};  // an own bucket whose gradient is not on the CPU
        // Declared last: destroyed (waiting for the collective) before the memory it uses.
        std::unique_ptr<PendingCollective> pending{};
    };

    void scale(Bucket& bucket) {
        for (float& value : bucket.values)
            value *= factor_;
        --bucket.missing;
    }
    static std::span<float> own_copy(Bucket& bucket) {
        bucket.copy.resize(bucket.size);
        bucket.values = bucket.copy;
        return bucket.values;
    }

    // Buckets start in bucket order (the same on every rank) once every member is in.
    void start_ready() {
        while (started_ < buckets_.size() && buckets_[started_].missing == 0) {
            Bucket& bucket = buckets_[started_];
            bucket.pending = owner_.group_.start_allreduce_sum(bucket.values);
            owner_.communicated_ += bucket.values.size() * sizeof(float);
            ++started_;
        }
    }

    DataParallel& owner_;
    const ParameterList& parameters_;
    float factor_;
    std::vector<std::vector<Piece>> pieces_;  // per parameter; empty when not trainable
    std::vector<Bucket> buckets_;
    std::vector<bool> seen_;
    std::unordered_map<const void*, std::size_t> index_;  // leaf node -> parameter index
    std::size_t started_ = 0;
    std::size_t finished_ = 0;
};

double DataParallel::summed_weight(double local_weight, const char* operation) {
    if (!std::isfinite(local_weight) || local_weight < 0.0) {
        throw std::invalid_argument(std::string(operation) +
                                    ": local_weight must be finite and >= 0, got " +
                                    std::to_string(local_weight));
    }
    const Stopwatch watch(seconds_);
    double total = local_weight;
    group_.allreduce_sum(std::span<double>(&total, 1));
    communicated_ += sizeof(double);
    if (!(total > 0.0)) {
        throw DistributedError(std::string(operation) + ": the ranks' weights sum to " +
                               std::to_string(total) + " (no target counted on any rank)");
    }
    return total;
}

double DataParallel::reduce_gradients(const ParameterList& parameters, double local_weight) {
    const double total = summed_weight(local_weight, "DataParallel::reduce_gradients");
    Reduction reduction(*this, parameters, static_cast<float>(local_weight / total));
    reduction.finish();
    return total;
}

double DataParallel::backward_and_reduce(const Variable& loss, const ParameterList& parameters,
                                         double local_weight, BackwardOptions options,
                                         float seed_scale) {
    if (!loss.defined() || loss.value().numel() != 1) {
        throw std::invalid_argument(
            "DataParallel::backward_and_reduce: loss must be a one-element Variable");
    }
    if (!std::isfinite(seed_scale)) {
        throw std::invalid_argument(
            "DataParallel::backward_and_reduce: seed_scale must be finite, got " +
            std::to_string(seed_scale));
    }
    const double total = summed_weight(local_weight, "DataParallel::backward_and_reduce");
    Reduction reduction(*this, parameters, static_cast<float>(local_weight / total));
    options.gradient_ready = [earlier = std::move(options.gradient_ready), &reduction](
                                 const Variable& leaf, Tensor& gradient) {
        if (earlier)
            earlier(leaf, gradient);
        if (const std::optional<std::size_t> index = reduction.index_of(leaf))
            reduction.ready(*index, gradient);
    };
    Variable root = loss;
    root.backward(Tensor::full(loss.shape(), seed_scale, loss.backend()), options);
    reduction.finish();
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
