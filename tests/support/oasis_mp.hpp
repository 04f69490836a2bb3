// tests/support/oasis_mp.hpp — identities checked in 50-digit arithmetic (docs/tolerances.md,
// policy item 2): a property exact in real arithmetic holds in oasis::mp50 to ~1e-49 relative;
// kMpTol = 1e-40 leaves room for exp/log of arguments up to ~40, while a real mistake is off by
// 1e-30 or more.
#pragma once

#include "oasis/core/multiprecision.hpp"

namespace oasis::test {

inline const mp50 kMpTol = mp50(1e-40);

inline mp50 mp_abs(const mp50& x) { return x < 0 ? mp50(-x) : x; }

}  // namespace oasis::test
