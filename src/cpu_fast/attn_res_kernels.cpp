// src/cpu_fast/attn_res_kernels.cpp — the fused AttnRes routing's row passes (kernels/attn_res.inc)
// compiled for the baseline, avx2 and avx512, each in its own target region that starts after every
// include (as fast_kernels_<isa>.cpp; see fast_kernels.hpp).
#include "attn_res_kernels.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace oasis::fast {

namespace generic_ar {
constexpr int W = 4;
typedef float V __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) void ar_stream(float* p, V x) {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_stream_ps(p, (__m128)x);
#else
  __builtin_memcpy(p, &x, sizeof(V));
#endif
}
#define ISA_NAME "generic"
#include "kernels/attn_res.inc"
#undef ISA_NAME
}  // namespace generic_ar

#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2_ar {
constexpr int W = 8;
typedef float V __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void ar_stream(float* p, V x) { _mm256_stream_ps(p, (__m256)x); }
#define ISA_NAME "avx2"
#include "kernels/attn_res.inc"
#undef ISA_NAME
}  // namespace avx2_ar
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
namespace avx512_ar {
constexpr int W = 16;
typedef float V __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) void ar_stream(float* p, V x) { _mm512_stream_ps(p, (__m512)x); }
#define ISA_NAME "avx512"
#include "kernels/attn_res.inc"
#undef ISA_NAME
}  // namespace avx512_ar
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

void stream_fence() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_sfence();
#endif
}

const AttnResRows& attn_res_rows() {
#if defined(__x86_64__) || defined(_M_X64)
  // the active variant was chosen among those this CPU runs (dispatch.cpp), so its width is safe
  switch (active_kernels().lanes) {
    case 16: return avx512_ar::ar_table;
    case 8: return avx2_ar::ar_table;
    default: break;
  }
#endif
  return generic_ar::ar_table;
}

}  // namespace oasis::fast
