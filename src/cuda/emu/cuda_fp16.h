// src/cuda/emu/cuda_fp16.h — IEEE binary16 storage type of the CUDA emulator (the toolkit's
// __half, __half_raw and their float conversions; round to nearest even, as __float2half_rn).
#pragma once

#include <cstdint>

namespace oasis_emu {
float half_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_half_bits(float x);  // round to nearest, ties to even
}  // namespace oasis_emu

struct __half_raw {
  unsigned short x;
};
struct __half {
  unsigned short __x;
  __half() = default;
  __half(const __half_raw& r) : __x(r.x) {}
  operator __half_raw() const { return __half_raw{__x}; }
};
inline float __half2float(__half h) { return oasis_emu::half_bits_to_float(h.__x); }
inline __half __float2half_rn(float x) { return __half(__half_raw{oasis_emu::float_to_half_bits(x)}); }
