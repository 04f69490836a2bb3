// src/cuda/emu/cuda_runtime.h — the device side of the CUDA emulator: what the kernel files
// (attention.cu, depth.cu) use of CUDA C++, as host C++.
//
// Execution model. A launch runs its blocks one after another; the threads of a block are fibers
// (own stacks, cooperative switching) scheduled round-robin, each running until it waits at a
// barrier or exits, so the code between barriers runs as a block of real threads may:
//   __syncthreads()          every thread of the block arrives before any continues; reaching it
//                            after some thread of the block exited is reported (undefined on the
//                            device), as is a block whose threads wait at different barriers.
//   __shfl_sync / _xor_sync  a warp collective: every lane of the mask arrives (with the same mask)
//                            before any reads; a lane of the mask that exited is reported.
//   __shared__               one instance per kernel, reused by each block in turn (blocks never
//                            run concurrently), filled with 0xFF bytes before each block (NaN as
//                            float): a read before the block wrote it shows.
// A fault (deadlock, misuse above, exception) stops the launch; cudaGetLastError() then returns
// cudaErrorLaunchFailure and cudaGetErrorString() carries the emulator's message.
//
// Numerics: float arithmetic is IEEE binary32 on the host; expf/logf/sqrtf/cosf/sinf are the host
// C library's (not CUDA's libdevice), fmaf is a fused multiply-add, and there is no automatic
// contraction (-ffp-contract=off). The emulator checks the kernels' logic — indexing, masking,
// tiling, synchronisation, the host wrappers — not the device's rounding.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

namespace oasis_emu {

/// Built-in variables of the running thread (set by the scheduler before resuming a fiber).
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
extern const ThreadContext* g_current;

void syncthreads();
/// Warp collective: every lane of `mask` contributes `value`; returns the value of lane
/// `src_lane` (which must be in the mask).
std::uint64_t warp_exchange(unsigned mask, std::uint64_t value, int src_lane);
int lane_id();
/// Runs `body` as every thread of every block of the grid; records a launch error or fault.
void run_grid(dim3 grid, dim3 block, const char* kernel, const std::function<void()>& body);
/// True if p is null or points into (or one past) a live device allocation.
bool is_device_pointer(const void* p);
/// Records a fault of the launch of `kernel` (cudaErrorLaunchFailure) without running it.
void launch_fault(const char* kernel, const std::string& what);

template <class T>
bool device_or_not_a_pointer(const T& v) {
  if constexpr (std::is_pointer_v<T>)
    return is_device_pointer(static_cast<const void*>(v));
  else
    return true;
}

template <class... P>
struct Launch {
  dim3 grid, block;
  const char* name;
  void (*kernel)(P...);
  template <class... A>
  void operator()(A&&... args) const {
    // The launch copies its parameters once; each thread receives them by value.
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    // A pointer parameter must be device memory (or null): a host pointer faults on the device.
    // (Pointers inside struct parameters are not checked.)
    int bad = -1;
    std::apply(
        [&bad](const auto&... p) {
          int i = 0;
          ((bad < 0 && !device_or_not_a_pointer(p) ? (void)(bad = i) : (void)0, ++i), ...);
        },
        params);
    if (bad >= 0) {
      launch_fault(name, "kernel argument " + std::to_string(bad) +
                             " is a pointer outside every device allocation (host memory?)");
      return;
    }
    run_grid(grid, block, name, [&] { std::apply(kernel, params); });
  }
};
template <class... P>
Launch<P...> launch(dim3 grid, dim3 block, CUstream_st* /*stream: launches run synchronously*/, const char* name,
                    void (*kernel)(P...)) {
  return Launch<P...>{grid, block, name, kernel};
}

template <class T>
std::uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <class T>
T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace oasis_emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
// One static instance per kernel, in the section oasis_emu_shared, which the emulator fills with
// 0xFF bytes (NaN as float, -1 as int) before every block: shared memory starts undefined.
#define __shared__ static __attribute__((section("oasis_emu_shared")))
#define __align__(n) __attribute__((aligned(n)))
#define threadIdx (::oasis_emu::g_current->thread_idx)
#define blockIdx (::oasis_emu::g_current->block_idx)
#define blockDim (::oasis_emu::g_current->block_dim)
#define gridDim (::oasis_emu::g_current->grid_dim)

inline void __syncthreads() { ::oasis_emu::syncthreads(); }
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const int lane = ::oasis_emu::lane_id();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return ::oasis_emu::from_bits<T>(::oasis_emu::warp_exchange(mask, ::oasis_emu::to_bits(var), src));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const int lane = ::oasis_emu::lane_id();
  int src = lane ^ lane_mask;
  // shfl.bfly: a source beyond the end of the lane's segment gives the lane's own value; one in
  // an earlier segment is read (CUDA C++ Programming Guide, warp shuffle functions).
  if (src > ((lane & ~(width - 1)) | (width - 1))) src = lane;
  return ::oasis_emu::from_bits<T>(::oasis_emu::warp_exchange(mask, ::oasis_emu::to_bits(var), src));
}

inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int min(int a, int b) { return a < b ? a : b; }
using std::isnan;

template <class F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* /*kernel*/) {
  if (!attr) return cudaErrorInvalidValue;
  *attr = cudaFuncAttributes{1024, 0, 0};
  return cudaSuccess;
}
