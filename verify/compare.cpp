// verify/compare.cpp — `oasis-verify compare` (see compare.hpp and docs/verify.md).
#include "compare.hpp"
#include "compare_detail.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "oasis/error_bounds.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify {
namespace {

using detail::compare_tensor;

using io::DType;
using io::StoredTensor;
using io::TensorMap;
using io::json::Value;
using Ref = Tensor<mp50>;
using BoundMap = std::map<std::string, Tensor<double>>;

// ---------------------------------------------------------------------------------------------
// files

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
std::string dir_of(const std::string& p) {
  const auto k = p.find_last_of('/');
  return k == std::string::npos ? "." : (k == 0 ? "/" : p.substr(0, k));
}
std::string join(const std::string& base, const std::string& p) {
  if (p.empty() || p[0] == '/' || base.empty()) return p;
  return base + "/" + p;
}

TensorMap read_tensor_file(const std::string& path, const std::string& what) {
  if (ends_with(path, ".safetensors")) return io::read_safetensors(path);
  OASIS_REQUIRE(!ends_with(path, ".npy"), what,
                "'", path, "' is one .npy array; list the tensors as an object {\"name\": \"file.npy\", ...}");
  throw invalid_argument(what, "'" + path + "': unknown file type (expected .safetensors, or .npy files by name)");
}

/// "inputs"/"outputs": a .safetensors path, or an object {tensor name: .npy or .safetensors path}.
TensorMap load_set(const Value* spec, const std::string& base, const std::string& default_file, const std::string& what) {
  if (!spec) {
    OASIS_REQUIRE(!default_file.empty(), what, "missing (a .safetensors path or an object {name: file})");
    return read_tensor_file(default_file, what);
  }
  if (spec->is_string()) return read_tensor_file(join(base, spec->text), what);
  OASIS_REQUIRE(spec->is_object(), what, "must be a .safetensors path or an object {name: file}");
  TensorMap out;
  for (const auto& [name, v] : spec->members) {
    OASIS_REQUIRE(v.is_string(), what, "entry '", name, "' must be a file path");
    const std::string path = join(base, v.text);
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

std::string names_of(const TensorMap& m) {
  std::string s;
  for (const auto& kv : m) s += (s.empty() ? "" : ", ") + kv.first;
  return s.empty() ? "none" : s;
}

const StoredTensor& need(const TensorMap& m, const std::string& name, const std::string& op) {
  auto it = m.find(name);
  OASIS_REQUIRE(it != m.end(), "inputs", "op ", op, " needs input tensor '", name, "' (the inputs hold: ", names_of(m), ")");
  for (index_t i = 0; i < it->second.values.size(); ++i)
    OASIS_REQUIRE(!std::isnan(it->second.values[i]), "inputs", "tensor '", name, "' holds NaN at flat index ", i);
  return it->second;
}
const StoredTensor* maybe(const TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// options

class Options {
 public:
  Options(const Value* v, std::string op, std::vector<std::string> known) : v_(v), op_(std::move(op)) {
    if (!v_) return;
    OASIS_REQUIRE(v_->is_object(), "options", "must be a JSON object");
    for (const auto& m : v_->members)
      if (std::find(known.begin(), known.end(), m.first) == known.end()) {
        std::string k;
        for (const auto& s : known) k += (k.empty() ? "" : ", ") + s;
        throw invalid_argument("options", "unknown option '" + m.first + "' for op " + op_ + " (known: " + k + ")");
      }
  }
  const Value* get(const std::string& key) const { return v_ ? v_->find(key) : nullptr; }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  bool boolean(const std::string& key, bool def) const {
    const Value* x = get(key);
    if (!x) return def;
    OASIS_REQUIRE(x->is_bool(), key, "must be true or false");
    return x->b;
  }
  double number(const std::string& key, double def) const {
    const Value* x = get(key);
    if (!x) return def;
    OASIS_REQUIRE(x->is_number(), key, "must be a number");
    return x->as_double();
  }
  std::string string(const std::string& key, const std::string& def) const {
    const Value* x = get(key);
    if (!x) return def;
    OASIS_REQUIRE(x->is_string(), key, "must be a string");
    return x->text;
  }
  std::vector<double> numbers(const std::string& key) const {
    std::vector<double> out;
    const Value* x = get(key);
    if (!x) return out;
    OASIS_REQUIRE(x->is_array(), key, "must be an array of numbers");
    for (const auto& e : x->items) {
      OASIS_REQUIRE(e.is_number(), key, "must be an array of numbers");
      out.push_back(e.as_double());
    }
    return out;
  }
  std::vector<index_t> integers(const std::string& key) const {
    std::vector<index_t> out;
    const Value* x = get(key);
    if (!x) return out;
    OASIS_REQUIRE(x->is_array(), key, "must be an array of non-negative integers");
    for (const auto& e : x->items) {
      std::uint64_t u;
      OASIS_REQUIRE(e.as_uint64(&u) && u < (1ull << 62), key, "must be an array of non-negative integers");
      out.push_back(static_cast<index_t>(u));
    }
    return out;
  }
  std::vector<std::string> strings(const std::string& key) const {
    std::vector<std::string> out;
    const Value* x = get(key);
    if (!x) return out;
    OASIS_REQUIRE(x->is_array(), key, "must be an array of strings");
    for (const auto& e : x->items) {
      OASIS_REQUIRE(e.is_string(), key, "must be an array of strings");
      out.push_back(e.text);
    }
    return out;
  }

 private:
  const Value* v_;
  std::string op_;
};

RowNorm token_normalizer(const Options& o, const std::string& key) {
  const RowNorm n = parse_row_norm(o.string(key, "softmax1"));
  OASIS_REQUIRE(n == RowNorm::softmax || n == RowNorm::softmax1, key,
                "compare supports softmax and softmax1 (the error bounds of the other normalisers are not derived)");
  return n;
}

std::vector<SourceKind> parse_kinds(const Options& o, index_t n) {
  std::vector<std::string> names = o.strings("kinds");
  std::vector<SourceKind> kinds;
  if (names.empty()) {  // default: the embedding, then attention sublayers
    for (index_t i = 0; i < n; ++i) kinds.push_back(i == 0 ? SourceKind::initial : SourceKind::attention);
    return kinds;
  }
  OASIS_REQUIRE(static_cast<index_t>(names.size()) == n, "kinds", "has ", names.size(), " entries, the inputs have n = ",
                n, " candidates");
  for (const auto& s : names) {
    if (s == "initial") kinds.push_back(SourceKind::initial);
    else if (s == "attention") kinds.push_back(SourceKind::attention);
    else if (s == "headless") kinds.push_back(SourceKind::headless);
    else throw invalid_argument("kinds", "unknown source kind '" + s + "' (expected initial, attention or headless)");
  }
  return kinds;
}

const std::vector<std::string> kDepthOptionKeys = {"kinds", "centring", "headless", "theta", "beta", "beta_max",
                                                   "score_clamp", "profile", "normalizer", "coupling"};

DepthOptions parse_depth_options(const Options& o, bool coupling_default) {
  DepthOptions d;
  const std::string profile = o.string("profile", "paper_v2");
  if (profile == "authors_code") d.coupling_options = CouplingOptions::authors_code();
  else OASIS_REQUIRE(profile == "paper_v2", "profile", "must be paper_v2 or authors_code");
  if (o.has("centring")) d.coupling_options.centring = parse_centring(o.string("centring", ""));
  if (o.has("headless")) d.coupling_options.headless = parse_headless_rule(o.string("headless", ""));
  d.coupling_options.beta_max = o.number("beta_max", d.coupling_options.beta_max);
  d.coupling_options.score_clamp = o.number("score_clamp", d.coupling_options.score_clamp);
  OASIS_REQUIRE(d.coupling_options.beta_max >= 0, "beta_max", "must be >= 0");
  OASIS_REQUIRE(d.coupling_options.score_clamp > 0, "score_clamp", "must be > 0");
  d.theta = o.number("theta", d.theta);
  if (o.has("beta")) d.beta = o.number("beta", 0);
  d.normalizer = token_normalizer(o, "normalizer");
  d.coupling = o.boolean("coupling", coupling_default);
  return d;
}

// ---------------------------------------------------------------------------------------------
// the tolerance policy

double unit_roundoff(DType d) { return io::dtype_eps(d) / 2; }

/// B(D) for every output: f64 from the double bound, f32 from the float bound, f16/bf16 the
/// float bound scaled by u_D / u_f32 (the bounds are first order in u).
class PlainBounds {
 public:
  using Fn = std::function<BoundMap(bool wide)>;  // wide: double, else float
  explicit PlainBounds(Fn fn) : fn_(std::move(fn)) {}
  Tensor<double> get(const std::string& name, DType d) {
    BoundMap& m = d == DType::f64 ? wide_ : narrow_;
    if (m.empty()) m = fn_(d == DType::f64);
    auto it = m.find(name);
    OASIS_REQUIRE(it != m.end(), "outputs", "no error bound for '", name, "'");
    Tensor<double> b = it->second;
    const double s = d == DType::f64 ? 1.0 : unit_roundoff(d) / unit_roundoff(DType::f32);
    for (index_t i = 0; i < b.size(); ++i) b[i] *= s;
    return b;
  }

 private:
  Fn fn_;
  BoundMap wide_, narrow_;
};

std::string index_str(const Shape& shape, index_t flat) {
  std::vector<index_t> ix(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    ix[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return shape_str(ix);
}

std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

/// Compare every output present against the oracle; outputs that the op does not produce are noted.
void compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, const Ref*>& refs,
                     PlainBounds& bounds, const CompareOptions& opt) {
  for (const auto& [name, t] : outputs) {
    auto it = refs.find(name);
    if (it == refs.end()) {
      std::string known;
      for (const auto& kv : refs) known += (known.empty() ? "" : ", ") + kv.first;
      rep.notes.push_back("output '" + name + "' is not an output of op " + rep.op + " (outputs: " + known + "); ignored");
      continue;
    }
    rep.tensors.push_back(compare_tensor(name, t, *it->second,
                                         t.values.shape() == it->second->shape() ? bounds.get(name, t.dtype)
                                                                                 : Tensor<double>(),
                                         opt.show));
  }
  std::string known;
  for (const auto& kv : refs) known += (known.empty() ? "" : ", ") + kv.first;
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "none of the op's outputs (", known, ") is present; the outputs hold: ",
                names_of(outputs));
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
}

template <class T> Tensor<T> as(const StoredTensor& s) { return s.values.cast<T>(); }
template <class T> Tensor<T> as(const Tensor<double>& s) { return s.cast<T>(); }
Ref to_ref(const Tensor<double>& t) { return t.cast<mp50>(); }

// ---------------------------------------------------------------------------------------------
// ops

CompareReport op_normalizer(const TensorMap& in, const TensorMap& out, const Options& o, const CompareOptions& copt) {
  const RowNorm kind = token_normalizer(o, "normalizer");
  const StoredTensor& z = need(in, "z", "normalizer");
  OASIS_REQUIRE(z.values.rank() >= 1, "z", "must have rank >= 1 (rows of logits), got a scalar");
  const index_t m = z.values.dim(z.values.rank() - 1);
  Shape lead(z.values.shape().begin(), z.values.shape().end() - 1);
  const index_t R = shape_numel(lead);
  std::vector<double> s(static_cast<std::size_t>(R), o.number("null_logit", 0.0));
  if (const StoredTensor* st = maybe(in, "s")) {
    OASIS_REQUIRE(!o.has("null_logit"), "s", "given both as input tensor 's' and as option null_logit");
    OASIS_REQUIRE(st->values.shape() == lead || st->values.size() == 1, "s", "shape ", shape_str(st->values.shape()),
                  " must be the rows' shape ", shape_str(lead), " or a single value");
    for (index_t r = 0; r < R; ++r) s[static_cast<std::size_t>(r)] = st->values[st->values.size() == 1 ? 0 : r];
  }
  OASIS_REQUIRE(kind == RowNorm::softmax1 || (!maybe(in, "s") && !o.has("null_logit")), "null_logit",
                "given but the normaliser is softmax (no null category)");
  Ref p(z.values.shape()), p_null(lead), lse(lead);
  for (index_t r = 0; r < R; ++r) {
    Vec<mp50> zr(m);
    for (index_t j = 0; j < m; ++j) zr[j] = mp50(z.values[r * m + j]);
    const RowProbs<mp50> rp = kind == RowNorm::softmax1 ? softmax_null(zr, mp50(s[static_cast<std::size_t>(r)])) : softmax(zr);
    for (index_t j = 0; j < m; ++j) p[r * m + j] = rp.p[j];
    p_null[r] = rp.p_null;
    lse[r] = rp.lse;
  }
  // The normaliser bound takes D's unit roundoff directly (no scaling needed).
  std::map<DType, BoundMap> cache;
  auto bound_for = [&](DType d) -> BoundMap& {
    BoundMap& bm = cache[d];
    if (!bm.empty()) return bm;
    const double denorm_min = std::ldexp(1.0, io::dtype_min_exponent(d) - io::dtype_fraction_bits(d));
    const bounds::Precision pr{unit_roundoff(d), 2.0 * denorm_min};
    Tensor<double> bp(z.values.shape()), bn(lead), bl(lead);
    std::vector<double> pr_d(static_cast<std::size_t>(m));
    for (index_t r = 0; r < R; ++r) {
      for (index_t j = 0; j < m; ++j) pr_d[static_cast<std::size_t>(j)] = static_cast<double>(p[r * m + j]);
      const bounds::RowBound rb = bounds::row_bound(pr, kind, z.values.data() + r * m, nullptr, m, s[static_cast<std::size_t>(r)],
                                                    0.0, pr_d.data(), static_cast<double>(p_null[r]), static_cast<double>(lse[r]));
      for (index_t j = 0; j < m; ++j) bp[r * m + j] = rb.p[static_cast<std::size_t>(j)];
      bn[r] = rb.p_null;
      bl[r] = rb.lse;
    }
    bm = {{"p", bp}, {"p_null", bn}, {"lse", bl}};
    return bm;
  };
  CompareReport rep;
  rep.op = "normalizer";
  const std::map<std::string, const Ref*> refs = {{"p", &p}, {"p_null", &p_null}, {"lse", &lse}};
  for (const auto& [name, t] : out) {
    auto it = refs.find(name);
    if (it == refs.end()) {
      rep.notes.push_back("output '" + name + "' is not an output of op normalizer (outputs: lse, p, p_null); ignored");
      continue;
    }
    const bool same = t.values.shape() == it->second->shape();
    rep.tensors.push_back(compare_tensor(name, t, *it->second, same ? bound_for(t.dtype).at(name) : Tensor<double>(), copt.show));
  }
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "none of the op's outputs (p, p_null, lse) is present; the outputs hold: ",
                names_of(out));
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

CompareReport op_attention(const TensorMap& in, const TensorMap& out, const Options& o, const CompareOptions& copt) {
  const StoredTensor &q = need(in, "q", "attention"), &k = need(in, "k", "attention"), &v = need(in, "v", "attention");
  AttentionOptions a;
  a.normalizer = token_normalizer(o, "normalizer");
  a.causal = o.boolean("causal", false);
  a.key_lengths = o.integers("key_lengths");
  a.null_logits = o.numbers("null_logits");
  if (const StoredTensor* nl = maybe(in, "null_logits")) {
    OASIS_REQUIRE(a.null_logits.empty(), "null_logits", "given both as input tensor and as option");
    OASIS_REQUIRE(nl->values.rank() == 1, "null_logits", "input tensor must have shape [H], got ", shape_str(nl->values.shape()));
    a.null_logits = nl->values.storage();
  }
  if (o.has("scale")) a.scale = o.number("scale", 1.0);
  a.return_probs = true;  // the bounds need the exact probabilities
  const Tensor<mp50> qm = q.values.cast<mp50>(), km = k.values.cast<mp50>(), vm = v.values.cast<mp50>();
  const AttentionResult<mp50> ref = token_attention(qm, km, vm, a);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::AttentionBounds b = bounds::attention_bounds(as<T>(q), as<T>(k), as<T>(v), a, ref);
      return BoundMap{{"out", b.out}, {"lse", b.lse}, {"p_null", b.p_null}, {"probs", b.probs}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = "attention";
  compare_outputs(rep, out, {{"out", &ref.out}, {"lse", &ref.lse}, {"p_null", &ref.p_null}, {"probs", &ref.probs}}, bounds, copt);
  return rep;
}

CompareReport op_psi(const TensorMap& in, const TensorMap& out, const Options& o, const CompareOptions& copt) {
  const std::string est = o.string("estimator", "p_null");
  OASIS_REQUIRE(est == "p_null" || est == "mass", "estimator", "must be p_null or mass");
  Ref psi;
  index_t H = 0, Tk = 0;
  if (est == "p_null") {
    const StoredTensor& pn = need(in, "p_null", "psi");
    require_rank(pn.values, 3, "p_null", "[B, H, T]");
    H = pn.values.dim(1);
    psi = null_statistic(pn.values.cast<mp50>());
  } else {
    const StoredTensor& pr = need(in, "probs", "psi");
    require_rank(pr.values, 4, "probs", "[B, H, Tq, Tk]");
    H = pr.values.dim(1);
    Tk = pr.values.dim(3);
    psi = null_statistic_from_mass(pr.values.cast<mp50>());
  }
  // psi = (1/H) sum_h p_null_h: H - 1 additions of non-negative terms and one division, each
  // rounding relative u: |err| <= H u psi. The mass estimator first forms 1 - sum_j p_j per head
  // (Tk additions of terms summing to <= 1, one subtraction): absolute (Tk + 1) u per head.
  PlainBounds bounds([&](bool wide) {
    const double u = wide ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
    Tensor<double> b(psi.shape());
    for (index_t i = 0; i < b.size(); ++i)
      b[i] = bounds::kSecondOrder * (static_cast<double>(H) * u * static_cast<double>(psi[i]) + static_cast<double>(Tk + (Tk ? 1 : 0)) * u);
    return BoundMap{{"psi", b}};
  });
  CompareReport rep;
  rep.op = "psi";
  compare_outputs(rep, out, {{"psi", &psi}}, bounds, copt);
  return rep;
}

CompareReport op_depth(const std::string& op, const TensorMap& in, const TensorMap& out, const Options& o,
                       const CompareOptions& copt) {
  const bool coupling_only = op == "coupling";
  const StoredTensor& g_old = need(in, "g_old", op);
  require_rank(g_old.values, 2, "g_old", "[n, N]");
  const index_t n = g_old.values.dim(0), N = g_old.values.dim(1);
  Tensor<double> sources;
  if (coupling_only) sources = Tensor<double>({n, N, 1});  // the coupled logits do not depend on the values
  else sources = need(in, "sources", op).values;
  DepthOptions d = parse_depth_options(o, true);
  if (coupling_only) OASIS_REQUIRE(d.coupling, "coupling", "op coupling always couples");
  Tensor<double> psi(Shape{n, N});
  if (const StoredTensor* p = maybe(in, "psi")) psi = p->values;
  else OASIS_REQUIRE(!d.coupling, "inputs", "op ", op, " with coupling needs input tensor 'psi' [n, N]");
  const std::vector<SourceKind> kinds = parse_kinds(o, n);
  const DepthRoute<mp50> ref = attn_res_route(sources.cast<mp50>(), g_old.values.cast<mp50>(), psi.cast<mp50>(), kinds, d);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::DepthRouteBounds b =
          bounds::depth_route_bounds(as<T>(sources), as<T>(g_old), as<T>(psi), kinds, d, ref);
      return BoundMap{{"h", b.h}, {"alpha", b.alpha}, {"alpha_null", b.alpha_null}, {"g", b.g}, {"dpsi", b.dpsi}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = op;
  if (coupling_only)
    compare_outputs(rep, out, {{"g", &ref.g}, {"dpsi", &ref.dpsi}}, bounds, copt);
  else
    compare_outputs(rep, out, {{"h", &ref.h}, {"alpha", &ref.alpha}, {"alpha_null", &ref.alpha_null}, {"g", &ref.g}, {"dpsi", &ref.dpsi}},
                    bounds, copt);
  return rep;
}

CompareReport op_pseudo_query(const TensorMap& in, const TensorMap& out, const Options& o, const CompareOptions& copt) {
  const StoredTensor &src = need(in, "sources", "pseudo_query"), &w = need(in, "w", "pseudo_query");
  Tensor<double> gain;
  if (const StoredTensor* g = maybe(in, "gain")) gain = g->values;
  KeyNormOptions k;
  k.eps = o.number("eps", k.eps);
  k.compute_in_float32 = o.boolean("compute_in_float32", false);
  // (a default Tensor has shape [] and casts to one element: keep "no gain" empty)
  const Ref g = pseudo_query_logits(src.values.cast<mp50>(), w.values.cast<mp50>(),
                                    gain.empty() ? Ref() : gain.cast<mp50>(), k);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      return BoundMap{{"g", bounds::pseudo_query_logits_bounds(as<T>(src), as<T>(w), gain.empty() ? Tensor<T>() : as<T>(gain), k)}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = "pseudo_query";
  compare_outputs(rep, out, {{"g", &g}}, bounds, copt);
  return rep;
}

}  // namespace

namespace detail {

TensorReport compare_tensor(const std::string& name, const StoredTensor& got, const Ref& ref, const Tensor<double>& plain,
                            int show) {
  TensorReport r;
  r.name = name;
  r.dtype = got.dtype;
  r.shape = got.values.shape();
  r.elements = got.values.size();
  if (got.values.shape() != ref.shape()) {
    r.problem = "shape " + shape_str(got.values.shape()) + " but the oracle's " + name + " has shape " + shape_str(ref.shape());
    r.violations = r.elements;
    return r;
  }
  for (index_t i = 0; i < got.values.size(); ++i) {
    const double x = got.values[i];
    const mp50& rm = ref[i];
    const double rd = static_cast<double>(rm);
    const double bound = 0.5 * io::dtype_ulp(got.dtype, rd) + 2.0 * plain[i];
    double err;
    if (is_finite(rm)) {
      err = std::isfinite(x) ? static_cast<double>(abs(mp50(x) - rm)) : std::numeric_limits<double>::infinity();
    } else {  // -inf (LSE of a fully masked plain-softmax row): must match exactly
      err = (x == rd) ? 0.0 : std::numeric_limits<double>::infinity();
    }
    if (std::isnan(x)) err = std::numeric_limits<double>::quiet_NaN();
    const bool ok = err <= bound;  // NaN fails
    const double shown_err = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
    r.max_abs = std::max(r.max_abs, shown_err);
    if (rd != 0 && std::isfinite(rd)) r.max_rel = std::max(r.max_rel, shown_err / std::fabs(rd));
    r.max_ulps = std::max(r.max_ulps, shown_err / io::dtype_ulp(got.dtype, rd));
    r.worst_ratio = std::max(r.worst_ratio, bound > 0 ? shown_err / bound : (shown_err > 0 ? INFINITY : 0.0));
    if (!ok) {
      if (r.violations < show)
        r.first_mismatches.push_back(name + index_str(r.shape, i) + ": got " + num(x) + " ref " + num(rd) + " |err| " +
                                     num(shown_err) + " (" + num(shown_err / io::dtype_ulp(got.dtype, rd)) + " ulp) bound " +
                                     num(bound));
      ++r.violations;
    }
  }
  r.passed = r.violations == 0;
  return r;
}

}  // namespace detail

std::string describe_ops() {
  return
      "  normalizer    inputs z [..., m], s [...] (optional null logit per row)\n"
      "                outputs p [..., m], p_null [...], lse [...]\n"
      "                options normalizer (softmax1|softmax), null_logit\n"
      "  attention     inputs q [B,H,Tq,dh], k [B,Hkv,Tk,dh], v [B,Hkv,Tk,dv], null_logits [H] (optional)\n"
      "                outputs out [B,H,Tq,dv], lse [B,H,Tq], p_null [B,H,Tq], probs [B,H,Tq,Tk]\n"
      "                options normalizer, causal, key_lengths, null_logits, scale\n"
      "  psi           inputs p_null [B,H,T] (or probs [B,H,Tq,Tk] with estimator mass)\n"
      "                outputs psi [B,T]; options estimator (p_null|mass)\n"
      "  coupling      inputs g_old [n,N], psi [n,N]; outputs dpsi [n,N], g [n,N]\n"
      "                options kinds, profile (paper_v2|authors_code), centring, headless, theta, beta,\n"
      "                beta_max, score_clamp, normalizer\n"
      "  depth         inputs sources [n,N,d], g_old [n,N], psi [n,N]\n"
      "                outputs h [N,d], alpha [n,N], alpha_null [N], g [n,N], dpsi [n,N]\n"
      "                options as coupling, plus coupling (true|false)\n"
      "  pseudo_query  inputs sources [n,N,d], w [d], gain [d] (optional); outputs g [n,N]\n"
      "                options eps, compute_in_float32\n"
      "  model         \"model\": weights file of oasis::model::save_model (configuration in its metadata)\n"
      "                inputs ids [B,T] (token ids, exact integers in any float dtype)\n"
      "                outputs logits [B,T,vocab] (verdict with the readout state 'state' [B,T,d], else\n"
      "                informative only); trace tensors, each checked on its own step inputs:\n"
      "                <sublayer>.alpha|alpha_null|g|dpsi|routed (inputs .sources|g_old|psi),\n"
      "                .attn_q|attn_k|attn_v|mlp_hidden (input .input), .attn_heads|p_null|lse|branch_psi\n"
      "                (inputs .attn_q|attn_k|attn_v), .output (input .attn_heads|.mlp_hidden, else .input),\n"
      "                .branch_psi (input .p_null); see docs/verify.md\n";
}

CompareReport compare_config(const Value& cfg, const std::string& base_dir, const std::string& default_file,
                             const CompareOptions& opt) {
  OASIS_REQUIRE(cfg.is_object(), "config", "must be a JSON object with \"op\", \"inputs\", \"outputs\", \"options\"");
  for (const auto& m : cfg.members)
    OASIS_REQUIRE(m.first == "op" || m.first == "inputs" || m.first == "outputs" || m.first == "options" ||
                      m.first == "description" || m.first == "model",
                  "config", "unknown key '", m.first, "' (known: op, inputs, outputs, options, description, model)");
  const Value* opv = cfg.find("op");
  OASIS_REQUIRE(opv && opv->is_string(), "op", "missing; one of normalizer, attention, psi, coupling, depth, pseudo_query");
  const std::string op = opv->text;
  static const std::map<std::string, std::vector<std::string>> known = {
      {"normalizer", {"normalizer", "null_logit"}},
      {"attention", {"normalizer", "causal", "key_lengths", "null_logits", "scale"}},
      {"psi", {"estimator"}},
      {"coupling", kDepthOptionKeys},
      {"depth", kDepthOptionKeys},
      {"pseudo_query", {"eps", "compute_in_float32"}},
      {"model", {}}};
  auto kn = known.find(op);
  OASIS_REQUIRE(kn != known.end(), "op", "unknown op '", op, "' (known: normalizer, attention, psi, coupling, depth, pseudo_query, model)");
  OASIS_REQUIRE((op == "model") == (cfg.find("model") != nullptr), "model",
                op == "model" ? "op model needs \"model\": the weights file written by oasis::model::save_model"
                              : "the key \"model\" belongs to op model only");
  const Options o(cfg.find("options"), op, kn->second);
  const TensorMap in = load_set(cfg.find("inputs"), base_dir, default_file, "inputs");
  const TensorMap out = load_set(cfg.find("outputs"), base_dir, default_file, "outputs");
  if (op == "normalizer") return op_normalizer(in, out, o, opt);
  if (op == "attention") return op_attention(in, out, o, opt);
  if (op == "psi") return op_psi(in, out, o, opt);
  if (op == "pseudo_query") return op_pseudo_query(in, out, o, opt);
  if (op == "model") return detail::op_model(*cfg.find("model"), base_dir, in, out, opt);
  return op_depth(op, in, out, o, opt);
}

CompareReport compare_config_file(const std::string& path, const CompareOptions& opt) {
  std::string text, default_file;
  if (ends_with(path, ".safetensors")) {
    const auto md = io::read_safetensors_metadata(path);
    auto it = md.find("oasis_config");
    OASIS_REQUIRE(it != md.end(), path, "has no \"oasis_config\" entry in its __metadata__ (see docs/verify.md)");
    text = it->second;
    default_file = path;
  } else {
    text = io::detail::read_file_bytes(path);
  }
  Value cfg;
  try {
    cfg = io::json::parse(text);
  } catch (const io::json::parse_error& e) {
    throw invalid_argument(path, std::string("configuration is not valid JSON: ") + e.what());
  }
  return compare_config(cfg, dir_of(path), default_file, opt);
}

std::string format_report(const CompareReport& r) {
  std::ostringstream os;
  os << "oasis-verify compare: op " << r.op << "  (oracle: mp50; policy per element: |x - ref| <= 0.5 ulp_D(ref) + 2 B_plain(D))\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-12s %-5s %-18s %12s %12s %12s %12s  %s\n", "tensor", "dtype", "shape", "max|err|",
                "max rel", "max ulps", "err/bound", "verdict");
  os << line;
  for (const auto& t : r.tensors) {
    std::string verdict = t.informative ? "INFO (no verdict)" : t.passed ? "PASS" : "FAIL";
    if (!t.passed && t.problem.empty())
      verdict += " (" + std::to_string(t.violations) + " of " + std::to_string(t.elements) + " elements outside the bound)";
    if (!t.problem.empty()) verdict += " (" + t.problem + ")";
    std::snprintf(line, sizeof line, "  %-12s %-5s %-18s %12.4g %12.4g %12.4g %12.4g  %s\n", t.name.c_str(),
                  std::string(io::to_string(t.dtype)).c_str(), shape_str(t.shape).c_str(), t.max_abs, t.max_rel, t.max_ulps,
                  t.worst_ratio, verdict.c_str());
    os << line;
    for (const auto& m : t.first_mismatches) os << "      " << m << "\n";
  }
  for (const auto& n : r.notes) os << "  note: " << n << "\n";
  index_t failed = 0, checked = 0;
  for (const auto& t : r.tensors) {
    checked += t.informative ? 0 : 1;
    failed += t.informative || t.passed ? 0 : 1;
  }
  os << "verdict: " << (r.passed ? "PASS" : "FAIL") << " (" << (checked - failed) << " of " << checked
     << " tensors within the policy)\n";
  return os.str();
}

std::string report_json(const CompareReport& r) {
  using io::json::quote;
  auto jnum = [](double x) {
    return std::isfinite(x) ? num(x) : std::string("null");  // JSON has no inf/NaN
  };
  std::ostringstream os;
  os << "{\"op\":" << quote(r.op) << ",\"passed\":" << (r.passed ? "true" : "false") << ",\"tensors\":[";
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& t = r.tensors[i];
    os << (i ? "," : "") << "{\"name\":" << quote(t.name) << ",\"dtype\":" << quote(std::string(io::to_string(t.dtype)))
       << ",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) os << (d ? "," : "") << t.shape[d];
    os << "],\"max_abs\":" << jnum(t.max_abs) << ",\"max_rel\":" << jnum(t.max_rel) << ",\"max_ulps\":" << jnum(t.max_ulps)
       << ",\"worst_ratio\":" << jnum(t.worst_ratio) << ",\"violations\":" << t.violations
       << ",\"passed\":" << (t.informative ? "null" : t.passed ? "true" : "false") << ",\"informative\":" << (t.informative ? "true" : "false")
       << ",\"problem\":" << quote(t.problem) << ",\"first_mismatches\":[";
    for (std::size_t k = 0; k < t.first_mismatches.size(); ++k) os << (k ? "," : "") << quote(t.first_mismatches[k]);
    os << "]}";
  }
  os << "],\"notes\":[";
  for (std::size_t k = 0; k < r.notes.size(); ++k) os << (k ? "," : "") << quote(r.notes[k]);
  os << "]}\n";
  return os.str();
}

}  // namespace oasis::verify
