// src/cuda/emu/cuda_fp16.h — IEEE binary16 storage of the CUDA emulator: what the kernels use of
// the toolkit's header (the __half storage type, its exact widening __half2float and the
// rounding __float2half_rn, to nearest with ties to even).
#pragma once

#include <cstdint>

namespace oasis_emu {
float half_bits_to_float(std::uint16_t bits);   // exact (runtime.cpp)
std::uint16_t float_to_half_bits(float x);      // round to nearest, ties to even (runtime.cpp)
}  // namespace oasis_emu

struct __half {
  unsigned short __x;
};
inline float __half2float(__half h) { return oasis_emu::half_bits_to_float(h.__x); }
inline __half __float2half_rn(float x) { return __half{oasis_emu::float_to_half_bits(x)}; }
