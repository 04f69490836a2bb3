// oasis/oasis.hpp — the whole oracle core in one include.
//
//   normalizer.hpp  softmax, Softmax1 / sink-logit normaliser (SPEC §1)
//   attention.hpp   multi-head token attention with LSE1 and p_null (SPEC §2)
//   coupling.hpp    psi, centring conventions, coupling g - beta * Dpsi (SPEC §3)
//   depth.hpp       depth weights, mixing, Kimi pseudo-query logits (SPEC §3–4)
//   variant.hpp     the paper's variants (SPEC §4 table)
//   error_bounds.hpp documented float/double error bounds against high precision
#pragma once

#include "oasis/attention.hpp"
#include "oasis/coupling.hpp"
#include "oasis/depth.hpp"
#include "oasis/error.hpp"
#include "oasis/instances.hpp"
#include "oasis/multiprecision.hpp"
#include "oasis/normalizer.hpp"
#include "oasis/scalar.hpp"
#include "oasis/tensor.hpp"
#include "oasis/variant.hpp"
