/* A deliberately broken PJRT plugin for the loader's failure tests (tests/test_pjrt_loader.cpp).
 * It is no emulator: it only reaches the step the test aims at. RIFTCO_FAKE_PJRT_MODE picks the
 * failure: "major" (API major 1), "minor" (API 0.10), "table" (a function table too short for
 * the entries we call), "device" (a working handshake whose client has no addressable device).
 * The layout is PJRT_Api's documented head: struct_size, extension_start, PJRT_Api_Version
 * {struct_size, extension_start, major, minor}, then the function pointers. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t struct_size;
    void* extension_start;
} Header;

typedef struct {
    size_t struct_size;
    void* extension_start;
    size_t version_struct_size;
    void* version_extension_start;
    int major_version;
    int minor_version;
    void* functions[140];
} FakeApi;

static int error_object;

static void error_destroy(void* args) {
    (void)args;
}

typedef struct {
    size_t struct_size;
    void* extension_start;
    const void* error;
    const char* message;
    size_t message_size;
} ErrorMessageArgs;

static void error_message(ErrorMessageArgs* args) {
    static const char text[] = "the fake plugin does not implement this call";
    args->message = text;
    args->message_size = sizeof(text) - 1;
}

static void* unexpected(void* args) {
    (void)args;
    return &error_object;
}

static void* succeed(void* args) {
    (void)args;
    return NULL;
}

typedef struct {
    size_t struct_size;
    void* extension_start;
    const void* create_options;
    size_t num_options;
    void* kv[4];
    void* client;
    void* kv_try[2];
} ClientCreateArgs;

static int client_object;

static void* client_create(ClientCreateArgs* args) {
    args->client = &client_object;
    return NULL;
}

typedef struct {
    size_t struct_size;
    void* extension_start;
    void* client;
    const char* name;
    size_t name_size;
} PlatformNameArgs;

static void* platform_name(PlatformNameArgs* args) {
    args->name = "fake";
    args->name_size = 4;
    return NULL;
}

typedef struct {
    size_t struct_size;
    void* extension_start;
    void* client;
    void* const* devices;
    size_t device_count;
} DevicesArgs;

static void* no_devices(DevicesArgs* args) {
    args->devices = NULL;
    args->device_count = 0;
    return NULL;
}

static FakeApi api;

__attribute__((visibility("default"))) const FakeApi* GetPjrtApi(void) {
    const char* mode = getenv("RIFTCO_FAKE_PJRT_MODE");
    if (mode == NULL) {
        mode = "device";
    }
    memset(&api, 0, sizeof(api));
    api.struct_size = sizeof(api);
    api.version_struct_size = 24;
    api.major_version = 0;
    api.minor_version = 115;
    for (size_t i = 0; i < 140; ++i) {
        api.functions[i] = (void*)unexpected;
    }
    api.functions[0] = (void*)error_destroy;
    api.functions[1] = (void*)error_message;
    api.functions[3] = (void*)succeed;        /* PJRT_Plugin_Initialize */
    api.functions[10] = (void*)client_create; /* PJRT_Client_Create */
    api.functions[12] = (void*)platform_name; /* PJRT_Client_PlatformName */
    api.functions[16] = (void*)no_devices;    /* PJRT_Client_AddressableDevices */
    if (strcmp(mode, "major") == 0) {
        api.major_version = 1;
    } else if (strcmp(mode, "minor") == 0) {
        api.minor_version = 10;
    } else if (strcmp(mode, "table") == 0) {
        api.struct_size = 40 + 20 * sizeof(void*);
    }
    return &api;
}
