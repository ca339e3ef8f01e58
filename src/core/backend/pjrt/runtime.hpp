#pragma once
// One loaded PJRT plugin: its client, its first addressable device, device buffers, a cache of
// compiled StableHLO programs, and the deferred value-domain checks of the programs it ran.
//
// Lifetime: a runtime lives for the whole process once loaded and is never destroyed (the
// plugin's own process-global state may already be torn down at exit, so nothing calls into it
// from static destructors). Buffers and executables are freed as they go.
//
// Thread safety: every call into the plugin is serialised by one mutex per runtime.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/backend/pjrt/pjrt_c_api.hpp"
#include "riftco_transformer/core/backend.hpp"

namespace riftco_transformer::detail::pjrt {

class Runtime;

// One immutable device array. The element count is that of the dense array; programs see
// every buffer as rank 1 and reshape inside.
class DeviceBuffer {
  public:
    DeviceBuffer(const Runtime& runtime, Buffer* buffer, ElementType type,
                 std::size_t element_count) noexcept
        : runtime_(runtime), buffer_(buffer), type_(type), element_count_(element_count) {}
    ~DeviceBuffer();
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    [[nodiscard]] Buffer* handle() const noexcept { return buffer_; }
    [[nodiscard]] ElementType type() const noexcept { return type_; }
    [[nodiscard]] std::size_t element_count() const noexcept { return element_count_; }

  private:
    const Runtime& runtime_;
    Buffer* buffer_;
    ElementType type_;
    std::size_t element_count_;
};

using BufferPointer = std::shared_ptr<const DeviceBuffer>;

// Counters a test or benchmark reads (process totals for this runtime).
struct RuntimeStatistics {
    std::uint64_t compiles = 0;
    std::uint64_t cache_hits = 0;
    std::uint64_t executions = 0;
    std::uint64_t bytes_to_device = 0;
    std::uint64_t bytes_to_host = 0;
    std::uint64_t uploads = 0;
    std::uint64_t downloads = 0;
    // Wall time spent inside the plugin, by kind of call: compiling programs, launching them
    // (the CPU plugin may run a program before Execute returns), host-to-device copies, and
    // device-to-host copies including the wait for the work that produces them.
    double compile_seconds = 0.0;
    double execute_seconds = 0.0;
    double upload_seconds = 0.0;
    double download_seconds = 0.0;
};

// A value-domain check a program carried out: `flag` is a rank-0 s32 buffer holding 0 when
// the check passed and 1 + the first failing position otherwise. `raise` builds the error
// (with the CPU reference's category and message) from that position; it may read more from
// the buffers it captured.
struct PendingCheck {
    BufferPointer flag;
    std::function<std::exception_ptr(std::size_t position)> raise;
};

// Why a plugin could not be used; the adapter words the unavailability reason from it.
struct LoadFailure {
    enum class Kind { LoadFailed, IncompatibleVersion, NoDevice };
    Kind kind;
    std::string message;
};

class Runtime {
  public:
    // Loads `library_path` (dlopen), checks its PJRT version and table size, initialises the
    // plugin, creates a client and takes its first addressable device. On failure returns null
    // and fills `failure`.
    [[nodiscard]] static Runtime* load(const std::string& library_path, ExecutionBackend backend,
                                       LoadFailure& failure);

    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    [[nodiscard]] ExecutionBackend backend() const noexcept { return backend_; }
    [[nodiscard]] const std::string& platform_name() const noexcept { return platform_name_; }
    [[nodiscard]] int api_minor() const noexcept { return api_minor_; }
    [[nodiscard]] std::size_t device_count() const noexcept { return device_count_; }

    // A dense rank-1 device array of `element_count` elements copied from `data`.
    [[nodiscard]] BufferPointer upload(ElementType type, const void* data,
                                       std::size_t element_count) const;
    // The whole buffer into `destination` (element_count · element size bytes).
    void download(const DeviceBuffer& buffer, void* destination) const;
    // Every buffer into its destination, with the transfers in flight together.
    void download_all(std::span<const DeviceBuffer* const> buffers,
                      std::span<void* const> destinations) const;

    // A compiled program, from the cache under `key` or compiled from `text()` (StableHLO in
    // MLIR text form, function @main) and cached. Compile errors throw runtime_error naming
    // the key and quoting the plugin's message.
    [[nodiscard]] LoadedExecutable* program(const std::string& key,
                                            const std::function<std::string()>& text) const;
    // Runs `executable` on the device with `inputs`; returns its `output_count` results.
    [[nodiscard]] std::vector<BufferPointer> execute(
        LoadedExecutable* executable, std::span<const BufferPointer> inputs,
        std::span<const ElementType> output_types,
        std::span<const std::size_t> output_counts) const;

    // Device checks: `defer` records one; `collect` (a sync point) reads every pending flag,
    // and the first failing check in program order is handed to defer_error.
    void defer(PendingCheck check) const;
    void collect() const;

    [[nodiscard]] RuntimeStatistics statistics() const;

    // Releases a buffer (DeviceBuffer's destructor).
    void destroy_buffer(Buffer* buffer) const noexcept;

  private:
    Runtime() = default;
    [[nodiscard]] Error* call(ApiSlot slot, void* args) const;
    void check(Error* error, std::string_view what) const;
    [[nodiscard]] std::string message_of(Error* error) const;
    void destroy_error(Error* error) const noexcept;
    void await(Event* event, std::string_view what) const;
    void collect_locked(std::vector<PendingCheck>& checks) const;

    ExecutionBackend backend_ = ExecutionBackend::Cpu;
    void* library_ = nullptr;
    const ApiHead* api_ = nullptr;
    std::size_t function_count_ = 0;
    int api_minor_ = 0;
    Client* client_ = nullptr;
    Device* device_ = nullptr;
    std::size_t device_count_ = 0;
    std::string platform_name_;
    std::string compile_options_;

    mutable std::recursive_mutex mutex_;
    mutable std::unordered_map<std::string, LoadedExecutable*> programs_;
    mutable std::vector<PendingCheck> pending_;
    mutable RuntimeStatistics statistics_;
};

[[nodiscard]] std::size_t element_size(ElementType type) noexcept;

}  // namespace riftco_transformer::detail::pjrt
