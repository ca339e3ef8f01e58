#pragma once
// The format and row-count switches of a block kernel set, written once for every instruction
// set. `Loops` supplies the set's inner loops as templates (compiled with its target
// attributes in its own file):
//   decode_range<Format>(view, begin, count, out)
//   gemv_forward<Format, Rows>(view, x, o_begin, o_end, y)        Rows in 1..4
//   gemv_backward<Format, Rows>(view, g, c_begin, c_end, dx)      Rows in 1..4
// and block_kernel_set<Loops>(name) is the BlockKernelSet over them.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/backend/cpu/block_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace riftco_transformer::detail::block_dispatch {

// The block holding column c of `row`, and the chunk of it c starts (c a multiple of 32).
template <WeightFormat Format>
inline const std::uint8_t* chunk_block(const std::uint8_t* row, std::size_t c,
                                       std::size_t& sub) noexcept {
    constexpr std::size_t elements = gguf_format_block_elements(Format);
    sub = (c % elements) / gguf_block_elements;
    return row + (c / elements) * gguf_block_bytes(Format);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The binary16 at `bytes` through F16C (exact, as block_half_at's portable conversion), for
// the vector sets (their targets include f16c).
__attribute__((target("f16c"))) inline float half_scalar(const std::uint8_t* bytes) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes, sizeof(bits));
    return _cvtsh_ss(bits);
}
#endif

// Calls `call.template operator()<Format>()` for the view's block format.
template <typename Call>
void on_format(WeightFormat format, Call&& call) {
    switch (format) {
        case WeightFormat::q8_0:
            return call.template operator()<WeightFormat::q8_0>();
        case WeightFormat::q4_0:
            return call.template operator()<WeightFormat::q4_0>();
        case WeightFormat::q5_0:
            return call.template operator()<WeightFormat::q5_0>();
        case WeightFormat::q4_k:
            return call.template operator()<WeightFormat::q4_k>();
        case WeightFormat::q5_k:
            return call.template operator()<WeightFormat::q5_k>();
        case WeightFormat::q6_k:
            return call.template operator()<WeightFormat::q6_k>();
        case WeightFormat::f16:
            return call.template operator()<WeightFormat::f16>();
        case WeightFormat::bf16:
            return call.template operator()<WeightFormat::bf16>();
        default:
            return call.template operator()<WeightFormat::q4_1>();
    }
}

// Calls `call.template operator()<Rows>()` for rows in 1..4 (more is 4).
template <typename Call>
void on_rows(std::size_t rows, Call&& call) {
    switch (rows) {
        case 1:
            return call.template operator()<1>();
        case 2:
            return call.template operator()<2>();
        case 3:
            return call.template operator()<3>();
        default:
            return call.template operator()<4>();
    }
}

template <typename Loops>
void decode_range(const BlockView& view, std::size_t begin, std::size_t count, float* out) {
    on_format(view.layout.format, [&]<WeightFormat Format>() {
        Loops::template decode_range<Format>(view, begin, count, out);
    });
}

template <typename Loops>
void gemv_forward(const BlockView& view, const float* x, std::size_t rows, std::size_t o_begin,
                  std::size_t o_end, float* y) {
    on_format(view.layout.format, [&]<WeightFormat Format>() {
        on_rows(rows, [&]<std::size_t Rows>() {
            Loops::template gemv_forward<Format, Rows>(view, x, o_begin, o_end, y);
        });
    });
}

template <typename Loops>
void gemv_backward(const BlockView& view, const float* g, std::size_t rows, std::size_t c_begin,
                   std::size_t c_end, float* dx) {
    on_format(view.layout.format, [&]<WeightFormat Format>() {
        on_rows(rows, [&]<std::size_t Rows>() {
            Loops::template gemv_backward<Format, Rows>(view, g, c_begin, c_end, dx);
        });
    });
}

template <typename Loops>
[[nodiscard]] constexpr BlockKernelSet block_kernel_set(const char* name) noexcept {
    return {name, &decode_range<Loops>, &gemv_forward<Loops>, &gemv_backward<Loops>};
}

}  // namespace riftco_transformer::detail::block_dispatch
