// src/verify/figures.cpp — the figures of a model trace (oasis/verify/figures.hpp).
//
// Every number is a library metric on a trace tensor (oasis/research/metrics.hpp) or a mean over
// batch and tokens; the layer structure (attention sublayers, routers and their candidates) is
// the configured model's wiring (oasis/model/wiring.hpp).
#include "oasis/verify/figures.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "oasis/core/error.hpp"
#include "oasis/io/json.hpp"
#include "oasis/model/config.hpp"
#include "oasis/model/wiring.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/research/metrics.hpp"
#include "oracle_arithmetic.hpp"

namespace oasis::verify {
namespace {

namespace om = oasis::model;

std::string num(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

/// The trace's tensors, each checked for the shape the configuration gives it; the first one
/// a figure needs and the trace lacks is remembered.
class Reader {
 public:
  explicit Reader(const io::TensorMap& trace) : trace_(trace) {}
  /// `name` with `want` its shape (-1: any extent); nullptr when absent.
  const Tensor<double>* get(const std::string& name, const Shape& want, const std::string& doc) {
    const auto it = trace_.find(name);
    if (it == trace_.end()) {
      if (missing_.empty()) missing_ = name + " " + doc;
      return nullptr;
    }
    const Tensor<double>& x = it->second.values;
    bool ok = x.rank() == static_cast<index_t>(want.size());
    for (std::size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || x.dim(static_cast<index_t>(d)) == want[d];
    OASIS_REQUIRE(ok && x.size() > 0, name, "has shape ", shape_str(x.shape()), "; the configured model's is ", doc);
    return &x;
  }
  /// "<figure>: the trace lacks <tensor>" after a figure's reads failed (then reset), else empty.
  std::optional<std::string> lacking(const std::string& figure) {
    if (missing_.empty()) return std::nullopt;
    std::string m = figure + ": the trace lacks " + missing_;
    missing_.clear();
    return m;
  }

 private:
  const io::TensorMap& trace_;
  std::string missing_;
};

/// Mean of x[first .. first + count) (flat).
double mean_of(const Tensor<double>& x, index_t first, index_t count) {
  double s = 0;
  for (index_t i = first; i < first + count; ++i) s += x[i];
  return s / static_cast<double>(count);
}

/// A library metric on a trace tensor, its errors naming the tensor.
template <class F>
double metric(const std::string& name, F f) {
  try {
    return f();
  } catch (const invalid_argument& e) {
    throw invalid_argument(name, e.what());
  }
}

std::string attn(index_t b) { return "layers." + std::to_string(b) + ".attn"; }

void null_mass_figure(const om::ModelConfig& c, Reader& rd, FigureSet& out) {
  FigureTable f{"null_mass", "Token null mass per layer and head (the sink map)",
                "Mean of p_null over the batch and the queries (oasis::null_mass) of every attention layer and head, read "
                "from layers.{b}.attn.p_null: the mass a head gives the null instead of a real key. The paper's Figures 2 "
                "and 4 show the first-token sinks this mass stands in for.",
                "heatmap", {"layer", "head", "null_mass"}, {}};
  const index_t H = c.n_heads;
  for (index_t b = 0; b < c.n_blocks; ++b) {
    const Tensor<double>* p = rd.get(attn(b) + ".p_null", {-1, H, -1}, "[B, H, T]");
    if (!p) continue;
    const index_t B = p->dim(0), T = p->dim(2);
    for (index_t h = 0; h < H; ++h) {
      Tensor<double> one({B, 1, T});
      for (index_t bb = 0; bb < B; ++bb)
        for (index_t t = 0; t < T; ++t) one(bb, 0, t) = (*p)(bb, h, t);
      f.rows.push_back({std::to_string(b), std::to_string(h), num(metric(attn(b) + ".p_null", [&] { return null_mass(one); }))});
    }
  }
  if (auto m = rd.lacking(f.name)) out.left_out.push_back(*m);
  else out.figures.push_back(std::move(f));
}

void depth_figure(const om::ModelConfig& c, const om::ModelWiring& w, Reader& rd, FigureSet& out) {
  if (w.routers.empty()) {
    out.left_out.push_back("depth_weights: the model has no depth routers (router " + std::string(om::to_string(c.router)) + ")");
    return;
  }
  FigureTable f{"depth_weights", "Depth weights per router over its sources",
                "Mean over the batch and the tokens of alpha (each source) and alpha_null (the depth null, column null) of "
                "every router, read from <router>.alpha and <router>.alpha_null; source 0 is the embedding, the names are "
                "the configured wiring's.",
                "heatmap", {"router", "source", "weight", "name"}, {}};
  for (const om::WiredRouter& r : w.routers) {
    const index_t n = static_cast<index_t>(r.candidates.size());
    const Tensor<double>* a = rd.get(r.trace + ".alpha", {n, -1, -1}, "[n = " + std::to_string(n) + ", B, T]");
    const Tensor<double>* an = rd.get(r.trace + ".alpha_null", {-1, -1}, "[B, T]");
    if (!a || !an) continue;
    const index_t N = a->size() / n;
    for (index_t i = 0; i < n; ++i)
      f.rows.push_back({r.trace, std::to_string(i), num(mean_of(*a, i * N, N)), r.candidates[static_cast<std::size_t>(i)].name});
    f.rows.push_back({r.trace, "null", num(mean_of(*an, 0, an->size())), "depth null"});
  }
  if (auto m = rd.lacking(f.name)) out.left_out.push_back(*m);
  else out.figures.push_back(std::move(f));
}

void psi_figure(const om::ModelConfig& c, Reader& rd, FigureSet& out) {
  FigureTable f{"psi", "psi per layer",
                "The null statistic psi of every attention layer (the mean over heads of p_null, docs/spec.md §3), "
                "averaged over the batch and the tokens, read from layers.{b}.attn.branch_psi.",
                "lines", {"layer", "psi"}, {}};
  for (index_t b = 0; b < c.n_blocks; ++b)
    if (const Tensor<double>* p = rd.get(attn(b) + ".branch_psi", {-1, -1}, "[B, T]"))
      f.rows.push_back({std::to_string(b), num(mean_of(*p, 0, p->size()))});
  if (auto m = rd.lacking(f.name)) out.left_out.push_back(*m);
  else out.figures.push_back(std::move(f));
}

void outlier_figure(const om::ModelConfig& c, const om::ModelWiring& w, Reader& rd, FigureSet& out) {
  FigureTable f{"outliers", "Kurtosis and max |x| of the residual stream per sublayer",
                "Reproduces the paper's Figure 3 (hidden-state kurtosis, left, and infinity norm, right, across layers): "
                "for every sublayer the state it reads (<sublayer>.input; with AttnRes the routed state), its regularised "
                "kurtosis (oasis::kurtosis_regularised, the form of the paper's Tables 1-3) and max |x| "
                "(oasis::max_inf_norm), each per sequence and averaged over the batch.",
                "lines", {"sublayer", "kurtosis", "max_abs"}, {}};
  const Shape want{-1, -1, c.d_model};
  for (const om::WiredSublayer& s : w.sublayers) {
    const std::string name = s.name + ".input";
    if (const Tensor<double>* x = rd.get(name, want, "[B, T, d_model]"))
      f.rows.push_back({s.name, num(metric(name, [&] { return kurtosis_regularised(*x); })),
                        num(metric(name, [&] { return max_inf_norm(*x); }))});
  }
  if (auto m = rd.lacking(f.name)) out.left_out.push_back(*m);
  else out.figures.push_back(std::move(f));
}

/// [B, T, Hx dh] -> [B, Hx, T, dh].
Tensor<double> heads_of(const Tensor<double>& x, index_t Hx, index_t dh) {
  const index_t B = x.dim(0), T = x.dim(1);
  Tensor<double> r({B, Hx, T, dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < Hx; ++h)
      for (index_t t = 0; t < T; ++t)
        for (index_t k = 0; k < dh; ++k) r(b, h, t, k) = x[(b * T + t) * Hx * dh + h * dh + k];
  return r;
}

void sink_figure(const om::ModelConfig& c, Reader& rd, FigureSet& out) {
  if (c.prefix_sink) {
    out.left_out.push_back("sink_rate: the prefix sink's attention over [sink; keys] is not recomputed from the trace");
    return;
  }
  FigureTable f{"sink_rate", "Sink rate per layer",
                "Fraction of (sequence, head) pairs of every attention layer whose first-key importance (1/T) sum_t p_{t,0} "
                "exceeds 0.3 (oasis::sink_rate, Gu et al. 2025), the probabilities recomputed by the model's token "
                "attention from layers.{b}.attn.attn_q and attn_k.",
                "lines", {"layer", "sink_rate"}, {}};
  const index_t H = c.n_heads, Hkv = c.kv_heads(), dh = c.head_dim();
  for (index_t b = 0; b < c.n_blocks; ++b) {
    const Tensor<double>* q = rd.get(attn(b) + ".attn_q", {-1, -1, H * dh}, "[B, T, H d_h]");
    const Tensor<double>* k = rd.get(attn(b) + ".attn_k", {-1, -1, Hkv * dh}, "[B, T, H_kv d_h]");
    if (!q || !k) continue;
    OASIS_REQUIRE(k->dim(0) == q->dim(0) && k->dim(1) == q->dim(1), attn(b) + ".attn_k", "has shape ", shape_str(k->shape()),
                  " but attn_q has ", shape_str(q->shape()));
    AttentionOptions ao;  // as oasis::model::attention_core: the variant's normaliser, causal, scale 1/sqrt(d_h)
    ao.normalizer = c.token_norm();
    ao.causal = true;
    ao.return_probs = true;
    const Tensor<double> v({k->dim(0), Hkv, k->dim(1), 1});  // zeros: only the probabilities are used
    const AttentionResult<double> r = token_attention(heads_of(*q, H, dh), heads_of(*k, Hkv, dh), v, ao);
    f.rows.push_back({std::to_string(b), num(metric(attn(b) + ".attn_q", [&] { return sink_rate(std::vector{r.probs}); }))});
  }
  if (auto m = rd.lacking(f.name)) out.left_out.push_back(*m);
  else out.figures.push_back(std::move(f));
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  OASIS_REQUIRE(static_cast<bool>(f), "out", "cannot write '", p.string(), "'");
}

}  // namespace

FigureSet model_figures(const om::ModelConfig& config, const io::TensorMap& trace) {
  const detail::OracleArithmetic arithmetic;
  const om::ModelWiring w = om::model_wiring(config);
  Reader rd(trace);
  FigureSet out;
  null_mass_figure(config, rd, out);
  depth_figure(config, w, rd, out);
  psi_figure(config, rd, out);
  outlier_figure(config, w, rd, out);
  sink_figure(config, rd, out);
  return out;
}

void write_figure_tables(const FigureSet& f, const std::string& dir) {
  namespace fs = std::filesystem;
  OASIS_REQUIRE(!dir.empty(), "out", "needs a directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  OASIS_REQUIRE(fs::is_directory(dir), "out", "cannot create the directory '", dir, "'", ec ? ": " + ec.message() : "");
  using io::json::quote;
  std::string js = "{\"figures\":[";
  for (std::size_t i = 0; i < f.figures.size(); ++i) {
    const FigureTable& t = f.figures[i];
    std::string csv;
    for (std::size_t k = 0; k < t.columns.size(); ++k) csv += (k ? "," : "") + csv_cell(t.columns[k]);
    csv += "\n";
    for (const auto& row : t.rows) {
      for (std::size_t k = 0; k < row.size(); ++k) csv += (k ? "," : "") + csv_cell(row[k]);
      csv += "\n";
    }
    write_file(fs::path(dir) / (t.name + ".csv"), csv);
    js += std::string(i ? "," : "") + "{\"name\":" + quote(t.name) + ",\"title\":" + quote(t.title) +
          ",\"caption\":" + quote(t.caption) + ",\"kind\":" + quote(t.kind) + ",\"columns\":[";
    for (std::size_t k = 0; k < t.columns.size(); ++k) js += (k ? "," : "") + quote(t.columns[k]);
    js += "]}";
  }
  js += "],\"left_out\":[";
  for (std::size_t i = 0; i < f.left_out.size(); ++i) js += (i ? "," : "") + quote(f.left_out[i]);
  write_file(fs::path(dir) / "figures.json", js + "]}\n");
}

}  // namespace oasis::verify
