// proofs_checks/statements.hpp — one factory per paper statement (one .cpp each); catalogue.cpp
// lists them explicitly, in paper order (docs/paper-map.md).
#pragma once

#include "check.hpp"

namespace oasis::checks {

Check make_mass_scaling();              // Eq. 4.1, App. C.5: mass scaling and ratio preservation
Check make_lemma_5_1();                 // Lemma 5.1 and the separation counterexample (u, -u)
Check make_theorem_5_1();               // Theorem 5.1: depth concentration
Check make_lemma_5_2();                 // Lemma 5.2: sink aggregation (softmax and Softmax1 depth)
Check make_theorem_5_2();               // Theorem 5.2: null bounds and feasibility thresholds
Check make_centring_ratio();            // §4.3: the centring ratio identity
Check make_coupling_limits();           // §4.3: beta = 0, one transformed branch, l = 1
Check make_depth_null_decomposition();  // §4.3: h - h_ref = sum_i a_i (s_i - h_ref) - a_null h_ref
Check make_pathology_sum_rule();        // Definitions 5.1/5.2 and Proposition 5.1's sum rule

}  // namespace oasis::checks
