// oasis/io/npy.hpp — read and write NumPy .npy files (format versions 1.0, 2.0, 3.0).
//
// Layout: magic "\x93NUMPY", major, minor, header length (uint16 LE for 1.0, uint32 LE for 2.0
// and 3.0), then an ASCII (3.0: UTF-8) Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ending in '\n', then the raw data. Supported: little-endian C-order
// arrays of '<f2', '<f4', '<f8', and the integers '<i4', '<i8' (token ids; an '<i8' entry beyond
// 2^53 in magnitude has no exact double and is rejected). NumPy has no bfloat16, so bf16 is stored as its raw 16 bits
// with descr '<u2' and the file name must end in ".bf16.npy" (the naming convention that says
// how to read the bits; '<u2' under any other name is rejected, as is every other descr,
// big-endian data and fortran_order True). The data must be exactly numel * itemsize bytes.
// Malformed input throws oasis::io::format_error naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oasis/core/huge_pages.hpp"
#include "oasis/io/dtype.hpp"

namespace oasis::io {

namespace detail {

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Strict reader of the header dict: exactly the keys descr, fortran_order, shape.
class NpyHeader {
 public:
  NpyHeader(const std::string& text, const std::string& file) : s_(text), file_(file) {}

  void parse(std::string* descr, bool* fortran, Shape* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    ws();
    expect('{');
    for (;;) {
      ws();
      if (peek() == '}') { ++i_; break; }
      const std::string key = str();
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        if (have_descr) fail("duplicate key 'descr'");
        *descr = str();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) fail("duplicate key 'fortran_order'");
        if (s_.compare(i_, 4, "True") == 0) { *fortran = true; i_ += 4; }
        else if (s_.compare(i_, 5, "False") == 0) { *fortran = false; i_ += 5; }
        else fail("fortran_order must be True or False");
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) fail("duplicate key 'shape'");
        tuple(shape);
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      ws();
      if (peek() == ',') { ++i_; continue; }
      ws();
      if (peek() == '}') { ++i_; break; }
      fail("expected ',' or '}'");
    }
    ws();
    if (i_ != s_.size()) fail("unexpected characters after the header dict");
    if (!have_descr || !have_fortran || !have_shape)
      fail("header must define 'descr', 'fortran_order' and 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw format_error(file_, "", "malformed .npy header: " + what + " (at header byte " + std::to_string(i_) + ")");
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() { while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t')) ++i_; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string str() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    ++i_;
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || static_cast<unsigned char>(s_[i_]) < 0x20) fail("unsupported character in string");
      ++i_;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    return s_.substr(start, i_++ - start);
  }
  void tuple(Shape* shape) {
    expect('(');
    shape->clear();
    for (;;) {
      ws();
      if (peek() == ')') { ++i_; return; }
      if (peek() < '0' || peek() > '9') fail("shape entries must be non-negative integers");
      std::uint64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const std::uint64_t d = static_cast<std::uint64_t>(s_[i_++] - '0');
        if (v > (static_cast<std::uint64_t>(INT64_MAX) - d) / 10) fail("shape entry too large");
        v = v * 10 + d;
      }
      if (peek() == 'L') ++i_;  // Python 2 long suffix, as NumPy still accepts
      shape->push_back(static_cast<index_t>(v));
      if (shape->size() > 64) fail("rank above 64");
      ws();
      if (peek() == ',') { ++i_; continue; }
      ws();
      if (peek() == ')') {
        if (shape->size() == 1) fail("a one-element shape tuple needs a trailing comma, e.g. (3,)");
        ++i_;
        return;
      }
      fail("expected ',' or ')' in shape");
    }
  }

  const std::string& s_;
  const std::string& file_;
  std::size_t i_ = 0;
};

}  // namespace detail

/// Parse a .npy file held in memory. `name` is used in messages and decides bf16: a '<u2' array
/// is read as bfloat16 bits only when name ends in ".bf16.npy".
inline StoredTensor parse_npy(const std::string& bytes, const std::string& name) {
  if (bytes.empty()) throw format_error(name, "", "empty file (a .npy file starts with \\x93NUMPY)");
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw format_error(name, "", bytes.size() < 10 ? "truncated: shorter than the 10-byte .npy preamble"
                                                   : "not a .npy file (missing \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw format_error(name, "", "truncated: shorter than the 12-byte .npy 2.0 preamble");
    for (int i = 11; i >= 8; --i) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    hstart = 12;
  } else {
    throw format_error(name, "", "unsupported .npy format version " + std::to_string(major) + "." +
                                     std::to_string(static_cast<unsigned char>(bytes[7])));
  }
  if (hlen > bytes.size() - hstart)
    throw format_error(name, "", "header length " + std::to_string(hlen) + " exceeds the " +
                                     std::to_string(bytes.size() - hstart) + " bytes that follow it (truncated file?)");
  std::string header = bytes.substr(hstart, hlen);
  if (header.empty() || header.back() != '\n') throw format_error(name, "", "malformed .npy header: must end with a newline");
  header.pop_back();
  std::string descr;
  bool fortran = false;
  Shape shape;
  detail::NpyHeader(header, name).parse(&descr, &fortran, &shape);
  if (fortran) throw format_error(name, "", "fortran_order True is not supported (write C-order arrays)");
  DType dt;
  if (descr == "<f2") dt = DType::f16;
  else if (descr == "<f4") dt = DType::f32;
  else if (descr == "<f8") dt = DType::f64;
  else if (descr == "<i4") dt = DType::i32;
  else if (descr == "<i8") dt = DType::i64;
  else if (descr == "<u2" && detail::ends_with(name, ".bf16.npy")) dt = DType::bf16;
  else if (descr == "<u2")
    throw format_error(name, "", "dtype '<u2' is read as bfloat16 bits only from files named *.bf16.npy");
  else if (!descr.empty() && descr[0] == '>')
    throw format_error(name, "", "big-endian dtype '" + descr + "' is not supported (use '<f2', '<f4', '<f8', '<i4' or '<i8')");
  else
    throw format_error(name, "", "unsupported dtype '" + descr +
                                     "' (supported: '<f2', '<f4', '<f8', '<i4', '<i8', bf16 as '<u2' in *.bf16.npy)");
  const std::size_t isz = dtype_size(dt);
  const std::size_t data_bytes = bytes.size() - hstart - hlen;
  std::uint64_t numel = 0;
  if (!detail::checked_numel(shape, data_bytes / isz, &numel) || numel * isz != data_bytes)
    throw format_error(name, "", "shape " + shape_str(shape) + " of '" + descr + "' needs a different byte count than the " +
                                     std::to_string(data_bytes) + " data bytes in the file (lying shape or truncated data)");
  std::vector<double> vals;
  resize_advised(vals, static_cast<std::size_t>(numel));
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data()) + hstart + hlen;
  const std::size_t bad = detail::load_le_array(p, vals.size(), dt, vals.data());
  if (bad < vals.size())
    throw format_error(name, "", "'<i8' entry " + std::to_string(bad) + " lies beyond 2^53 in magnitude (not exact as a double)");
  return StoredTensor{dt, Tensor<double>(shape, std::move(vals))};
}

/// Read a .npy file; throws format_error on malformed or unsupported input.
inline StoredTensor read_npy(const std::string& path) { return parse_npy(detail::read_file_bytes(path), path); }

/// Serialise to .npy 1.0 bytes (header padded to a multiple of 64 bytes, as NumPy does).
/// bf16 is written as '<u2' bits; `name` must then end in ".bf16.npy" so that it reads back.
inline std::string serialize_npy(const StoredTensor& t, const std::string& name) {
  const char* descr = t.dtype == DType::f16 ? "<f2" : t.dtype == DType::f32 ? "<f4" : t.dtype == DType::f64 ? "<f8"
                    : t.dtype == DType::i32 ? "<i4" : t.dtype == DType::i64 ? "<i8" : "<u2";
  if (is_integer(t.dtype))
    for (index_t i = 0; i < t.values.size(); ++i)
      if (!detail::storable_integer(t.values[i], t.dtype))
        throw format_error(name, "", "entry " + std::to_string(i) + " is not an integer that " + std::string(to_string(t.dtype)) +
                                         " holds exactly");
  if (t.dtype == DType::bf16 && !detail::ends_with(name, ".bf16.npy"))
    throw format_error(name, "", "bfloat16 .npy files must be named *.bf16.npy (raw '<u2' bits; see oasis/io/npy.hpp)");
  std::string shape = "(";
  for (std::size_t d = 0; d < t.values.shape().size(); ++d)
    shape += std::to_string(t.values.shape()[d]) + (t.values.shape().size() == 1 ? "," : d + 1 < t.values.shape().size() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  std::size_t total = 10 + header.size() + 1;
  const bool v2 = header.size() + 64 > 65535;
  if (v2) total += 2;
  while (total % 64) { header.push_back(' '); ++total; }
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  const std::size_t hl = header.size();
  out.push_back(static_cast<char>(hl & 0xFF));
  out.push_back(static_cast<char>((hl >> 8) & 0xFF));
  if (v2) {
    out.push_back(static_cast<char>((hl >> 16) & 0xFF));
    out.push_back(static_cast<char>((hl >> 24) & 0xFF));
  }
  out += header;
  for (index_t i = 0; i < t.values.size(); ++i) detail::store_le(t.values[i], t.dtype, out);
  return out;
}

/// Write a .npy file (values rounded to the dtype, RNE). bf16 requires a *.bf16.npy path.
inline void write_npy(const std::string& path, const StoredTensor& t) {
  detail::write_file_bytes(path, serialize_npy(t, path));
}

}  // namespace oasis::io
