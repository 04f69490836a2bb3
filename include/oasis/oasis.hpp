// oasis/oasis.hpp — the whole oracle core in one include.
//
//   normalizer.hpp  softmax, Softmax1 / sink-logit normaliser (docs/spec.md §1)
//   attention.hpp   multi-head token attention with LSE1 and p_null (docs/spec.md §2)
//   coupling.hpp    psi, centring conventions, coupling g - beta * Dpsi (docs/spec.md §3)
//   depth.hpp       depth weights, mixing, Kimi pseudo-query logits (docs/spec.md §3–4)
//   variant.hpp     the paper's variants (docs/spec.md §4 table)
//   error_bounds.hpp documented float/double error bounds against high precision
//   backend.hpp     the same float32 API on the reference, fast CPU and CUDA backends
//   baselines.hpp   S1/S2 sinks, gated attention, StreamingLLM policy (clipped softmax, sparsemax,
//                   entmax-1.5 are RowNorm kinds of normalizer.hpp)
//   metrics.hpp     kurtosis, max |x|, BOS mass, entropy, null mass, sink rate (docs/spec.md §6)
//   quant.hpp       fake quantisation (W8A8 / W6A6 / W4A4 presets)
// Separate includes: oasis/model/model.hpp (the AttnRes transformer), oasis/io/*.hpp (npy,
// safetensors), oasis/verify/*.hpp (the compare engine, target oasis::verify); included here,
// oasis/research/pathology.hpp (Definition 5.1/5.2 scores). The layers: docs/architecture.md.
#pragma once

#include "oasis/ops/attention.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/research/baselines.hpp"
#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/core/error.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/ops/gate.hpp"
#include "oasis/ops/prefix_sink.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/research/metrics.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/research/pathology.hpp"
#include "oasis/ops/quantize.hpp"
#include "oasis/research/quant_presets.hpp"
#include "oasis/core/scalar.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/ops/variant.hpp"
