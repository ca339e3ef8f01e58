#pragma once
// The part of the PJRT C API this backend calls, declared here from the API's documented
// layout (openxla/xla, xla/pjrt/c/pjrt_c_api.h) instead of including that header: the adapter
// compiles with no XLA source tree and links no runtime; the plugin is dlopen'd.
//
// Layout rules the API states and this file relies on:
// - every argument struct begins {size_t struct_size; PJRT_Extension_Base* extension_start}
//   and only ever grows at its end (major 0). A plugin rejects a struct_size smaller than its
//   own, so the structs here carry every field up to the newest one of API minor
//   `minimum_minor`, which is the oldest plugin we accept (fields we do not use stay zero);
// - PJRT_Api is {struct_size, extension_start, PJRT_Api_Version, function pointers...} and
//   new functions are appended; `ApiSlot` gives the position of each function we call.
//
// Everything here is plain data: no behaviour, no allocation.

#include <cstddef>
#include <cstdint>

namespace riftco_transformer::detail::pjrt {

inline constexpr int supported_major = 0;
// The layouts below are those of API 0.90; a plugin reporting an older minor is refused.
inline constexpr int minimum_minor = 90;

struct Error;
struct Event;
struct Client;
struct Device;
struct Memory;
struct LoadedExecutable;
struct Buffer;
struct ExtensionBase;

#define RIFTCO_PJRT_ARGS_HEADER \
    std::size_t struct_size;    \
    ExtensionBase* extension_start

struct ApiVersion {
    RIFTCO_PJRT_ARGS_HEADER;
    int major_version;
    int minor_version;
};

struct ErrorDestroyArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Error* error;
};

struct ErrorMessageArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    const Error* error;
    const char* message;  // out, lives as long as `error`
    std::size_t message_size;
};

struct PluginInitializeArgs {
    RIFTCO_PJRT_ARGS_HEADER;
};

struct EventDestroyArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Event* event;
};

struct EventAwaitArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Event* event;
};

struct ClientCreateArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    const void* create_options;  // const PJRT_NamedValue*
    std::size_t num_options;
    void* kv_get_callback;
    void* kv_get_user_arg;
    void* kv_put_callback;
    void* kv_put_user_arg;
    Client* client;  // out
    void* kv_try_get_callback;
    void* kv_try_get_user_arg;
};

struct ClientPlatformNameArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Client* client;
    const char* platform_name;  // out
    std::size_t platform_name_size;
};

struct ClientAddressableDevicesArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Client* client;
    Device* const* addressable_devices;  // out, owned by the client
    std::size_t num_addressable_devices;
};

struct Program {
    RIFTCO_PJRT_ARGS_HEADER;
    char* code;
    std::size_t code_size;
    const char* format;  // "mlir": MLIR bytecode or text
    std::size_t format_size;
};

struct ClientCompileArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Client* client;
    const Program* program;
    const char* compile_options;  // a serialized xla.CompileOptionsProto
    std::size_t compile_options_size;
    LoadedExecutable* executable;  // out
};

// PJRT_Buffer_Type values this backend uses.
enum class ElementType : int { S32 = 4, U8 = 6, U32 = 8, F32 = 11 };

// PJRT_HostBufferSemantics_kImmutableOnlyDuringCall: the runtime copies during the call.
inline constexpr int host_buffer_immutable_only_during_call = 0;

struct ClientBufferFromHostBufferArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Client* client;
    const void* data;
    ElementType type;
    const std::int64_t* dims;
    std::size_t num_dims;
    const std::int64_t* byte_strides;
    std::size_t num_byte_strides;
    int host_buffer_semantics;
    Device* device;
    Memory* memory;
    void* device_layout;           // PJRT_Buffer_MemoryLayout*; null: dense, major-to-minor
    Event* done_with_host_buffer;  // out
    Buffer* buffer;                // out
};

struct BufferDestroyArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Buffer* buffer;
};

struct BufferToHostBufferArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    Buffer* src;
    void* host_layout;  // null: the buffer's own (dense) layout
    void* dst;
    std::size_t dst_size;
    Event* event;  // out
};

struct ExecuteOptions {
    RIFTCO_PJRT_ARGS_HEADER;
    void* send_callbacks;
    void* recv_callbacks;
    std::size_t num_send_ops;
    std::size_t num_recv_ops;
    int launch_id;
    const std::int64_t* non_donatable_input_indices;
    std::size_t num_non_donatable_input_indices;
    void* context;
    const char* call_location;
    std::size_t num_tasks;
    int* task_ids;
    std::int64_t* incarnation_ids;
};

struct LoadedExecutableExecuteArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    LoadedExecutable* executable;
    ExecuteOptions* options;
    Buffer* const* const* argument_lists;  // [num_devices][num_args]
    std::size_t num_devices;
    std::size_t num_args;
    Buffer** const* output_lists;    // [num_devices][num_outputs], filled by the call
    Event** device_complete_events;  // [num_devices] or null
    Device* execute_device;
};

struct LoadedExecutableDestroyArgs {
    RIFTCO_PJRT_ARGS_HEADER;
    LoadedExecutable* executable;
};

#undef RIFTCO_PJRT_ARGS_HEADER

// Positions of the functions we call in PJRT_Api's function table.
enum class ApiSlot : std::size_t {
    ErrorDestroy = 0,
    ErrorMessage = 1,
    PluginInitialize = 3,
    EventDestroy = 5,
    EventAwait = 8,
    ClientCreate = 10,
    ClientPlatformName = 12,
    ClientAddressableDevices = 16,
    ClientCompile = 20,
    ClientBufferFromHostBuffer = 22,
    LoadedExecutableDestroy = 50,
    LoadedExecutableExecute = 55,
    BufferDestroy = 58,
    BufferToHostBuffer = 70,
};
inline constexpr std::size_t highest_slot_used = 70;

// The head of PJRT_Api; `functions` continues for as many entries as struct_size says.
struct ApiHead {
    std::size_t struct_size;
    ExtensionBase* extension_start;
    ApiVersion version;
    void* functions[1];
};

inline constexpr std::size_t api_functions_offset = offsetof(ApiHead, functions);

// Checks the layouts above against the documented 64-bit sizes.
static_assert(sizeof(void*) == 8, "the PJRT backend is declared for 64-bit platforms");
static_assert(api_functions_offset == 40);
static_assert(sizeof(ClientCreateArgs) == 88);
static_assert(sizeof(ClientCompileArgs) == 56);
static_assert(sizeof(ClientBufferFromHostBufferArgs) == 120);
static_assert(sizeof(LoadedExecutableExecuteArgs) == 80);
static_assert(sizeof(ExecuteOptions) == 112);

}  // namespace riftco_transformer::detail::pjrt
