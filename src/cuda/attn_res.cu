// src/cuda/attn_res.cu — the kernels of the fused AttnRes routing (oasis/ops/attn_res.hpp) and of
// its backward (oasis/grad/attn_res_backward.hpp) that depth.cu does not already hold.
//
// Rows r = i N + t of the sources [n, N, d] (candidate i, token t). The forward's logits are
// pseudo_query_kernel's g_r = w^T RMSNorm(s_r) (depth.cu) times scale, rounded once more, as
// oasis::attn_res_logits. The backward's O(n N d) parts (the O(n N) weight backward runs on the
// host, attn_res.cpp):
//   da_r    = <dh_t, s_r> + dalpha_r                                (the mix's part of dL/dalpha)
//   ds_rc   = alpha_r dh_tc + inv_r (dxhat_c - xhat_c m_r)         (mix + RMSNorm backward)
//             xhat_c = x_c inv_r, dy_c = dg_r w_c, dxhat_c = dy_c gain_c, m_r = (1/d) sum_c dxhat_c xhat_c
//   dw_c    = sum_r dg_r (xhat_rc gain_c),  dgain_c = sum_r (dg_r w_c) xhat_rc
// with each product rounded as the float reference rounds it (no contraction: --fmad=false; the
// sums use fmaf, their order is the kernel's). dw and dgain are reduced deterministically: fixed
// row chunks summed in order, then the chunks of each column in order (no float atomics).
#include <cuda_runtime.h>

#include <cmath>

#include "attn_res_launch.hpp"
#include "kernel_launch.hpp"

namespace oasis::cuda::detail {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowWarps = 4;         // rows (warps) per block of the row kernels
constexpr int kColumnThreads = 128;  // columns per block of the column kernels
constexpr int kMinBlockThreads = 256;

__device__ __forceinline__ float warp_total(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

/// inv = 1 / sqrt(sum x^2 / d + eps) of a row, one warp (depth.cu's rms_inverse).
__device__ __forceinline__ float row_rms_inverse(const float* x, int d, float eps, int lane) {
  float ss = 0.0f;
  for (int c = lane; c < d; c += 32) ss = fmaf(x[c], x[c], ss);
  ss = warp_total(ss);
  return 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
}

__device__ __forceinline__ bool non_finite(float v) { return !(fabsf(v) < INFINITY); }

__global__ void scale_logits_kernel(float* g, int n, int N, float scale, int* bad_token) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  bool bad = false;
  for (int i = 0; i < n; ++i) {
    const long long r = static_cast<long long>(i) * N + t;
    const float v = __fmul_rn(g[r], scale);  // g = (w^T y) * scale, as the reference
    g[r] = v;
    bad = bad || non_finite(v);
  }
  bad_token[t] = bad ? t : N;
}

/// One block: first_bad[0] = min_t bad_token[t] (a minimum: exact in any order).
__global__ void first_bad_kernel(const int* bad_token, int N, int* first_bad) {
  __shared__ int m[kMinBlockThreads];
  int v = N;
  for (int t = static_cast<int>(threadIdx.x); t < N; t += static_cast<int>(blockDim.x)) v = min(v, bad_token[t]);
  m[threadIdx.x] = v;
  __syncthreads();
  for (int s = kMinBlockThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) m[threadIdx.x] = min(m[threadIdx.x], m[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) first_bad[0] = m[0];
}

__global__ void dalpha_kernel(const float* sources, const float* dh, const float* dalpha, int n, int N, int d,
                              float* da) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n * N) return;  // warp-uniform
  const int t = row % N;
  const float* s = sources + static_cast<long long>(row) * d;
  const float* g = dh + static_cast<long long>(t) * d;
  float acc = 0.0f;
  for (int c = lane; c < d; c += 32) acc = fmaf(g[c], s[c], acc);
  acc = warp_total(acc);
  if (lane == 0) da[row] = dalpha ? acc + dalpha[row] : acc;
}

__global__ void grad_sources_kernel(const float* sources, const float* dh, const float* alpha, const float* dg,
                                    const float* w, const float* gain, int n, int N, int d, float eps, float* ds,
                                    float* inv_out) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n * N) return;  // warp-uniform
  const int t = row % N;
  const float* x = sources + static_cast<long long>(row) * d;
  const float* g = dh + static_cast<long long>(t) * d;
  float* out = ds + static_cast<long long>(row) * d;
  const float inv = row_rms_inverse(x, d, eps, lane);
  const float gr = dg[row], a = alpha[row];
  float m = 0.0f;  // sum_c dxhat_c xhat_c
  for (int c = lane; c < d; c += 32) {
    const float xhat = __fmul_rn(x[c], inv);
    const float dy = __fmul_rn(gr, w[c]);
    const float dxhat = gain ? __fmul_rn(dy, gain[c]) : dy;
    m = fmaf(dxhat, xhat, m);
  }
  m = warp_total(m) / static_cast<float>(d);
  for (int c = lane; c < d; c += 32) {
    const float xhat = __fmul_rn(x[c], inv);
    const float dy = __fmul_rn(gr, w[c]);
    const float dxhat = gain ? __fmul_rn(dy, gain[c]) : dy;
    const float dx = __fmul_rn(inv, __fsub_rn(dxhat, __fmul_rn(xhat, m)));
    out[c] = __fmul_rn(a, g[c]) + dx;  // through the mix, plus through the keys
  }
  if (lane == 0) inv_out[row] = inv;
}

__global__ void param_partials_kernel(const float* sources, const float* inv, const float* dg, const float* w,
                                      const float* gain, int rows, int d, int rows_per_chunk, float* part_w,
                                      float* part_g) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  const int chunk = blockIdx.y;
  const long long r0 = static_cast<long long>(chunk) * rows_per_chunk;
  const long long r1 = min(static_cast<long long>(rows), r0 + rows_per_chunk);
  const float gc = gain ? gain[c] : 1.0f, wc = w[c];
  float aw = 0.0f, ag = 0.0f;
  for (long long r = r0; r < r1; ++r) {
    const float xhat = __fmul_rn(sources[r * d + c], inv[r]);
    const float y = gain ? __fmul_rn(xhat, gc) : xhat;
    aw = fmaf(dg[r], y, aw);                              // dw_c += dg_r y_rc
    if (gain) ag = fmaf(__fmul_rn(dg[r], wc), xhat, ag);  // dgain_c += dy_rc xhat_rc
  }
  part_w[static_cast<long long>(chunk) * d + c] = aw;
  if (gain) part_g[static_cast<long long>(chunk) * d + c] = ag;
}

__global__ void param_combine_kernel(const float* part_w, const float* part_g, int chunks, int d, float* dw,
                                     float* dgain) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  float aw = 0.0f, ag = 0.0f;
  for (int k = 0; k < chunks; ++k) {  // chunks in order
    aw += part_w[static_cast<long long>(k) * d + c];
    if (dgain) ag += part_g[static_cast<long long>(k) * d + c];
  }
  dw[c] = aw;
  if (dgain) dgain[c] = ag;
}

unsigned row_blocks(long long rows) { return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps); }
unsigned column_blocks(int d) { return static_cast<unsigned>((d + kColumnThreads - 1) / kColumnThreads); }

}  // namespace

int launch_attn_res_scale_logits(float* g, int n, int N, float scale, int* bad_token, int* first_bad,
                                 CUstream_st* stream) {
  const int threads = 128;
  OASIS_LAUNCH(static_cast<unsigned>((static_cast<long long>(N) + threads - 1) / threads), threads, stream,
               scale_logits_kernel)(g, n, N, scale, bad_token);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  OASIS_LAUNCH(1, kMinBlockThreads, stream, first_bad_kernel)(bad_token, N, first_bad);
  return static_cast<int>(cudaGetLastError());
}

int launch_attn_res_dalpha(const float* sources, const float* dh, const float* dalpha, int n, int N, int d, float* da,
                           CUstream_st* stream) {
  OASIS_LAUNCH(row_blocks(static_cast<long long>(n) * N), 32 * kRowWarps, stream, dalpha_kernel)(sources, dh, dalpha,
                                                                                                 n, N, d, da);
  return static_cast<int>(cudaGetLastError());
}

int launch_attn_res_grad_sources(const float* sources, const float* dh, const float* alpha, const float* dg,
                                 const float* w, const float* gain, int n, int N, int d, float eps, float* ds,
                                 float* inv, CUstream_st* stream) {
  OASIS_LAUNCH(row_blocks(static_cast<long long>(n) * N), 32 * kRowWarps, stream, grad_sources_kernel)(
      sources, dh, alpha, dg, w, gain, n, N, d, eps, ds, inv);
  return static_cast<int>(cudaGetLastError());
}

ParamGradChunks attn_res_param_grad_chunks(int rows) {
  // At least 64 rows a chunk, at most 1024 chunks (grid y, and the combine's sequential sum).
  ParamGradChunks ch;
  const long long per = (static_cast<long long>(rows) + 1023) / 1024;
  ch.rows_per_chunk = static_cast<int>(per < 64 ? 64 : per);
  ch.chunks = static_cast<int>((static_cast<long long>(rows) + ch.rows_per_chunk - 1) / ch.rows_per_chunk);
  if (ch.chunks < 1) ch.chunks = 1;
  return ch;
}

int launch_attn_res_param_grads(const float* sources, const float* inv, const float* dg, const float* w,
                                const float* gain, int rows, int d, const ParamGradChunks& ch, float* part_w,
                                float* part_g, float* dw, float* dgain, CUstream_st* stream) {
  OASIS_LAUNCH(dim3(column_blocks(d), static_cast<unsigned>(ch.chunks)), kColumnThreads, stream,
               param_partials_kernel)(sources, inv, dg, w, gain, rows, d, ch.rows_per_chunk, part_w, part_g);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  OASIS_LAUNCH(column_blocks(d), kColumnThreads, stream, param_combine_kernel)(
      part_w, gain ? part_g : nullptr, ch.chunks, d, dw, gain ? dgain : nullptr);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace oasis::cuda::detail
