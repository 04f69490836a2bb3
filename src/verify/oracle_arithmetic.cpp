// src/verify/oracle_arithmetic.cpp — OracleArithmetic (oracle_arithmetic.hpp).
#include "oracle_arithmetic.hpp"

#include <cfenv>

#include <omp.h>

namespace oasis::verify::detail {
namespace {
struct ThreadState {
  int guards = 0;      ///< the calling thread's open guards
  bool saved = false;  ///< env holds this thread's environment from before a guard
  std::fenv_t env;
};
thread_local ThreadState state;

void set_default(ThreadState& s) {
  s.saved = std::fegetenv(&s.env) == 0;
  std::fesetenv(FE_DFL_ENV);
}

void restore(ThreadState& s) {
  if (s.saved) std::fesetenv(&s.env);
  s.saved = false;
}
}  // namespace

OracleArithmetic::OracleArithmetic() : outer_(state.guards++ == 0) {
  if (!outer_) return;
  set_default(state);
  // the pool's other threads (the calling thread's state is already saved)
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0 && state.guards == 0 && !state.saved) set_default(state);
  }
}

OracleArithmetic::~OracleArithmetic() {
  --state.guards;
  if (!outer_) return;
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0 && state.guards == 0) restore(state);
  }
  restore(state);
}

}  // namespace oasis::verify::detail
