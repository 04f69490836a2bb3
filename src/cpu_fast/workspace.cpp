// src/cpu_fast/workspace.cpp — the workspaces of workspace.hpp, result reshaping, and
// cpu_fast::release_workspaces.
#include "workspace.hpp"

#include <type_traits>
#include <utility>

#include "oasis/backends/cpu_fast.hpp"

namespace oasis {
namespace fast {

thread_local Workspace tl_kt, tl_v, tl_tile, tl_alpha;
thread_local Workspace tl_qp, tl_dop, tl_kp, tl_ktb, tl_vt, tl_rows, tl_dq, tl_dz, tl_bwd;
thread_local std::vector<index_t> tl_chunks;
thread_local std::vector<index_t> tl_span;
thread_local std::vector<online::State> tl_state;

void ensure_shape(Tensor<float>& t, const Shape& s) {
  if (t.shape() == s) return;
  std::vector<float> st = std::move(t.storage());
  st.resize(static_cast<std::size_t>(shape_numel(s)));
  t = Tensor<float>(s, std::move(st));
}

}  // namespace fast

namespace cpu_fast {

void release_workspaces() {
  using namespace fast;
  auto drop = [](auto& v) { std::decay_t<decltype(v)>().swap(v); };
  drop(tl_kt);
  drop(tl_v);
  drop(tl_span);
  drop(tl_qp);
  drop(tl_dop);
  drop(tl_kp);
  drop(tl_ktb);
  drop(tl_vt);
  drop(tl_rows);
  drop(tl_dq);
  drop(tl_dz);
  drop(tl_chunks);
#pragma omp parallel
  {
    drop(tl_tile);
    drop(tl_state);
    drop(tl_alpha);
    drop(tl_bwd);
  }
}

}  // namespace cpu_fast
}  // namespace oasis
