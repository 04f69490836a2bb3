// src/verify/oracle_kernels_avx512.cpp — the oracle's matrix products (oracle_kernels_impl.inc)
// compiled for avx512. The target region starts after every include (src/cpu_fast/fast_kernels.hpp).
#include "oracle_kernels.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif

namespace oasis::verify::kernels::avx512_impl {
namespace f64 {
using T = double;
constexpr int W = 8;
typedef double V __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c); }
constexpr int MR = 6, NC = 4;
#include "oracle_kernels_impl.inc"
}  // namespace f64
namespace f32 {
using T = float;
constexpr int W = 16;
typedef float V __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
constexpr int MR = 6, NC = 2;
#include "oracle_kernels_impl.inc"
}  // namespace f32
static const Gemm table = {"avx512", &f64::gemm, &f64::gemm_at, &f32::gemm};
}  // namespace oasis::verify::kernels::avx512_impl

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace oasis::verify::kernels {
const Gemm& gemm_avx512() { return avx512_impl::table; }
}  // namespace oasis::verify::kernels
#endif
