// src/verify/oracle_arithmetic.hpp — the arithmetic the oracles' own error bounds assume (round to
// nearest, gradual underflow), set for the length of a check whatever modes the caller left on its
// thread or its OpenMP pool (docs/tolerances.md, "The oracle's arithmetic").
#pragma once

namespace oasis::verify::detail {

/// Scoped: the outermost guard of a thread sets the default floating-point environment (FE_DFL_ENV)
/// on it and on its OpenMP pool (omp_get_max_threads threads) and restores theirs when it ends;
/// nested guards, and guards on a pool thread inside its master's, do nothing. A pool thread first
/// started inside the guard gets the calling thread's environment at the end.
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
