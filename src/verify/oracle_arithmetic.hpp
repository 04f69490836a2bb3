// src/verify/oracle_arithmetic.hpp — the arithmetic the oracles assume, set for the length of a check
// whatever the caller set (docs/tolerances.md, "The oracle's arithmetic").
//
// Every bound of the oracles' own error (u = 2^-53 for double, 2^-24 for float, the subnormal floors
// of float_sums.hpp) assumes IEEE round-to-nearest-even with gradual underflow. A caller may run
// under other modes: torch.set_flush_denormal(True) sets flush-to-zero and denormals-are-zero, a
// kernel harness may leave a directed rounding mode or unmasked exceptions behind. The modes are
// per thread (x86 MXCSR and the x87 control word, AArch64 FPCR), and OpenMP's pool threads keep
// theirs between parallel regions, so the guard sets the default environment (FE_DFL_ENV: round to
// nearest, no flushing, exceptions masked) on the calling thread and on every thread of its pool,
// and gives each back the environment it had.
#pragma once

namespace oasis::verify::detail {

/// Scoped: the outermost guard of a thread sets the default floating-point environment on it and on
/// its OpenMP pool (omp_get_max_threads threads) and restores theirs when it ends; nested guards do
/// nothing. A pool thread first started inside the guard starts from the calling thread's (default)
/// environment and keeps it.
class OracleArithmetic {
 public:
  OracleArithmetic();
  ~OracleArithmetic();
  OracleArithmetic(const OracleArithmetic&) = delete;
  OracleArithmetic& operator=(const OracleArithmetic&) = delete;

 private:
  bool outer_;
};

}  // namespace oasis::verify::detail
