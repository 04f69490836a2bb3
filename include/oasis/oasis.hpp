// oasis/oasis.hpp — the whole oracle core in one include.
//
//   core/      scalar types (float ... mp50, mpfr50), Tensor, errors, compiled-instance lists
//   ops/       the oracle's ops and their bounds: normalizer (softmax, Softmax1 / sink logit,
//              docs/spec.md §1), attention (LSE1 and p_null, §2), online_softmax, coupling (psi,
//              centring, g - beta * Dpsi, §3), depth (depth weights, mixing, Kimi pseudo-query
//              logits, §3-4), variant (the paper's variants, §4 table), gate (gated attention),
//              prefix_sink (S2), quantize (fake quantisation); error_bounds (certain) and
//              prob_bounds (probabilistic) against high precision
//   backends/  the same float32 API on the reference, fast CPU and CUDA backends
//   research/  baselines (S1 options, clipped-softmax parameters, StreamingLLM policy), metrics
//              (kurtosis, max |x|, BOS mass, entropy, null mass, sink rate, §6), pathology
//              (Definition 5.1/5.2 scores), quant_presets (W8A8 / W6A6 / W4A4 presets)
// Separate includes: oasis/model/model.hpp (the AttnRes transformer), oasis/grad/grad.hpp (the
// backward), oasis/io/*.hpp (npy, safetensors), oasis/verify/*.hpp (the compare engine, target
// oasis_verify). The layers: docs/architecture.md.
#pragma once

#include "oasis/ops/attention.hpp"
#include "oasis/ops/attn_res.hpp"
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
