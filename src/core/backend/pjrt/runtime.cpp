#include "core/backend/pjrt/runtime.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/backend/synchronization.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

// xla.CompileOptionsProto{executable_build_options (3): {num_replicas (4): 1,
// num_partitions (5): 1}} in protobuf wire format: one replica, one partition, the client's
// default device.
constexpr char single_device_compile_options[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01};

// Adds the wall time of its scope to a statistics field.
class Stopwatch {
  public:
    explicit Stopwatch(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
    ~Stopwatch() {
        total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    Stopwatch(const Stopwatch&) = delete;
    Stopwatch& operator=(const Stopwatch&) = delete;

  private:
    double& total_;
    std::chrono::steady_clock::time_point start_;
};

template <typename Args>
Args make_args() {
    Args args{};
    args.struct_size = sizeof(Args);
    return args;
}

}  // namespace

std::size_t element_size(ElementType type) noexcept {
    return type == ElementType::U8 ? 1 : 4;
}

DeviceBuffer::~DeviceBuffer() {
    runtime_.destroy_buffer(buffer_);
}

Error* Runtime::call(ApiSlot slot, void* args) const {
    using Function = Error* (*)(void*);
    // The table size was checked at load against highest_slot_used.
    auto* function = reinterpret_cast<Function>(api_->functions[static_cast<std::size_t>(slot)]);
    return function(args);
}

std::string Runtime::message_of(Error* error) const {
    auto args = make_args<ErrorMessageArgs>();
    args.error = error;
    using Function = void (*)(ErrorMessageArgs*);
    reinterpret_cast<Function>(api_->functions[static_cast<std::size_t>(ApiSlot::ErrorMessage)])(
        &args);
    return std::string(args.message, args.message_size);
}

void Runtime::destroy_error(Error* error) const noexcept {
    auto args = make_args<ErrorDestroyArgs>();
    args.error = error;
    using Function = void (*)(ErrorDestroyArgs*);
    reinterpret_cast<Function>(api_->functions[static_cast<std::size_t>(ApiSlot::ErrorDestroy)])(
        &args);
}

void Runtime::check(Error* error, std::string_view what) const {
    if (error == nullptr) {
        return;
    }
    std::string message = message_of(error);
    destroy_error(error);
    std::ostringstream text;
    text << "PJRT " << what << " failed: " << message;
    throw std::runtime_error(text.str());
}

void Runtime::await(Event* event, std::string_view what) const {
    if (event == nullptr) {
        return;
    }
    auto args = make_args<EventAwaitArgs>();
    args.event = event;
    Error* error = call(ApiSlot::EventAwait, &args);
    auto destroy = make_args<EventDestroyArgs>();
    destroy.event = event;
    Error* destroy_error_value = call(ApiSlot::EventDestroy, &destroy);
    if (destroy_error_value != nullptr) {
        destroy_error(destroy_error_value);
    }
    check(error, what);
}

Runtime* Runtime::load(const std::string& library_path, ExecutionBackend backend,
                       LoadFailure& failure) {
    void* library = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
        const char* reason = dlerror();
        failure = {LoadFailure::Kind::LoadFailed,
                   "could not load '" + library_path + "': " + (reason ? reason : "dlopen failed")};
        return nullptr;
    }
    using GetApi = const ApiHead* (*)();
    auto get_api = reinterpret_cast<GetApi>(dlsym(library, "GetPjrtApi"));
    if (get_api == nullptr) {
        failure = {LoadFailure::Kind::LoadFailed,
                   "'" + library_path + "' does not export GetPjrtApi (not a PJRT plugin)"};
        dlclose(library);
        return nullptr;
    }
    const ApiHead* api = get_api();
    if (api == nullptr) {
        failure = {LoadFailure::Kind::LoadFailed,
                   "'" + library_path + "': GetPjrtApi returned null"};
        dlclose(library);
        return nullptr;
    }
    const int major = api->version.major_version;
    const int minor = api->version.minor_version;
    const std::size_t needed = api_functions_offset + (highest_slot_used + 1) * sizeof(void*);
    if (major != supported_major || minor < minimum_minor || api->struct_size < needed) {
        std::ostringstream message;
        message << "'" << library_path << "' implements PJRT C API " << major << "." << minor
                << " with a " << api->struct_size << "-byte function table; this build needs "
                << supported_major << ".x with x >= " << minimum_minor << " and at least " << needed
                << " bytes";
        failure = {LoadFailure::Kind::IncompatibleVersion, message.str()};
        // The library stays mapped: unloading a runtime that may have started threads in its
        // initialisers is not safe.
        return nullptr;
    }
    auto* runtime = new Runtime();  // process lifetime (see runtime.hpp)
    runtime->backend_ = backend;
    runtime->library_ = library;
    runtime->api_ = api;
    runtime->function_count_ = (api->struct_size - api_functions_offset) / sizeof(void*);
    runtime->api_minor_ = minor;
    runtime->compile_options_.assign(single_device_compile_options,
                                     sizeof(single_device_compile_options));
    for (std::size_t slot = 0; slot <= highest_slot_used; ++slot) {
        // Only the slots we call must be present; checking all up to the highest is simpler
        // and every plugin of minor >= 90 fills them.
        if (api->functions[slot] == nullptr) {
            std::ostringstream message;
            message << "'" << library_path << "' leaves PJRT function table entry " << slot
                    << " empty";
            failure = {LoadFailure::Kind::IncompatibleVersion, message.str()};
            delete runtime;
            return nullptr;
        }
    }
    try {
        auto initialize = make_args<PluginInitializeArgs>();
        runtime->check(runtime->call(ApiSlot::PluginInitialize, &initialize),
                       "plugin initialisation");
        auto create = make_args<ClientCreateArgs>();
        runtime->check(runtime->call(ApiSlot::ClientCreate, &create), "client creation");
        runtime->client_ = create.client;
        auto name = make_args<ClientPlatformNameArgs>();
        name.client = runtime->client_;
        runtime->check(runtime->call(ApiSlot::ClientPlatformName, &name), "platform name");
        runtime->platform_name_.assign(name.platform_name, name.platform_name_size);
        auto devices = make_args<ClientAddressableDevicesArgs>();
        devices.client = runtime->client_;
        runtime->check(runtime->call(ApiSlot::ClientAddressableDevices, &devices),
                       "device discovery");
        if (devices.num_addressable_devices == 0) {
            failure = {LoadFailure::Kind::NoDevice, "the " + runtime->platform_name_ +
                                                        " PJRT client of '" + library_path +
                                                        "' has no addressable device"};
            return nullptr;  // the client stays: destroying it at this point gains nothing
        }
        runtime->device_ = devices.addressable_devices[0];
        runtime->device_count_ = devices.num_addressable_devices;
    } catch (const std::exception& error) {
        failure = {LoadFailure::Kind::NoDevice, std::string(error.what())};
        return nullptr;
    }
    return runtime;
}

BufferPointer Runtime::upload(ElementType type, const void* data, std::size_t element_count) const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    const Stopwatch stopwatch(statistics_.upload_seconds);
    auto args = make_args<ClientBufferFromHostBufferArgs>();
    const auto dims = static_cast<std::int64_t>(element_count);
    // A zero-element array still needs a valid pointer.
    static const std::uint32_t empty = 0;
    args.client = client_;
    args.data = element_count == 0 ? static_cast<const void*>(&empty) : data;
    args.type = type;
    args.dims = &dims;
    args.num_dims = 1;
    args.host_buffer_semantics = host_buffer_immutable_only_during_call;
    args.device = device_;
    check(call(ApiSlot::ClientBufferFromHostBuffer, &args), "host-to-device transfer");
    auto buffer = std::make_shared<const DeviceBuffer>(*this, args.buffer, type, element_count);
    // kImmutableOnlyDuringCall: the copy is done when the call returns; the event (if any)
    // is already complete.
    await(args.done_with_host_buffer, "host-to-device transfer");
    statistics_.uploads += 1;
    statistics_.bytes_to_device += element_count * element_size(type);
    return buffer;
}

void Runtime::download(const DeviceBuffer& buffer, void* destination) const {
    const DeviceBuffer* buffers[] = {&buffer};
    void* destinations[] = {destination};
    download_all(buffers, destinations);
}

void Runtime::download_all(std::span<const DeviceBuffer* const> buffers,
                           std::span<void* const> destinations) const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    const Stopwatch stopwatch(statistics_.download_seconds);
    std::vector<Event*> events(buffers.size(), nullptr);
    std::exception_ptr first_error;
    for (std::size_t i = 0; i < buffers.size(); ++i) {
        const std::size_t bytes = buffers[i]->element_count() * element_size(buffers[i]->type());
        if (bytes == 0) {
            continue;
        }
        auto args = make_args<BufferToHostBufferArgs>();
        args.src = buffers[i]->handle();
        args.dst = destinations[i];
        args.dst_size = bytes;
        try {
            check(call(ApiSlot::BufferToHostBuffer, &args), "device-to-host transfer");
        } catch (...) {
            if (!first_error) {
                first_error = std::current_exception();
            }
            continue;
        }
        events[i] = args.event;
        statistics_.downloads += 1;
        statistics_.bytes_to_host += bytes;
    }
    for (Event* event : events) {
        try {
            await(event, "device-to-host transfer");
        } catch (...) {
            if (!first_error) {
                first_error = std::current_exception();
            }
        }
    }
    if (first_error) {
        std::rethrow_exception(first_error);
    }
}

LoadedExecutable* Runtime::program(const std::string& key,
                                   const std::function<std::string()>& text) const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (auto found = programs_.find(key); found != programs_.end()) {
        statistics_.cache_hits += 1;
        return found->second;
    }
    const Stopwatch stopwatch(statistics_.compile_seconds);
    std::string code = text();
    auto program_args = make_args<Program>();
    program_args.code = code.data();
    program_args.code_size = code.size();
    static constexpr char format[] = "mlir";
    program_args.format = format;
    program_args.format_size = sizeof(format) - 1;
    auto args = make_args<ClientCompileArgs>();
    args.client = client_;
    args.program = &program_args;
    args.compile_options = compile_options_.data();
    args.compile_options_size = compile_options_.size();
    Error* error = call(ApiSlot::ClientCompile, &args);
    if (error != nullptr) {
        std::string message = message_of(error);
        destroy_error(error);
        throw std::runtime_error("PJRT compilation of program '" + key + "' failed: " + message);
    }
    statistics_.compiles += 1;
    programs_.emplace(key, args.executable);
    return args.executable;
}

std::vector<BufferPointer> Runtime::execute(LoadedExecutable* executable,
                                            std::span<const BufferPointer> inputs,
                                            std::span<const ElementType> output_types,
                                            std::span<const std::size_t> output_counts) const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    const Stopwatch stopwatch(statistics_.execute_seconds);
    std::vector<Buffer*> arguments(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        arguments[i] = inputs[i]->handle();
    }
    std::vector<Buffer*> outputs(output_types.size(), nullptr);
    Buffer* const* argument_list = arguments.data();
    Buffer** output_list = outputs.data();
    auto options = make_args<ExecuteOptions>();
    auto args = make_args<LoadedExecutableExecuteArgs>();
    args.executable = executable;
    args.options = &options;
    args.argument_lists = &argument_list;
    args.num_devices = 1;
    args.num_args = arguments.size();
    args.output_lists = &output_list;
    args.execute_device = nullptr;
    check(call(ApiSlot::LoadedExecutableExecute, &args), "program execution");
    statistics_.executions += 1;
    std::vector<BufferPointer> results;
    results.reserve(outputs.size());
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        results.push_back(std::make_shared<const DeviceBuffer>(*this, outputs[i], output_types[i],
                                                               output_counts[i]));
    }
    return results;
}

void Runtime::destroy_buffer(Buffer* buffer) const noexcept {
    if (buffer == nullptr) {
        return;
    }
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto args = make_args<BufferDestroyArgs>();
    args.buffer = buffer;
    Error* error = call(ApiSlot::BufferDestroy, &args);
    if (error != nullptr) {
        destroy_error(error);
    }
}

void Runtime::defer(PendingCheck check) const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    pending_.push_back(std::move(check));
    // An unbounded queue would grow without limit in a loop that never reads the host; past
    // this many, the checks so far are read now (not a sync point of the caller: nothing is
    // raised yet, the first failure stays deferred).
    constexpr std::size_t most_pending = 4096;
    if (pending_.size() >= most_pending) {
        std::vector<PendingCheck> checks = std::exchange(pending_, {});
        collect_locked(checks);
    }
}

void Runtime::collect_locked(std::vector<PendingCheck>& checks) const {
    if (checks.empty()) {
        return;
    }
    std::vector<std::int32_t> flags(checks.size(), 0);
    std::vector<const DeviceBuffer*> buffers(checks.size());
    std::vector<void*> destinations(checks.size());
    for (std::size_t i = 0; i < checks.size(); ++i) {
        buffers[i] = checks[i].flag.get();
        destinations[i] = &flags[i];
    }
    download_all(buffers, destinations);
    for (std::size_t i = 0; i < checks.size(); ++i) {
        if (flags[i] != 0) {
            defer_error(backend_, checks[i].raise(static_cast<std::size_t>(flags[i] - 1)));
            break;
        }
    }
}

void Runtime::collect() const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    std::vector<PendingCheck> checks = std::exchange(pending_, {});
    collect_locked(checks);
}

RuntimeStatistics Runtime::statistics() const {
    const std::lock_guard<std::recursive_mutex> lock(mutex_);
    return statistics_;
}

}  // namespace riftco_transformer::detail::pjrt
