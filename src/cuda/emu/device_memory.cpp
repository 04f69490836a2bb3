// src/cuda/emu/device_memory.cpp — device memory of the CUDA emulator: cudaMalloc, cudaFree (and
// their stream-ordered forms), cudaMemcpy, cudaMemset on host memory, with the checks a GPU would
// make by faulting.
//
// An allocation is 256-byte aligned host memory filled with 0xFF bytes (NaN in every float lane,
// so an output a kernel never writes reads back as NaN) between guard bytes that cudaFree checks
// (a write past either end is a fault). Under AddressSanitizer (the oasis_emu_asan build) there are no guard
// bytes: ASan's redzones report any out-of-bounds access where it happens. Copies and memsets
// check that the device side lies inside one live allocation and that the host side of a copy
// is not device memory.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda_runtime_api.h"
#include "emulator.hpp"

namespace oasis_emu {
namespace {

// cudaMalloc returns 256-byte aligned memory (CUDA C++ Programming Guide, "Device Memory
// Accesses"); kernels may rely on it (vector loads, wmma's 32-byte alignment), so the emulator
// aligns alike: the guard below an allocation is a multiple of 256 bytes.
constexpr std::size_t kAlign = 256;
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kGuard = 0;
#else
constexpr std::size_t kGuard = kAlign;
#endif
constexpr unsigned char kGuardByte = 0xA5;

struct Allocation {
  unsigned char* raw;
  std::size_t bytes;
};
std::map<std::uintptr_t, Allocation>& allocations() {
  static std::map<std::uintptr_t, Allocation> m;
  return m;
}

}  // namespace

std::mutex& memory_mutex() {
  static std::mutex m;
  return m;
}

bool in_device_memory(const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto& m = allocations();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a >= it->first && a - it->first <= it->second.bytes && bytes <= it->second.bytes - (a - it->first);
}

bool is_device_pointer(const void* p) {
  if (!p) return true;
  std::lock_guard<std::mutex> lock(memory_mutex());
  return in_device_memory(p, 0);
}

}  // namespace oasis_emu

using oasis_emu::set_last;

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  using oasis_emu::kGuard;
  if (!ptr) return set_last(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* mem = nullptr;
  if (posix_memalign(&mem, oasis_emu::kAlign, bytes + 2 * kGuard) != 0) return set_last(cudaErrorMemoryAllocation);
  auto* raw = static_cast<unsigned char*>(mem);
  std::memset(raw, oasis_emu::kGuardByte, kGuard);
  std::memset(raw + kGuard, 0xFF, bytes);  // NaN in every float lane: unwritten outputs show
  std::memset(raw + kGuard + bytes, oasis_emu::kGuardByte, kGuard);
  std::lock_guard<std::mutex> lock(oasis_emu::memory_mutex());
  oasis_emu::allocations()[reinterpret_cast<std::uintptr_t>(raw + kGuard)] = oasis_emu::Allocation{raw, bytes};
  *ptr = raw + kGuard;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  using oasis_emu::kGuard;
  using oasis_emu::kGuardByte;
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(oasis_emu::memory_mutex());
  auto& m = oasis_emu::allocations();
  auto it = m.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == m.end()) return set_last(cudaErrorInvalidDevicePointer);
  const oasis_emu::Allocation a = it->second;
  m.erase(it);
  std::size_t below = 0, above = 0;
  for (std::size_t i = 0; i < kGuard; ++i) {
    below += a.raw[i] != kGuardByte;
    above += a.raw[kGuard + a.bytes + i] != kGuardByte;
  }
  std::free(a.raw);
  if (below || above) {
    oasis_emu::record_fault(cudaErrorIllegalAddress,
                            "cudaFree: a write outside an allocation of " + std::to_string(a.bytes) + " bytes (" +
                                std::to_string(below) + " guard bytes below, " + std::to_string(above) +
                                " above were overwritten)");
    return cudaErrorIllegalAddress;
  }
  return cudaSuccess;
}

// Stream-ordered allocation: launches run synchronously, so the stream's order is the call order.
cudaError_t cudaMallocAsync(void** ptr, std::size_t bytes, cudaStream_t /*stream*/) { return cudaMalloc(ptr, bytes); }
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t /*stream*/) { return cudaFree(ptr); }

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t p = oasis_emu::take_pending(); p != cudaSuccess) return set_last(p);
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return set_last(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(oasis_emu::memory_mutex());
  const bool dst_dev = oasis_emu::in_device_memory(dst, bytes), src_dev = oasis_emu::in_device_memory(src, bytes);
  bool ok = false;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = !dst_dev && !src_dev; break;
    case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = src_dev && !dst_dev; break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyDefault: ok = true; break;
    default: return set_last(cudaErrorInvalidMemcpyDirection);
  }
  // The device side is not inside one allocation, or the host side is device memory.
  if (!ok) return set_last(cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(oasis_emu::memory_mutex());
  if (!oasis_emu::in_device_memory(ptr, bytes)) return set_last(cudaErrorInvalidValue);
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}
