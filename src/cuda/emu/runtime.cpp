// src/cuda/emu/runtime.cpp — the CUDA runtime API of the emulator apart from memory: the device
// it reports, the error state (last error, faults) and its strings, and the 16-bit widening of
// cuda_fp16.h / cuda_bf16.h and their roundings.
//
// Errors: a failed API call sets the last error (cudaGetLastError returns and clears it). A
// device fault (recorded by the execution model, a cudaFree that finds its guard bytes
// overwritten, an SGEMM operand outside device memory) also becomes pending: the next
// synchronising call (cudaDeviceSynchronize, cudaMemcpy) returns it once. Unlike a GPU's, a fault
// is not sticky, and the state is per process rather than per host thread.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "oasis/io/dtype.hpp"

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime_api.h"
#include "emulator.hpp"

namespace oasis_emu {
namespace {

struct ErrorState {
  cudaError_t last = cudaSuccess;     // returned and cleared by cudaGetLastError
  cudaError_t pending = cudaSuccess;  // a device fault, returned once by the next synchronising call
  long long faults = 0;
  std::string fault_message;
  std::string fault_text;  // what cudaGetErrorString returns for the fault's code
};
ErrorState& err() {
  static ErrorState e;
  return e;
}

}  // namespace

void record_fault(cudaError_t code, const std::string& message) {
  ErrorState& e = err();
  ++e.faults;
  e.fault_message = message;
  e.last = code;
  e.pending = code;
  std::fprintf(stderr, "oasis CUDA emulator: %s\n", message.c_str());
}

cudaError_t set_last(cudaError_t code) {
  if (code != cudaSuccess) err().last = code;
  return code;
}

cudaError_t take_pending() {
  ErrorState& e = err();
  const cudaError_t p = e.pending;
  e.pending = cudaSuccess;
  return p;
}

long long fault_count() { return err().faults; }
std::string last_fault() { return err().fault_message; }

// The kernels' 16-bit loads: exact widening (oasis/io/dtype.hpp, whose conversions
// tests/verify/test_tensor16.cpp checks against independent definitions).
float half_bits_to_float(std::uint16_t bits) { return static_cast<float>(oasis::io::half_bits_to_double(bits)); }
float bf16_bits_to_float(std::uint16_t bits) { return static_cast<float>(oasis::io::bf16_bits_to_double(bits)); }
// The kernels' roundings to 16 bits (the tensor-core kernel's P): float -> double is exact, so the
// library's one rounding of a double is the rounding of the float.
std::uint16_t float_to_half_bits(float x) { return oasis::io::double_to_half_bits(static_cast<double>(x)); }
std::uint16_t float_to_bf16_bits(float x) { return oasis::io::double_to_bf16_bits(static_cast<double>(x)); }

}  // namespace oasis_emu

using oasis_emu::set_last;

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return set_last(cudaErrorInvalidValue);
  if (const char* v = std::getenv("OASIS_EMU_NO_DEVICE"); v && *v && std::string(v) != "0") {
    *count = 0;
    return set_last(cudaErrorNoDevice);
  }
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return set_last(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return set_last(cudaErrorInvalidValue);
  if (device != 0) return set_last(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "%s", "oasis CUDA emulator (host CPU)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = std::size_t{1} << 34;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return set_last(oasis_emu::take_pending()); }

cudaError_t cudaGetLastError() {
  auto& e = oasis_emu::err();
  const cudaError_t last = e.last;
  e.last = cudaSuccess;
  return last;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (OASIS_EMU_NO_DEVICE is set)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure: {
      auto& state = oasis_emu::err();
      state.fault_text = std::string(e == cudaErrorIllegalAddress ? "an illegal memory access was encountered"
                                                                  : "unspecified launch failure") +
                         " (emulator: " + state.fault_message + ")";
      return state.fault_text.c_str();
    }
  }
  return "unknown error";
}
