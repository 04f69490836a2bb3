// src/verify/oracle_kernels_generic.cpp — the oracle's matrix product (oracle_kernels_impl.inc)
// for the baseline ISA: 16-byte vectors, a multiply and an add.
#include "oracle_kernels.hpp"

namespace oasis::verify::kernels::generic_impl {
constexpr int W = 2;
typedef double V __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return a * b + c; }
constexpr int MR = 4, NC = 4;
#define ISA_NAME "generic"
#include "oracle_kernels_impl.inc"
#undef ISA_NAME
}  // namespace oasis::verify::kernels::generic_impl

namespace oasis::verify::kernels {
const Gemm& gemm_generic() { return generic_impl::table; }
}  // namespace oasis::verify::kernels
