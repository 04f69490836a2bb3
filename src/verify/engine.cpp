// src/verify/engine.cpp — the compare engine's entry points (oasis/verify/compare.hpp): reading a
// configuration and its tensor files, validating a call against its op's spec, running the op.
#include <algorithm>
#include <cmath>
#include <set>

#include "engine.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"

namespace oasis::verify {
namespace detail {

// ---------------------------------------------------------------------------------------------
// Options

std::vector<std::string> Options::keys() const {
  std::vector<std::string> k;
  if (v_)
    for (const auto& m : v_->members) k.push_back(m.first);
  return k;
}
bool Options::boolean(const std::string& key, bool def) const {
  const Value* x = get(key);
  if (!x) return def;
  OASIS_REQUIRE(x->is_bool(), key, "must be true or false");
  return x->b;
}
double Options::number(const std::string& key, double def) const {
  const Value* x = get(key);
  if (!x) return def;
  OASIS_REQUIRE(x->is_number(), key, "must be a number");
  return x->as_double();
}
std::string Options::string(const std::string& key, const std::string& def) const {
  const Value* x = get(key);
  if (!x) return def;
  OASIS_REQUIRE(x->is_string(), key, "must be a string");
  return x->text;
}
std::vector<double> Options::numbers(const std::string& key) const {
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
std::vector<index_t> Options::integers(const std::string& key) const {
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
std::vector<std::string> Options::strings(const std::string& key) const {
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

// ---------------------------------------------------------------------------------------------
// helpers

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

std::string names_of(const TensorMap& m) {
  std::vector<std::string> n;
  for (const auto& kv : m) n.push_back(kv.first);
  return join_names(n);
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

RowNorm token_normalizer(const Options& o, const std::string& key) {
  const RowNorm n = parse_row_norm(o.string(key, "softmax1"));
  OASIS_REQUIRE(n == RowNorm::softmax || n == RowNorm::softmax1, key,
                "compare supports softmax and softmax1 (the error bounds of the other normalisers are not derived)");
  return n;
}

const Tensor<double>& PlainBounds::raw(const std::string& name, DType d) {
  BoundMap& m = d == DType::f64 ? wide_ : narrow_;
  if (m.empty()) m = fn_(d == DType::f64);
  auto it = m.find(name);
  OASIS_REQUIRE(it != m.end(), "outputs", "no error bound for '", name, "'");
  return it->second;
}

Tensor<double> PlainBounds::get(const std::string& name, DType d) {
  Tensor<double> b = raw(name, d);
  const double s = d == DType::f64 ? 1.0 : unit_roundoff(d) / unit_roundoff(DType::f32);
  for (index_t i = 0; i < b.size(); ++i) b[i] *= s;
  return b;
}

Allowed allowed_terms(DType d, Policy p, double wc, double prob, double mix_mass, double rho) {
  const double scale16 = is16(d) ? unit_roundoff(d) / unit_roundoff(DType::f32) : 1.0;
  const double certain = 2.0 * wc * scale16;
  if (p == Policy::worst_case || std::isnan(prob)) return {certain, certain, false, rho};
  if (!is16(d)) return {prob, certain, false, rho};
  // accumulated in float32 and rounded once to d (p16: the probabilities rounded to d before P·V)
  const double e = prob + (p == Policy::p16 ? bounds::kSecondOrder * unit_roundoff(d) * mix_mass : 0.0);
  return {e, certain, true, rho};
}

std::string bound_name(DType d, Policy p, bool has_prob, bool mixture) {
  if (p == Policy::worst_case) return is16(d) ? "worst-case, all in " + std::string(io::to_string(d)) : "worst-case";
  if (!has_prob) return "worst-case (no probabilistic bound)";
  if (!is16(d)) return "probabilistic";
  const std::string ds(io::to_string(d));
  return (p == Policy::p16 && mixture ? "p16: f32, P in " + ds + ", stored " : "f32 stored as ") + ds;
}

}  // namespace detail

TensorReport compare_tensor(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref,
                            const Tensor<double>& plain, int show) {
  using namespace detail;
  if (got.values.shape() != ref.shape()) return shape_mismatch(name, got, ref.shape());
  TensorCheck chk(name, got, show);
  for (index_t i = 0; i < ref.size(); ++i) {
    const double hi = static_cast<double>(ref[i]);
    const double lo = std::isfinite(hi) ? static_cast<double>(ref[i] - mp50(hi)) : 0.0;
    chk.add(i, RefValue{hi, lo, 0.0, &ref[i]}, Allowed{2.0 * plain[i], 2.0 * plain[i], false, 0.0});
  }
  return chk.finish("worst-case");
}

namespace detail {

namespace {

const Shape& shape_of(const Ref* r) { return r->shape(); }
index_t size_of(const Ref* r) { return r->size(); }
RefValue value_at(const Ref* r, index_t i) {
  const double hi = static_cast<double>((*r)[i]);
  const double lo = std::isfinite(hi) ? static_cast<double>((*r)[i] - mp50(hi)) : 0.0;
  return {hi, lo, 0.0, &(*r)[i]};
}
const Shape& shape_of(const DoubleRef& r) { return r.value->shape(); }
index_t size_of(const DoubleRef& r) { return r.value->size(); }
RefValue value_at(const DoubleRef& r, index_t i) { return {(*r.value)[i], 0.0, r.err_scale * (*r.err)[i]}; }

/// Both compare_outputs: every output present judged element by element; returns the number of
/// elements left undecided (always 0 for mp50 references).
template <class R>
index_t compare_each(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, R>& refs,
                     PlainBounds& bounds, const CompareOptions& opt, PlainBounds* prob, double rho) {
  index_t undecided = 0;
  for (const auto& [name, t] : outputs) {
    auto it = refs.find(name);
    if (it == refs.end()) continue;  // an input of the op held in the same file (the engine checked the names)
    const R& ref = it->second;
    if (t.values.shape() != shape_of(ref)) {
      rep.tensors.push_back(shape_mismatch(name, t, shape_of(ref)));
      continue;
    }
    const Tensor<double>& wc = bounds.raw(name, t.dtype);
    const Tensor<double>* pb = prob ? &prob->raw(name, t.dtype) : nullptr;
    TensorCheck chk(name, t, opt.show);
    for (index_t i = 0; i < size_of(ref); ++i)
      if (!chk.add(i, value_at(ref, i),
                   allowed_terms(t.dtype, opt.policy, wc[i], pb ? (*pb)[i] : std::numeric_limits<double>::quiet_NaN(), 0.0,
                                 rho)))
        ++undecided;
    rep.tensors.push_back(chk.finish(bound_name(t.dtype, opt.policy, pb != nullptr, false)));
  }
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return undecided;
}

}  // namespace

void compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, const Ref*>& refs,
                     PlainBounds& bounds, const CompareOptions& opt, PlainBounds* prob) {
  (void)compare_each(rep, outputs, refs, bounds, opt, prob, 0.0);
}

index_t compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, DoubleRef>& refs,
                        PlainBounds& bounds, const CompareOptions& opt, double rho) {
  return compare_each(rep, outputs, refs, bounds, opt, nullptr, rho);
}

std::vector<index_t> sample_rows(index_t total, index_t n, std::uint64_t seed) {
  std::vector<index_t> rows;
  if (n <= 0 || n >= total) {
    rows.resize(static_cast<std::size_t>(total));
    for (index_t i = 0; i < total; ++i) rows[static_cast<std::size_t>(i)] = i;
    return rows;
  }
  std::uint64_t state = seed;
  auto next = [&] {  // SplitMix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  // Floyd's algorithm: n distinct values of [0, total) with n draws.
  std::set<index_t> chosen;
  for (index_t j = total - n; j < total; ++j) {
    const std::uint64_t range = static_cast<std::uint64_t>(j) + 1;
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % range);
    std::uint64_t x;
    do x = next(); while (x >= limit);  // unbiased
    const index_t t = static_cast<index_t>(x % range);
    if (!chosen.insert(t).second) chosen.insert(j);
  }
  rows.assign(chosen.begin(), chosen.end());
  return rows;
}

// ---------------------------------------------------------------------------------------------
// validation of a call against its spec

std::vector<std::string> names(const std::vector<TensorSpec>& v) {
  std::vector<std::string> n;
  for (const auto& t : v) n.push_back(t.name);
  return n;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Unknown options, inputs or outputs are errors listing the known names; a tensor that belongs
/// to the other set (inputs and outputs read from one file) is allowed and not compared.
void validate_call(const OpSpec& s, const TensorMap& in, const TensorMap& out, const Options& o) {
  for (const auto& k : o.keys())
    OASIS_REQUIRE(contains(s.options, k), "options", "unknown option '", k, "' for op ", s.name,
                  " (known: ", join_names(s.options), ")");
  const std::vector<std::string> ins = names(s.inputs), outs = names(s.outputs);
  for (const auto& [name, t] : in) {
    (void)t;
    OASIS_REQUIRE(contains(ins, name) || contains(outs, name), "inputs", "unknown input tensor '", name, "' for op ",
                  s.name, " (inputs: ", join_names(ins), ")");
  }
  bool any = false;
  for (const auto& [name, t] : out) {
    (void)t;
    OASIS_REQUIRE(contains(outs, name) || contains(ins, name), "outputs", "unknown output tensor '", name, "' for op ",
                  s.name, " (outputs: ", join_names(outs), ")");
    any = any || contains(outs, name);
  }
  OASIS_REQUIRE(any, "outputs", "none of the outputs of op ", s.name, " (", join_names(outs),
                ") is present, so nothing would be checked; the outputs hold: ", names_of(out));
  for (const auto& t : s.inputs)
    OASIS_REQUIRE(!t.required || in.count(t.name), "inputs", "op ", s.name, " needs input tensor '", t.name, "' ", t.shape,
                  " (the inputs hold: ", names_of(in), ")");
}

const std::vector<OpSpec>& op_specs() {
  static const std::vector<OpSpec> specs = {normalizer_op(),          attention_op(),     psi_op(),
                                            coupling_op(),            depth_op(),         pseudo_query_op(),
                                            attention_backward_op(),  psi_backward_op(),  depth_backward_op(),
                                            pseudo_query_backward_op()};
  return specs;
}

const OpSpec& op_spec(const std::string& name) {
  for (const auto& s : op_specs())
    if (s.name == name) return s;
  throw invalid_argument("op", "unknown op '" + name + "' (known: " + join_names(op_names()) + ")");
}

}  // namespace detail

using namespace detail;

namespace {

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

}  // namespace

std::vector<std::string> op_names() {
  std::vector<std::string> n;
  for (const auto& s : op_specs()) n.push_back(s.name);
  n.push_back("model");
  return n;
}

CompareReport check(const std::string& op, const TensorMap& inputs, const TensorMap& outputs, const Value& options,
                    const CompareOptions& opt) {
  OASIS_REQUIRE(op != "model", "op", "the model level is check_model(weights_file, inputs, trace)");
  const OpSpec& s = op_spec(op);
  const Options o(&options);
  validate_call(s, inputs, outputs, o);
  for (const auto& [name, t] : outputs)  // integer tensors (ids) have no rounding policy
    OASIS_REQUIRE(!io::is_integer(t.dtype) || inputs.count(name), name, "is an integer tensor (", io::to_string(t.dtype),
                  "); outputs are floating point");
  OASIS_REQUIRE(opt.sample >= 0, "sample", "must be >= 0 (0: every row), got ", opt.sample);
  OASIS_REQUIRE(opt.sample == 0 || s.samples_rows, "sample", "op ", op,
                " checks every element (sampling rows is offered by ops attention, depth, coupling and normalizer)");
  CompareReport rep = s.run(OpCall{inputs, outputs, o, opt});
  rep.op = op;
  rep.policy = std::string(to_string(opt.policy));
  // A 16-bit tensor outside the policy's bound (float32 arithmetic, stored once) but inside the
  // certain line, which is the worst case of arithmetic in 16 bits throughout: say which policy a
  // kernel that keeps its intermediates in 16 bits needs (it does not excuse a float32 kernel).
  if (opt.policy != Policy::worst_case) {
    std::string soft;
    for (const auto& t : rep.tensors)
      if (!t.informative && !t.passed && !t.certain_failure && t.problem.empty() &&
          (t.dtype == DType::f16 || t.dtype == DType::bf16))
        soft += (soft.empty() ? "" : ", ") + t.name;
    if (!soft.empty())
      rep.notes.push_back("16-bit " + soft + ": outside the " + std::string(to_string(opt.policy)) +
                          " bound, within the worst case of arithmetic in 16 bits throughout. A kernel that rounds the "
                          "probabilities to 16 bits before P V (FlashAttention) is checked with policy p16, one that "
                          "keeps its scores or weights in 16 bits with worst_case; for a kernel that accumulates in "
                          "float32 and rounds once the FAIL stands");
  }
  for (const auto& [name, t] : outputs) {
    (void)t;
    if (!rep.tensors.empty() && std::none_of(s.outputs.begin(), s.outputs.end(), [&](const TensorSpec& x) { return x.name == name; }))
      rep.notes.push_back("'" + name + "' is an input of op " + op + " held with the outputs; not compared");
  }
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "op ", op, " checked no tensor");
  return rep;
}

namespace {
void check_model_options(const Value& options, const CompareOptions& opt) {
  const Options o(&options);
  for (const auto& k : o.keys()) throw invalid_argument("options", "unknown option '" + k + "' for op model (known: none)");
  OASIS_REQUIRE(opt.sample == 0, "sample",
                "the model level checks every element (sampling rows is offered by ops attention, depth, coupling and normalizer)");
}

/// The model level has its own rules (each step under the worst-case line, end-to-end and gradient
/// verdicts under the parity rule; docs/verify.md), whatever the op-level policy.
CompareReport model_report(CompareReport rep, const CompareOptions& opt) {
  rep.policy = "worst_case";
  if (opt.policy != Policy::probabilistic)
    rep.notes.push_back("policy " + std::string(to_string(opt.policy)) +
                        " applies to op-level checks; the model level uses its own rules (docs/verify.md)");
  return rep;
}
}  // namespace

CompareReport check_model(const std::string& weights_file, const TensorMap& inputs, const TensorMap& trace,
                          const Value& options, const CompareOptions& opt) {
  check_model_options(options, opt);
  return model_report(run_model(weights_file, inputs, trace, opt), opt);
}

CompareReport check_model(const model::ModelConfig& config, const TensorMap& weights, const TensorMap& inputs,
                          const TensorMap& trace, const Value& options, const CompareOptions& opt) {
  check_model_options(options, opt);
  return model_report(run_model(config, weights, inputs, trace, opt), opt);
}

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
    } else {
      throw invalid_argument(key, "unknown comparison option (known: show, policy, oracle, sample, seed)");
    }
  }
  return opt;
}

std::string describe_ops() {
  std::string s;
  auto tensors = [](const std::vector<TensorSpec>& v) {
    std::string t;
    for (const auto& x : v) t += (t.empty() ? "" : ", ") + x.name + " " + x.shape + (x.required ? "" : " (optional)");
    return t;
  };
  for (const auto& op : op_specs()) {
    char head[32];
    std::snprintf(head, sizeof head, "  %-13s ", op.name.c_str());
    s += head + std::string("inputs ") + tensors(op.inputs) + "\n";
    s += "                outputs " + tensors(op.outputs) + "\n";
    if (!op.options.empty()) s += "                options " + join_names(op.options) + "\n";
    if (!op.help.empty()) s += "                " + op.help + "\n";
  }
  s += "  model         \"model\": weights file of oasis::model::save_model (configuration in its metadata)\n"
       "                inputs ids [B,T] (integer or float dtype); outputs logits [B,T,vocab], state [B,T,d] and\n"
       "                trace tensors <sublayer>.<field>, each checked against its producer in the configured\n"
       "                model (docs/verify.md, model level)\n";
  return s;
}

CompareReport compare_config(const Value& cfg, const std::string& base_dir, const std::string& default_file,
                             const CompareOptions& opt) {
  OASIS_REQUIRE(cfg.is_object(), "config", "must be a JSON object with \"op\", \"inputs\", \"outputs\", \"options\"");
  for (const auto& m : cfg.members)
    OASIS_REQUIRE(m.first == "op" || m.first == "inputs" || m.first == "outputs" || m.first == "options" ||
                      m.first == "description" || m.first == "model",
                  "config", "unknown key '", m.first, "' (known: op, inputs, outputs, options, description, model)");
  const Value* opv = cfg.find("op");
  OASIS_REQUIRE(opv && opv->is_string(), "op", "missing; one of ", join_names(op_names()));
  const std::string op = opv->text;
  if (op != "model") (void)op_spec(op);  // unknown op: an error before any file is read
  OASIS_REQUIRE((op == "model") == (cfg.find("model") != nullptr), "model",
                op == "model" ? "op model needs \"model\": the weights file written by oasis::model::save_model"
                              : "the key \"model\" belongs to op model only");
  static const Value none;
  const Value* options = cfg.find("options");
  const TensorMap in = load_set(cfg.find("inputs"), base_dir, default_file, "inputs");
  const TensorMap out = load_set(cfg.find("outputs"), base_dir, default_file, "outputs");
  if (op == "model") {
    const Value& mv = *cfg.find("model");
    OASIS_REQUIRE(mv.is_string(), "model", "must be the path of a weights file (.safetensors)");
    return check_model(join(base_dir, mv.text), in, out, options ? *options : none, opt);
  }
  return check(op, in, out, options ? *options : none, opt);
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

}  // namespace oasis::verify
