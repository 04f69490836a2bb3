// src/cuda/emu/emulator.hpp — what the emulator's parts share (internal to oasis_emu; the toolkit-
// named headers beside it are the emulator's public face):
//   runtime.cpp        the error state: faults, the last error, the pending (sticky-once) error
//   device_memory.cpp  the map of live device allocations
//   shared_memory.cpp  the __shared__ arrays of a kernel
//   fibers.cpp         the execution model (uses the three above)
//   cublas.cpp         SGEMM (uses the error state and the allocation map)
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

namespace oasis_emu {

// --- error state (runtime.cpp) ---------------------------------------------------------------------

/// Records a device fault: counted, printed to stderr, returned by cudaGetLastError() and once by
/// the next synchronising call.
void record_fault(cudaError_t code, const std::string& message);
/// Sets the last error (if code is not cudaSuccess) and returns code.
cudaError_t set_last(cudaError_t code);
/// The pending device fault, cleared (a synchronising call returns it once).
cudaError_t take_pending();

// --- device memory (device_memory.cpp) ---------------------------------------------------------------

/// Guards the allocation map; held by in_device_memory's callers.
std::mutex& memory_mutex();
/// True if [p, p + bytes) lies inside one live allocation (the caller holds memory_mutex()).
bool in_device_memory(const void* p, std::size_t bytes);

// --- shared memory (shared_memory.cpp) ---------------------------------------------------------------

struct ByteRange {
  unsigned char* begin;
  std::size_t size;
};
/// The __shared__ arrays of the kernel whose code starts at `kernel` (`name` for messages); called
/// under the launch lock.
const std::vector<ByteRange>& shared_arrays(const void* kernel, const char* name);

}  // namespace oasis_emu
