// src/cuda/emu/cuda_runtime_api.h — the CUDA runtime API subset that oasis_cuda uses, implemented
// on the host by the CUDA emulator (emu.cpp). Only the emulator build (target oasis_cuda_emu,
// docs/cuda.md "The CUDA emulator") puts this folder on the include path; the real build uses the
// toolkit's headers. Names, signatures and error codes are the toolkit's, so the unchanged host
// wrappers (backend_cuda.cpp, route.cpp, layer.cpp) and CUDA tests compile against either.
#pragma once

#include <cstddef>
#include <string>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

/// The toolkit's values for the codes the emulator returns.
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
};
using cudaError_t = cudaError;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct cudaDeviceProp {
  char name[256];
  int major;
  int minor;
  std::size_t totalGlobalMem;
  int multiProcessorCount;
  int warpSize;
  int maxThreadsPerBlock;
};

struct cudaFuncAttributes {
  int maxThreadsPerBlock;
  std::size_t sharedSizeBytes;
  int numRegs;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaMalloc(void** ptr, std::size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, std::size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes);

/// What the emulator adds (not CUDA API): its identity and its fault record.
namespace oasis_emu {
/// Device faults seen so far in this process (faults in kernels, deadlocks, writes outside an
/// allocation found at cudaFree, cuBLAS calls out of bounds). Tests assert it stays 0.
long long fault_count();
/// The message of the most recent fault ("" if none).
std::string last_fault();
/// The order in which the scheduler runs the blocks of a grid and resumes the runnable threads
/// of a block on each pass: forward (block 0 and thread 0 first), reverse, or shuffled by a
/// seeded generator. A race (a missing barrier) shows as a wrong result under some order:
/// forward exposes a thread reading what a later thread writes, reverse one reading what an
/// earlier thread (or block) writes. The initial order is taken from the environment variable
/// OASIS_EMU_SCHEDULE (forward, reverse, random[:seed]).
enum class Schedule { forward, reverse, random };
void set_schedule(Schedule s, unsigned seed = 1);
Schedule schedule();
}  // namespace oasis_emu
