// src/cuda/emu/cuda_bf16.h — bfloat16 storage of the CUDA emulator: what the kernels use of the
// toolkit's header (the __nv_bfloat16 storage type and its exact widening __bfloat162float).
#pragma once

#include <cstdint>

namespace oasis_emu {
float bf16_bits_to_float(std::uint16_t bits);  // exact (runtime.cpp)
}  // namespace oasis_emu

struct __nv_bfloat16 {
  unsigned short __x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return oasis_emu::bf16_bits_to_float(h.__x); }
