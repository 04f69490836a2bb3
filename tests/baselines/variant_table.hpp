// The variant table of issue 8: for a small AttnRes model with identical weights under each
// variant of the SPEC §4 table (and the token-normaliser baselines the model supports), the
// outlier metrics of its trace and the output error under fake weight quantisation.
//
// Identical weights: one model of the superset configuration (OASIS: every router parameter,
// theta included) is initialised from a seed; every other variant copies each of its parameters
// by name. Pseudo-queries (zero-initialised in training) are drawn N(0, init_std^2) here so
// that the routers are not uniform.
//
// Tracked tensors (metrics.hpp): the hidden state h_l entering every sublayer and the readout
// state. Null mass: mean p_null of the token attentions; depth null mass: mean alpha_null.
// Quantised output error: relative RMS of the logits, ||logits_q - logits|| / ||logits||, with
// the linear-layer weights (q, k, v, o, gate, up, down) fake-quantised by the preset's weight
// scheme; embeddings, LM head, norms and router parameters stay in full precision (as in
// W8A8 studies). Activation quantisation needs a hook in the model's linear layers
// (include/oasis/model/layers.hpp), which the model does not offer: activations stay in full
// precision, and the column header says "W-only".
#pragma once

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "oasis/metrics.hpp"
#include "oasis/model/model.hpp"
#include "oasis/quant.hpp"

namespace oasis::baselines_table {

using namespace oasis::model;

struct VariantCase {
  std::string name;
  Variant variant;
  std::optional<RowNorm> token;  ///< token-normaliser override (baselines)
};

inline std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> c;
  for (const VariantSpec& s : kVariants) c.push_back({std::string(s.name), s.variant, std::nullopt});
  c.push_back({"clipped_softmax", Variant::vanilla_attnres, RowNorm::clipped_softmax});
  c.push_back({"clipped_outeffhop", Variant::token_only, RowNorm::clipped_softmax1});
  c.push_back({"clipped_aos", Variant::aos, RowNorm::clipped_softmax1});
  c.push_back({"sparsemax", Variant::vanilla_attnres, RowNorm::sparsemax});
  c.push_back({"entmax15", Variant::vanilla_attnres, RowNorm::entmax15});
  return c;
}

struct VariantRow {
  std::string name;
  std::string token, depth;
  OutlierSummary outliers;
  double null_mass = 0;        ///< mean token p_null over attention sublayers
  double depth_null_mass = 0;  ///< mean alpha_null over routers (0 without routing)
  std::vector<double> quant_error;  ///< per preset: relative RMS logit error
};

struct TableOptions {
  ModelConfig base;  ///< sizes and conventions; variant/token_normalizer are set per row
  std::uint64_t seed = 8;
  index_t batch = 2, seq = 16;
  std::vector<std::string> presets{"W8A8", "W6A6", "W4A4"};
};

inline TableOptions default_table_options() {
  TableOptions o;
  o.base.vocab_size = 64;
  o.base.d_model = 32;
  o.base.n_blocks = 3;
  o.base.n_heads = 4;
  o.base.d_ff = 64;
  o.base.init_std = 0.25;  // large enough for non-uniform attention in an untrained model
  return o;
}

inline bool is_quantised_linear(const std::string& name) {
  for (const char* s : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                        ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"})
    if (name.size() > std::string(s).size() && name.compare(name.size() - std::string(s).size(), std::string::npos, s) == 0 &&
        name.rfind("_res.", std::string::npos) == std::string::npos)
      return true;
  return false;
}

inline double rel_rms(const Tensor<double>& a, const Tensor<double>& ref) {
  double num = 0, den = 0;
  for (index_t i = 0; i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<VariantRow> variant_table(const TableOptions& opt) {
  // The superset model: OASIS has every parameter of the Kimi-router variants.
  ModelConfig sup = opt.base;
  sup.variant = Variant::oasis;
  sup.token_normalizer.reset();
  Model<double> ref = Model<double>::initialized(sup, opt.seed);
  {
    std::mt19937_64 rng(opt.seed + 1);
    std::normal_distribution<double> nd(0.0, sup.init_std);
    for (const ParamSpec& p : parameter_specs(sup))
      if (p.name.size() > 6 && p.name.compare(p.name.size() - 6, 6, ".query") == 0) {
        Tensor<double> q(p.shape);
        for (index_t i = 0; i < q.size(); ++i) q[i] = nd(rng);
        ref.set_param(p.name, q);
      }
  }
  std::mt19937_64 rng(opt.seed + 2);
  std::uniform_int_distribution<index_t> tok(0, sup.vocab_size - 1);
  std::vector<index_t> ids(static_cast<std::size_t>(opt.batch * opt.seq));
  for (auto& t : ids) t = tok(rng);
  ForwardOptions fo;
  fo.trace = true;

  std::vector<VariantRow> rows;
  for (const VariantCase& vc : variant_cases()) {
    ModelConfig cfg = opt.base;
    cfg.variant = vc.variant;
    cfg.token_normalizer = vc.token;
    Model<double> m(cfg);
    for (const ParamSpec& p : parameter_specs(cfg)) m.set_param(p.name, ref.param(p.name));
    const ForwardResult<double> fp = m.forward(ids, opt.batch, opt.seq, fo);

    VariantRow r;
    r.name = vc.name;
    r.token = std::string(to_string(cfg.token_norm()));
    r.depth = cfg.attn_res() ? std::string(to_string(variant_spec(cfg.variant).depth)) : "residual";
    std::vector<Tensor<double>> tracked;
    double pn = 0, an = 0;
    index_t n_att = 0, n_route = 0;
    for (const SublayerTrace<double>& tr : fp.trace) {
      if (tr.kind != SublayerKind::readout && !tr.input.empty()) tracked.push_back(tr.input);
      if (tr.kind == SublayerKind::attention && !tr.p_null.empty()) {
        pn += null_mass(tr.p_null);
        ++n_att;
      }
      if (tr.has_route && !tr.alpha_null.empty()) {
        double s = 0;
        for (index_t i = 0; i < tr.alpha_null.size(); ++i) s += tr.alpha_null[i];
        an += s / static_cast<double>(tr.alpha_null.size());
        ++n_route;
      }
    }
    tracked.push_back(fp.state);
    r.outliers = outlier_summary(tracked);
    r.null_mass = n_att ? pn / static_cast<double>(n_att) : 0.0;
    r.depth_null_mass = n_route ? an / static_cast<double>(n_route) : 0.0;

    for (const std::string& preset : opt.presets) {
      const WAQuantConfig qc = wa_preset(preset);
      Model<double> mq = m;
      for (const auto& [name, w] : m.parameters())
        if (is_quantised_linear(name)) mq.set_param(name, fake_quantize(w, qc.weights));
      const ForwardResult<double> q = mq.forward(ids, opt.batch, opt.seq);
      r.quant_error.push_back(rel_rms(q.logits, fp.logits));
    }
    rows.push_back(r);
  }
  return rows;
}

inline void print_table(std::ostream& os, const TableOptions& opt, const std::vector<VariantRow>& rows) {
  os << "# variant table: d_model " << opt.base.d_model << ", blocks " << opt.base.n_blocks << ", heads "
     << opt.base.n_heads << ", B " << opt.batch << ", T " << opt.seq << ", seed " << opt.seed
     << ", init_std " << opt.base.init_std << "\n";
  os << "# quant columns: relative RMS logit error, weights fake-quantised (W-only; activations full precision)\n";
  os << std::left << std::setw(20) << "variant" << std::setw(18) << "token" << std::setw(10) << "depth" << std::right
     << std::setw(10) << "avg_kurt" << std::setw(10) << "max_kurt" << std::setw(10) << "max_inf" << std::setw(10)
     << "null" << std::setw(10) << "d_null";
  for (const std::string& p : opt.presets) os << std::setw(12) << (p + "-W");
  os << "\n";
  os << std::fixed;
  for (const VariantRow& r : rows) {
    os << std::left << std::setw(20) << r.name << std::setw(18) << r.token << std::setw(10) << r.depth << std::right
       << std::setprecision(3) << std::setw(10) << r.outliers.avg_kurtosis << std::setw(10) << r.outliers.max_kurtosis
       << std::setw(10) << r.outliers.max_inf_norm << std::setw(10) << r.null_mass << std::setw(10)
       << r.depth_null_mass;
    os << std::setprecision(6);
    for (double e : r.quant_error) os << std::setw(12) << e;
    os << "\n";
  }
}

}  // namespace oasis::baselines_table
