// src/verify/oracle_arithmetic.cpp — OracleArithmetic (oracle_arithmetic.hpp).
#include "oracle_arithmetic.hpp"

#include <cfenv>

#include <omp.h>

namespace oasis::verify::detail {
namespace {
struct ThreadState {
  int guards = 0;      ///< the calling thread's open guards
  bool saved = false;  ///< env holds this thread's environment from before a guard
  std::fenv_t env{};
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

// A pool thread already set by its master's guard (saved) does not open one of its own: its saved
// environment is the one to give back.
OracleArithmetic::OracleArithmetic() : outer_(state.guards++ == 0 && !state.saved) {
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
  const std::fenv_t caller = state.env;
  const bool known = state.saved;
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0 && state.guards == 0) {
      if (state.saved)
        restore(state);
      else if (known)  // started inside the guard: the caller's environment, which it would have inherited
        std::fesetenv(&caller);
    }
  }
  restore(state);
}

}  // namespace oasis::verify::detail
