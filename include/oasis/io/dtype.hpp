// oasis/io/dtype.hpp — storage dtypes of tensor files and exact conversions to and from double.
//
// A stored tensor keeps the dtype it was written in and its values widened *exactly* to double
// (every f16, bf16 and f32 value is a double). Writing narrows each double to the dtype with
// IEEE 754 round-to-nearest, ties-to-even (RNE), overflowing to +-inf and keeping NaN a NaN.
//
// Formats, as (fraction bits f, exponent bits w, bias b = 2^(w-1) - 1, emin = 1 - b):
//   f16  (IEEE binary16)  f = 10, w = 5,  emin = -14,   max = 65504
//   bf16 (bfloat16)       f = 7,  w = 8,  emin = -126,  max = (2 - 2^-7) 2^127
//   f32  (IEEE binary32)  f = 23, w = 8
//   f64  (IEEE binary64)  f = 52, w = 11
// eps(D) = 2^-f is the spacing of D at 1; the unit roundoff of D is eps(D)/2.
// Integer tensors (i32, i64: token ids) are held as doubles too; an i64 value beyond 2^53 in
// magnitude has no exact double and is rejected by the readers (exact_integer()).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

#include "oasis/core/error.hpp"
#include "oasis/io/dtype_enum.hpp"
#include "oasis/core/huge_pages.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::io {

/// True for the integer dtypes (token ids); comparisons take floating-point tensors only.
inline bool is_integer(DType d) { return d == DType::i32 || d == DType::i64; }

/// Largest magnitude of an integer that every double holds exactly: 2^53.
inline constexpr double kMaxExactInteger = 9007199254740992.0;

/// A tensor as stored in a file: its dtype and its values widened exactly to double.
struct StoredTensor {
  DType dtype;
  Tensor<double> values;
};

/// Tensors by name (safetensors files; a directory of .npy files maps the same way).
using TensorMap = std::map<std::string, StoredTensor>;

/// A malformed, truncated or unsupported tensor file. Derives from oasis::invalid_argument with
/// the file path as the argument; file() and tensor() say where (tensor() is "" for file-level
/// problems such as a bad header).
class format_error : public ::oasis::invalid_argument {
 public:
  format_error(std::string file, std::string tensor, const std::string& what)
      : ::oasis::invalid_argument(file, (tensor.empty() ? std::string() : "tensor '" + tensor + "': ") + what),
        file_(std::move(file)), tensor_(std::move(tensor)) {}
  const std::string& file() const noexcept { return file_; }
  const std::string& tensor() const noexcept { return tensor_; }

 private:
  std::string file_;
  std::string tensor_;
};

/// Size in bytes of one element.
inline std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::f16: case DType::bf16: return 2;
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
  }
  return 0;
}

/// Number of fraction (explicitly stored mantissa) bits (0 for integers: spacing 1).
inline int dtype_fraction_bits(DType d) {
  switch (d) {
    case DType::f16: return 10;
    case DType::bf16: return 7;
    case DType::f32: return 23;
    case DType::f64: return 52;
    case DType::i32: case DType::i64: return 0;
  }
  return 0;
}

/// Smallest normal exponent emin (the smallest normal number is 2^emin).
inline int dtype_min_exponent(DType d) {
  switch (d) {
    case DType::f16: return -14;
    case DType::bf16: case DType::f32: return -126;
    case DType::f64: return -1022;
    case DType::i32: case DType::i64: return 0;
  }
  return 0;
}

/// eps(D) = 2^-f: the distance from 1 to the next larger number of D.
inline double dtype_eps(DType d) { return std::ldexp(1.0, -dtype_fraction_bits(d)); }

/// floor(log2 |x|) of a finite nonzero x: std::ilogb(x), read from the bits where x is a normal
/// double (its biased exponent E gives E - 1023), so that a verdict, which needs it per element,
/// makes no libm call; zeros and subnormals go to std::ilogb (FP_ILOGB0 for a zero).
inline int exponent_of(double x) {
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int E = static_cast<int>((bits >> 52) & 0x7ff);
  return E != 0 ? E - 1023 : std::ilogb(x);
}

/// ulp_D(x): spacing of D at |x| (2^(max(e, emin) - f) with e = floor(log2 |x|)); the
/// subnormal spacing at 0 (and at inf or NaN). Used to express errors "in units of the tensor's
/// precision". 2^k is assembled from bits: a normal double, or for k < -1022 the subnormal 2^k.
inline double dtype_ulp(DType d, double x) {
  if (is_integer(d)) return 1.0;
  const int f = dtype_fraction_bits(d), emin = dtype_min_exponent(d);
  const bool finite_nonzero = std::isfinite(x) && x != 0;
  const int k = (finite_nonzero ? std::max(exponent_of(x), emin) : emin) - f;  // in [-1074, 1016]
  const std::uint64_t bits = k >= -1022 ? static_cast<std::uint64_t>(k + 1023) << 52 : std::uint64_t{1} << (k + 1074);
  double r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

/// safetensors names: "F16", "BF16", "F32", "F64", "I32", "I64".
inline std::string_view safetensors_name(DType d) {
  switch (d) {
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

/// Lower-case names used in reports and configuration files: "f16", "bf16", "f32", "f64", "i32", "i64".
inline std::string_view to_string(DType d) {
  switch (d) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

inline DType parse_dtype(std::string_view name) {
  if (name == "f16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "f64" || name == "float64") return DType::f64;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64") return DType::i64;
  throw ::oasis::invalid_argument("dtype", "unknown dtype '" + std::string(name) +
                                               "' (expected f16, bf16, f32, f64, i32 or i64)");
}

namespace detail {

/// Decode the bits of a small binary format (f fraction bits, w exponent bits) exactly.
inline double decode_small_float(std::uint32_t bits, int f, int w) {
  const std::uint32_t frac = bits & ((1u << f) - 1u);
  const std::uint32_t expf = (bits >> f) & ((1u << w) - 1u);
  const bool neg = (bits >> (f + w)) & 1u;
  const int bias = (1 << (w - 1)) - 1;
  double v;
  if (expf == 0) {
    v = std::ldexp(static_cast<double>(frac), 1 - bias - f);  // subnormal (or zero)
  } else if (expf == (1u << w) - 1u) {
    v = frac ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(static_cast<double>((1u << f) | frac), static_cast<int>(expf) - bias - f);
  }
  return neg ? -v : v;
}

/// Round x to the nearest value of the format (ties to even) and return its bits.
/// The rounding is done on the exact double value in one step (no double rounding):
/// q = |x| / quantum is exact (power-of-two scaling), nearbyint rounds it ties-to-even
/// under the default rounding mode, and q * quantum is exactly the rounded value.
inline std::uint32_t encode_small_float(double x, int f, int w) {
  const int bias = (1 << (w - 1)) - 1;
  const int emin = 1 - bias, emax = bias;
  const std::uint32_t sign = std::signbit(x) ? (1u << (f + w)) : 0u;
  const std::uint32_t exp_all = ((1u << w) - 1u) << f;
  if (std::isnan(x)) return sign | exp_all | (1u << (f - 1));  // quiet NaN
  const double ax = std::fabs(x);
  if (std::isinf(ax)) return sign | exp_all;
  if (ax == 0) return sign;
  const int e = std::max(std::ilogb(ax), emin);
  const double quantum = std::ldexp(1.0, e - f);
  const double q = std::nearbyint(ax / quantum);
  const double r = q * quantum;  // exact: q has at most f + 2 bits
  const double max_finite = std::ldexp(static_cast<double>((2u << f) - 1u), emax - f);
  if (r > max_finite) return sign | exp_all;  // overflow rounds to infinity
  if (r < std::ldexp(1.0, emin))              // subnormal (or rounded to zero)
    return sign | static_cast<std::uint32_t>(std::ldexp(r, f - emin));
  const int er = std::ilogb(r);
  const std::uint32_t frac = static_cast<std::uint32_t>(std::ldexp(r, f - er)) - (1u << f);
  return sign | (static_cast<std::uint32_t>(er + bias) << f) | frac;
}

}  // namespace detail

/// binary32 bits -> double, exactly, from the bits alone where they are subnormal: m 2^-149 is a
/// normal double, while the conversion instruction reads a subnormal float as 0 under a thread's
/// denormals-are-zero mode (e.g. after torch.set_flush_denormal(True)).
inline double float_bits_to_double(std::uint32_t b) {
  if ((b & 0x7F800000u) == 0) {  // zero or subnormal
    const double x = static_cast<double>(b & 0x7FFFFFu) * 0x1p-149;
    return (b >> 31) ? -x : x;
  }
  float f;
  std::memcpy(&f, &b, 4);
  return static_cast<double>(f);
}
inline double half_bits_to_double(std::uint16_t b) { return detail::decode_small_float(b, 10, 5); }
inline double bf16_bits_to_double(std::uint16_t b) { return detail::decode_small_float(b, 7, 8); }
/// double -> binary16 bits, round to nearest even (directly from double: no double rounding).
inline std::uint16_t double_to_half_bits(double x) {
  return static_cast<std::uint16_t>(detail::encode_small_float(x, 10, 5));
}
/// double -> bfloat16 bits, round to nearest even (directly from double: no double rounding).
inline std::uint16_t double_to_bf16_bits(double x) {
  return static_cast<std::uint16_t>(detail::encode_small_float(x, 7, 8));
}

/// Round a double to the nearest value of dtype d (RNE), returned as a double.
inline double round_to_dtype(double x, DType d) {
  switch (d) {
    case DType::f16: return half_bits_to_double(double_to_half_bits(x));
    case DType::bf16: return bf16_bits_to_double(double_to_bf16_bits(x));
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    case DType::f64: return x;
    case DType::i32: case DType::i64: return std::nearbyint(x);
  }
  return x;
}

namespace detail {

/// Little-endian element decode/encode (the formats are little-endian on every platform).
inline double load_le(const unsigned char* p, DType d) {
  switch (d) {
    case DType::f16: return half_bits_to_double(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
    case DType::bf16: return bf16_bits_to_double(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
    case DType::f32: {
      std::uint32_t u = 0;
      for (int i = 3; i >= 0; --i) u = (u << 8) | p[i];
      return float_bits_to_double(u);
    }
    case DType::f64: {
      std::uint64_t u = 0;
      for (int i = 7; i >= 0; --i) u = (u << 8) | p[i];
      double dv;
      std::memcpy(&dv, &u, 8);
      return dv;
    }
    case DType::i32: {
      std::uint32_t u = 0;
      for (int i = 3; i >= 0; --i) u = (u << 8) | p[i];
      return static_cast<double>(static_cast<std::int32_t>(u));
    }
    case DType::i64: {  // exact only within 2^53: the readers check with exact_integer()
      std::uint64_t u = 0;
      for (int i = 7; i >= 0; --i) u = (u << 8) | p[i];
      return static_cast<double>(static_cast<std::int64_t>(u));
    }
  }
  return 0;
}

template <DType D>
void load_le_run(const unsigned char* p, std::size_t n, double* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = load_le(p + i * dtype_size(D), D);  // D fixed: no switch per element
}

/// n elements of dtype d from p into out, as load_le each; for i64 first the index of the first
/// element beyond 2^53 in magnitude (exact_integer, below), returned with nothing written; else n.
inline std::size_t load_le_array(const unsigned char* p, std::size_t n, DType d, double* out);

/// An i64 element read exactly: |v| <= 2^53 (every such integer is a double).
inline bool exact_integer(const unsigned char* p, DType d) {
  if (d != DType::i64) return true;
  std::uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | p[i];
  const std::int64_t v = static_cast<std::int64_t>(u);
  return v >= -(std::int64_t(1) << 53) && v <= (std::int64_t(1) << 53);
}

inline std::size_t load_le_array(const unsigned char* p, std::size_t n, DType d, double* out) {
  switch (d) {
    case DType::f16: load_le_run<DType::f16>(p, n, out); break;
    case DType::bf16: load_le_run<DType::bf16>(p, n, out); break;
    case DType::f32: load_le_run<DType::f32>(p, n, out); break;
    case DType::f64: load_le_run<DType::f64>(p, n, out); break;
    case DType::i32: load_le_run<DType::i32>(p, n, out); break;
    case DType::i64:
      for (std::size_t i = 0; i < n; ++i)
        if (!exact_integer(p + i * 8, d)) return i;
      load_le_run<DType::i64>(p, n, out);
      break;
  }
  return n;
}

/// An integer dtype holds only integers within its range (and within 2^53 for i64).
inline bool storable_integer(double x, DType d) {
  if (!std::isfinite(x) || x != std::floor(x)) return false;
  if (d == DType::i32) return x >= -2147483648.0 && x <= 2147483647.0;
  return std::fabs(x) <= kMaxExactInteger;
}

inline void store_le(double x, DType d, std::string& out) {
  std::uint64_t u = 0;
  std::size_t n = dtype_size(d);
  switch (d) {
    case DType::f16: u = double_to_half_bits(x); break;
    case DType::bf16: u = double_to_bf16_bits(x); break;
    case DType::f32: { const float fv = static_cast<float>(x); std::uint32_t b; std::memcpy(&b, &fv, 4); u = b; break; }
    case DType::f64: std::memcpy(&u, &x, 8); break;
    case DType::i32: u = static_cast<std::uint32_t>(static_cast<std::int32_t>(x)); break;
    case DType::i64: u = static_cast<std::uint64_t>(static_cast<std::int64_t>(x)); break;
  }
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xFFu));
}

using oasis::checked_numel;  // oasis/core/tensor.hpp

/// The whole file as bytes; format_error when it cannot be read. Regular files only (after
/// following symbolic links): a directory, FIFO, socket or device is refused by name before it is
/// opened, since a FIFO would block the reader and a directory or device has no size to read.
inline std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    const char* kind = std::filesystem::is_directory(st) ? "a directory"
                       : std::filesystem::is_fifo(st)    ? "a FIFO (named pipe)"
                       : std::filesystem::is_socket(st)  ? "a socket"
                       : std::filesystem::is_character_file(st) || std::filesystem::is_block_file(st) ? "a device"
                                                                                                     : "a special file";
    throw format_error(path, "", std::string("is ") + kind + ", not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw format_error(path, "", "cannot open file for reading");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw format_error(path, "", "cannot determine the file size");
  in.seekg(0, std::ios::beg);
  std::string bytes;
  resize_advised(bytes, static_cast<std::size_t>(size));
  if (size > 0 && !in.read(&bytes[0], size)) throw format_error(path, "", "read error");
  return bytes;
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw format_error(path, "", "cannot open file for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw format_error(path, "", "write error");
}

}  // namespace detail
}  // namespace oasis::io
