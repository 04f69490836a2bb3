// proofs_checks/support.hpp — what a check file includes (internal to oasis_proofs).
//
// Every check follows one pattern (docs/paper-map.md, "What passes means"):
//  1. an instance is drawn in double from a reproducible stream and rounded once to the scalar T
//     under test, so that T and mp50 see identical inputs                        (instances.hpp);
//  2. the implementation under test (a small struct of std::function: the library by default, a
//     mutant in the teeth tests) is evaluated in T                                (evaluate.hpp);
//  3. for T != mp50 the library is also evaluated in oasis::mp50 on the same inputs and every
//     output is compared with the documented bound of oasis/error_bounds.hpp (worst_error);
//  4. the statement's conclusion is evaluated in mp50 on the T outputs (converted exactly), with
//     a rounding allowance derived from the same bounds (worst_margin >= -allowance passes); at an
//     equality (tight) instance the margin must also be <= the allowance          (check_run.hpp).
// define_check.hpp turns a statement, the library and the mutants into a Check.
#pragma once

#include "check.hpp"
#include "check_run.hpp"
#include "define_check.hpp"
#include "evaluate.hpp"
#include "instances.hpp"
