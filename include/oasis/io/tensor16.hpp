// oasis/io/tensor16.hpp — tensors of float16 / bfloat16 values stored as their 16-bit patterns, and
// their conversions to and from float32 on the host. Header-only: available in every build, with
// or without the CUDA backend (whose 16-bit entry points take these tensors, oasis/backends/cuda.hpp).
//
//   round_to_bits(x, dtype)  float -> f16 / bf16 bits, round to nearest, ties to even; overflow
//                            rounds to +-inf, NaN stays NaN. One rounding: the float is widened
//                            exactly to double and narrowed by oasis/io/dtype.hpp's encoder.
//   widen_bits(bits, dtype)  f16 / bf16 bits -> float, exact (every such value is a float).
//
// These are the host's conversions. Device code converts with the toolkit's intrinsics
// (__half2float, __bfloat162float); tests/verify/test_tensor16.cpp checks the host conversions
// against definitions independent of oasis/io/dtype.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::io {

/// A tensor of float16 (IEEE binary16) or bfloat16 values stored as their 16-bit patterns.
struct Tensor16 {
  DType dtype = DType::f16;  ///< f16 or bf16
  Shape shape;
  std::vector<std::uint16_t> bits;
  index_t size() const { return static_cast<index_t>(bits.size()); }
};

/// Throws invalid_argument(arg) unless d is one of the two 16-bit formats.
inline void require_16bit(DType d, const char* arg) {
  OASIS_REQUIRE(d == DType::f16 || d == DType::bf16, arg, "dtype ", to_string(d),
                " has no 16-bit storage (use f16 or bf16)");
}

/// float -> 16-bit pattern of dtype (f16 or bf16), round to nearest, ties to even.
inline std::uint16_t round_to_bits(float x, DType dtype) {
  require_16bit(dtype, "dtype");
  const double exact = static_cast<double>(x);
  return dtype == DType::f16 ? double_to_half_bits(exact) : double_to_bf16_bits(exact);
}

/// 16-bit pattern of dtype (f16 or bf16) -> float, exact.
inline float widen_bits(std::uint16_t bits, DType dtype) {
  require_16bit(dtype, "dtype");
  return static_cast<float>(dtype == DType::f16 ? half_bits_to_double(bits) : bf16_bits_to_double(bits));
}

/// Every element of x rounded to dtype (f16 or bf16).
inline Tensor16 round_to(const Tensor<float>& x, DType dtype) {
  require_16bit(dtype, "dtype");
  Tensor16 t{dtype, x.shape(), std::vector<std::uint16_t>(static_cast<std::size_t>(x.size()))};
  for (index_t i = 0; i < x.size(); ++i) t.bits[static_cast<std::size_t>(i)] = round_to_bits(x[i], dtype);
  return t;
}

/// Every element of x widened exactly to float.
inline Tensor<float> widen(const Tensor16& x) {
  require_16bit(x.dtype, "dtype");
  OASIS_REQUIRE(static_cast<index_t>(x.bits.size()) == shape_numel(x.shape), "bits", "has ", x.bits.size(),
                " elements but shape ", shape_str(x.shape), " needs ", shape_numel(x.shape));
  Tensor<float> t(x.shape);
  for (index_t i = 0; i < t.size(); ++i) t[i] = widen_bits(x.bits[static_cast<std::size_t>(i)], x.dtype);
  return t;
}

}  // namespace oasis::io
