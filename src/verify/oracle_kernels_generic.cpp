// src/verify/oracle_kernels_generic.cpp — the oracle's matrix products (oracle_kernels_impl.inc)
// for the baseline ISA: 16-byte vectors, a multiply and an add.
#include "oracle_kernels.hpp"

namespace oasis::verify::kernels::generic_impl {
namespace f64 {
using T = double;
constexpr int W = 2;
typedef double V __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return a * b + c; }
constexpr int MR = 4, NC = 4;
#include "oracle_kernels_impl.inc"
}  // namespace f64
namespace f32 {
using T = float;
constexpr int W = 4;
typedef float V __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) V vfma(V a, V b, V c) { return a * b + c; }
constexpr int MR = 4, NC = 4;
#include "oracle_kernels_impl.inc"
}  // namespace f32
static const Gemm table = {"generic", &f64::gemm, &f64::gemm_at, &f32::gemm};
}  // namespace oasis::verify::kernels::generic_impl

namespace oasis::verify::kernels {
const Gemm& gemm_generic() { return generic_impl::table; }
}  // namespace oasis::verify::kernels
