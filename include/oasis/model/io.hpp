// oasis/model/io.hpp — save and load Model<T> weights in safetensors (oasis/io/safetensors.hpp).
//
// Tensor names and shapes are those of parameter_specs(config) (docs/model.md lists them; they
// follow the Hugging Face Llama names where one exists: embed_tokens.weight,
// layers.{b}.attn.q_proj.weight, ..., norm.weight, lm_head.weight). The configuration travels in
// the file's __metadata__ ("oasis.<field>" keys), so load_model(path) rebuilds the model alone.
//
// dtype: float models are written as F32 and double models as F64 by default, so save-then-load
// reproduces every weight bit for bit; long double and mp50 are written as F64 (rounded once).
// Loading checks that every expected tensor is present with the expected shape and finite values
// and that the file has no unexpected tensor; each failure throws oasis::invalid_argument whose
// argument is the tensor's name. `rename` maps names in the file to model names, so weights of an
// external implementation can be mapped in.
#pragma once

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "oasis/io/safetensors.hpp"
#include "oasis/model/model.hpp"

namespace oasis::model {

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

/// Inverse of config_metadata; a missing or malformed field throws naming "oasis.<field>".
inline ModelConfig config_from_metadata(const std::map<std::string, std::string>& m) {
  auto get = [&](const std::string& k) -> const std::string& {
    const auto it = m.find("oasis." + k);
    OASIS_REQUIRE(it != m.end(), "oasis." + k, "missing from the file's metadata");
    return it->second;
  };
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
  OASIS_REQUIRE(get("format") == "oasis-model-1", "oasis.format", "unknown format '", get("format"), "'");
  ModelConfig c;
  c.vocab_size = integer("vocab_size");
  c.d_model = integer("d_model");
  c.n_blocks = integer("n_blocks");
  c.n_heads = integer("n_heads");
  c.n_kv_heads = integer("n_kv_heads");
  c.d_head = integer("d_head");
  c.d_ff = integer("d_ff");
  c.variant = parse_variant(get("variant"));
  c.router = parse_router_family(get("router"));
  c.block_size = integer("block_size");
  c.readout = parse_readout(get("readout"));
  if (m.count("oasis.token_normalizer")) c.token_normalizer = parse_row_norm(get("token_normalizer"));
  CouplingOptions co;
  co.centring = parse_centring(get("centring"));
  co.headless = parse_headless_rule(get("headless"));
  co.beta_max = real("beta_max");
  co.score_clamp = real("score_clamp");
  c.coupling = co;
  if (m.count("oasis.beta")) c.beta = real("beta");
  c.psi_estimator = parse_psi_estimator(get("psi_estimator"));
  c.rope = parse_rope_layout(get("rope"));
  c.rope_theta = real("rope_theta");
  c.norm_eps = real("norm_eps");
  c.qk_norm = flag("qk_norm");
  c.key_norm.eps = real("key_norm_eps");
  c.key_norm.compute_in_float32 = flag("key_norm_float32");
  c.key_norm_gain = flag("key_norm_gain");
  c.authors_rank = integer("authors_rank");
  c.tie_embeddings = flag("tie_embeddings");
  // Files written before the baseline options existed carry neither key and have both options off.
  if (m.count("oasis.gated_attention")) c.gated_attention = flag("gated_attention");
  if (m.count("oasis.prefix_sink")) c.prefix_sink = flag("prefix_sink");
  c.init_std = real("init_std");
  c.theta_init = real("theta_init");
  c.validate();
  return c;
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

/// The model of `cfg` with the weights `file` (tensors by name; `path` says where they come from
/// in the errors). rename: file name -> model name (names not in it are taken as they are).
/// Missing, mis-shaped, non-finite and unexpected tensors throw naming them.
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
  Model<T> m(cfg);
  std::set<std::string> used;
  for (const ParamSpec& p : parameter_specs(cfg)) {
    const auto it = by_model_name.find(p.name);
    OASIS_REQUIRE(it != by_model_name.end(), p.name, "missing from ", path, " (expected shape ", shape_str(p.shape), ")");
    const Tensor<double>& v = it->second->values;
    OASIS_REQUIRE(v.shape() == p.shape, p.name, "has shape ", shape_str(v.shape()), " in ", path, ", expected ",
                  shape_str(p.shape));
    m.set_param(p.name, v.template cast<T>());
    used.insert(p.name);
  }
  for (const auto& [mname, st] : by_model_name)
    OASIS_REQUIRE(used.count(mname), mname, "in ", path, " is not a parameter of this configuration");
  return m;
}

/// Load the weights of `cfg` from a file (model_from_tensors on its tensors).
template <class T>
Model<T> load_model(const ModelConfig& cfg, const std::string& path,
                    const std::map<std::string, std::string>& rename = {}) {
  return model_from_tensors<T>(cfg, io::read_safetensors(path), path, rename);
}

/// Load a file written by save_model: the configuration comes from its metadata.
template <class T>
Model<T> load_model(const std::string& path) {
  return load_model<T>(config_from_metadata(io::read_safetensors_metadata(path)), path);
}

}  // namespace oasis::model
