// src/cuda/depth.cu — depth routing of Attention Residuals (docs/spec.md §3–4) and the layer's helpers.
//
// Per token t over candidates i = 0..n-1 (oasis::depth_weights, the same operations in the same
// order, in float32):
//   paper_v2      Dpsi_i = psi_i - mean_{r in E} psi_r for i in E (evidence), else 0; |E| < 2: 0
//   authors_code  Dpsi_i = psi~_i - mean_{r < n} psi~_r, psi~ = psi on E, 0 elsewhere
//   g_i  = clamp(g_old_i - beta * Dpsi_i, -clamp, clamp)          (only with coupling)
//   M    = max(s, max_i g_i) with s = 0 (Softmax1) or -inf (softmax)
//   S    = e^{s - M} + sum_i e^{g_i - M},  alpha_i = e^{g_i - M} / S,  alpha_null = e^{-M} / S
//   h    = sum_i alpha_i s_i  (mixing, sequential in i).
// Pseudo-query logits g_i = w^T RMSNorm(s_i) = sum_c w_c (x_c inv) gain_c, inv = 1/sqrt(mean x^2 + eps).
#include <cuda_runtime.h>

#include <cmath>

#include "kernel_launch.hpp"
#include "launch.hpp"

namespace oasis::cuda::detail {
namespace {

constexpr unsigned kFull = 0xffffffffu;

__global__ void depth_weights_kernel(const __grid_constant__ DepthLaunch a) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.N) return;
  const long long N = a.N;
  if (a.coupling) {
    float mean = 0.0f;
    int count = 0;
    if (!a.authors_code) {
      float sum = 0.0f;
      for (int i = 0; i < a.n; ++i)
        if (a.evidence.flag[i]) { sum += a.psi[i * N + t]; ++count; }
      if (count >= 2) mean = sum / static_cast<float>(count);
    } else {
      float sum = 0.0f;
      for (int i = 0; i < a.n; ++i) sum += a.evidence.flag[i] ? a.psi[i * N + t] : 0.0f;
      mean = sum / static_cast<float>(a.n);
    }
    for (int i = 0; i < a.n; ++i) {
      float d = 0.0f;
      if (a.authors_code)
        d = (a.evidence.flag[i] ? a.psi[i * N + t] : 0.0f) - mean;
      else if (a.evidence.flag[i] && count >= 2)
        d = a.psi[i * N + t] - mean;
      // g_old - beta * Dpsi, rounded after the product as in the reference (no contraction).
      float x = __fsub_rn(a.g_old[i * N + t], __fmul_rn(a.beta, d));
      if (x > a.score_clamp) x = a.score_clamp;
      if (x < -a.score_clamp) x = -a.score_clamp;
      a.dpsi[i * N + t] = d;
      a.g[i * N + t] = x;
    }
  } else {
    for (int i = 0; i < a.n; ++i) {
      float x = a.g_old[i * N + t];
      if (a.clamp_uncoupled) {  // the model's routers clamp whether or not psi couples
        if (x > a.score_clamp) x = a.score_clamp;
        if (x < -a.score_clamp) x = -a.score_clamp;
      }
      a.dpsi[i * N + t] = 0.0f;
      a.g[i * N + t] = x;
    }
  }
  float M = a.softmax1 ? 0.0f : -INFINITY;
  for (int i = 0; i < a.n; ++i) M = fmaxf(M, a.g[i * N + t]);  // g is finite, n >= 1
  float S = a.softmax1 ? expf(-M) : 0.0f;
  for (int i = 0; i < a.n; ++i) {
    const float e = expf(a.g[i * N + t] - M);
    a.alpha[i * N + t] = e;
    S += e;
  }
  const float inv = 1.0f / S;
  for (int i = 0; i < a.n; ++i) a.alpha[i * N + t] *= inv;
  a.alpha_null[t] = a.softmax1 ? expf(-M) * inv : 0.0f;
}

__global__ void depth_mix_kernel(const float* sources, const float* alpha, int n, int N, int d, float* h) {
  const int t = blockIdx.x;  // tokens on x (up to 2^31 - 1), column blocks on y
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= d) return;
  float acc = 0.0f;
  for (int i = 0; i < n; ++i)
    acc = fmaf(alpha[static_cast<long long>(i) * N + t], sources[(static_cast<long long>(i) * N + t) * d + c], acc);
  h[static_cast<long long>(t) * d + c] = acc;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

/// One warp per row of width d: inv = 1 / sqrt(sum x^2 / d + eps).
__device__ __forceinline__ float rms_inverse(const float* x, int d, float eps, int lane) {
  float ss = 0.0f;
  for (int c = lane; c < d; c += 32) ss = fmaf(x[c], x[c], ss);
  ss = warp_sum(ss);
  return 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
}

__global__ void pseudo_query_kernel(const float* sources, int rows, int d, const float* w, const float* gain,
                                    float eps, float* g) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;  // warp-uniform
  const float* x = sources + static_cast<long long>(row) * d;
  const float inv = rms_inverse(x, d, eps, lane);
  float acc = 0.0f;
  for (int c = lane; c < d; c += 32) {
    float y = x[c] * inv;
    if (gain) y *= gain[c];
    acc = fmaf(w[c], y, acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) g[row] = acc;
}

__global__ void rms_norm_kernel(const float* x, int rows, int d, const float* gain, float eps, float* y) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + static_cast<long long>(row) * d;
  float* yr = y + static_cast<long long>(row) * d;
  const float inv = rms_inverse(xr, d, eps, lane);
  for (int c = lane; c < d; c += 32) {
    float v = xr[c] * inv;
    if (gain) v *= gain[c];
    yr[c] = v;
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, long long count, float* a) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float gt = gate[i];
  a[i] = gt / (1.0f + expf(-gt)) * up[i];  // silu(g) * up
}

__global__ void rope_kernel(float* x, int N, int T, int H, int dh, bool interleaved, const float* inv_freq) {
  const int half = dh / 2;
  const long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= static_cast<long long>(N) * H * half) return;
  const int i = static_cast<int>(e % half);
  const long long rh = e / half;  // row * H + head
  const int r = static_cast<int>(rh / H);
  float* xh = x + rh * dh;
  const float angle = static_cast<float>(r % T) * inv_freq[i];
  const float cs = cosf(angle), sn = sinf(angle);
  const int c1 = interleaved ? 2 * i : i, c2 = interleaved ? 2 * i + 1 : i + half;
  const float x1 = xh[c1], x2 = xh[c2];
  xh[c1] = x1 * cs - x2 * sn;
  xh[c2] = x2 * cs + x1 * sn;
}

}  // namespace

int launch_rope(float* x, int N, int T, int H, int dh, bool interleaved, const float* inv_freq, CUstream_st* stream) {
  const long long count = static_cast<long long>(N) * H * (dh / 2);
  const int threads = 256;
  if (count == 0) return 0;
  OASIS_LAUNCH(static_cast<unsigned>((count + threads - 1) / threads), threads, stream, rope_kernel)(
      x, N, T, H, dh, interleaved, inv_freq);
  return static_cast<int>(cudaGetLastError());
}

int launch_depth_weights(const DepthLaunch& a, CUstream_st* stream) {
  const int threads = 128;
  OASIS_LAUNCH(static_cast<unsigned>((static_cast<long long>(a.N) + threads - 1) / threads), threads, stream,
               depth_weights_kernel)(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_depth_mix(const float* sources, const float* alpha, int n, int N, int d, float* h, CUstream_st* stream) {
  const int threads = 128;
  OASIS_LAUNCH(dim3(N, (d + threads - 1) / threads), threads, stream, depth_mix_kernel)(sources, alpha, n, N, d, h);
  return static_cast<int>(cudaGetLastError());
}

int launch_pseudo_query_logits(const float* sources, int n, int N, int d, const float* w, const float* gain,
                               float eps, float* g, CUstream_st* stream) {
  const int rows = n * N, warps = 4;
  OASIS_LAUNCH(static_cast<unsigned>((static_cast<long long>(rows) + warps - 1) / warps), 32 * warps, stream,
               pseudo_query_kernel)(sources, rows, d, w, gain, eps, g);
  return static_cast<int>(cudaGetLastError());
}

int launch_rms_norm(const float* x, int R, int d, const float* gain, float eps, float* y, CUstream_st* stream) {
  const int warps = 4;
  OASIS_LAUNCH(static_cast<unsigned>((static_cast<long long>(R) + warps - 1) / warps), 32 * warps, stream,
               rms_norm_kernel)(x, R, d, gain, eps, y);
  return static_cast<int>(cudaGetLastError());
}

int launch_swiglu(const float* gate, const float* up, long long count, float* a, CUstream_st* stream) {
  const int threads = 256;
  OASIS_LAUNCH(static_cast<unsigned>((count + threads - 1) / threads), threads, stream, swiglu_kernel)(gate, up,
                                                                                                   count, a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace oasis::cuda::detail
