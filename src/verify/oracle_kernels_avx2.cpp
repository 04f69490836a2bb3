// src/verify/oracle_kernels_avx2.cpp — the oracle's matrix products (oracle_kernels_impl.inc)
// compiled for avx2. The target region starts after every include (src/cpu_fast/fast_kernels.hpp).
#include "oracle_kernels.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

// A register tile of 3 rows x 4 vectors: 12 accumulators (independent multiply-add chains), one
// broadcast of A per 4 multiply-adds; with B's 4 vectors it needs more than the 16 ymm registers,
// so the compiler reads some of B from the packed panel as memory operands. On the AVX2 EPYC host
// it ran the oracle's products 13-32% faster than 4 x 2 (BM_OracleGemm, docs/benchmarks.md
// "Failing fast"); 6 x 2, 8 x 1, 2 x 4 and 4 x 4 were slower.
namespace oasis::verify::kernels::avx2_impl {
namespace f64 {
using T = double;
constexpr int W = 4;
typedef double V __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c); }
constexpr int MR = 3, NC = 4;
#include "oracle_kernels_impl.inc"
}  // namespace f64
namespace f32 {
using T = float;
constexpr int W = 8;
typedef float V __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
constexpr int MR = 3, NC = 4;
#include "oracle_kernels_impl.inc"
}  // namespace f32
static const Gemm table = {"avx2", &f64::gemm, &f64::gemm_at, &f32::gemm};
}  // namespace oasis::verify::kernels::avx2_impl

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace oasis::verify::kernels {
const Gemm& gemm_avx2() { return avx2_impl::table; }
}  // namespace oasis::verify::kernels
#endif
