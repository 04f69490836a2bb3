// src/cuda/emu/cuda_bf16.h — bfloat16 storage type of the CUDA emulator (the toolkit's
// __nv_bfloat16, __nv_bfloat16_raw and their float conversions; round to nearest even).
#pragma once

#include <cstdint>

namespace oasis_emu {
float bf16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16_bits(float x);  // round to nearest, ties to even
}  // namespace oasis_emu

struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
inline float __bfloat162float(__nv_bfloat16 h) { return oasis_emu::bf16_bits_to_float(h.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  return __nv_bfloat16(__nv_bfloat16_raw{oasis_emu::float_to_bf16_bits(x)});
}
