// src/cuda/emu/cuda_bf16.h — bfloat16 storage of the CUDA emulator: what the kernels use of the
// toolkit's header (the __nv_bfloat16 storage type, its exact widening __bfloat162float and the
// rounding __float2bfloat16_rn, to nearest with ties to even).
#pragma once

#include <cstdint>

namespace oasis_emu {
float bf16_bits_to_float(std::uint16_t bits);   // exact (runtime.cpp)
std::uint16_t float_to_bf16_bits(float x);      // round to nearest, ties to even (runtime.cpp)
}  // namespace oasis_emu

struct __nv_bfloat16 {
  unsigned short __x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return oasis_emu::bf16_bits_to_float(h.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __nv_bfloat16{oasis_emu::float_to_bf16_bits(x)}; }
