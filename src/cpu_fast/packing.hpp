// src/cpu_fast/packing.hpp — the operands' layout as the fast path reads them: strides of either
// layout, the visible key ranges, and the key (and value) panels of the score gemm.
#pragma once

#include "oasis/ops/attention.hpp"

namespace oasis::fast {

// Element strides of a [B, H, T, d] or [B, T, H, d] tensor in (batch, head, time) order.
struct Strides {
  index_t b, h, t;
};
inline Strides strides_of(const Tensor<float>& x, AttentionLayout l) {
  const index_t d = x.dim(3);
  if (l == AttentionLayout::bhtd) return {x.dim(1) * x.dim(2) * d, x.dim(2) * d, d};
  return {x.dim(1) * x.dim(2) * d, d, x.dim(2) * d};
}

// packing.cpp: each (batch, query)'s visible key range, and one key (or value) panel of the score
// gemm, transposed.
index_t* key_ranges(const AttentionShape& s, const AttentionOptions& opt);
bool pack_panel(const float* x, const Strides& xs, index_t b, index_t h, index_t tile, index_t KT, index_t T,
                index_t d, float* dst);

}  // namespace oasis::fast
