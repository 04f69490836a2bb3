// proofs_checks/support.hpp — what a check file includes (internal to oasis_proofs).
//
// Every check follows the pattern of docs/paper-map.md, "What passes means". The pieces:
//   instances.hpp     instances drawn in double and rounded once to the scalar T under test;
//                     exact conversion of T results to mp50
//   evaluate.hpp      the functions under test (the library, or a mutant) evaluated in T and
//                     compared with the library in mp50 under the bounds of oasis/ops/error_bounds.hpp
//   check_run.hpp     CheckRun: the errors, margins and equality cases of one run, and its result
//   define_check.hpp  define_check(): the library on every scalar and backend, and the mutants
#pragma once

#include "check.hpp"
#include "check_run.hpp"
#include "define_check.hpp"
#include "evaluate.hpp"
#include "instances.hpp"
