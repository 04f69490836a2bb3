// src/cpu_fast/workspace.hpp — the fast path's grow-only workspaces and the reuse of a caller's
// result tensors.
// Workspaces are thread_local and grow only (first-touch page faults are paid once); they are
// defined, and freed by cpu_fast::release_workspaces, in workspace.cpp.
#pragma once

#include <cstddef>
#include <vector>

#include "fast_kernels.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::fast {

// Workspaces (grow only): the calling thread's packed keys/values and visible key ranges, and
// each OpenMP thread's tile buffers, row states and depth weights.
extern thread_local Workspace tl_kt, tl_v, tl_tile, tl_alpha;
// the backward's packed operands, per-row arrays and dq buffers (calling thread), and each OpenMP
// thread's tile workspace
extern thread_local Workspace tl_qp, tl_dop, tl_kp, tl_ktb, tl_vt, tl_rows, tl_dq, tl_dz, tl_bwd;
extern thread_local std::vector<index_t> tl_chunks;
extern thread_local std::vector<index_t> tl_span;
extern thread_local std::vector<online::State> tl_state;

inline float* grow(Workspace& b, std::size_t n) {
  if (b.size() < n) {
    b.clear();
    b.shrink_to_fit();
    b.resize(n);
  }
  return b.data();
}

// t reshaped to s, its storage reused (and resized when the element count differs).
void ensure_shape(Tensor<float>& t, const Shape& s);

}  // namespace oasis::fast
