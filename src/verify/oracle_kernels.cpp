// src/verify/oracle_kernels.cpp — run-time choice of the oracle's matrix product.
#include <cstdlib>
#include <cstring>

#include "oracle_kernels.hpp"

namespace oasis::verify::kernels {

std::vector<const Gemm*> runnable_variants() {
  std::vector<const Gemm*> v = {&gemm_generic()};
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v.push_back(&gemm_avx2());
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512f"))
    v.push_back(&gemm_avx512());
#endif
  return v;
}

const Gemm& oracle_gemm() {
  static const Gemm* chosen = [] {
    const char* env = std::getenv("OASIS_ORACLE_ISA");
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
    if (env && std::strcmp(env, "generic") == 0) return &gemm_generic();
    if (env && std::strcmp(env, "avx2") == 0 && avx2) return &gemm_avx2();
    if (avx512) return &gemm_avx512();
    if (avx2) return &gemm_avx2();
#endif
    (void)env;
    return &gemm_generic();
  }();
  return *chosen;
}

}  // namespace oasis::verify::kernels
