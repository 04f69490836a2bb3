// src/cuda/attention.cu — fused token attention forward with a null category (docs/spec.md §1–2, §8).
//
// One thread block = 4 warps = kQueryTile (16) queries of one (batch, head); each warp owns 4
// queries and the block streams the key tiles of kKeyTile (32) keys (lane j scores key j0 + j)
// that meet its queries' visible ranges (oasis::online::key_span: padding, bottom-right causal
// mask, sliding window; every tile outside the band of the block is skipped, so a windowed row
// costs O(W), not O(Tk)) through shared memory (converted to float32 on load, so float16 /
// bfloat16 inputs are accumulated in float32). Each query runs the online softmax of
// oasis/ops/online_softmax.hpp (start, rescale, weight, finish: the null category folded in once per
// row; rows with no visible key give its exact start-state results). A tile that holds no visible
// key of a query is skipped for that query; the others get -inf at their masked lanes.
// Logits are z = scale * <q, k> (+ bias, staged per tile in shared memory beside the keys: one
// coalesced row segment per query) with the dot product summed in c order (as the reference); a
// logit that overflows to NaN or +inf is reported through bad_score (the host wrapper throws as
// the reference does). exp/log are the accurate expf/logf (no fast-math), so the error stays at
// the reference's level. q, k, v and out are addressed by strides, so [B, H, T, d] and
// [B, T, H, d] are read and written in place.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernel_launch.hpp"
#include "launch.hpp"
#include "oasis/ops/online_softmax.hpp"

namespace oasis::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kQPerWarp = 4;
constexpr int kQueryTile = kWarps * kQPerWarp;  // queries per block
constexpr int kKeyTile = 32;                    // keys per tile (one per lane)
constexpr unsigned kFull = 0xffffffffu;

template <class In> __device__ __forceinline__ float load(const In* p);
template <> __device__ __forceinline__ float load<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float load<__half>(const __half* p) { return __half2float(*p); }
template <> __device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

/// v[0..R) = p[0..R) from shared memory with one 16-byte (R = 4) or 8-byte (R = 2) load.
template <int R>
__device__ __forceinline__ void load_row_slice(const float* p, float (&v)[R]) {
  static_assert(R == 2 || R == 4, "head tiles of 64 or 128");
  if constexpr (R == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x; v[1] = x.y;
  }
}

/// Visible keys [begin, end) of query t (oasis::online::key_span).
__device__ __forceinline__ online::KeySpan<int> key_span(const AttentionLaunch& a, int len, int t) {
  return online::key_span<int>(len, a.causal, a.window, t, a.Tq, a.Tk);
}

/// Offset of the bias row of (b, h, t): its key j is at a.bias[bias_at(a, b, h, t) + j].
__device__ __forceinline__ long long bias_at(const AttentionLaunch& a, int b, int h, int t) {
  return b * a.bias_sb + h * a.bias_sh + static_cast<long long>(t) * a.bias_st;
}

template <class In, int D>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttentionLaunch a) {
  static_assert(D % 32 == 0, "head dimension tile must be a multiple of the warp size");
  constexpr int R = D / 32;  // output columns per lane: columns lane * R .. lane * R + R - 1
  // Rows of 16-byte multiples, read as float4 / float2. Ks rows are padded by 4 floats so that
  // the 8 lanes of each quarter-warp phase of a 16-byte load hit distinct banks.
  __shared__ __align__(16) float Qs[kQueryTile][D];
  __shared__ __align__(16) float Ks[kKeyTile][D + 4];
  __shared__ __align__(16) float Vs[kKeyTile][D];
  __shared__ float Bs[kQueryTile][kKeyTile];         // the bias tile (when there is a bias)
  __shared__ online::KeySpan<int> vis[kQueryTile];  // visible keys of each query (shared: no registers)

  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kQueryTile;
  const int hk = h / (a.H / a.H_kv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const In* q = static_cast<const In*>(a.q) + b * a.q_sb + h * a.q_sh;
  const In* k = static_cast<const In*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const In* v = static_cast<const In*>(a.v) + b * a.v_sb + hk * a.v_sh;

  for (int e = tid; e < kQueryTile * D; e += kThreads) {
    const int r = e / D, c = e % D, t = q0 + r;
    Qs[r][c] = (t < a.Tq && c < a.d_h) ? load(q + static_cast<long long>(t) * a.q_st + c) : 0.0f;
  }

  // The block's band of keys: from the first query's first visible key (its tile) to the last
  // query's end (key ranges never decrease with t).
  const int len = a.key_lengths ? a.key_lengths[b] : a.Tk;
  const int kbegin = key_span(a, len, q0).begin / kKeyTile * kKeyTile;
  const int kend = key_span(a, len, min(q0 + kQueryTile, a.Tq) - 1).end;
  const float s_null = a.softmax1 ? (a.null_logits ? a.null_logits[h] : 0.0f) : -INFINITY;
  if (tid < kQueryTile) vis[tid] = q0 + tid < a.Tq ? key_span(a, len, q0 + tid) : online::KeySpan<int>{0, 0};

  online::State row[kQPerWarp];
  float o[kQPerWarp][R];
#pragma unroll
  for (int i = 0; i < kQPerWarp; ++i) {
    row[i] = online::start(a.softmax1, s_null);  // the null category, folded in once per row
#pragma unroll
    for (int r = 0; r < R; ++r) o[i][r] = 0.0f;
  }
  __syncthreads();

  for (int j0 = kbegin; j0 < kend; j0 += kKeyTile) {
    for (int e = tid; e < kKeyTile * D; e += kThreads) {
      const int r = e / D, c = e % D, j = j0 + r;
      Ks[r][c] = (j < kend && c < a.d_h) ? load(k + static_cast<long long>(j) * a.k_st + c) : 0.0f;
      Vs[r][c] = (j < kend && c < a.d_v) ? load(v + static_cast<long long>(j) * a.v_st + c) : 0.0f;
    }
    if (a.bias)  // the bias of the block's queries at the tile's keys, one coalesced row segment each
      for (int e = tid; e < kQueryTile * kKeyTile; e += kThreads) {
        const int r = e / kKeyTile, c = e % kKeyTile, t = q0 + r, j = j0 + c;
        Bs[r][c] = (t < a.Tq && j < kend) ? a.bias[bias_at(a, b, h, t) + j] : 0.0f;
      }
    __syncthreads();

    // dot_{t,j} = sum_c q_c k_{j,c}, lane = key j0 + lane.
    float acc[kQPerWarp];
#pragma unroll
    for (int i = 0; i < kQPerWarp; ++i) acc[i] = 0.0f;
#pragma unroll 2
    for (int c = 0; c < D; c += 4) {  // c order, as the reference sums
      const float4 kc = *reinterpret_cast<const float4*>(&Ks[lane][c]);
#pragma unroll
      for (int i = 0; i < kQPerWarp; ++i) {
        const float4 qc = *reinterpret_cast<const float4*>(&Qs[warp * kQPerWarp + i][c]);  // broadcast
        acc[i] = fmaf(qc.x, kc.x, acc[i]);
        acc[i] = fmaf(qc.y, kc.y, acc[i]);
        acc[i] = fmaf(qc.z, kc.z, acc[i]);
        acc[i] = fmaf(qc.w, kc.w, acc[i]);
      }
    }

    const int j = j0 + lane;
    float p[kQPerWarp];
#pragma unroll
    for (int i = 0; i < kQPerWarp; ++i) {
      p[i] = 0.0f;
      const online::KeySpan<int> ks = vis[warp * kQPerWarp + i];
      if (j0 >= ks.end || j0 + kKeyTile <= ks.begin) continue;  // warp-uniform: no visible key here
      float z = -INFINITY;
      if (j >= ks.begin && j < ks.end) {  // z = (scale * dot) + bias: the reference's two roundings
        z = acc[i] * a.scale;
        if (a.bias) z += Bs[warp * kQPerWarp + i][lane];
      }
      if (isnan(z) || z == INFINITY) {  // overflowed logit: reported, then treated as masked
        if (a.bad_score) *a.bad_score = 1;
        z = -INFINITY;
      }
      const float c = online::rescale(row[i], warp_max(z));
      p[i] = online::weight(z, row[i].m);
      row[i].l += warp_sum(p[i]);
#pragma unroll
      for (int r = 0; r < R; ++r) o[i][r] *= c;
    }
    // o += sum_j p_j v_j; lane owns columns lane * R + r. Masked keys have p = 0 (rows past kend: V = 0).
    const int jn = min(kKeyTile, kend - j0);
    for (int jj = 0; jj < jn; ++jj) {
      float vr[R];
      load_row_slice<R>(&Vs[jj][lane * R], vr);
#pragma unroll
      for (int i = 0; i < kQPerWarp; ++i) {
        const float pj = __shfl_sync(kFull, p[i], jj);
#pragma unroll
        for (int r = 0; r < R; ++r) o[i][r] = fmaf(pj, vr[r], o[i][r]);
      }
    }
    __syncthreads();  // the next tile overwrites Ks, Vs
  }

#pragma unroll
  for (int i = 0; i < kQPerWarp; ++i) {
    const int t = q0 + warp * kQPerWarp + i;
    if (t >= a.Tq) continue;
    const online::Finish f = online::finish(row[i], a.softmax1, s_null);
    float* out = a.out + b * a.o_sb + h * a.o_sh + static_cast<long long>(t) * a.o_st;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int c = lane * R + r;
      if (c < a.d_v) out[c] = o[i][r] * f.inv;
    }
    if (lane == 0) {
      const long long r_out = (static_cast<long long>(b) * a.H + h) * a.Tq + t;
      a.lse[r_out] = f.lse;
      a.p_null[r_out] = f.p_null;
      if (a.row_max) a.row_max[r_out] = row[i].m;
      if (a.row_sum) a.row_sum[r_out] = row[i].l;
    }
  }
}

/// probs[b, h, t, j] = e^{z_j - M} * (1 / S) for visible j, else 0 (oasis::normalize_row's
/// arithmetic with the fused kernel's final M and S; z computed exactly as in the fused kernel).
template <class In>
__global__ void __launch_bounds__(kThreads) probs_kernel(const AttentionLaunch a, float* probs) {
  __shared__ float qs[kMaxHeadDim];
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (a.H / a.H_kv);
  const In* q = static_cast<const In*>(a.q) + b * a.q_sb + h * a.q_sh + static_cast<long long>(t) * a.q_st;
  const In* k = static_cast<const In*>(a.k) + b * a.k_sb + hk * a.k_sh;
  for (int c = threadIdx.x; c < a.d_h; c += kThreads) qs[c] = load(q + c);
  __syncthreads();
  const long long row = (static_cast<long long>(b) * a.H + h) * a.Tq + t;
  const online::KeySpan<int> vis = key_span(a, a.key_lengths ? a.key_lengths[b] : a.Tk, t);
  const online::State st{a.row_max[row], a.row_sum[row]};
  const float inv = online::finish(st, a.softmax1, 0.0f).inv;
  float* pr = probs + row * a.Tk;
  for (int j = threadIdx.x; j < a.Tk; j += kThreads) {
    float p = 0.0f;
    if (j >= vis.begin && j < vis.end) {
      const In* kj = k + static_cast<long long>(j) * a.k_st;
      float acc = 0.0f;
      for (int c = 0; c < a.d_h; ++c) acc = fmaf(qs[c], load(kj + c), acc);
      const float z = acc * a.scale + (a.bias ? a.bias[bias_at(a, b, h, t) + j] : 0.0f);
      p = (isnan(z) || z == INFINITY) ? 0.0f : online::weight(z, st.m) * inv;
    }
    pr[j] = p;
  }
}

__global__ void null_statistic_kernel(const float* p_null, int B, int H, int T, float* psi) {
  const long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= static_cast<long long>(B) * T) return;
  const long long b = e / T, t = e % T;
  float sum = 0.0f;
  for (int h = 0; h < H; ++h) sum += p_null[(b * H + h) * T + t];
  psi[e] = sum / static_cast<float>(H);
}

template <class In>
int launch_typed(const AttentionLaunch& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((static_cast<long long>(a.Tq) + kQueryTile - 1) / kQueryTile), a.H, a.B);
  if (a.d_h <= 64 && a.d_v <= 64)
    OASIS_LAUNCH(grid, kThreads, s, attention_kernel<In, 64>)(a);
  else
    OASIS_LAUNCH(grid, kThreads, s, attention_kernel<In, 128>)(a);
  return static_cast<int>(cudaGetLastError());
}

template <class In>
int launch_probs_typed(const AttentionLaunch& a, float* probs, cudaStream_t s) {
  OASIS_LAUNCH(dim3(a.Tq, a.H, a.B), kThreads, s, probs_kernel<In>)(a, probs);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_attention(const AttentionLaunch& a, CUstream_st* stream) {
  if (a.d_h > kMaxHeadDim || a.d_v > kMaxHeadDim) return static_cast<int>(cudaErrorInvalidValue);
  switch (a.in_type) {
    case io::DType::f32: return launch_typed<float>(a, stream);
    case io::DType::f16: return launch_typed<__half>(a, stream);
    case io::DType::bf16: return launch_typed<__nv_bfloat16>(a, stream);
    case io::DType::f64: case io::DType::i32: case io::DType::i64: break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int launch_attention_probs(const AttentionLaunch& a, float* probs, CUstream_st* stream) {
  if (a.d_h > kMaxHeadDim || !a.row_max || !a.row_sum) return static_cast<int>(cudaErrorInvalidValue);
  switch (a.in_type) {
    case io::DType::f32: return launch_probs_typed<float>(a, probs, stream);
    case io::DType::f16: return launch_probs_typed<__half>(a, probs, stream);
    case io::DType::bf16: return launch_probs_typed<__nv_bfloat16>(a, probs, stream);
    case io::DType::f64: case io::DType::i32: case io::DType::i64: break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int launch_null_statistic(const float* p_null, int B, int H, int T, float* psi, CUstream_st* stream) {
  const long long count = static_cast<long long>(B) * T;
  const int threads = 256;
  OASIS_LAUNCH(static_cast<unsigned>((count + threads - 1) / threads), threads, stream, null_statistic_kernel)(
      p_null, B, H, T, psi);
  return static_cast<int>(cudaGetLastError());
}

int probe_kernel_image() {
  cudaFuncAttributes attr;
  return static_cast<int>(cudaFuncGetAttributes(&attr, null_statistic_kernel));
}

}  // namespace oasis::cuda::detail
