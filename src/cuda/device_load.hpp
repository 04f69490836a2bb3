// src/cuda/device_load.hpp — the device code's loads of input elements (internal to oasis_cuda):
// float32, binary16 and bfloat16 widened exactly to float, one element at a time or a lane's
// contiguous run of R elements as stored (one vector load when the run is aligned).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::cuda::detail {

template <class In> __device__ __forceinline__ float widen_load(const In* p);
template <> __device__ __forceinline__ float widen_load<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float widen_load<__half>(const __half* p) { return __half2float(*p); }
template <> __device__ __forceinline__ float widen_load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

template <class In> __device__ __forceinline__ float widen(In x);
template <> __device__ __forceinline__ float widen<float>(float x) { return x; }
template <> __device__ __forceinline__ float widen<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

/// R elements of In, aligned for one vector load of R * sizeof(In) bytes.
template <class In, int R>
struct alignas(R * sizeof(In)) Run {
  In e[R];
};

/// True when runs of R elements at element offsets that are multiples of R from `base` are
/// aligned, with rows `stride` elements apart.
template <class In, int R>
__device__ __forceinline__ bool runs_aligned(const void* base, long long stride) {
  return reinterpret_cast<std::uintptr_t>(base) % (R * sizeof(In)) == 0 && stride % R == 0;
}

template <class In> __device__ __forceinline__ In zero_of();
template <> __device__ __forceinline__ float zero_of<float>() { return 0.0f; }
template <> __device__ __forceinline__ __half zero_of<__half>() { return __float2half_rn(0.0f); }
template <> __device__ __forceinline__ __nv_bfloat16 zero_of<__nv_bfloat16>() { return __float2bfloat16_rn(0.0f); }

/// The run row[c0 .. c0 + R) as stored, with 0 for c0 + i >= n; `vec`: the run is aligned and
/// c0 + R <= n (one vector load). row is not read at all when n <= c0.
template <class In, int R>
__device__ __forceinline__ Run<In, R> load_run(const In* row, int c0, int n, bool vec) {
  if (vec) return *reinterpret_cast<const Run<In, R>*>(row + c0);
  Run<In, R> x;
#pragma unroll
  for (int i = 0; i < R; ++i) x.e[i] = c0 + i < n ? row[c0 + i] : zero_of<In>();
  return x;
}

}  // namespace oasis::cuda::detail
