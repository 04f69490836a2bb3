// src/cuda/attention_backward.cu — the backward of token attention with a null category (docs/spec.md §8),
// float32, FlashAttention-2's algorithm in two passes without atomics.
//
// Input: the forward's out, p_null and final row state (M, S) (attention.cu writes them, with
// row_max and row_sum set), and dL/dout, dL/dLSE, dL/dp_null. Per visible (query t, key j):
//   z = scale <q_t, k_j> (+ bias)      the forward's score, bitwise (the same fmaf chain in c order)
//   p = e^{z - M} (1 / S)              oasis::normalize_row's arithmetic (online::weight)
//   dp = <dO_t, v_j>,  dz = p ((dp - D) + dLSE),  D = <dO_t, O_t> + p_null dP
//   dv_j += p dO_t,  dk_j += dz q_t,  dq_t += dz k_j   (dk, dq scaled once at the end)
//   ds_t = p_null ((dP - D) + dLSE)    the null logit's gradient of the row (summed per head on the host)
// Kernels:
//   rows   one thread per row: 1/S (online::finish), D (c order) and ds_t;
//   dkdv   one block per (batch, kv head, tile of 32 keys): the tile's keys and values stay in
//          shared memory while the block walks the query tiles of every query head of the group
//          that see one of its keys (GQA summed in the block, in head order); each thread owns one
//          key and D/4 columns of its dk and dv in registers; the tile's dz (for the bias and
//          score gradients) is written here when requested;
//   dq     one block per (batch, query head, tile of queries), over the key tiles of its band, as
//          the forward: each warp owns rows, each lane a key of the tile and then R columns of dq.
// Every sum runs in a fixed order (keys, rows, heads ascending), so results are deterministic;
// dk, dv and dq each have one writer, so no atomics are needed (the price: dz is computed twice,
// once per pass). Rows without a visible key (1/S = 0, or no key in range) and masked keys
// contribute nothing. q, k, v, dout and the gradients are addressed by the AttentionLaunch's
// strides, so both layouts are read and written in place.
#include <cuda_runtime.h>

#include <cmath>

#include "kernel_launch.hpp"
#include "launch_backward.hpp"
#include "oasis/ops/online_softmax.hpp"

namespace oasis::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeyTile = 32;  // keys per tile (one per lane)
constexpr unsigned kFull = 0xffffffffu;

/// Query rows per block: 16 for head tiles of 64, 8 for 128 (static shared memory within 48 KiB).
template <int D>
constexpr int kQueryTileOf = D > 64 ? 8 : 16;

/// What the backward needs of one row.
struct RowTerms {
  float m, inv, D, dlse;
};

__device__ __forceinline__ RowTerms row_terms(const AttentionLaunch& a, const AttentionBackwardLaunch& g, long long r) {
  return RowTerms{a.row_max[r], g.row_inv[r], g.row_D[r], g.dlse ? g.dlse[r] : 0.0f};
}

__device__ __forceinline__ online::KeySpan<int> visible_keys(const AttentionLaunch& a, int b, int t) {
  return online::key_span<int>(a.key_lengths ? a.key_lengths[b] : a.Tk, a.causal, a.window, t, a.Tq, a.Tk);
}

/// <x, y> over c = 0..D-1 of two shared rows as the forward sums a score: one fmaf chain in c order.
template <int D>
__device__ __forceinline__ float dot_rows(const float* x, const float* y) {
  float acc = 0.0f;
#pragma unroll 2
  for (int c = 0; c < D; c += 4) {
    const float4 a = *reinterpret_cast<const float4*>(x + c);
    const float4 b = *reinterpret_cast<const float4*>(y + c);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    acc = fmaf(a.w, b.w, acc);
  }
  return acc;
}

/// dz of a visible key from its raw dot products qk = <q_t, k_j> and dov = <dO_t, v_j>; p through `p`.
__device__ __forceinline__ float key_dz(const AttentionLaunch& a, const RowTerms& r, float qk, float dov,
                                       long long bias_row, int j, float& p) {
  float z = qk * a.scale;  // (scale * dot) + bias: the forward's two roundings
  if (a.bias) z += a.bias[bias_row + j];
  p = online::weight(z, r.m) * r.inv;
  return p * ((dov - r.D) + r.dlse);
}

__device__ __forceinline__ long long bias_row(const AttentionLaunch& a, int b, int h, int t) {
  return b * a.bias_sb + h * a.bias_sh + static_cast<long long>(t) * a.bias_st;
}

__global__ void backward_rows_kernel(const AttentionLaunch a, const AttentionBackwardLaunch g) {
  const long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= static_cast<long long>(a.B) * a.H * a.Tq) return;
  const int t = static_cast<int>(r % a.Tq);
  const int h = static_cast<int>((r / a.Tq) % a.H);
  const int b = static_cast<int>(r / (static_cast<long long>(a.Tq) * a.H));
  const float s_null = a.softmax1 ? (a.null_logits ? a.null_logits[h] : 0.0f) : 0.0f;
  g.row_inv[r] = online::finish(online::State{a.row_max[r], a.row_sum[r]}, a.softmax1, s_null).inv;
  const float pn = a.softmax1 ? a.p_null[r] : 0.0f;
  const float dP = g.dp_null ? g.dp_null[r] : 0.0f;
  const float dl = g.dlse ? g.dlse[r] : 0.0f;
  const long long off = b * a.o_sb + h * a.o_sh + static_cast<long long>(t) * a.o_st;
  float D = a.softmax1 ? pn * dP : 0.0f;
  for (int c = 0; c < a.d_v; ++c) D += g.dout[off + c] * a.out[off + c];
  g.row_D[r] = D;
  g.row_ds[r] = a.softmax1 ? pn * ((dP - D) + dl) : 0.0f;
}

template <int D>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const AttentionLaunch a, const AttentionBackwardLaunch g) {
  static_assert(D % (4 * kWarps) == 0, "head tile");
  constexpr int QT = kQueryTileOf<D>;
  constexpr int RPW = QT / kWarps;  // rows per warp
  constexpr int C = D / kWarps;     // dk / dv columns per thread: warp + kWarps * i
  __shared__ __align__(16) float Ks[kKeyTile][D + 4];  // padded: a lane's float4 loads hit distinct banks
  __shared__ __align__(16) float Vs[kKeyTile][D + 4];
  __shared__ __align__(16) float Qs[QT][D];
  __shared__ __align__(16) float dOs[QT][D];
  __shared__ float Ps[QT][kKeyTile];
  __shared__ float dZs[QT][kKeyTile];
  __shared__ RowTerms rt[QT];
  __shared__ online::KeySpan<int> vis[QT];

  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kKeyTile;
  const int group = a.H / a.H_kv;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float* k = static_cast<const float*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const float* v = static_cast<const float*>(a.v) + b * a.v_sb + hk * a.v_sh;
  for (int e = tid; e < kKeyTile * D; e += kThreads) {
    const int r = e / D, c = e % D, j = j0 + r;
    Ks[r][c] = (j < a.Tk && c < a.d_h) ? k[static_cast<long long>(j) * a.k_st + c] : 0.0f;
    Vs[r][c] = (j < a.Tk && c < a.d_v) ? v[static_cast<long long>(j) * a.v_st + c] : 0.0f;
  }
  float dk[C], dv[C];
#pragma unroll
  for (int i = 0; i < C; ++i) dk[i] = dv[i] = 0.0f;

  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const float* q = static_cast<const float*>(a.q) + b * a.q_sb + h * a.q_sh;
    const float* dout = g.dout + b * a.o_sb + h * a.o_sh;
    for (int q0 = 0; q0 < a.Tq; q0 += QT) {
      // block-uniform: the rows' key ranges never decrease with t
      if (visible_keys(a, b, min(q0 + QT, a.Tq) - 1).end <= j0) continue;  // every row ends before the tile
      if (visible_keys(a, b, q0).begin >= j0 + kKeyTile) break;             // this and later rows start after it
      for (int e = tid; e < QT * D; e += kThreads) {
        const int r = e / D, c = e % D, t = q0 + r;
        Qs[r][c] = (t < a.Tq && c < a.d_h) ? q[static_cast<long long>(t) * a.q_st + c] : 0.0f;
        dOs[r][c] = (t < a.Tq && c < a.d_v) ? dout[static_cast<long long>(t) * a.o_st + c] : 0.0f;
      }
      if (tid < QT) {
        const int t = q0 + tid;
        const long long row = (static_cast<long long>(b) * a.H + h) * a.Tq + t;
        vis[tid] = t < a.Tq ? visible_keys(a, b, t) : online::KeySpan<int>{0, 0};
        rt[tid] = t < a.Tq ? row_terms(a, g, row) : RowTerms{0.0f, 0.0f, 0.0f, 0.0f};
      }
      __syncthreads();

      const int j = j0 + lane;
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const int rr = warp * RPW + i, t = q0 + rr;
        const float qk = dot_rows<D>(Qs[rr], Ks[lane]);
        const float dov = dot_rows<D>(dOs[rr], Vs[lane]);
        float p = 0.0f, dz = 0.0f;
        if (j >= vis[rr].begin && j < vis[rr].end && rt[rr].inv > 0.0f) {
          dz = key_dz(a, rt[rr], qk, dov, a.bias ? bias_row(a, b, h, t) : 0, j, p);
          if (g.dz) g.dz[((static_cast<long long>(b) * a.H + h) * a.Tq + t) * a.Tk + j] = dz;
        }
        Ps[rr][lane] = p;
        dZs[rr][lane] = dz;
      }
      __syncthreads();

      // dv_j += sum_t p dO_t, dk_j += sum_t dz q_t: this thread's key `lane`, columns warp + kWarps i
      for (int rr = 0; rr < QT; ++rr) {
        const float p = Ps[rr][lane], dz = dZs[rr][lane];
#pragma unroll
        for (int i = 0; i < C; ++i) {
          dv[i] = fmaf(p, dOs[rr][warp + kWarps * i], dv[i]);
          dk[i] = fmaf(dz, Qs[rr][warp + kWarps * i], dk[i]);
        }
      }
      __syncthreads();  // the next query tile overwrites Qs, dOs, Ps, dZs
    }
  }

  const int j = j0 + lane;
  if (j >= a.Tk) return;
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int c = warp + kWarps * i;
    if (c < a.d_h) g.dk[b * a.k_sb + hk * a.k_sh + static_cast<long long>(j) * a.k_st + c] = a.scale * dk[i];
    if (c < a.d_v) g.dv[b * a.v_sb + hk * a.v_sh + static_cast<long long>(j) * a.v_st + c] = dv[i];
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(const AttentionLaunch a, const AttentionBackwardLaunch g) {
  constexpr int QT = kQueryTileOf<D>;
  constexpr int RPW = QT / kWarps;
  constexpr int R = D / 32;  // dq columns per lane: lane * R .. lane * R + R - 1
  __shared__ __align__(16) float Ks[kKeyTile][D + 4];
  __shared__ __align__(16) float Vs[kKeyTile][D + 4];
  __shared__ __align__(16) float Qs[QT][D];
  __shared__ __align__(16) float dOs[QT][D];
  __shared__ RowTerms rt[QT];
  __shared__ online::KeySpan<int> vis[QT];

  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * QT;
  const int hk = h / (a.H / a.H_kv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float* q = static_cast<const float*>(a.q) + b * a.q_sb + h * a.q_sh;
  const float* dout = g.dout + b * a.o_sb + h * a.o_sh;
  const float* k = static_cast<const float*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const float* v = static_cast<const float*>(a.v) + b * a.v_sb + hk * a.v_sh;
  for (int e = tid; e < QT * D; e += kThreads) {
    const int r = e / D, c = e % D, t = q0 + r;
    Qs[r][c] = (t < a.Tq && c < a.d_h) ? q[static_cast<long long>(t) * a.q_st + c] : 0.0f;
    dOs[r][c] = (t < a.Tq && c < a.d_v) ? dout[static_cast<long long>(t) * a.o_st + c] : 0.0f;
  }
  if (tid < QT) {
    const int t = q0 + tid;
    vis[tid] = t < a.Tq ? visible_keys(a, b, t) : online::KeySpan<int>{0, 0};
    rt[tid] = t < a.Tq ? row_terms(a, g, (static_cast<long long>(b) * a.H + h) * a.Tq + t)
                       : RowTerms{0.0f, 0.0f, 0.0f, 0.0f};
  }
  // the block's band of keys, as the forward's
  const int kbegin = visible_keys(a, b, q0).begin / kKeyTile * kKeyTile;
  const int kend = visible_keys(a, b, min(q0 + QT, a.Tq) - 1).end;
  float acc[RPW][R];
#pragma unroll
  for (int i = 0; i < RPW; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
  __syncthreads();

  for (int j0 = kbegin; j0 < kend; j0 += kKeyTile) {
    for (int e = tid; e < kKeyTile * D; e += kThreads) {
      const int r = e / D, c = e % D, j = j0 + r;
      Ks[r][c] = (j < kend && c < a.d_h) ? k[static_cast<long long>(j) * a.k_st + c] : 0.0f;
      Vs[r][c] = (j < kend && c < a.d_v) ? v[static_cast<long long>(j) * a.v_st + c] : 0.0f;
    }
    __syncthreads();
    const int j = j0 + lane, jn = min(kKeyTile, kend - j0);
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int rr = warp * RPW + i, t = q0 + rr;
      const online::KeySpan<int> ks = vis[rr];
      if (j0 >= ks.end || j0 + kKeyTile <= ks.begin || !(rt[rr].inv > 0.0f)) continue;  // warp-uniform
      const float qk = dot_rows<D>(Qs[rr], Ks[lane]);
      const float dov = dot_rows<D>(dOs[rr], Vs[lane]);
      float p = 0.0f, dz = 0.0f;
      if (j >= ks.begin && j < ks.end) dz = key_dz(a, rt[rr], qk, dov, a.bias ? bias_row(a, b, h, t) : 0, j, p);
      // dq_t += sum_j dz_j k_j, keys in order; lane owns columns lane * R + r
      for (int jj = 0; jj < jn; ++jj) {
        const float dzj = __shfl_sync(kFull, dz, jj);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = fmaf(dzj, Ks[jj][lane * R + r], acc[i][r]);
      }
    }
    __syncthreads();  // the next tile overwrites Ks, Vs
  }

#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int t = q0 + warp * RPW + i;
    if (t >= a.Tq) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int c = lane * R + r;
      if (c < a.d_h) g.dq[b * a.q_sb + h * a.q_sh + static_cast<long long>(t) * a.q_st + c] = a.scale * acc[i][r];
    }
  }
}

}  // namespace

int launch_attention_backward_rows(const AttentionLaunch& a, const AttentionBackwardLaunch& g, CUstream_st* stream) {
  const long long rows = static_cast<long long>(a.B) * a.H * a.Tq;
  const int threads = 256;
  OASIS_LAUNCH(static_cast<unsigned>((rows + threads - 1) / threads), threads, stream, backward_rows_kernel)(a, g);
  return static_cast<int>(cudaGetLastError());
}

int launch_attention_backward_dkdv(const AttentionLaunch& a, const AttentionBackwardLaunch& g, CUstream_st* stream) {
  if (a.in_type != io::DType::f32 || a.d_h > kMaxHeadDim || a.d_v > kMaxHeadDim)
    return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>((a.Tk + kKeyTile - 1) / kKeyTile), a.H_kv, a.B);
  if (a.d_h <= 64 && a.d_v <= 64)
    OASIS_LAUNCH(grid, kThreads, stream, dkdv_kernel<64>)(a, g);
  else
    OASIS_LAUNCH(grid, kThreads, stream, dkdv_kernel<128>)(a, g);
  return static_cast<int>(cudaGetLastError());
}

int launch_attention_backward_dq(const AttentionLaunch& a, const AttentionBackwardLaunch& g, CUstream_st* stream) {
  if (a.in_type != io::DType::f32 || a.d_h > kMaxHeadDim || a.d_v > kMaxHeadDim)
    return static_cast<int>(cudaErrorInvalidValue);
  if (a.d_h <= 64 && a.d_v <= 64) {
    const dim3 grid(static_cast<unsigned>((a.Tq + kQueryTileOf<64> - 1) / kQueryTileOf<64>), a.H, a.B);
    OASIS_LAUNCH(grid, kThreads, stream, dq_kernel<64>)(a, g);
  } else {
    const dim3 grid(static_cast<unsigned>((a.Tq + kQueryTileOf<128> - 1) / kQueryTileOf<128>), a.H, a.B);
    OASIS_LAUNCH(grid, kThreads, stream, dq_kernel<128>)(a, g);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace oasis::cuda::detail
