// src/verify/op_options.cpp — the options of an op call (op_options.hpp).
#include "op_options.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "oasis/ops/coupling.hpp"
#include "oasis/ops/normalizer.hpp"

namespace oasis::verify::detail {

using io::StoredTensor;
using io::json::Value;

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

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

RowNorm token_normalizer(const Options& o, const std::string& key) {
  const RowNorm n = parse_row_norm(o.string(key, "softmax1"));
  OASIS_REQUIRE(n == RowNorm::softmax || n == RowNorm::softmax1, key,
                "compare supports softmax and softmax1 (the error bounds of the other normalisers are not derived)");
  return n;
}

namespace {

/// A boolean mask tensor (1 = visible, 0 = masked) as the additive bias 0 / -inf.
Tensor<double> mask_to_bias(const StoredTensor& m) {
  Tensor<double> b(m.values.shape());
  for (index_t i = 0; i < b.size(); ++i) {
    const double x = m.values[i];
    OASIS_REQUIRE(x == 0.0 || x == 1.0, "mask", "must hold 1 (visible) or 0 (masked); entry ", i, " is ", x);
    b[i] = x == 1.0 ? 0.0 : -std::numeric_limits<double>::infinity();
  }
  return b;
}

}  // namespace

const StoredTensor* maybe(const io::TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

AttentionOptions attention_call_options(const Options& o, const io::TensorMap& in) {
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
  if (o.has("window")) {
    const double wv = o.number("window", 0.0);
    OASIS_REQUIRE(wv >= 0 && wv == std::floor(wv) && wv < 9.0e15, "window", "must be a non-negative integer (0: none), got ", wv);
    a.window = static_cast<index_t>(wv);
  }
  a.layout = parse_attention_layout(o.string("layout", "bhtd"));
  const StoredTensor* bias = maybe(in, "bias");
  const StoredTensor* mask = maybe(in, "mask");
  if (bias) a.bias = bias->values;
  if (mask) {
    const Tensor<double> mb = mask_to_bias(*mask);
    if (!bias) {
      a.bias = mb;
    } else {
      OASIS_REQUIRE(mb.shape() == a.bias.shape(), "mask", "shape ", shape_str(mb.shape()), " differs from bias ",
                    shape_str(a.bias.shape()), " (give both with the same shape, or one of them)");
      for (index_t i = 0; i < mb.size(); ++i) a.bias[i] += mb[i];
    }
  }
  return a;
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

}  // namespace oasis::verify::detail
