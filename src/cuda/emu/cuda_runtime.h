// src/cuda/emu/cuda_runtime.h — the device side of the CUDA emulator: what the kernel files
// (attention.cu, depth.cu) use of CUDA C++, as host C++. docs/cuda.md ("The CUDA emulator")
// describes the execution model; in short:
//   launch                   the configuration and every pointer argument (and pointer member of
//                            a struct argument, kernel_arguments.hpp) are checked, then the
//                            blocks run one after another (fibers.cpp);
//   threads of a block       fibers, each running until it waits at a barrier or exits;
//   __syncthreads()          every thread of the block arrives before any continues;
//   __shfl_sync / _xor_sync  a warp collective: every lane of the mask arrives before any reads;
//   __shared__               a function-local static of the kernel, one instance reused by each
//                            block in turn, filled with 0xFF bytes (NaN as float) before every
//                            block (shared_memory.cpp).
// Misuse (a barrier after some thread exited, a collective naming an exited lane, a deadlock, an
// exception) stops the launch as a device fault. Arithmetic: IEEE binary32 on the host, host libm
// for expf/logf/sqrtf/cosf/sinf, fmaf fused, no other contraction (-ffp-contract=off, matching
// the device build's --fmad=false).
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
#include "kernel_arguments.hpp"

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
/// A whole-warp operation (the wmma functions of mma.h): every lane of the warp, all 32 present
/// and live, arrives with a pointer to its own `data` and the same `call` bytes (the arguments
/// every lane must give alike); the last lane to arrive runs `run` with the 32 lanes' data
/// pointers (lane order) and the call, then every lane continues. Lanes that disagree on the
/// call, or a warp with exited lanes, are device faults.
void warp_operation(const char* name, const void* call, std::size_t call_bytes, void* data,
                    void (*run)(void* const* lane_data, const void* call));
/// Stops the calling thread with a device fault (the launch reports `what`).
[[noreturn]] void device_error(const std::string& what);
/// Runs `body` as every thread of every block of the grid of `kernel` (whose __shared__ arrays
/// are refilled before each block); records a launch error or fault.
void run_grid(dim3 grid, dim3 block, const char* name, const void* kernel, const std::function<void()>& body);
/// Records a fault of the launch of kernel `name` (cudaErrorLaunchFailure) without running it.
void launch_fault(const char* name, const std::string& what);

template <class... P>
struct Launch {
  dim3 grid, block;
  const char* name;
  void (*kernel)(P...);
  template <class... A>
  void operator()(A&&... args) const {
    // The launch copies its parameters once; each thread receives them by value.
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    std::string bad;
    std::apply(
        [&bad](const auto&... p) {
          int i = 0;
          ((bad.empty() ? (void)(bad = arguments::host_pointer_in(p, i)) : (void)0, ++i), ...);
        },
        params);
    if (!bad.empty()) {
      launch_fault(name, bad);
      return;
    }
    run_grid(grid, block, name, reinterpret_cast<const void*>(kernel), [&] { std::apply(kernel, params); });
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
// One static instance per kernel, which the emulator fills with 0xFF bytes (NaN as float, -1 as
// int) before every block: shared memory starts undefined (shared_memory.cpp).
#define __shared__ static
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

/// __syncwarp: the lanes of `mask` wait for each other (a warp collective without a value).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::oasis_emu::warp_exchange(mask, 0, ::oasis_emu::lane_id());
}

inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
using std::isnan;

template <class F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* /*kernel*/) {
  if (!attr) return cudaErrorInvalidValue;
  *attr = cudaFuncAttributes{1024, 0, 0};
  return cudaSuccess;
}
