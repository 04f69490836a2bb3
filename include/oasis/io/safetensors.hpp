// oasis/io/safetensors.hpp — read and write safetensors files (f16, bf16, f32, f64).
//
// Format (https://github.com/huggingface/safetensors): 8 bytes N (unsigned little-endian), then N
// bytes of UTF-8 JSON, then the data buffer. The JSON object maps each tensor name to
//   {"dtype": "F16"|"BF16"|"F32"|"F64"|"I32"|"I64", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// (offsets relative to the start of the data buffer, little-endian C-order data) and may hold
// "__metadata__": {string: string}. The reader is as strict as the reference implementation:
// the header is a JSON object that starts with '{' and fits in the file, every tensor's byte
// range is [begin, end) with end - begin = numel * itemsize, ranges do not overlap and together
// cover the whole data buffer exactly (no holes, no trailing bytes); an I64 entry beyond 2^53 in
// magnitude (not exact as a double) is rejected. Any violation, and any other dtype (I8, U8,
// F8_*, ...), throws oasis::io::format_error naming the file and the tensor.
// Sizes are checked against the file size before anything is allocated.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "oasis/core/huge_pages.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"

namespace oasis::io {

namespace detail {
/// Largest header accepted (the reference implementation's limit).
constexpr std::uint64_t kMaxSafetensorsHeader = 100u * 1024u * 1024u;

inline DType parse_safetensors_dtype(const std::string& file, const std::string& tensor, const std::string& s) {
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  static const char* known[] = {"BOOL", "U8", "I8", "I16", "U16", "U32", "U64",
                                "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
  for (const char* k : known)
    if (s == k)
      throw format_error(file, tensor, "unsupported dtype \"" + s + "\" (supported: F16, BF16, F32, F64, I32, I64)");
  throw format_error(file, tensor, "unknown dtype \"" + s + "\" (supported: F16, BF16, F32, F64, I32, I64)");
}
}  // namespace detail

/// Parse a safetensors file held in memory; `name` is used in error messages. If `metadata`
/// is not null it receives the "__metadata__" entries.
inline TensorMap parse_safetensors(const std::string& bytes, const std::string& name,
                                   std::map<std::string, std::string>* metadata = nullptr) {
  if (bytes.empty()) throw format_error(name, "", "empty file (a safetensors file starts with an 8-byte header length)");
  if (bytes.size() < 8)
    throw format_error(name, "", "truncated: " + std::to_string(bytes.size()) +
                                     " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  const std::uint64_t avail = bytes.size() - 8;
  if (n > avail)
    throw format_error(name, "", "header length " + std::to_string(n) + " exceeds the " + std::to_string(avail) +
                                     " bytes that follow it (truncated file or a lying header)");
  if (n > detail::kMaxSafetensorsHeader)
    throw format_error(name, "", "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n < 2) throw format_error(name, "", "header of " + std::to_string(n) + " bytes cannot hold a JSON object");
  const std::string header = bytes.substr(8, static_cast<std::size_t>(n));
  if (header[0] != '{') throw format_error(name, "", "header does not start with '{'");
  json::Value root;
  try {
    root = json::parse(header);
  } catch (const json::parse_error& e) {
    throw format_error(name, "", std::string("malformed header: ") + e.what());
  }
  if (!root.is_object()) throw format_error(name, "", "header is not a JSON object");

  const std::uint64_t data_size = avail - n;
  const std::size_t data_start = 8 + static_cast<std::size_t>(n);
  struct Entry { std::string name; DType dtype; Shape shape; std::uint64_t begin, end; };
  std::vector<Entry> entries;
  for (const auto& m : root.members) {
    const std::string& tname = m.first;
    const json::Value& v = m.second;
    if (tname == "__metadata__") {
      if (!v.is_object()) throw format_error(name, "__metadata__", "must be an object of strings");
      for (const auto& kv : v.members) {
        if (!kv.second.is_string())
          throw format_error(name, "__metadata__", "value of \"" + kv.first + "\" is not a string");
        if (metadata) (*metadata)[kv.first] = kv.second.text;
      }
      continue;
    }
    if (!v.is_object()) throw format_error(name, tname, "entry is not a JSON object");
    for (const auto& kv : v.members)
      if (kv.first != "dtype" && kv.first != "shape" && kv.first != "data_offsets")
        throw format_error(name, tname, "unexpected field \"" + kv.first + "\"");
    const json::Value* dt = v.find("dtype");
    const json::Value* sh = v.find("shape");
    const json::Value* off = v.find("data_offsets");
    if (!dt || !dt->is_string()) throw format_error(name, tname, "missing or non-string \"dtype\"");
    if (!sh || !sh->is_array()) throw format_error(name, tname, "missing or non-array \"shape\"");
    if (!off || !off->is_array() || off->items.size() != 2)
      throw format_error(name, tname, "\"data_offsets\" must be an array [begin, end]");
    Entry e{tname, detail::parse_safetensors_dtype(name, tname, dt->text), {}, 0, 0};
    if (sh->items.size() > 64) throw format_error(name, tname, "rank above 64");
    for (const auto& d : sh->items) {
      std::uint64_t u;
      if (!d.as_uint64(&u) || u > static_cast<std::uint64_t>(INT64_MAX))
        throw format_error(name, tname, "shape entries must be non-negative integers");
      e.shape.push_back(static_cast<index_t>(u));
    }
    if (!off->items[0].as_uint64(&e.begin) || !off->items[1].as_uint64(&e.end))
      throw format_error(name, tname, "data_offsets must be non-negative integers");
    if (e.begin > e.end)
      throw format_error(name, tname, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                          "] has begin > end");
    if (e.end > data_size)
      throw format_error(name, tname, "data_offsets end " + std::to_string(e.end) + " lies beyond the " +
                                          std::to_string(data_size) + "-byte data buffer (truncated file?)");
    const std::uint64_t isz = dtype_size(e.dtype);
    std::uint64_t numel = 0;
    if (!detail::checked_numel(e.shape, data_size / isz, &numel) || numel * isz != e.end - e.begin)
      throw format_error(name, tname, "shape " + shape_str(e.shape) + " of " + std::string(safetensors_name(e.dtype)) +
                                          " needs a different byte count than data_offsets [" + std::to_string(e.begin) +
                                          ", " + std::to_string(e.end) + ") holds");
    entries.push_back(std::move(e));
  }
  // Byte ranges: sorted, non-overlapping, covering [0, data_size) exactly.
  std::vector<const Entry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t pos = 0;
  for (const Entry* e : order) {
    if (e->begin < pos)
      throw format_error(name, e->name, "data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                                            ") overlap another tensor's bytes");
    if (e->begin > pos)
      throw format_error(name, e->name, "data_offsets begin " + std::to_string(e->begin) +
                                            " leaves a hole in the data buffer (previous tensor ends at " +
                                            std::to_string(pos) + ")");
    pos = e->end;
  }
  if (pos != data_size)
    throw format_error(name, "", std::to_string(data_size - pos) + " bytes after the last tensor are not described by the header");

  TensorMap out;
  for (const Entry& e : entries) {
    const std::size_t isz = dtype_size(e.dtype);
    const std::size_t numel = static_cast<std::size_t>((e.end - e.begin) / isz);
    std::vector<double> vals;
    resize_advised(vals, numel);
    const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data()) + data_start + e.begin;
    const std::size_t bad = detail::load_le_array(p, numel, e.dtype, vals.data());
    if (bad < numel)
      throw format_error(name, e.name, "I64 entry " + std::to_string(bad) + " lies beyond 2^53 in magnitude (not exact as a double)");
    out.emplace(e.name, StoredTensor{e.dtype, Tensor<double>(e.shape, std::move(vals))});
  }
  return out;
}

/// Read a safetensors file; throws format_error (naming file and tensor) on malformed input.
inline TensorMap read_safetensors(const std::string& path) {
  return parse_safetensors(detail::read_file_bytes(path), path);
}

/// The "__metadata__" entries of a safetensors file (the file is fully validated).
inline std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::map<std::string, std::string> md;
  parse_safetensors(detail::read_file_bytes(path), path, &md);
  return md;
}

/// Serialise tensors (each narrowed to its dtype with round-to-nearest-even) to safetensors bytes.
inline std::string serialize_safetensors(const TensorMap& tensors,
                                         const std::map<std::string, std::string>& metadata = {}) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      header += (it == metadata.begin() ? "" : ",") + json::quote(it->first) + ":" + json::quote(it->second);
    header += "}";
    first = false;
  }
  std::uint64_t pos = 0;
  for (const auto& [tname, t] : tensors) {
    OASIS_REQUIRE(tname != "__metadata__", "tensors", "a tensor may not be named __metadata__");
    if (is_integer(t.dtype))
      for (index_t i = 0; i < t.values.size(); ++i)
        OASIS_REQUIRE(detail::storable_integer(t.values[i], t.dtype), tname, "entry ", i, " = ", t.values[i],
                      " is not an integer that ", to_string(t.dtype), " holds exactly");
    const std::uint64_t nbytes = static_cast<std::uint64_t>(t.values.size()) * dtype_size(t.dtype);
    header += (first ? "" : ",") + json::quote(tname) + ":{\"dtype\":\"" + std::string(safetensors_name(t.dtype)) +
              "\",\"shape\":[";
    for (std::size_t d = 0; d < t.values.shape().size(); ++d)
      header += (d ? "," : "") + std::to_string(t.values.shape()[d]);
    header += "],\"data_offsets\":[" + std::to_string(pos) + "," + std::to_string(pos + nbytes) + "]}";
    pos += nbytes;
    first = false;
  }
  header += "}";
  while (header.size() % 8) header.push_back(' ');  // align the data buffer to 8 bytes
  std::string out;
  out.reserve(8 + header.size() + static_cast<std::size_t>(pos));
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFFu));
  out += header;
  for (const auto& kv : tensors)
    for (index_t i = 0; i < kv.second.values.size(); ++i) detail::store_le(kv.second.values[i], kv.second.dtype, out);
  return out;
}

/// Write tensors to a safetensors file (values rounded to each tensor's dtype, RNE).
inline void write_safetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  detail::write_file_bytes(path, serialize_safetensors(tensors, metadata));
}

}  // namespace oasis::io
