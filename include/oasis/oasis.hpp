// oasis/oasis.hpp — the whole oracle core in one include.
//
//   normalizer.hpp  softmax, Softmax1 / sink-logit normaliser (SPEC §1)
//   attention.hpp   multi-head token attention with LSE1 and p_null (SPEC §2)
//   coupling.hpp    psi, centring conventions, coupling g - beta * Dpsi (SPEC §3)
//   depth.hpp       depth weights, mixing, Kimi pseudo-query logits (SPEC §3–4)
//   variant.hpp     the paper's variants (SPEC §4 table)
//   error_bounds.hpp documented float/double error bounds against high precision
//   backend.hpp     the same float32 API on the reference, fast CPU and CUDA backends
//   baselines.hpp   S1/S2 sinks, gated attention, StreamingLLM policy (clipped softmax, sparsemax,
//                   entmax-1.5 are RowNorm kinds of normalizer.hpp)
//   metrics.hpp     kurtosis, max |x|, BOS mass, entropy, null mass, sink rate (SPEC §6)
//   quant.hpp       fake quantisation (W8A8 / W6A6 / W4A4 presets)
// Separate includes: oasis/model/model.hpp (the AttnRes transformer), oasis/io/*.hpp (npy,
// safetensors), oasis/verify/*.hpp (the compare engine, target oasis::verify); included here,
// oasis/pathology.hpp (Definition 5.1/5.2 scores). The layers: docs/architecture.md.
#pragma once

#include "oasis/attention.hpp"
#include "oasis/backend.hpp"
#include "oasis/baselines.hpp"
#include "oasis/coupling.hpp"
#include "oasis/depth.hpp"
#include "oasis/error.hpp"
#include "oasis/error_bounds.hpp"
#include "oasis/instances.hpp"
#include "oasis/metrics.hpp"
#include "oasis/multiprecision.hpp"
#include "oasis/normalizer.hpp"
#include "oasis/pathology.hpp"
#include "oasis/quant.hpp"
#include "oasis/scalar.hpp"
#include "oasis/tensor.hpp"
#include "oasis/variant.hpp"
