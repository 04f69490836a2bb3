// src/verify/fuzz/regimes.cpp — the catalogue (run order), the sizes' fields per op, the features
// a case exercises, make_case(), and the generators' helpers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "oasis/core/error.hpp"
#include "regimes.hpp"

namespace oasis::verify::fuzz {

namespace detail {

double Rng::normal() {
  const double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  Rng r(a ^ (b * 0x9E3779B97F4A7C15ull));
  return r.next();
}

std::uint64_t hash_text(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

Regime make_regime(std::string name, std::vector<std::string> ops, std::string description, std::string targets,
                   std::vector<std::string> needs, std::vector<std::pair<std::string, Dims>> variants, Dims least,
                   std::function<void(Case&, int, Rng&)> generate) {
  Regime r;
  r.info.name = std::move(name);
  r.info.ops = std::move(ops);
  r.info.description = std::move(description);
  r.info.targets = std::move(targets);
  r.info.needs = std::move(needs);
  for (auto& [label, dims] : variants) {
    r.info.variants.push_back(label);
    r.start.push_back(dims);
  }
  r.least = least;
  r.generate = std::move(generate);
  return r;
}

const std::vector<Regime>& catalogue() {
  static const std::vector<Regime> all = [] {
    std::vector<Regime> v;
    add_attention_regimes(v);
    add_other_regimes(v);
    add_merge_regimes(v);
    return v;
  }();
  return all;
}

std::string family(const std::string& op) {
  if (op == "attention" || op == "attention_backward") return "attention";
  if (op == "normalizer") return "normalizer";
  if (op == "psi" || op == "psi_backward") return "psi";
  if (op == "depth" || op == "depth_backward" || op == "coupling") return "depth";
  if (op == "pseudo_query" || op == "pseudo_query_backward") return "pseudo_query";
  if (op == "attention_merge") return "merge";
  if (op == "attn_res" || op == "attn_res_backward" || op == "block_attn_res" || op == "block_attn_res_backward")
    return "attn_res";
  throw invalid_argument("op", "'" + op + "' is not an op the fuzzer drives (expected attention, attention_backward, normalizer, "
                               "psi, psi_backward, depth, depth_backward, coupling, pseudo_query, pseudo_query_backward, "
                               "attention_merge, attn_res, attn_res_backward, block_attn_res or block_attn_res_backward)");
}

std::vector<std::string> dim_fields(const std::string& op) {
  const std::string f = family(op);
  if (f == "attention") return {"B", "Hkv", "Tq", "Tk", "dh", "dv"};
  if (f == "normalizer" || f == "psi") return {"B", "H", "Tq", "Tk"};
  if (f == "merge") return {"S", "B", "H", "Tq", "dv"};
  return {"L", "N", "d"};
}

index_t& dim_ref(Dims& d, const std::string& f) {
  if (f == "B") return d.B;
  if (f == "H") return d.H;
  if (f == "Hkv") return d.Hkv;
  if (f == "Tq") return d.Tq;
  if (f == "Tk") return d.Tk;
  if (f == "dh") return d.dh;
  if (f == "dv") return d.dv;
  if (f == "L") return d.L;
  if (f == "N") return d.N;
  if (f == "S") return d.S;
  return d.d;
}
index_t dim_get(const Dims& d, const std::string& f) { return dim_ref(const_cast<Dims&>(d), f); }

std::set<std::string> case_features(const Case& c) {
  std::set<std::string> f;
  const std::string fam = family(c.op);
  const auto opt = [&](const std::string& k) {
    auto it = c.options.find(k);
    return it == c.options.end() ? std::string() : it->second;
  };
  auto has_inf = [&](const char* name) {
    auto it = c.inputs.find(name);
    if (it == c.inputs.end()) return false;
    for (double x : it->second.values.storage())
      if (std::isinf(x)) return true;
    return false;
  };
  if (fam == "attention") {
    f.insert(opt("causal") == "true" ? "causal" : "noncausal");
    if (!opt("window").empty() && opt("window") != "0") f.insert("window");
    if (!opt("key_lengths").empty()) f.insert("key_lengths");
    if (c.inputs.count("bias")) f.insert("bias");
    if (c.inputs.count("mask")) f.insert("mask");
    if (c.dims.H > c.dims.Hkv) f.insert("gqa");
    if (c.dims.Tq < c.dims.Tk) f.insert("decode");
    if (c.dims.Tq > c.dims.Tk && opt("causal") == "true") f.insert("tq_gt_tk");
    if (c.inputs.count("null_logits")) f.insert("null_logits");
    if (has_inf("null_logits")) f.insert("infinite_null");
    if (c.inputs.count("grad_lse")) f.insert("grad_lse");
    if (c.inputs.count("grad_p_null")) f.insert("grad_p_null");
  } else if (fam == "normalizer") {
    if (c.inputs.count("s")) f.insert("null_logits");
    if (has_inf("s")) f.insert("infinite_null");
  } else if (fam == "merge") {
    if (c.inputs.count("null_logits")) f.insert("null_logits");
    if (has_inf("null_logits")) f.insert("infinite_null");
  } else if (fam == "psi") {
    if (opt("estimator") == "\"mass\"") f.insert("mass");
  } else if (fam == "depth" || fam == "attn_res") {
    if (c.op == "coupling" || opt("coupling") == "true") f.insert("coupling");
    if (c.inputs.count("grad_alpha") || c.inputs.count("grad_alpha_null")) f.insert("grad_alpha");
    if (fam == "attn_res" && c.inputs.count("gain")) f.insert("gain");
    if (c.inputs.count("partial")) f.insert("partial");
  } else if (c.inputs.count("gain")) {
    f.insert("gain");
  }
  if (c.dims.B > 1) f.insert("batch");
  return f;
}

io::StoredTensor make_tensor(io::DType d, const Shape& shape, const std::function<double(index_t)>& f) {
  io::StoredTensor t{d, Tensor<double>(shape)};
  for (index_t i = 0; i < t.values.size(); ++i) t.values[i] = io::round_to_dtype(f(i), d);
  return t;
}

io::StoredTensor randn(io::DType d, const Shape& shape, Rng& rng, double scale) {
  return make_tensor(d, shape, [&](index_t) { return scale * rng.normal(); });
}

double dtype_max(io::DType d) {
  switch (d) {
    case io::DType::f16: return 65504.0;
    case io::DType::bf16: return 3.3895313892515355e38;
    case io::DType::f32: return std::numeric_limits<float>::max();
    default: return std::numeric_limits<double>::max();
  }
}

std::string num(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

}  // namespace detail

std::string Dims::str() const {
  const std::pair<const char*, index_t> f[] = {{"S", S},   {"B", B},   {"H", H}, {"Hkv", Hkv}, {"Tq", Tq}, {"Tk", Tk},
                                                {"dh", dh}, {"dv", dv}, {"L", L}, {"N", N},     {"d", d}};
  std::string s;
  for (const auto& [name, v] : f)
    if (v > 0) s += (s.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(v);
  return s;
}

double Dims::volume() const {
  auto z = [](index_t x) { return static_cast<double>(std::max<index_t>(x, 1)); };
  if (L > 0) return z(L) * z(N) * z(d) + z(L) + z(N) + z(d);
  if (S > 0) return z(S) * z(B) * z(H) * z(Tq) * (z(dv) + 1) + z(S) + z(B) + z(H) + z(Tq) + z(dv);  // the partials
  // attention: q, k, v and the scores; the sum of the fields breaks ties (Tk 65 -> 64 is smaller)
  return z(B) * z(H) * (z(Tq) * (z(dh) + z(dv) + z(Tk))) + z(B) * z(Hkv) * z(Tk) * (z(dh) + z(dv)) + z(B) + z(H) +
         z(Hkv) + z(Tq) + z(Tk) + z(dh) + z(dv);
}

std::string Case::options_json() const {
  std::string s = "{";
  for (const auto& [k, v] : options) s += (s.size() > 1 ? ", " : "") + io::json::quote(k) + ": " + v;
  return s + "}";
}

std::vector<std::string> feature_names() {
  return {"causal", "noncausal", "window", "key_lengths", "bias", "mask", "gqa", "decode", "tq_gt_tk", "batch",
          "null_logits", "infinite_null", "grad_lse", "grad_p_null", "mass", "coupling", "grad_alpha", "gain", "partial"};
}

std::vector<RegimeInfo> regimes(const std::string& op) {
  if (!op.empty()) detail::family(op);  // names an unknown op
  std::vector<RegimeInfo> out;
  for (const auto& r : detail::catalogue())
    if (op.empty() || std::count(r.info.ops.begin(), r.info.ops.end(), op)) out.push_back(r.info);
  return out;
}

Case make_case(const std::string& op, const std::string& regime, io::DType dtype, std::uint64_t seed, const Dims& dims) {
  detail::family(op);
  const std::string base = regime.substr(0, regime.find('['));
  for (const auto& r : detail::catalogue()) {
    if (r.info.name != base || !std::count(r.info.ops.begin(), r.info.ops.end(), op)) continue;
    int variant = 0;
    if (base != regime) {
      const std::string label = regime.substr(base.size() + 1, regime.size() - base.size() - 2);
      auto it = std::find(r.info.variants.begin(), r.info.variants.end(), label);
      OASIS_REQUIRE(regime.back() == ']' && it != r.info.variants.end(), "regime", "'", regime, "' names no variant of ",
                    base);
      variant = static_cast<int>(it - r.info.variants.begin());
    }
    Case c;
    c.op = op;
    c.regime = r.info.variants[static_cast<std::size_t>(variant)].empty()
                   ? base
                   : base + "[" + r.info.variants[static_cast<std::size_t>(variant)] + "]";
    c.seed = seed;
    c.dtype = dtype;
    c.dims = r.start[static_cast<std::size_t>(variant)];
    for (const std::string& f : detail::dim_fields(op)) {
      const index_t want = detail::dim_get(dims, f);
      if (want > 0) detail::dim_ref(c.dims, f) = std::max(want, detail::dim_get(r.least, f));
    }
    detail::Rng rng(seed);
    r.generate(c, variant, rng);
    return c;
  }
  throw invalid_argument("regime", "'" + regime + "' is not a regime of op " + op + " (oasis-verify fuzz " + op +
                                       " --list names them)");
}

}  // namespace oasis::verify::fuzz
