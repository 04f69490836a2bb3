// The variant table: for a small AttnRes model with identical weights under each
// variant of the docs/spec.md §4 table (plus OASIS at beta = 0, the token-normaliser baselines, gated
// attention and the S2 prefix sink), the outlier and sink metrics of its trace, the Definition
// 5.1/5.2 pathology scores, and the end-to-end output error of a fake-quantised forward.
//
// Identical weights: one model of the superset configuration (OASIS with gated attention and
// the prefix sink: every parameter any row uses) is initialised from a seed; every row copies
// each of its parameters by name. Pseudo-queries (zero-initialised in training) are drawn
// N(0, init_std^2) here so that the routers are not uniform.
//
// Tracked tensors (metrics.hpp): the hidden state h_l entering every sublayer and the readout
// state. Attention probabilities come from the model's trace (ForwardOptions::trace_probs).
// Null mass: mean p_null of the token attentions (S2 rows: mean p_sink, the sink playing the
// null category's role); depth null mass: mean alpha_null. BOS mass, sink rate (Gu et al.:
// per (sample, layer, head), epsilon 0.3) and entropy are over the real tokens (S2: the sink column is dropped and enters the entropy
// as the null category).
// Pathology (pathology.hpp, docs/baselines.md): per query t >= 1 with N_t = {0} (the first token
// as the weakly relevant position), lambda1 = lambda2 = 1; AttnRes rows use Definition 5.1 with
// the final readout router's alpha over its sources, the token distribution of an attention
// source being its head-mean attention row and that of a position-wise source (embedding, MLP)
// the one-hot row of the token itself; the original backbone uses Definition 5.2 with the
// head-mean row of its last attention layer. Reported: means of L, C, E and S over (b, t >= 1).
// Quantised output error: a full forward with ForwardOptions::quant = wa_preset(p) (every linear
// layer of the blocks with fake-quantised weights and input activations; embedding, LM head,
// norms and routers in full precision) against the full-precision logits: relative Frobenius
// ||Δ||_F / ||logits||_F and max |Δ|. Presets with calibrated activation ranges first run
// kCalibrationBatches calibration forwards on batches of other random tokens (same B, T), then
// evaluate with the frozen ranges.
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "oasis/research/metrics.hpp"
#include "oasis/model/model.hpp"
#include "oasis/research/pathology.hpp"
#include "oasis/ops/quantize.hpp"
#include "oasis/research/quant_presets.hpp"

namespace oasis::baselines_table {

using namespace oasis::model;

struct VariantCase {
  std::string name;
  Variant variant;
  std::optional<RowNorm> token;  ///< token-normaliser override (baselines)
  bool gated = false;            ///< ModelConfig::gated_attention
  bool sink = false;             ///< ModelConfig::prefix_sink (S2)
  std::optional<double> beta;    ///< ModelConfig::beta (fixed coupling strength)
};

inline std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> c;
  for (const VariantSpec& s : kVariants) c.push_back({std::string(s.name), s.variant, std::nullopt});
  c.push_back({"oasis_beta0", Variant::oasis, std::nullopt, false, false, 0.0});
  c.push_back({"clipped_softmax", Variant::vanilla_attnres, RowNorm::clipped_softmax});
  c.push_back({"clipped_outeffhop", Variant::token_only, RowNorm::clipped_softmax1});
  c.push_back({"clipped_aos", Variant::aos, RowNorm::clipped_softmax1});
  c.push_back({"sparsemax", Variant::vanilla_attnres, RowNorm::sparsemax});
  c.push_back({"entmax15", Variant::vanilla_attnres, RowNorm::entmax15});
  c.push_back({"gated", Variant::vanilla_attnres, std::nullopt, true});
  c.push_back({"gated_aos", Variant::aos, std::nullopt, true});
  c.push_back({"s2_sink", Variant::vanilla_attnres, std::nullopt, false, true});
  return c;
}

/// The pathology weights of the table (Definition 5.1: S = L + lambda1 C + lambda2 E).
inline constexpr double kLambda1 = 1.0, kLambda2 = 1.0;

struct VariantRow {
  std::string name;
  std::string token, depth;
  OutlierSummary outliers;
  double null_mass = 0;        ///< mean token p_null over attention sublayers (S2: mean p_sink)
  double depth_null_mass = 0;  ///< mean alpha_null over routers (0 without routing)
  double bos_mass = 0;         ///< mean over attention layers of bos_mass (real tokens)
  double sink_rate = 0;        ///< sink_rate (Gu et al.): fraction of (sample, layer, head) with first-key importance > 0.3
  double entropy = 0;          ///< mean attention entropy (nats), null category (S2: sink) included
  PathologyTerms<double> pathology{0, 0, 0};  ///< means over (b, t >= 1) of L, C, E
  double pathology_score = 0;                  ///< mean over (b, t >= 1) of S_t
  std::vector<double> quant_rel;  ///< per preset: ||logits_q - logits||_F / ||logits||_F (W and A quantised)
  std::vector<double> quant_max;  ///< per preset: max |logits_q - logits|
};

struct TableOptions {
  ModelConfig base;  ///< sizes and conventions; variant/token_normalizer/gating/sink set per row
  std::uint64_t seed = 8;
  index_t batch = 2, seq = 16;
  /// The paper's settings (docs/baselines.md, "Quantisation presets"): W8A8 as Bondarenko et al.,
  /// W6A6 and W4A4 in OmniQuant's quantiser layout with round-to-nearest ranges.
  std::vector<std::string> presets{"bondarenko-W8A8", "omniquant-rtn-W6A6", "omniquant-rtn-W4A4"};
};

/// Calibration batches of the presets with calibrated activation ranges.
inline constexpr int kCalibrationBatches = 4;

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

/// Head-mean token distribution [B, T, Tk - offset] of probs [B, H, T, Tk] (offset 1 drops the
/// S2 sink column). Entries are clamped to <= 1 (a normalised probability may exceed 1 by a
/// rounding, e.g. 1 - tau in sparsemax; pathology.hpp requires [0, 1]).
inline Tensor<double> head_mean_rows(const Tensor<double>& probs, index_t offset) {
  const index_t B = probs.dim(0), H = probs.dim(1), Tq = probs.dim(2), Tk = probs.dim(3) - offset;
  Tensor<double> out({B, Tq, Tk});
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < Tq; ++t)
      for (index_t j = 0; j < Tk; ++j) {
        double s = 0;
        for (index_t h = 0; h < H; ++h) s += probs(b, h, t, j + offset);
        out(b, t, j) = std::min(1.0, s / static_cast<double>(H));
      }
  return out;
}

/// probs [B, H, T, Tk] without the first `offset` key columns.
inline Tensor<double> drop_key_columns(const Tensor<double>& probs, index_t offset) {
  if (offset == 0) return probs;
  const index_t B = probs.dim(0), H = probs.dim(1), Tq = probs.dim(2), Tk = probs.dim(3) - offset;
  Tensor<double> out({B, H, Tq, Tk});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tq; ++t)
        for (index_t j = 0; j < Tk; ++j) out(b, h, t, j) = probs(b, h, t, j + offset);
  return out;
}

/// Means over (b, t >= 1) of the pathology terms and score (N_t = {0}). AttnRes: Definition 5.1
/// on the final readout router (`readout`); original backbone: Definition 5.2 on the last
/// attention layer. rows: "<attention sublayer>.output" (the source name of its output) -> head-mean rows [B, T, T].
inline void pathology_means(const SublayerTrace<double>* readout, const std::map<std::string, Tensor<double>>& rows,
                            const std::string& last_attention, VariantRow& r) {
  const Tensor<double>& any = rows.at(last_attention);
  const index_t B = any.dim(0), Tn = any.dim(1);
  OASIS_REQUIRE(Tn >= 2, "seq", "the pathology scores need T >= 2 (queries t >= 1), got ", Tn);
  PathologyTerms<double> sum{0, 0, 0};
  double ssum = 0;
  std::vector<bool> irrelevant(static_cast<std::size_t>(Tn), false);
  irrelevant[0] = true;  // N_t = {0}
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 1; t < Tn; ++t) {
      PathologyTerms<double> pt{0, 0, 0};
      if (readout) {
        const index_t n = readout->alpha.dim(0);
        Vec<double> alpha(n);
        Mat<double> probs = Mat<double>::Zero(n, Tn);
        for (index_t l = 0; l < n; ++l) {
          alpha[l] = readout->alpha(l, b, t);
          const auto it = rows.find(readout->source_names[static_cast<std::size_t>(l)]);
          if (it == rows.end()) {
            probs(l, t) = 1.0;  // position-wise source (embedding, MLP): the token itself
          } else {
            for (index_t j = 0; j < Tn; ++j) probs(l, j) = it->second(b, t, j);
          }
        }
        pt = pathology_terms(alpha, probs, irrelevant);
      } else {
        Vec<double> p(Tn);
        for (index_t j = 0; j < Tn; ++j) p[j] = any(b, t, j);
        pt = vanilla_pathology_terms(p, irrelevant);
      }
      sum.leakage += pt.leakage;
      sum.concentration += pt.concentration;
      sum.entropy_collapse += pt.entropy_collapse;
      ssum += pathology_score_from_terms(pt, kLambda1, kLambda2);
    }
  const double n = static_cast<double>(B * (Tn - 1));
  r.pathology = {sum.leakage / n, sum.concentration / n, sum.entropy_collapse / n};
  r.pathology_score = ssum / n;
}

inline double rel_frobenius(const Tensor<double>& a, const Tensor<double>& ref) {
  double num = 0, den = 0;
  for (index_t i = 0; i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double max_abs_diff(const Tensor<double>& a, const Tensor<double>& ref) {
  double m = 0;
  for (index_t i = 0; i < ref.size(); ++i) m = std::max(m, std::abs(a[i] - ref[i]));
  return m;
}

inline std::vector<VariantRow> variant_table(const TableOptions& opt) {
  // The superset model: OASIS with gating and the sink has every parameter of every row.
  ModelConfig sup = opt.base;
  sup.variant = Variant::oasis;
  sup.token_normalizer.reset();
  sup.gated_attention = true;
  sup.prefix_sink = true;
  OASIS_REQUIRE(sup.router == RouterFamily::kimi_full && sup.readout_or_default() == Readout::final_attnres, "router",
                "the table's pathology scores use the final readout router of kimi_full (docs/baselines.md)");
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
  fo.trace_probs = true;

  std::vector<VariantRow> rows;
  for (const VariantCase& vc : variant_cases()) {
    ModelConfig cfg = opt.base;
    cfg.variant = vc.variant;
    cfg.token_normalizer = vc.token;
    cfg.gated_attention = vc.gated;
    cfg.prefix_sink = vc.sink;
    if (vc.beta) cfg.beta = vc.beta;
    Model<double> m(cfg);
    for (const ParamSpec& p : parameter_specs(cfg)) m.set_param(p.name, ref.param(p.name));
    const ForwardResult<double> fp = m.forward(ids, opt.batch, opt.seq, fo);

    VariantRow r;
    r.name = vc.name;
    r.token = std::string(to_string(cfg.token_norm())) + (vc.gated ? "+gate" : "") + (vc.sink ? "+S2" : "");
    r.depth = cfg.attn_res() ? std::string(to_string(variant_spec(cfg.variant).depth)) : "residual";
    const index_t offset = vc.sink ? 1 : 0;
    std::vector<Tensor<double>> tracked, probs;
    std::map<std::string, Tensor<double>> mean_rows;
    std::string last_attention;
    const SublayerTrace<double>* readout = nullptr;
    double pn = 0, an = 0;
    index_t n_att = 0, n_route = 0;
    for (const SublayerTrace<double>& tr : fp.trace) {
      if (tr.kind != SublayerKind::readout && !tr.input.empty()) tracked.push_back(tr.input);
      if (tr.kind == SublayerKind::readout) readout = &tr;
      if (tr.kind == SublayerKind::attention) {
        const Tensor<double> p = drop_key_columns(tr.attn_probs, offset);
        const Tensor<double>& pnull = vc.sink ? tr.p_sink : tr.p_null;
        pn += null_mass(pnull);
        r.bos_mass += bos_mass(p);
        r.entropy += attention_entropy(p, pnull);
        // keyed by the name the routers give this sublayer's output as a candidate (wiring.hpp)
        mean_rows[tr.name + ".output"] = head_mean_rows(tr.attn_probs, offset);
        last_attention = tr.name + ".output";
        probs.push_back(p);
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
    r.null_mass = pn / static_cast<double>(n_att);
    r.bos_mass /= static_cast<double>(n_att);
    r.entropy /= static_cast<double>(n_att);
    r.sink_rate = sink_rate(probs);
    r.depth_null_mass = n_route ? an / static_cast<double>(n_route) : 0.0;
    OASIS_REQUIRE(!cfg.attn_res() || readout, "readout", "an AttnRes row has no final readout router in its trace");
    pathology_means(cfg.attn_res() ? readout : nullptr, mean_rows, last_attention, r);

    for (const std::string& preset : opt.presets) {
      WAQuantConfig qc = wa_preset(preset);
      ActivationCalibration calibration;
      ForwardOptions qo;
      qo.quant = &qc;
      if (qc.activation_ranges == ActivationRanges::calibrated) {
        qc.calibration = &calibration;
        std::mt19937_64 crng(opt.seed + 3);
        std::vector<index_t> cids(ids.size());
        for (int c = 0; c < kCalibrationBatches; ++c) {
          for (auto& t : cids) t = tok(crng);
          m.forward(cids, opt.batch, opt.seq, qo);
        }
        calibration.frozen = true;
      }
      const ForwardResult<double> q = m.forward(ids, opt.batch, opt.seq, qo);
      r.quant_rel.push_back(rel_frobenius(q.logits, fp.logits));
      r.quant_max.push_back(max_abs_diff(q.logits, fp.logits));
    }
    rows.push_back(r);
  }
  return rows;
}

inline void print_table(std::ostream& os, const TableOptions& opt, const std::vector<VariantRow>& rows) {
  os << "# variant table: d_model " << opt.base.d_model << ", blocks " << opt.base.n_blocks << ", heads "
     << opt.base.n_heads << ", B " << opt.batch << ", T " << opt.seq << ", seed " << opt.seed
     << ", init_std " << opt.base.init_std << "\n";
  os << "# null: token p_null (S2: p_sink), d_null: depth alpha_null, bos: first-token mass, sink: sink rate\n"
     << "#   (Gu et al.: per sample, layer and head, eps 0.3), entropy: attention entropy in nats with the null category (S2: the sink)\n"
     << "# L, C, E, S: pathology (Def. 5.1 on the readout router; original: Def. 5.2 on the last layer),\n"
     << "#   N_t = {0}, lambda1 = " << kLambda1 << ", lambda2 = " << kLambda2 << ", mean over queries t >= 1\n"
     << "# <preset>-rel / -max: end-to-end logits error of the forward with every block linear layer's\n"
     << "#   weights and input activations fake-quantised: ||d||_F / ||logits||_F and max |d|\n";
  os << std::left << std::setw(19) << "variant" << std::setw(21) << "token" << std::setw(10) << "depth" << std::right
     << std::setw(9) << "avg_kurt" << std::setw(9) << "max_kurt" << std::setw(9) << "max_inf" << std::setw(8)
     << "null" << std::setw(8) << "d_null" << std::setw(8) << "bos" << std::setw(8) << "sink" << std::setw(8)
     << "entropy" << std::setw(8) << "L" << std::setw(8) << "C" << std::setw(8) << "E" << std::setw(8) << "S";
  auto width = [](const std::string& p) { return static_cast<int>(std::max<std::size_t>(10, p.size() + 6)); };
  for (const std::string& p : opt.presets) os << std::setw(width(p)) << (p + "-rel") << std::setw(width(p)) << (p + "-max");
  os << "\n";
  os << std::fixed;
  for (const VariantRow& r : rows) {
    os << std::left << std::setw(19) << r.name << std::setw(21) << r.token << std::setw(10) << r.depth << std::right
       << std::setprecision(3) << std::setw(9) << r.outliers.avg_kurtosis << std::setw(9) << r.outliers.max_kurtosis
       << std::setw(9) << r.outliers.max_inf_norm << std::setw(8) << r.null_mass << std::setw(8)
       << r.depth_null_mass << std::setw(8) << r.bos_mass << std::setw(8) << r.sink_rate << std::setw(8)
       << r.entropy << std::setw(8) << r.pathology.leakage << std::setw(8) << r.pathology.concentration
       << std::setw(8) << r.pathology.entropy_collapse << std::setw(8) << r.pathology_score;
    os << std::setprecision(5);
    for (std::size_t i = 0; i < r.quant_rel.size(); ++i)
      os << std::setw(width(opt.presets[i])) << r.quant_rel[i] << std::setw(width(opt.presets[i])) << r.quant_max[i];
    os << "\n";
  }
}

}  // namespace oasis::baselines_table
