// How the two PJRT identities find and load their runtime, and how each failure reads.
// Every scenario runs in a child process (a gtest death-test fork), because a process loads
// each identity's runtime once and keeps the outcome: the child sets the environment, asks,
// prints what it saw and exits; the parent checks the exit code and the text.
//
// - tpu: RIFTCO_TRANSFORMER_TPU_LIBRARY, else TPU_LIBRARY_PATH, else libtpu.so;
// - pjrt: RIFTCO_TRANSFORMER_PJRT_PLUGIN, no fallback;
// - the reasons name the step: not compiled in, failed to load, incompatible PJRT version, no
//   device; a failure is cached (the environment is not read again).
// A small broken plugin (support/pjrt_fake_plugin.c) reaches the version and device steps;
// XLA's CPU plugin, when present, is the working case.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "riftco_transformer/core/backend.hpp"

namespace riftco_transformer {
namespace {

#if RIFTCO_TRANSFORMER_HAVE_PJRT

const char* const variables[] = {"RIFTCO_TRANSFORMER_TPU_LIBRARY", "TPU_LIBRARY_PATH",
                                 "RIFTCO_TRANSFORMER_PJRT_PLUGIN", "RIFTCO_FAKE_PJRT_MODE"};

// In the child: clears the loader's variables, applies `settings` ("NAME=value" pairs), asks
// about `backend`, prints "available" or the reason to stderr and exits 0 (available) or 1.
[[noreturn]] void ask(ExecutionBackend backend,
                      std::initializer_list<std::pair<const char*, std::string>> settings) {
    for (const char* variable : variables) {
        unsetenv(variable);
    }
    for (const auto& [name, value] : settings) {
        setenv(name, value.c_str(), 1);
    }
    if (execution_backend_available(backend)) {
        std::fprintf(stderr, "available\n");
        std::exit(0);
    }
    std::fprintf(stderr, "reason: %s\n",
                 std::string(execution_backend_unavailability_reason(backend)).c_str());
    std::exit(1);
}

std::string cpu_plugin() {
    const char* path = std::getenv("RIFTCO_TRANSFORMER_PJRT_PLUGIN");
    return path != nullptr ? path : "";
}

class PjrtLoader : public ::testing::Test {
  protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(PjrtLoader, PjrtWithoutAPluginNamedSaysWhichVariableToSet) {
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt, {}), ::testing::ExitedWithCode(1),
                "reason: no PJRT plugin is named: set RIFTCO_TRANSFORMER_PJRT_PLUGIN");
}

TEST_F(PjrtLoader, AMissingLibraryFailsToLoadNamingItsPath) {
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt,
                    {{"RIFTCO_TRANSFORMER_PJRT_PLUGIN", "/nonexistent/plugin_a.so"}}),
                ::testing::ExitedWithCode(1),
                "the PJRT plugin failed to load: could not load '/nonexistent/plugin_a.so'");
}

TEST_F(PjrtLoader, ALibraryThatIsNoPluginFailsToLoad) {
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt, {{"RIFTCO_TRANSFORMER_PJRT_PLUGIN", "libm.so.6"}}),
                ::testing::ExitedWithCode(1), "does not export GetPjrtApi");
}

TEST_F(PjrtLoader, TpuTriesItsOwnVariableFirstThenTpuLibraryPathThenLibtpu) {
    EXPECT_EXIT(ask(ExecutionBackend::Tpu, {{"RIFTCO_TRANSFORMER_TPU_LIBRARY", "/nonexistent/a.so"},
                                            {"TPU_LIBRARY_PATH", "/nonexistent/b.so"}}),
                ::testing::ExitedWithCode(1),
                "the TPU runtime library failed to load: could not load '/nonexistent/a.so'");
    EXPECT_EXIT(ask(ExecutionBackend::Tpu, {{"TPU_LIBRARY_PATH", "/nonexistent/b.so"}}),
                ::testing::ExitedWithCode(1), "could not load '/nonexistent/b.so'");
    EXPECT_EXIT(ask(ExecutionBackend::Tpu, {}), ::testing::ExitedWithCode(1),
                "could not load 'libtpu.so'");
}

TEST_F(PjrtLoader, IncompatibleVersionsAndShortTablesAreRefused) {
    const std::string fake = RIFTCO_TRANSFORMER_TEST_FAKE_PJRT_PLUGIN;
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt,
                    {{"RIFTCO_TRANSFORMER_PJRT_PLUGIN", fake}, {"RIFTCO_FAKE_PJRT_MODE", "major"}}),
                ::testing::ExitedWithCode(1),
                "has an incompatible PJRT version: .* implements PJRT C API 1\\.115");
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt,
                    {{"RIFTCO_TRANSFORMER_PJRT_PLUGIN", fake}, {"RIFTCO_FAKE_PJRT_MODE", "minor"}}),
                ::testing::ExitedWithCode(1), "incompatible PJRT version: .* API 0\\.10 .*x >= 90");
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt,
                    {{"RIFTCO_TRANSFORMER_PJRT_PLUGIN", fake}, {"RIFTCO_FAKE_PJRT_MODE", "table"}}),
                ::testing::ExitedWithCode(1),
                "incompatible PJRT version: .*200-byte function table");
}

TEST_F(PjrtLoader, AClientWithoutDevicesIsNoDevice) {
    const std::string fake = RIFTCO_TRANSFORMER_TEST_FAKE_PJRT_PLUGIN;
    EXPECT_EXIT(ask(ExecutionBackend::Tpu, {{"RIFTCO_TRANSFORMER_TPU_LIBRARY", fake},
                                            {"RIFTCO_FAKE_PJRT_MODE", "device"}}),
                ::testing::ExitedWithCode(1),
                "the TPU runtime library found no device: the fake PJRT client .* has no "
                "addressable device");
}

TEST_F(PjrtLoader, AFailureIsKeptForTheProcess) {
    const std::string plugin = cpu_plugin();
    if (plugin.empty()) {
        GTEST_SKIP() << "RIFTCO_TRANSFORMER_PJRT_PLUGIN does not name the CPU plugin";
    }
    EXPECT_EXIT(
        {
            unsetenv("RIFTCO_TRANSFORMER_PJRT_PLUGIN");
            const bool first = execution_backend_available(ExecutionBackend::Pjrt);
            setenv("RIFTCO_TRANSFORMER_PJRT_PLUGIN", plugin.c_str(), 1);
            const bool second = execution_backend_available(ExecutionBackend::Pjrt);
            std::fprintf(stderr, "first=%d second=%d\n", first, second);
            std::exit(0);
        },
        ::testing::ExitedWithCode(0), "first=0 second=0");
}

TEST_F(PjrtLoader, BothIdentitiesLoadARealPluginIndependently) {
    const std::string plugin = cpu_plugin();
    if (plugin.empty()) {
        GTEST_SKIP() << "RIFTCO_TRANSFORMER_PJRT_PLUGIN does not name the CPU plugin";
    }
    EXPECT_EXIT(ask(ExecutionBackend::Pjrt, {{"RIFTCO_TRANSFORMER_PJRT_PLUGIN", plugin}}),
                ::testing::ExitedWithCode(0), "available");
    // The tpu identity takes any PJRT runtime it is pointed at (here XLA's CPU plugin).
    EXPECT_EXIT(ask(ExecutionBackend::Tpu, {{"RIFTCO_TRANSFORMER_TPU_LIBRARY", plugin}}),
                ::testing::ExitedWithCode(0), "available");
}

// Google's real libtpu (PyPI's libtpu wheel, unpacked into the cache by .ci/run) on a machine
// without a TPU: a clean "no device" reason, no crash and no hang (the child has two minutes).
// TPU_SKIP_MDS_QUERY=1 is libtpu's own switch for hosts outside Google Cloud: without it libtpu
// spends minutes retrying the cloud metadata server before it gives up. Skipped when the wheel
// is not in the cache.
TEST_F(PjrtLoader, RealLibtpuWithoutATpuSaysSoCleanly) {
    const std::string libtpu = RIFTCO_TRANSFORMER_TEST_LIBTPU;
    if (libtpu.empty() || !std::filesystem::exists(libtpu)) {
        GTEST_SKIP() << "libtpu.so is not in the cache (" << libtpu
                     << "); .ci/run fetches PyPI's libtpu wheel";
    }
    EXPECT_EXIT(
        {
            alarm(120);
            ask(ExecutionBackend::Tpu,
                {{"RIFTCO_TRANSFORMER_TPU_LIBRARY", libtpu}, {"TPU_SKIP_MDS_QUERY", "1"}});
        },
        ::testing::ExitedWithCode(1),
        "reason: the TPU runtime library found no device: PJRT client creation failed: .*");
}

#else  // the default build: both identities are the unavailable stub

TEST(PjrtLoader, BothIdentitiesSayTheyAreNotCompiledIn) {
    for (const ExecutionBackend backend : {ExecutionBackend::Tpu, ExecutionBackend::Pjrt}) {
        EXPECT_FALSE(execution_backend_available(backend));
        const std::string reason(execution_backend_unavailability_reason(backend));
        EXPECT_NE(reason.find("not compiled into this build (RIFTCO_TRANSFORMER_ENABLE_TPU=OFF)"),
                  std::string::npos)
            << reason;
    }
}

#endif

}  // namespace
}  // namespace riftco_transformer
