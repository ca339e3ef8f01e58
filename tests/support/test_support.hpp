#pragma once
// Shared helpers for the GoogleTest suites: tolerance comparisons (form A of
// docs/ARCHITECTURE.md, 'Numeric parity'),
// centred finite differences in double, and tensor construction shortcuts.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/core/threading.hpp"

namespace riftco_transformer::testing {

// |a − e| <= atol + rtol·max(|a|, |e|) for every element (form A); NaN matches only NaN,
// infinities only the same infinity.
inline ::testing::AssertionResult all_close(const std::vector<float>& actual,
                                            const std::vector<double>& expected, double atol = 1e-6,
                                            double rtol = 1e-6) {
    if (actual.size() != expected.size()) {
        return ::testing::AssertionFailure()
               << "size " << actual.size() << " != expected size " << expected.size();
    }
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double a = actual[i];
        const double e = expected[i];
        if (std::isnan(e) || std::isnan(a)) {
            if (std::isnan(e) && std::isnan(a))
                continue;
            return ::testing::AssertionFailure() << "element " << i << ": " << a << " vs " << e;
        }
        if (std::isinf(e) || std::isinf(a)) {
            if (a == e)
                continue;
            return ::testing::AssertionFailure() << "element " << i << ": " << a << " vs " << e;
        }
        const double tolerance = atol + rtol * std::max(std::fabs(a), std::fabs(e));
        if (std::fabs(a - e) > tolerance) {
            return ::testing::AssertionFailure()
                   << "element " << i << ": " << a << " vs expected " << e << " (|diff| "
                   << std::fabs(a - e) << " > " << tolerance << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_close(const Tensor& actual,
                                            const std::vector<double>& expected, double atol = 1e-6,
                                            double rtol = 1e-6) {
    return all_close(actual.to_host(), expected, atol, rtol);
}

// Bitwise equality of two float vectors (for "unchanged" and causality checks).
inline ::testing::AssertionResult bit_identical(const std::vector<float>& a,
                                                const std::vector<float>& b) {
    if (a.size() != b.size()) {
        return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            return ::testing::AssertionFailure()
                   << "element " << i << ": " << a[i] << " vs " << b[i];
        }
    }
    return ::testing::AssertionSuccess();
}

// Centred finite-difference gradient of a scalar function f(x) over every element of x:
// df/dx_i ≈ (f(x + ε e_i) − f(x − ε e_i)) / 2ε, evaluated with f computed in float by the code
// under test but differenced in double. Use with ε = 1e-2 and tolerance ~5e-3
// (docs/ARCHITECTURE.md, 'Numeric parity').
inline std::vector<double> finite_difference_gradient(
    const std::function<double(const std::vector<float>&)>& f, std::vector<float> x,
    double epsilon = 1e-2) {
    std::vector<double> gradient(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const float original = x[i];
        x[i] = static_cast<float>(original + epsilon);
        const double plus = f(x);
        x[i] = static_cast<float>(original - epsilon);
        const double minus = f(x);
        x[i] = original;
        gradient[i] = (plus - minus) / (2.0 * epsilon);
    }
    return gradient;
}

// Deterministic pseudo-random floats in [lo, hi) (a small LCG: reproducible everywhere).
inline std::vector<float> pseudo_random(std::size_t count, float lo = -1.0F, float hi = 1.0F,
                                        std::uint32_t seed = 12345U) {
    std::vector<float> values(count);
    std::uint32_t state = seed;
    for (float& value : values) {
        state = state * 1664525U + 1013904223U;
        value = lo + (hi - lo) * static_cast<float>(state >> 8U) / 16777216.0F;
    }
    return values;
}

// Deterministic pseudo-random token ids in [0, vocabulary).
inline std::vector<std::uint32_t> pseudo_random_tokens(std::size_t count, std::uint32_t vocabulary,
                                                       std::uint32_t seed) {
    std::vector<std::uint32_t> tokens(count);
    std::uint32_t state = seed;
    for (auto& token : tokens) {
        state = state * 1664525U + 1013904223U;
        token = (state >> 8U) % vocabulary;
    }
    return tokens;
}

// Σ a_i·b_i in double (adjoint identities, weighted objectives for finite differences).
inline double inner_product(const std::vector<float>& a, const std::vector<float>& b) {
    double total = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        total += static_cast<double>(a[i]) * b[i];
    }
    return total;
}

// Restores the process-wide CPU thread count when a test that changes it ends.
class ThreadCountGuard {
  public:
    ThreadCountGuard() : saved_(cpu_thread_count()) {}
    ~ThreadCountGuard() { set_cpu_thread_count(saved_); }
    ThreadCountGuard(const ThreadCountGuard&) = delete;
    ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

  private:
    std::size_t saved_;
};

inline std::vector<double> to_double(const std::vector<float>& values) {
    return {values.begin(), values.end()};
}

// The message of the `Exception` that `action()` throws (a test failure, and "", when it
// throws none).
template <typename Exception, typename Action>
std::string message_of(Action&& action) {
    try {
        action();
    } catch (const Exception& error) {
        return error.what();
    }
    ADD_FAILURE() << "expected an exception";
    return "";
}

// Success only when `action` throws exactly `Error` (not a class derived from it) with a
// message containing `fragment`.
template <typename Error, typename Action>
::testing::AssertionResult throws(Action&& action, std::string_view fragment) {
    try {
        action();
    } catch (const std::exception& error) {
        if (typeid(error) != typeid(Error)) {
            return ::testing::AssertionFailure()
                   << "threw " << typeid(error).name() << " instead of " << typeid(Error).name()
                   << ": " << error.what();
        }
        if (std::string_view(error.what()).find(fragment) == std::string_view::npos) {
            return ::testing::AssertionFailure()
                   << "message \"" << error.what() << "\" lacks \"" << fragment << "\"";
        }
        return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "nothing was thrown";
}

// `count` draws of N(0, scale²) from a generator seeded with `seed`.
inline std::vector<float> normal_values(std::size_t count, std::uint32_t seed, float scale = 1.0F) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0F, scale);
    std::vector<float> values(count);
    for (float& v : values)
        v = normal(generator);
    return values;
}

}  // namespace riftco_transformer::testing
