// Environment variables the library reads once per process (RIFTCO_TRANSFORMER_NUM_THREADS,
// RIFTCO_TRANSFORMER_CPU_CACHE_BYTES): every behaviour runs in a forked child (EXPECT_EXIT)
// that sets the variable before the library first reads it. The parent process of this
// binary never allocates a large tensor, so each child starts with an unread environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "riftco_transformer/core/memory.hpp"
#include "riftco_transformer/core/tensor_ops.hpp"
#include "riftco_transformer/core/threading.hpp"

namespace riftco_transformer {
namespace {

std::string invalid_argument_message(const std::function<void()>& action) {
    try {
        action();
    } catch (const std::invalid_argument& error) {
        return error.what();
    }
    return "";
}

// Runs `check` in a child process with the variable set (or unset when value is null);
// the child exits 0 when the check holds and prints what went wrong otherwise.
void expect_in_child(const char* value, const std::function<bool()>& check) {
    EXPECT_EXIT(
        {
            if (value == nullptr) {
                ::unsetenv("RIFTCO_TRANSFORMER_NUM_THREADS");
            } else {
                ::setenv("RIFTCO_TRANSFORMER_NUM_THREADS", value, 1);
            }
            std::exit(check() ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
}

}  // namespace

TEST(ThreadCountEnvironment, MalformedValueIsInvalidArgumentNamingVariableAndValue) {
    expect_in_child("two", [] {
        const std::string message =
            invalid_argument_message([] { static_cast<void>(cpu_thread_count()); });
        const bool named = message.find("RIFTCO_TRANSFORMER_NUM_THREADS") != std::string::npos &&
                           message.find("two") != std::string::npos;
        if (!named)
            std::cerr << "message: " << message << '\n';
        // Kernels that consult the pool report the same error instead of guessing a size.
        const Tensor big({1U << 20U}, 1.0F);
        const bool kernel_reports =
            !invalid_argument_message([&] { static_cast<void>(tensor_ops::exp(big)); }).empty();
        // An explicit choice overrides the broken environment.
        set_cpu_thread_count(1);
        return named && kernel_reports && cpu_thread_count() == 1;
    });
}

TEST(ThreadCountEnvironment, ZeroNegativeAndTrailingTextAreRejected) {
    for (const char* value : {"0", "-2", "4x", "99999"}) {
        expect_in_child(value, [] {
            return !invalid_argument_message([] { static_cast<void>(cpu_thread_count()); }).empty();
        });
    }
}

TEST(ThreadCountEnvironment, PositiveValueSetsThePoolSize) {
    expect_in_child("3", [] { return cpu_thread_count() == 3; });
}

TEST(ThreadCountEnvironment, UnsetMeansEveryHardwareThread) {
    expect_in_child(nullptr, [] {
        const unsigned hardware = std::thread::hardware_concurrency();
        return cpu_thread_count() == (hardware == 0 ? 1U : hardware);
    });
}

TEST(ThreadCount, ExplicitZeroIsInvalidArgument) {
    EXPECT_THROW(set_cpu_thread_count(0), std::invalid_argument);
}

TEST(CpuMemoryEnvironment, MalformedCacheLimitIsInvalidArgumentNamingVariable) {
    // The cache reads its limit when first used; a child process starts without one only if
    // this test binary has not allocated a large tensor yet, so fork before doing anything.
    EXPECT_EXIT(
        {
            ::setenv("RIFTCO_TRANSFORMER_CPU_CACHE_BYTES", "lots", 1);
            try {
                const Tensor large({std::size_t{1} << 20U});
            } catch (const std::invalid_argument& error) {
                const std::string message = error.what();
                std::exit(message.find("RIFTCO_TRANSFORMER_CPU_CACHE_BYTES") != std::string::npos &&
                                  message.find("lots") != std::string::npos
                              ? 0
                              : 1);
            }
            std::exit(2);
        },
        ::testing::ExitedWithCode(0), "");
}

}  // namespace riftco_transformer
