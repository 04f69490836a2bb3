// src/cuda/attention_tc.cu — fused token attention with a null category on tensor cores
// (nvcuda::wmma, 16x16x16 tiles), for float16 / bfloat16 inputs, as FlashAttention computes it:
// S = Q K^T and O += P V on tensor cores with float accumulation, the online softmax in float,
// and P rounded to the input type before P V (the normaliser S sums the unrounded p). The rounding
// of P is the one term this path adds to the fused kernels' error; docs/tolerances.md, "Tensor
// cores", derives it (bounds::p_rounding_bound).
//
// One block = 4 warps = 64 queries of one (batch, head); warp w owns the 16 query rows
// q0 + 16 w .. + 15, whose Q fragments it keeps in registers. The block streams the keys visible
// to its last query in tiles of BK (64 for head tiles of 64, 32 for 128: static shared memory
// stays under 48 KB) through shared memory in the input type. Per tile each warp
//   1. S = Q K^T into accumulators, stored to its score rows in shared memory;
//   2. runs the online softmax of oasis/ops/online_softmax.hpp on its 16 rows (lane = row l % 16, half of
//      the tile l / 16): z = scale * S, masked keys -inf, M' = max(M, tile max),
//      c = e^{M - M'}, p = e^{z - M'}, S = S c + sum p; writes P rounded to the input type and c;
//   3. rescales its output accumulators row by row: a fragment's element layout is opaque, so
//      the row of each element comes from an accumulator loaded from the table rowid[r][c] = r
//      (load and store are inverse and mma_sync's result is what store writes, so the table's
//      fragment names the rows of every accumulator of the same type);
//   4. O += P V.
// At the end each row finishes as the fused kernel (online::finish: out = o / S, LSE1, p_null),
// the outputs going through shared memory to the row-major output. The null category is the
// start state (M, S) = (s, 1): folded in once per row, as in attention.cu. Query blocks run in
// reverse order so that, under a causal mask, the longest rows start first.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>

#include "device_load.hpp"
#include "kernel_launch.hpp"
#include "launch.hpp"
#include "oasis/ops/online_softmax.hpp"

namespace oasis::cuda::detail {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;                  // query rows per warp (one fragment high)
constexpr int kBlockQ = kWarps * kRows;    // queries per block
constexpr unsigned kFull = 0xffffffffu;

template <class In> __device__ __forceinline__ In round_to_input(float x);
template <> __device__ __forceinline__ __half round_to_input<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 round_to_input<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// dst[r][c] (row stride ld) = src[r * stride + c] for r < rows_valid, c < cols_valid, else 0,
/// for a tile of ROWS x D elements of In, by the whole block; `vec`: 16-byte runs (every column
/// valid, rows aligned).
template <class In, int D, int ROWS>
__device__ __forceinline__ void load_tile(In* dst, int ld, const In* src, long long stride, int rows_valid,
                                          int cols_valid, bool vec, In zero) {
  if (vec) {
    constexpr int kRun = 8;
    Run<In, kRun> z;
#pragma unroll
    for (int i = 0; i < kRun; ++i) z.e[i] = zero;
    for (int e = threadIdx.x; e < ROWS * (D / kRun); e += kThreads) {
      const int r = e / (D / kRun), c = e % (D / kRun) * kRun;
      *reinterpret_cast<Run<In, kRun>*>(dst + r * ld + c) =
          r < rows_valid ? *reinterpret_cast<const Run<In, kRun>*>(src + r * stride + c) : z;
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * D; e += kThreads) {
      const int r = e / D, c = e % D;
      dst[r * ld + c] = (r < rows_valid && c < cols_valid) ? src[r * stride + c] : zero;
    }
  }
}

template <class In, int D>
__global__ void __launch_bounds__(kThreads) attention_tc_kernel(const AttentionLaunch a) {
  static_assert(D % 16 == 0, "head tile of whole fragments");
  constexpr int BK = D == 64 ? 64 : 32;  // keys per tile
  constexpr int LDK = D + 8;             // In per K / V / Q row in shared memory (a 16-byte skew)
  constexpr int LDS = BK + 4;            // floats per score row
  constexpr int LDP = BK + 8;            // In per P row
  constexpr int DF = D / 16;             // fragments across the head
  constexpr int KF = BK / 16;            // fragments across the tile
  constexpr int HALF = BK / 2;           // keys per lane in the softmax
  constexpr int KV = (2 * BK > kBlockQ ? 2 * BK : kBlockQ) * LDK;
  // kv: the Q tile [64][LDK] at the start, then the K tile [BK][LDK] and the V tile after it.
  __shared__ __align__(128) In kv[KV];
  __shared__ __align__(128) float score[kWarps][kRows][LDS];
  __shared__ __align__(128) In prob[kWarps][kRows][LDP];
  __shared__ __align__(128) float rowid[16][16];
  __shared__ float row_factor[kWarps][kRows];
  In* const Ks = kv;
  In* const Vs = kv + BK * LDK;

  const int b = blockIdx.z, h = blockIdx.y;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kBlockQ;
  const int hk = h / (a.H / a.H_kv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const In* q = static_cast<const In*>(a.q) + b * a.q_sb + h * a.q_sh;
  const In* k = static_cast<const In*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const In* v = static_cast<const In*>(a.v) + b * a.v_sb + hk * a.v_sh;
  const In zero = zero_of<In>();
  const bool q_vec = a.d_h == D && runs_aligned<In, 8>(q, a.q_st);
  const bool k_vec = a.d_h == D && runs_aligned<In, 8>(k, a.k_st);
  const bool v_vec = a.d_v == D && runs_aligned<In, 8>(v, a.v_st);

  load_tile<In, D, kBlockQ>(kv, LDK, q + static_cast<long long>(q0) * a.q_st, a.q_st, a.Tq - q0, a.d_h, q_vec, zero);
  for (int e = tid; e < 256; e += kThreads) rowid[e / 16][e % 16] = static_cast<float>(e / 16);
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, In, wmma::row_major> qa[DF];
#pragma unroll
  for (int f = 0; f < DF; ++f) wmma::load_matrix_sync(qa[f], kv + warp * kRows * LDK + f * 16, LDK);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> row_of;  // row_of.x[i]: the row of element i
  wmma::load_matrix_sync(row_of, &rowid[0][0], 16, wmma::mem_row_major);
  __syncthreads();  // the key tiles overwrite the Q tile

  const int r = lane % kRows, half = lane / kRows;  // this lane's row and half of each tile
  const int t = q0 + warp * kRows + r;
  const int len = a.key_lengths ? a.key_lengths[b] : a.Tk;
  const int nvis = t < a.Tq ? online::key_span<int>(len, a.causal, 0, t, a.Tq, a.Tk).end : 0;
  const int t_block = min(q0 + kBlockQ, a.Tq) - 1, t_warp = min(q0 + warp * kRows + kRows, a.Tq) - 1;
  const int kmax = online::key_span<int>(len, a.causal, 0, t_block, a.Tq, a.Tk).end;  // grows with t
  const int kwarp = t_warp >= q0 + warp * kRows ? online::key_span<int>(len, a.causal, 0, t_warp, a.Tq, a.Tk).end : 0;
  const float s_null = a.softmax1 ? (a.null_logits ? a.null_logits[h] : 0.0f) : -INFINITY;
  online::State st = online::start(a.softmax1, s_null);  // the null category, folded in once per row

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[DF];
#pragma unroll
  for (int f = 0; f < DF; ++f) wmma::fill_fragment(o[f], 0.0f);

  for (int j0 = 0; j0 < kmax; j0 += BK) {
    const int keys = min(BK, kmax - j0);
    load_tile<In, D, BK>(Ks, LDK, k + static_cast<long long>(j0) * a.k_st, a.k_st, keys, a.d_h, k_vec, zero);
    load_tile<In, D, BK>(Vs, LDK, v + static_cast<long long>(j0) * a.v_st, a.v_st, keys, a.d_v, v_vec, zero);
    __syncthreads();
    if (j0 < kwarp) {  // warp-uniform: a visible key of this tile for some row of the warp
      // 1. S = Q K^T (K^T is the K tile read column-major).
#pragma unroll
      for (int n = 0; n < KF; ++n) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
        wmma::fill_fragment(s, 0.0f);
#pragma unroll
        for (int f = 0; f < DF; ++f) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, In, wmma::col_major> kb;
          wmma::load_matrix_sync(kb, Ks + n * 16 * LDK + f * 16, LDK);
          wmma::mma_sync(s, qa[f], kb, s);
        }
        wmma::store_matrix_sync(&score[warp][0][n * 16], s, LDS, wmma::mem_row_major);
      }
      __syncwarp();
      // 2. The online softmax of row r over keys [half * HALF, half * HALF + HALF) of the tile.
      float z[HALF];
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < HALF; i += 4) {
        const float4 s4 = *reinterpret_cast<const float4*>(&score[warp][r][half * HALF + i]);
        const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = j0 + half * HALF + i + u;
          float x = sv[u] * a.scale;
          if (j >= nvis) {
            x = -INFINITY;
          } else if (isnan(x) || x == INFINITY) {  // overflowed score: reported, then treated as masked
            if (a.bad_score) *a.bad_score = 1;
            x = -INFINITY;
          }
          z[i + u] = x;
          tile_max = fmaxf(tile_max, x);
        }
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFull, tile_max, 16));
      const float corr = online::rescale(st, tile_max);
      float psum = 0.0f;
#pragma unroll
      for (int i = 0; i < HALF; i += 4) {
        Run<In, 4> pr;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float p = online::weight(z[i + u], st.m);
          psum += p;
          pr.e[u] = round_to_input<In>(p);  // P in the input type for P V; S sums the float p
        }
        *reinterpret_cast<Run<In, 4>*>(&prob[warp][r][half * HALF + i]) = pr;
      }
      st.l += psum + __shfl_xor_sync(kFull, psum, 16);  // both halves add the same two sums
      if (half == 0) row_factor[warp][r] = corr;
      __syncwarp();
      // 3. O rescaled row by row (every accumulator of the type maps element i to the same row).
      float factor[decltype(row_of)::num_elements];
#pragma unroll
      for (int i = 0; i < row_of.num_elements; ++i) factor[i] = row_factor[warp][static_cast<int>(row_of.x[i])];
#pragma unroll
      for (int f = 0; f < DF; ++f)
#pragma unroll
        for (int i = 0; i < o[f].num_elements; ++i) o[f].x[i] *= factor[i];
      // 4. O += P V.
#pragma unroll
      for (int kk = 0; kk < KF; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, In, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, &prob[warp][0][kk * 16], LDP);
#pragma unroll
        for (int f = 0; f < DF; ++f) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, In, wmma::row_major> vb;
          wmma::load_matrix_sync(vb, Vs + kk * 16 * LDK + f * 16, LDK);
          wmma::mma_sync(o[f], pa, vb, o[f]);
        }
      }
    }
    __syncthreads();  // the next tile overwrites Ks, Vs
  }

  const online::Finish fin = online::finish(st, a.softmax1, s_null);
  if (half == 0) row_factor[warp][r] = fin.inv;
  __syncwarp();
  float* out = a.out + b * a.o_sb + h * a.o_sh;
#pragma unroll
  for (int f = 0; f < DF; ++f) {
    wmma::store_matrix_sync(&score[warp][0][0], o[f], LDS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int rr = e / 16, c = f * 16 + e % 16, tt = q0 + warp * kRows + rr;
      if (tt < a.Tq && c < a.d_v)
        out[static_cast<long long>(tt) * a.o_st + c] = score[warp][rr][e % 16] * row_factor[warp][rr];
    }
    __syncwarp();
  }
  if (half == 0 && t < a.Tq) {
    const long long row = (static_cast<long long>(b) * a.H + h) * a.Tq + t;
    a.lse[row] = fin.lse;
    a.p_null[row] = fin.p_null;
    if (a.row_max) a.row_max[row] = st.m;
    if (a.row_sum) a.row_sum[row] = st.l;
  }
}

template <class In>
int launch_tc_typed(const AttentionLaunch& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((static_cast<long long>(a.Tq) + kBlockQ - 1) / kBlockQ), a.H, a.B);
  if (a.d_h <= 64 && a.d_v <= 64)
    OASIS_LAUNCH(grid, kThreads, s, attention_tc_kernel<In, 64>)(a);
  else
    OASIS_LAUNCH(grid, kThreads, s, attention_tc_kernel<In, 128>)(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_attention_tc(const AttentionLaunch& a, CUstream_st* stream) {
  if (a.d_h > kMaxHeadDim || a.d_v > kMaxHeadDim) return static_cast<int>(cudaErrorInvalidValue);
  switch (a.in_type) {
    case io::DType::f16: return launch_tc_typed<__half>(a, stream);
    case io::DType::bf16: return launch_tc_typed<__nv_bfloat16>(a, stream);
    case io::DType::f32:
    case io::DType::f64: break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace oasis::cuda::detail
