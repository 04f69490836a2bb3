// src/cpu_fast/fast_kernels_generic.cpp — the fast CPU kernels (kernels/*.inc) for the
// baseline ISA (SSE2 on x86-64; whatever 16-byte vectors the target has elsewhere). No fused
// multiply-add: vfma is a multiply and an add.
#include "fast_kernels.hpp"

namespace oasis::fast::generic_impl {
constexpr int W = 4;
typedef float V __attribute__((vector_size(16)));
typedef int VI __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return a * b + c; }
static inline __attribute__((always_inline)) V splat(float x) { return V{x, x, x, x}; }
constexpr int MR = 4, NC = 2;
#define ISA_NAME "generic"
#include "kernels/table.inc"
#undef ISA_NAME
}  // namespace oasis::fast::generic_impl

namespace oasis::fast {
const Kernels& kernels_generic() { return generic_impl::table; }
}  // namespace oasis::fast
