// src/cpu_fast/fast_kernels_avx2.cpp — the fast CPU kernels (kernels/*.inc) compiled for avx2.
// The target region starts after every include; see fast_kernels.hpp.
#include "fast_kernels.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace oasis::fast::avx2_impl {
constexpr int W = 8;
typedef float V __attribute__((vector_size(32)));
typedef int VI __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline __attribute__((always_inline)) V splat(float x) { return (V)_mm256_set1_ps(x); }
// maxps / minps; horizontal reductions in log2(8) shuffle steps
#define OASIS_FAST_ISA_MINMAX
static inline __attribute__((always_inline)) V vmax(V a, V b) { return (V)_mm256_max_ps((__m256)a, (__m256)b); }
static inline __attribute__((always_inline)) V vmin(V a, V b) { return (V)_mm256_min_ps((__m256)a, (__m256)b); }
static inline __attribute__((always_inline)) float hmax(V a) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128((__m256)a), _mm256_extractf128_ps((__m256)a, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
static inline __attribute__((always_inline)) float hsum(V a) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128((__m256)a), _mm256_extractf128_ps((__m256)a, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
constexpr int MR = 4, NC = 3;
#define ISA_NAME "avx2"
#include "kernels/table.inc"
#undef ISA_NAME
#undef OASIS_FAST_ISA_MINMAX
}  // namespace oasis::fast::avx2_impl

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace oasis::fast {
const Kernels& kernels_avx2() { return avx2_impl::table; }
}  // namespace oasis::fast
#endif
