// src/cpu_fast/fast_kernels_avx512.cpp — the fast CPU kernels (kernels/*.inc) compiled for avx512.
// The target region starts after every include; see fast_kernels.hpp.
#include "fast_kernels.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif

namespace oasis::fast::avx512_impl {
constexpr int W = 16;
typedef float V __attribute__((vector_size(64)));
typedef int VI __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
static inline __attribute__((always_inline)) V splat(float x) { return (V)_mm512_set1_ps(x); }
// maxps / minps; horizontal reductions in log2(16) shuffle steps; p 2^n in one rounding (vscalefps),
// and masked to the lanes that keep it
#define OASIS_FAST_ISA_MINMAX
static inline __attribute__((always_inline)) V vmax(V a, V b) { return (V)_mm512_max_ps((__m512)a, (__m512)b); }
static inline __attribute__((always_inline)) V vmin(V a, V b) { return (V)_mm512_min_ps((__m512)a, (__m512)b); }
static inline __attribute__((always_inline)) float hmax(V a) { return _mm512_reduce_max_ps((__m512)a); }
static inline __attribute__((always_inline)) float hsum(V a) { return _mm512_reduce_add_ps((__m512)a); }
#define OASIS_FAST_ISA_SCALE_POW2
static inline __attribute__((always_inline)) V scale_pow2(V p, V n) { return (V)_mm512_scalef_ps((__m512)p, (__m512)n); }
// p 2^n where x >= lo or x is NaN, 0 elsewhere, the scaling masked (no clamp of x needed before)
#define OASIS_FAST_ISA_SCALE_POW2_WHERE
static inline __attribute__((always_inline)) V scale_pow2_where_not_below(V p, V n, V x, float lo) {
  const __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(lo), _CMP_NLT_UQ);
  return (V)_mm512_maskz_scalef_ps(keep, (__m512)p, (__m512)n);
}
constexpr int MR = 4, NC = 4;
#define ISA_NAME "avx512"
#include "kernels/table.inc"
#undef ISA_NAME
#undef OASIS_FAST_ISA_MINMAX
#undef OASIS_FAST_ISA_SCALE_POW2
#undef OASIS_FAST_ISA_SCALE_POW2_WHERE
}  // namespace oasis::fast::avx512_impl

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace oasis::fast {
const Kernels& kernels_avx512() { return avx512_impl::table; }
}  // namespace oasis::fast
#endif
