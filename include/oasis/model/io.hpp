// oasis/model/io.hpp — save and load Model<T> weights in safetensors (oasis/io/safetensors.hpp).
//
// Tensor names and shapes are those of parameter_specs(config) (docs/model.md lists them; they
// follow the Hugging Face Llama names where one exists: embed_tokens.weight,
// layers.{b}.attn.q_proj.weight, ..., norm.weight, lm_head.weight). The configuration travels in
// the file's __metadata__ ("oasis.<field>" keys), so load_model(path) rebuilds the model alone.
//
// dtype: float models are written as F32 and double models as F64 by default, so save-then-load
// reproduces every weight bit for bit; long double and mp50 are written as F64 (rounded once).
// A hand-written file needs only the metadata keys that differ from the defaults
// (config_from_metadata; docs/model.md lists every key).
// Loading checks that every expected tensor is present with the expected shape and finite values
// and that the file has no unexpected tensor; each failure throws oasis::invalid_argument whose
// argument is the tensor's name. `rename` maps names in the file to model names, so weights of an
// external implementation can be mapped in.
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <vector>
#include <sstream>
#include <string>
#include <type_traits>

#include "oasis/io/safetensors.hpp"
#include "oasis/model/model.hpp"

namespace oasis::model {

/// Shapes of the tensors of a weights file (the sizes the metadata leaves out are read from them).
using ShapeMap = std::map<std::string, Shape>;

/// Every metadata key config_from_metadata knows, without the "oasis." prefix (docs/model.md
/// lists each with its meaning and default).
inline const std::vector<std::string>& metadata_keys() {
  static const std::vector<std::string> k = {
      "format", "vocab_size", "d_model", "n_blocks", "n_heads", "n_kv_heads", "d_head", "d_ff", "variant", "router",
      "block_size", "block_sizes", "readout", "token_normalizer", "centring", "headless", "beta_max", "score_clamp",
      "beta", "psi_estimator", "rope", "rope_theta", "norm_eps", "norm_float32", "qk_norm", "key_norm_eps",
      "key_norm_float32", "key_norm_gain", "authors_rank", "tie_embeddings", "gated_attention", "prefix_sink",
      "init_std", "theta_init"};
  return k;
}

/// Every configuration field as "oasis.<field>" -> text (doubles with 17 significant digits).
inline std::map<std::string, std::string> config_metadata(const ModelConfig& c) {
  auto num = [](double x) { std::ostringstream os; os.precision(17); os << x; return os.str(); };
  std::map<std::string, std::string> m;
  m["oasis.format"] = "oasis-model-1";
  m["oasis.vocab_size"] = std::to_string(c.vocab_size);
  m["oasis.d_model"] = std::to_string(c.d_model);
  m["oasis.n_blocks"] = std::to_string(c.n_blocks);
  m["oasis.n_heads"] = std::to_string(c.n_heads);
  m["oasis.n_kv_heads"] = std::to_string(c.n_kv_heads);
  m["oasis.d_head"] = std::to_string(c.d_head);
  m["oasis.d_ff"] = std::to_string(c.d_ff);
  m["oasis.variant"] = std::string(to_string(c.variant));
  m["oasis.router"] = std::string(to_string(c.router));
  m["oasis.block_size"] = std::to_string(c.block_size);
  if (!c.block_sizes.empty()) {
    std::string b;
    for (index_t k : c.block_sizes) b += (b.empty() ? "" : ",") + std::to_string(k);
    m["oasis.block_sizes"] = b;
  }
  m["oasis.readout"] = std::string(to_string(c.readout_or_default()));
  if (c.token_normalizer) m["oasis.token_normalizer"] = std::string(to_string(*c.token_normalizer));
  const CouplingOptions co = c.coupling_or_default();
  m["oasis.centring"] = std::string(to_string(co.centring));
  m["oasis.headless"] = std::string(to_string(co.headless));
  m["oasis.beta_max"] = num(co.beta_max);
  m["oasis.score_clamp"] = num(co.score_clamp);
  if (c.beta) m["oasis.beta"] = num(*c.beta);
  m["oasis.psi_estimator"] = std::string(to_string(c.psi_estimator));
  m["oasis.rope"] = std::string(to_string(c.rope));
  m["oasis.rope_theta"] = num(c.rope_theta);
  m["oasis.norm_eps"] = num(c.norm_eps);
  m["oasis.norm_float32"] = c.norm_float32 ? "1" : "0";
  m["oasis.qk_norm"] = c.qk_norm ? "1" : "0";
  m["oasis.key_norm_eps"] = num(c.key_norm.eps);
  m["oasis.key_norm_float32"] = c.key_norm.compute_in_float32 ? "1" : "0";
  m["oasis.key_norm_gain"] = c.key_norm_gain ? "1" : "0";
  m["oasis.authors_rank"] = std::to_string(c.authors_rank);
  m["oasis.tie_embeddings"] = c.tie_embeddings ? "1" : "0";
  m["oasis.gated_attention"] = c.gated_attention ? "1" : "0";
  m["oasis.prefix_sink"] = c.prefix_sink ? "1" : "0";
  m["oasis.init_std"] = num(c.init_std);
  m["oasis.theta_init"] = num(c.theta_init);
  return m;
}

/// Inverse of config_metadata, with defaults: a key that is absent takes the default of
/// ModelConfig (docs/model.md), so a file needs only the keys that differ; the sizes vocab_size,
/// d_model, n_blocks, d_ff, n_kv_heads and d_head default to what the tensor shapes in `shapes`
/// say (embed_tokens.weight, layers.{b}.*, q/k projections); n_heads has no default. The
/// coupling keys (centring, headless, beta_max, score_clamp) override the router's default
/// convention one by one. A malformed value, an unknown "oasis.*" key or a missing n_heads throws
/// naming "oasis.<field>"; keys without the "oasis." prefix are not ours and are ignored.
inline ModelConfig config_from_metadata(const std::map<std::string, std::string>& m, const ShapeMap& shapes = {}) {
  for (const auto& [key, value] : m) {
    (void)value;
    if (key.rfind("oasis.", 0) != 0) continue;
    const std::string k = key.substr(6);
    const auto& known = metadata_keys();
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (const auto& n : known) list += (list.empty() ? "oasis." : ", oasis.") + n;
      throw invalid_argument(key, "unknown metadata key (known: " + list + ")");
    }
  }
  auto has = [&](const std::string& k) { return m.count("oasis." + k) > 0; };
  auto get = [&](const std::string& k) -> const std::string& { return m.at("oasis." + k); };
  auto integer = [&](const std::string& k) -> index_t {
    const std::string& s = get(k);
    std::size_t used = 0;
    long long v = 0;
    try { v = std::stoll(s, &used); } catch (const std::exception&) { used = 0; }
    OASIS_REQUIRE(used == s.size() && !s.empty(), "oasis." + k, "is not an integer: '", s, "'");
    return static_cast<index_t>(v);
  };
  auto real = [&](const std::string& k) -> double {
    const std::string& s = get(k);
    std::size_t used = 0;
    double v = 0;
    try { v = std::stod(s, &used); } catch (const std::exception&) { used = 0; }
    OASIS_REQUIRE(used == s.size() && !s.empty(), "oasis." + k, "is not a number: '", s, "'");
    return v;
  };
  auto flag = [&](const std::string& k) -> bool {
    const std::string& s = get(k);
    OASIS_REQUIRE(s == "0" || s == "1", "oasis." + k, "must be 0 or 1, got '", s, "'");
    return s == "1";
  };
  auto shape_of = [&](const std::string& tensor) -> const Shape* {
    const auto it = shapes.find(tensor);
    return it == shapes.end() ? nullptr : &it->second;
  };
  // a size: the metadata value, else the dimension `dim` of `tensor` in the file
  auto size = [&](const std::string& k, const std::string& tensor, std::size_t dim) -> index_t {
    if (has(k)) return integer(k);
    const Shape* sh = shape_of(tensor);
    OASIS_REQUIRE(sh && sh->size() > dim, "oasis." + k, "missing from the metadata, and the file has no ", tensor,
                  " to read it from");
    return (*sh)[dim];
  };
  OASIS_REQUIRE(!has("format") || get("format") == "oasis-model-1", "oasis.format", "unknown format '", get("format"),
                "' (expected oasis-model-1)");
  ModelConfig c;
  c.vocab_size = size("vocab_size", "embed_tokens.weight", 0);
  c.d_model = size("d_model", "embed_tokens.weight", 1);
  if (has("n_blocks")) {
    c.n_blocks = integer("n_blocks");
  } else {
    index_t nb = 0;
    while (shape_of("layers." + std::to_string(nb) + ".attn_norm.weight")) ++nb;
    OASIS_REQUIRE(nb > 0, "oasis.n_blocks", "missing from the metadata, and the file has no layers.0.attn_norm.weight");
    c.n_blocks = nb;
  }
  OASIS_REQUIRE(has("n_heads"), "oasis.n_heads", "missing from the metadata (the number of heads cannot be read from "
                "the tensor shapes; it has no default)");
  c.n_heads = integer("n_heads");
  OASIS_REQUIRE(c.n_heads > 0, "oasis.n_heads", "must be positive, got ", c.n_heads);
  const Shape* wq = shape_of("layers.0.attn.q_proj.weight");
  const Shape* wk = shape_of("layers.0.attn.k_proj.weight");
  if (has("d_head")) c.d_head = integer("d_head");
  else if (wq && wq->size() == 2 && (*wq)[0] != c.d_model && (*wq)[0] % c.n_heads == 0) c.d_head = (*wq)[0] / c.n_heads;
  if (has("n_kv_heads")) c.n_kv_heads = integer("n_kv_heads");
  else if (wq && wk && wq->size() == 2 && wk->size() == 2 && (*wk)[0] != (*wq)[0] && (*wq)[0] > 0 &&
           (*wk)[0] <= INT64_MAX / c.n_heads && ((*wk)[0] * c.n_heads) % (*wq)[0] == 0)
    c.n_kv_heads = (*wk)[0] * c.n_heads / (*wq)[0];
  c.d_ff = size("d_ff", "layers.0.mlp.gate_proj.weight", 0);
  if (has("variant")) c.variant = parse_variant(get("variant"));
  if (has("router")) c.router = parse_router_family(get("router"));
  if (has("block_size")) c.block_size = integer("block_size");
  if (has("block_sizes")) {
    const std::string& s = get("block_sizes");
    std::size_t at = 0;
    while (at <= s.size()) {
      const std::size_t comma = std::min(s.find(',', at), s.size());
      const std::string item = s.substr(at, comma - at);
      std::size_t used = 0;
      long long v = 0;
      try { v = std::stoll(item, &used); } catch (const std::exception&) { used = 0; }
      OASIS_REQUIRE(used == item.size() && !item.empty(), "oasis.block_sizes",
                    "must be comma-separated positive integers such as '2,2,1,1', got '", s, "'");
      c.block_sizes.push_back(static_cast<index_t>(v));
      at = comma + 1;
    }
  }
  if (has("readout")) c.readout = parse_readout(get("readout"));
  if (has("token_normalizer")) c.token_normalizer = parse_row_norm(get("token_normalizer"));
  if (has("centring") || has("headless") || has("beta_max") || has("score_clamp")) {
    CouplingOptions co = c.coupling_or_default();
    if (has("centring")) co.centring = parse_centring(get("centring"));
    if (has("headless")) co.headless = parse_headless_rule(get("headless"));
    if (has("beta_max")) co.beta_max = real("beta_max");
    if (has("score_clamp")) co.score_clamp = real("score_clamp");
    c.coupling = co;
  }
  if (has("beta")) c.beta = real("beta");
  if (has("psi_estimator")) c.psi_estimator = parse_psi_estimator(get("psi_estimator"));
  if (has("rope")) c.rope = parse_rope_layout(get("rope"));
  if (has("rope_theta")) c.rope_theta = real("rope_theta");
  if (has("norm_eps")) c.norm_eps = real("norm_eps");
  if (has("norm_float32")) c.norm_float32 = flag("norm_float32");
  if (has("qk_norm")) c.qk_norm = flag("qk_norm");
  if (has("key_norm_eps")) c.key_norm.eps = real("key_norm_eps");
  if (has("key_norm_float32")) c.key_norm.compute_in_float32 = flag("key_norm_float32");
  if (has("key_norm_gain")) c.key_norm_gain = flag("key_norm_gain");
  if (has("authors_rank")) c.authors_rank = integer("authors_rank");
  if (has("tie_embeddings")) c.tie_embeddings = flag("tie_embeddings");
  if (has("gated_attention")) c.gated_attention = flag("gated_attention");
  if (has("prefix_sink")) c.prefix_sink = flag("prefix_sink");
  if (has("init_std")) c.init_std = real("init_std");
  if (has("theta_init")) c.theta_init = real("theta_init");
  c.validate();
  return c;
}

/// Every trace tensor of a forward with ForwardOptions::trace, named and laid out as the model
/// level of `oasis-verify compare` reads them (docs/verify-model.md, "Model level"): "logits", "state"
/// and "<sublayer>.<field>" for every field the sublayer has (router fields where a router ran),
/// each rounded to `dtype`. The reference layout for implementations that write traces.
template <class T>
io::TensorMap trace_tensors(const ForwardResult<T>& res, io::DType dtype) {
  io::TensorMap out;
  auto put = [&](const std::string& name, const Tensor<T>& t) {
    if (t.size() == 0) return;
    Tensor<double> v = t.template cast<double>();
    for (index_t i = 0; i < v.size(); ++i) v[i] = io::round_to_dtype(v[i], dtype);
    out.emplace(name, io::StoredTensor{dtype, std::move(v)});
  };
  put("logits", res.logits);
  put("state", res.state);
  for (const SublayerTrace<T>& tr : res.trace) {
    const std::string P = tr.name + ".";
    if (tr.has_route) {
      put(P + "sources", tr.sources);
      put(P + "psi", tr.psi);
      put(P + "g_old", tr.g_old);
      put(P + "g", tr.g);
      put(P + "dpsi", tr.dpsi);
      put(P + "alpha", tr.alpha);
      put(P + "alpha_null", tr.alpha_null);
      put(P + "routed", tr.routed);
    }
    if (tr.kind == SublayerKind::readout) continue;
    put(P + "input", tr.input);
    put(P + "output", tr.output);
    if (tr.kind == SublayerKind::attention) {
      put(P + "attn_q", tr.attn_q);
      put(P + "attn_k", tr.attn_k);
      put(P + "attn_v", tr.attn_v);
      put(P + "p_null", tr.p_null);
      put(P + "lse", tr.lse);
      put(P + "attn_heads", tr.attn_heads);
      put(P + "branch_psi", tr.branch_psi);
    } else {
      put(P + "mlp_hidden", tr.mlp_hidden);
    }
  }
  return out;
}

/// The storage dtype that keeps T's values exact where possible: F32 for float, else F64.
template <class T> io::DType default_dtype() { return std::is_same_v<T, float> ? io::DType::f32 : io::DType::f64; }

/// Write every parameter (canonical names) and the configuration metadata.
template <class T>
void save_model(const Model<T>& model, const std::string& path, io::DType dtype = default_dtype<T>()) {
  io::TensorMap out;
  for (const auto& [name, t] : model.parameters()) out[name] = io::StoredTensor{dtype, t.template cast<double>()};
  io::write_safetensors(path, out, config_metadata(model.config()));
}

/// The sizes of `cfg` bounded by what a weights file holds, checked before anything is
/// allocated or a parameter list is built: every parameter of parameter_specs(cfg) must be one
/// of the file's `n_tensors` tensors, so there are at most n_tensors blocks (each block has
/// parameters), and must equal a tensor of the file in shape, so none has more elements than the
/// file's largest tensor, `max_numel` (itself bounded by the file's bytes). Errors name
/// prefix + field ("oasis." for a configuration read from the file's metadata).
inline void require_config_fits_file(const ModelConfig& cfg, std::size_t n_tensors, std::uint64_t max_numel,
                                     const std::string& path, const std::string& prefix = "") {
  OASIS_REQUIRE(static_cast<std::uint64_t>(cfg.n_blocks) <= n_tensors, prefix + "n_blocks", "= ", cfg.n_blocks,
                " declares more blocks than ", path, " has tensors (", n_tensors, ")");
  auto bound = [&](const std::string& field, const Shape& shape, const char* param) {
    std::uint64_t n = 0;
    OASIS_REQUIRE(checked_numel(shape, max_numel, &n), prefix + field, "declares ", param, " of shape ",
                  shape_str(shape), ", more elements than the largest tensor of ", path, " (", max_numel, ")");
  };
  bound("d_model", {cfg.d_model}, "norm.weight");
  bound("vocab_size", {cfg.vocab_size, cfg.d_model}, "embed_tokens.weight");
  bound(cfg.d_head ? "d_head" : "n_heads", {cfg.n_heads * cfg.head_dim(), cfg.d_model}, "layers.0.attn.q_proj.weight");
  bound("d_ff", {cfg.d_ff, cfg.d_model}, "layers.0.mlp.gate_proj.weight");
  if (cfg.attn_res() && cfg.router == RouterFamily::authors_code)
    bound("authors_rank", {cfg.authors_width(), cfg.d_model}, "layers.0.attn_res.q_proj.weight");
}

/// The model of `cfg` with the weights `file` (tensors by name; `path` says where they come from
/// in the errors). rename: file name -> model name (names not in it are taken as they are).
/// Every declared tensor is checked against the file — present, of a floating-point dtype, of the
/// declared shape — and unexpected tensors are refused, all before the model is allocated (a
/// declared size the file cannot hold is a shape mismatch, found without allocating); each
/// failure throws naming the tensor.
template <class T>
Model<T> model_from_tensors(const ModelConfig& cfg, const io::TensorMap& file, const std::string& path,
                            const std::map<std::string, std::string>& rename = {}) {
  std::map<std::string, const io::StoredTensor*> by_model_name;
  for (const auto& [fname, st] : file) {
    const auto it = rename.find(fname);
    const std::string mname = it == rename.end() ? fname : it->second;
    OASIS_REQUIRE(!by_model_name.count(mname), mname, "given twice in ", path, " (after renaming)");
    by_model_name[mname] = &st;
  }
  cfg.validate();
  if (static_cast<std::uint64_t>(cfg.n_blocks) > file.size()) {
    // More blocks than the file has tensors: some declared tensor is missing. Name the first one
    // among the parameters of the first file.size() + 1 blocks (the same names, without building
    // the whole list of a configuration that may declare 10^9 blocks).
    ModelConfig head = cfg;
    head.n_blocks = static_cast<index_t>(file.size()) + 1;
    head.block_sizes.clear();
    for (const ParamSpec& p : parameter_specs(head))
      OASIS_REQUIRE(by_model_name.count(p.name), p.name, "missing from ", path, " (expected shape ", shape_str(p.shape), ")");
  }
  const std::vector<ParamSpec> specs = parameter_specs(cfg);
  std::set<std::string> declared;
  for (const ParamSpec& p : specs) {
    const auto it = by_model_name.find(p.name);
    OASIS_REQUIRE(it != by_model_name.end(), p.name, "missing from ", path, " (expected shape ", shape_str(p.shape), ")");
    OASIS_REQUIRE(!io::is_integer(it->second->dtype), p.name, "is stored as ", io::safetensors_name(it->second->dtype),
                  " in ", path, "; weights must be floating point (F16, BF16, F32 or F64)");
    const Tensor<double>& v = it->second->values;
    OASIS_REQUIRE(v.shape() == p.shape, p.name, "has shape ", shape_str(v.shape()), " in ", path, ", expected ",
                  shape_str(p.shape));
    declared.insert(p.name);
  }
  for (const auto& [mname, st] : by_model_name)
    OASIS_REQUIRE(declared.count(mname), mname, "in ", path, " is not a parameter of this configuration");
  Model<T> m(cfg);
  for (const ParamSpec& p : specs) m.set_param(p.name, by_model_name.at(p.name)->values.template cast<T>());
  return m;
}

/// Load the weights of `cfg` from a file (model_from_tensors on its tensors).
template <class T>
Model<T> load_model(const ModelConfig& cfg, const std::string& path,
                    const std::map<std::string, std::string>& rename = {}) {
  return model_from_tensors<T>(cfg, io::read_safetensors(path), path, rename);
}

/// The model of a weights file held in memory (`name` says where it comes from in the errors):
/// configuration from its metadata (config_from_metadata), sizes bounded by the file
/// (require_config_fits_file), then model_from_tensors; a size or field the file cannot hold or
/// validate() rejects is named as its metadata key ("oasis.n_blocks").
template <class T>
Model<T> parse_model(const std::string& bytes, const std::string& name) {
  std::map<std::string, std::string> md;
  const io::TensorMap file = io::parse_safetensors(bytes, name, &md);
  ShapeMap shapes;
  std::uint64_t max_numel = 0;
  for (const auto& [tname, t] : file) {
    shapes[tname] = t.values.shape();
    max_numel = std::max<std::uint64_t>(max_numel, static_cast<std::uint64_t>(t.values.size()));
  }
  ModelConfig cfg;
  try {
    cfg = config_from_metadata(md, shapes);
  } catch (const invalid_argument& e) {
    // A field ModelConfig::validate rejects is a metadata key here: name it as the file does.
    const auto& known = metadata_keys();
    if (std::find(known.begin(), known.end(), e.argument()) == known.end()) throw;
    const std::string prefix = "oasis: argument '" + e.argument() + "': ", what = e.what();
    throw invalid_argument("oasis." + e.argument(), what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what);
  }
  require_config_fits_file(cfg, file.size(), max_numel, name, "oasis.");
  return model_from_tensors<T>(cfg, file, name);
}

/// Load a file whose configuration is in its metadata (written by save_model, or by hand with
/// only the keys that differ from the defaults: config_from_metadata). Regular files only.
template <class T>
Model<T> load_model(const std::string& path) {
  return parse_model<T>(io::detail::read_file_bytes(path), path);
}

}  // namespace oasis::model
