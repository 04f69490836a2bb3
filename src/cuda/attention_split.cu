// src/cuda/attention_split.cu — split-K attention (flash-decoding) for few query rows per kv head:
// the keys of each row are split across blocks and warps, each computes a partial online-softmax
// state, and a second kernel merges them with the null category added exactly once
// (oasis/ops/online_softmax.hpp, merge; launch.hpp, SplitLaunch).
//
// Partial kernel: grid (splits * row_groups, H_kv, B), 4 warps per block. A row group is up to
// kSplitRows = 4 query rows that read one kv head (query head g of the group and query t:
// row r = g * Tq + t), so each key and value is read once for the whole group. Warp w of split i
// owns keys [p L, (p + 1) L) with p = i * 4 + w, which it streams in chunks of 8 keys: lane l
// holds columns [l R, l R + R) (R = D / 32) of the chunk's 8 keys and values, forms its 4 x 8
// partial dot products, and one reduce-scatter of the 32 values (31 shuffles) leaves at lane l
// the score of row l / 8 with key l % 8 — the 8 lanes of a row then run the online softmax of
// oasis/ops/online_softmax.hpp on the chunk (a tile of 8 keys), and the outputs o[r][c] are accumulated
// per lane with the weights broadcast by shuffles. The warps then leave their states (M_p, S_p,
// o_p) in shared memory and warp w merges the four states of row w in key order into the split's
// partial, which it writes, empty states (M = -inf, S = 0, o = 0) included, so the workspace is
// always defined.
//
// Scores: z = scale * <q, k> with the dot product summed per lane in column order (fmaf) and then
// over the lanes by a fixed tree: another order than the reference's, covered by the parity
// rule's score term (any order, at most d_h roundings: docs/tolerances.md, "CUDA split-K").
//
// Combine kernel: one warp per row (b, h, t); lane owns columns c = lane + 32 i. It starts from
// online::start(softmax1, s), merges the splits' partials in key order and finishes exactly as
// the fused kernel (online::finish), writing out, lse, p_null and, when requested, row_max /
// row_sum for the probability kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "device_load.hpp"
#include "kernel_launch.hpp"
#include "launch.hpp"
#include "oasis/ops/online_softmax.hpp"

namespace oasis::cuda::detail {
namespace {

constexpr int kThreads = 32 * kSplitWarps;
constexpr int kChunk = 32 / kSplitRows;  // keys per step: kSplitRows * kChunk = 32 scores, one per lane
constexpr unsigned kFull = 0xffffffffu;

/// One step of warp_reduce_scatter: the lanes keep the half of their 2 O values whose index has
/// the bit O of their lane, and add the partner's copy of that half.
template <int O>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float keep = upper ? v[i + O] : v[i];
    const float send = upper ? v[i] : v[i + O];
    v[i] = keep + __shfl_xor_sync(kFull, send, O);
  }
}

/// Lane l returns the sum over the warp's lanes of their v[l]: a reduce-scatter in 31 shuffles
/// (after the five steps lane l holds index l).
__device__ __forceinline__ float warp_reduce_scatter(float (&v)[32], int lane) {
  reduce_scatter_step<16>(v, lane);
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  return v[0];
}

/// Maximum and sum over the kChunk lanes of a row (lanes 8 r .. 8 r + 7): every lane of the
/// group gets the same bits (the butterfly adds the same pairs in both lanes of a pair).
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int o = kChunk / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = kChunk / 2; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

template <class In, int D>
__global__ void __launch_bounds__(kThreads, 4) split_partial_kernel(const AttentionLaunch a, const SplitLaunch s) {
  static_assert(D % 32 == 0, "head tile of whole lanes");
  constexpr int R = D / 32;  // columns per lane
  constexpr int NR = kSplitRows;
  __shared__ __align__(16) float Qs[NR][D];
  __shared__ float Ms[kSplitWarps][NR], Ls[kSplitWarps][NR];  // the warps' states, for the block merge
  __shared__ __align__(16) float Os[kSplitWarps][NR][D];

  const int b = blockIdx.z, hk = blockIdx.y;
  const int split = static_cast<int>(blockIdx.x) % s.splits, group = static_cast<int>(blockIdx.x) / s.splits;
  const int G = a.H / a.H_kv, rows = G * a.Tq;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int range = split * kSplitWarps + warp;

  // The group's rows: row r0 + r is query head hk * G + (r0 + r) / Tq at query (r0 + r) % Tq.
  const int r0 = group * NR;
  const int len = a.key_lengths ? a.key_lengths[b] : a.Tk;
  int nvis[NR];
  long long out_row[NR];  // (b, h, t) row index, -1 for a row beyond the group
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const int row = r0 + r;
    if (row < rows) {
      const int h = hk * G + row / a.Tq, t = row % a.Tq;
      nvis[r] = online::key_span<int>(len, a.causal, 0, t, a.Tq, a.Tk).end;
      out_row[r] = (static_cast<long long>(b) * a.H + h) * a.Tq + t;
    } else {
      nvis[r] = 0;
      out_row[r] = -1;
    }
  }
  for (int e = tid; e < NR * D; e += kThreads) {
    const int r = e / D, c = e % D, row = r0 + r;
    float x = 0.0f;
    if (row < rows && c < a.d_h) {
      const int h = hk * G + row / a.Tq, t = row % a.Tq;
      x = widen_load(static_cast<const In*>(a.q) + b * a.q_sb + h * a.q_sh + static_cast<long long>(t) * a.q_st + c);
    }
    Qs[r][c] = x;
  }
  __syncthreads();

  const In* k = static_cast<const In*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const In* v = static_cast<const In*>(a.v) + b * a.v_sb + hk * a.v_sh;
  const bool k_vec = a.d_h == D && runs_aligned<In, R>(a.k, a.k_st) && a.k_sb % R == 0 && a.k_sh % R == 0;
  const bool v_vec = a.d_v == D && runs_aligned<In, R>(a.v, a.v_st) && a.v_sb % R == 0 && a.v_sh % R == 0;

  // This warp's keys, up to the last key any row of the group sees.
  int kmax = 0;
#pragma unroll
  for (int r = 0; r < NR; ++r) kmax = max(kmax, nvis[r]);
  const long long first = static_cast<long long>(range) * s.keys_per_warp;
  const int begin = static_cast<int>(min(first, static_cast<long long>(kmax)));
  const int end = static_cast<int>(min(first + s.keys_per_warp, static_cast<long long>(kmax)));

  const int my_row = lane / kChunk, my_key = lane % kChunk;  // the score this lane holds after the scatter
  int my_nvis = 0;
#pragma unroll
  for (int r = 0; r < NR; ++r)
    if (r == my_row) my_nvis = nvis[r];
  const int my_end = min(end, my_nvis);  // visible keys of this lane's row inside the range
  online::State st = online::start(false, 0.0f);  // a partial: no null category
  float o[NR][R];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int i = 0; i < R; ++i) o[r][i] = 0.0f;

  for (int j0 = begin; j0 < end; j0 += kChunk) {
    Run<In, R> kk[kChunk], vv[kChunk];  // the chunk's keys and values as stored (widened on use)
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int j = j0 + u;
      kk[u] = load_run<In, R>(k + static_cast<long long>(j) * a.k_st, lane * R, j < end ? a.d_h : 0, k_vec && j < end);
      vv[u] = load_run<In, R>(v + static_cast<long long>(j) * a.v_st, lane * R, j < end ? a.d_v : 0, v_vec && j < end);
    }
    float dots[NR * kChunk];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      float q[R];  // this lane's columns of query row r (read per chunk: fewer registers held)
#pragma unroll
      for (int i = 0; i < R; ++i) q[i] = Qs[r][lane * R + i];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < R; ++i) acc = fmaf(q[i], widen<In>(kk[u].e[i]), acc);
        dots[r * kChunk + u] = acc;
      }
    }
    const int j = j0 + my_key;
    float z = warp_reduce_scatter(dots, lane) * a.scale;
    if (j >= my_end) {
      z = -INFINITY;  // masked, or outside this warp's range
    } else if (isnan(z) || z == INFINITY) {  // overflowed score: reported, then treated as masked
      if (a.bad_score) *a.bad_score = 1;
      z = -INFINITY;
    }
    const float corr = online::rescale(st, row_max(z));
    const float p = online::weight(z, st.m);
    st.l += row_sum(p);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const float c = __shfl_sync(kFull, corr, r * kChunk);
#pragma unroll
      for (int i = 0; i < R; ++i) o[r][i] *= c;
    }
#pragma unroll
    for (int u = 0; u < kChunk; ++u)
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float pj = __shfl_sync(kFull, p, r * kChunk + u);
#pragma unroll
        for (int i = 0; i < R; ++i) o[r][i] = fmaf(pj, widen<In>(vv[u].e[i]), o[r][i]);
      }
  }

  // The block merge: every warp's state of every row to shared memory, then warp w merges the
  // four states of row w (warps in key order) into the split's partial.
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (lane == r * kChunk) {
      Ms[warp][r] = st.m;
      Ls[warp][r] = st.l;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) Os[warp][r][lane * R + i] = o[r][i];
  }
  __syncthreads();
  const int r = warp;
  long long row_out = -1;
#pragma unroll
  for (int rr = 0; rr < NR; ++rr)
    if (rr == r) row_out = out_row[rr];
  if (row_out < 0) return;  // a row beyond the group: the whole warp leaves (no collective follows)
  online::State m = online::start(false, 0.0f);
  float om[R];
#pragma unroll
  for (int i = 0; i < R; ++i) om[i] = 0.0f;
#pragma unroll
  for (int w = 0; w < kSplitWarps; ++w) {
    const online::MergeFactors f = online::merge(m, online::State{Ms[w][r], Ls[w][r]});
#pragma unroll
    for (int i = 0; i < R; ++i) om[i] = online::merge_output(om[i], Os[w][r][lane * R + i], f);
  }
  const long long slot = row_out * s.splits + split;
  if (lane == 0) {
    s.part_m[slot] = m.m;
    s.part_l[slot] = m.l;
  }
  float* po = s.part_o + slot * a.d_v;
#pragma unroll
  for (int i = 0; i < R; ++i)
    if (lane * R + i < a.d_v) po[lane * R + i] = om[i];
}

/// One warp per row: the null category's state, then the partials merged in key order.
__global__ void __launch_bounds__(kThreads) split_combine_kernel(const AttentionLaunch a, const SplitLaunch s) {
  constexpr int C = kMaxHeadDim / 32;  // columns per lane: c = lane + 32 i
  const long long rows = static_cast<long long>(a.B) * a.H * a.Tq;
  const long long row = static_cast<long long>(blockIdx.x) * kSplitWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together (no collective below)
  const int h = static_cast<int>(row / a.Tq % a.H);
  const int P = s.splits;
  const float s_null = a.softmax1 ? (a.null_logits ? a.null_logits[h] : 0.0f) : -INFINITY;
  online::State st = online::start(a.softmax1, s_null);  // the null category, added exactly once
  float o[C];
#pragma unroll
  for (int i = 0; i < C; ++i) o[i] = 0.0f;
  for (int p = 0; p < P; ++p) {
    const long long slot = row * P + p;
    const online::MergeFactors f = online::merge(st, online::State{s.part_m[slot], s.part_l[slot]});
    const float* po = s.part_o + slot * a.d_v;
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const int c = lane + 32 * i;
      if (c < a.d_v) o[i] = online::merge_output(o[i], po[c], f);
    }
  }
  const online::Finish fin = online::finish(st, a.softmax1, s_null);
  const long long b = row / (static_cast<long long>(a.H) * a.Tq), t = row % a.Tq;
  float* out = a.out + b * a.o_sb + h * a.o_sh + t * a.o_st;
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int c = lane + 32 * i;
    if (c < a.d_v) out[c] = o[i] * fin.inv;
  }
  if (lane == 0) {
    a.lse[row] = fin.lse;
    a.p_null[row] = fin.p_null;
    if (a.row_max) a.row_max[row] = st.m;
    if (a.row_sum) a.row_sum[row] = st.l;
  }
}

template <class In>
int launch_partials_typed(const AttentionLaunch& a, const SplitLaunch& s, cudaStream_t stream) {
  const int groups = (a.H / a.H_kv * a.Tq + kSplitRows - 1) / kSplitRows;
  const dim3 grid(static_cast<unsigned>(s.splits * groups), static_cast<unsigned>(a.H_kv), static_cast<unsigned>(a.B));
  if (a.d_h <= 64 && a.d_v <= 64)
    OASIS_LAUNCH(grid, kThreads, stream, split_partial_kernel<In, 64>)(a, s);
  else
    OASIS_LAUNCH(grid, kThreads, stream, split_partial_kernel<In, 128>)(a, s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_attention_split_partials(const AttentionLaunch& a, const SplitLaunch& s, CUstream_st* stream) {
  if (a.d_h > kMaxHeadDim || a.d_v > kMaxHeadDim || s.splits < 1 || s.keys_per_warp < 1 ||
      static_cast<long long>(s.splits) * kSplitWarps * s.keys_per_warp < a.Tk)
    return static_cast<int>(cudaErrorInvalidValue);
  switch (a.in_type) {
    case io::DType::f32: return launch_partials_typed<float>(a, s, stream);
    case io::DType::f16: return launch_partials_typed<__half>(a, s, stream);
    case io::DType::bf16: return launch_partials_typed<__nv_bfloat16>(a, s, stream);
    case io::DType::f64: break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int launch_attention_split_combine(const AttentionLaunch& a, const SplitLaunch& s, CUstream_st* stream) {
  if (a.d_v > kMaxHeadDim || s.splits < 1) return static_cast<int>(cudaErrorInvalidValue);
  const long long rows = static_cast<long long>(a.B) * a.H * a.Tq;
  OASIS_LAUNCH(static_cast<unsigned>((rows + kSplitWarps - 1) / kSplitWarps), kThreads, stream, split_combine_kernel)(
      a, s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace oasis::cuda::detail
