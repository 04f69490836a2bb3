// src/verify/config_files.cpp — a compare configuration and its tensor files (config_files.hpp),
// and the comparison options (compare_options, oasis/verify/compare.hpp).
#include "config_files.hpp"

#include <cmath>

#include "oasis/core/error.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/verify/compare.hpp"

namespace oasis::verify {
namespace detail {

using io::TensorMap;
using io::json::Value;

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
std::string dir_of(const std::string& p) {
  const auto k = p.find_last_of('/');
  return k == std::string::npos ? "." : (k == 0 ? "/" : p.substr(0, k));
}

TensorMap read_tensor_file(const std::string& path, const std::string& what) {
  if (ends_with(path, ".safetensors")) return io::read_safetensors(path);
  OASIS_REQUIRE(!ends_with(path, ".npy"), what,
                "'", path, "' is one .npy array; list the tensors as an object {\"name\": \"file.npy\", ...}");
  throw invalid_argument(what, "'" + path + "': unknown file type (expected .safetensors, or .npy files by name)");
}

}  // namespace

std::string resolve_path(const std::string& base, const std::string& p) {
  if (p.empty() || p[0] == '/' || base.empty()) return p;
  return base + "/" + p;
}

TensorMap load_tensor_set(const Value* spec, const std::string& base, const std::string& default_file,
                          const std::string& what) {
  if (!spec) {
    OASIS_REQUIRE(!default_file.empty(), what, "missing (a .safetensors path or an object {name: file})");
    return read_tensor_file(default_file, what);
  }
  if (spec->is_string()) return read_tensor_file(resolve_path(base, spec->text), what);
  OASIS_REQUIRE(spec->is_object(), what, "must be a .safetensors path or an object {name: file}");
  TensorMap out;
  for (const auto& [name, v] : spec->members) {
    OASIS_REQUIRE(v.is_string(), what, "entry '", name, "' must be a file path");
    const std::string path = resolve_path(base, v.text);
    if (ends_with(path, ".npy")) {
      out.emplace(name, io::read_npy(path));
    } else if (ends_with(path, ".safetensors")) {
      TensorMap m = io::read_safetensors(path);
      auto it = m.find(name);
      if (it == m.end() && m.size() == 1) it = m.begin();
      OASIS_REQUIRE(it != m.end(), what, "'", path, "' has no tensor named '", name, "'");
      out.emplace(name, it->second);
    } else {
      throw invalid_argument(what, "entry '" + name + "': '" + path + "' is neither .npy nor .safetensors");
    }
  }
  return out;
}

ConfigFile read_config_file(const std::string& path) {
  ConfigFile f;
  std::string text;
  if (ends_with(path, ".safetensors")) {
    const auto md = io::read_safetensors_metadata(path);
    auto it = md.find("oasis_config");
    OASIS_REQUIRE(it != md.end(), path, "has no \"oasis_config\" entry in its __metadata__ (see docs/verify.md)");
    text = it->second;
    f.default_file = path;
  } else {
    text = io::detail::read_file_bytes(path);
  }
  try {
    f.cfg = io::json::parse(text);
  } catch (const io::json::parse_error& e) {
    throw invalid_argument(path, std::string("configuration is not valid JSON: ") + e.what());
  }
  f.base_dir = dir_of(path);
  return f;
}

}  // namespace detail

using io::json::Value;

CompareOptions compare_options(const Value& v) {
  OASIS_REQUIRE(v.kind == Value::Kind::null || v.is_object(), "compare options", "must be a JSON object");
  CompareOptions opt;
  for (const auto& [key, x] : v.members) {
    if (key == "show") {
      std::uint64_t n = 0;
      OASIS_REQUIRE(x.as_uint64(&n) && n <= 1000000, "show", "must be an integer in [0, 1000000]");
      opt.show = static_cast<int>(n);
    } else if (key == "policy") {
      OASIS_REQUIRE(x.is_string(), "policy", "must be a string (probabilistic, p16 or worst_case)");
      opt.policy = parse_policy(x.text);
    } else if (key == "oracle") {
      OASIS_REQUIRE(x.is_string(), "oracle", "must be a string (fast or mp50)");
      opt.oracle = parse_oracle(x.text);
    } else if (key == "sample") {
      std::uint64_t n = 0;
      OASIS_REQUIRE(x.as_uint64(&n) && n < (1ull << 62), "sample", "must be a non-negative integer (0: every row)");
      opt.sample = static_cast<index_t>(n);
    } else if (key == "seed") {
      std::uint64_t n = 0;
      OASIS_REQUIRE(x.as_uint64(&n), "seed", "must be a non-negative integer");
      opt.seed = n;
    } else if (key == "mp50_budget" || key == "mp50_memory") {
      const double n = x.is_number() ? x.as_double() : -1.0;
      OASIS_REQUIRE(n >= 0 && !std::isnan(n), key,
                    key == "mp50_budget" ? "must be a non-negative number (mp50 multiply-adds)" : "must be a non-negative number (bytes)");
      (key == "mp50_budget" ? opt.mp50_budget : opt.mp50_memory) = n;
    } else {
      throw invalid_argument(key, "unknown comparison option (known: show, policy, oracle, sample, seed, mp50_budget, "
                                  "mp50_memory)");
    }
  }
  return opt;
}

}  // namespace oasis::verify
