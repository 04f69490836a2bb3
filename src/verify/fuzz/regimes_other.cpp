// src/verify/fuzz/regimes_other.cpp — the regimes of normalizer, the psi ops, the depth ops
// (depth, depth_backward, coupling), the pseudo-query ops and the fused AttnRes ops (attn_res,
// attn_res_backward, and Block AttnRes's block_attn_res, block_attn_res_backward): the null at its
// extremes, the estimator at its kink, one or one dominant source, logits at the clamps,
// degenerate RMS norms, a block's first layer (no partial) and a single block.
// docs/fuzz.md gives each regime's bug class.
#include <cmath>
#include <limits>
#include <map>

#include "regimes.hpp"

namespace oasis::verify::fuzz::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- normalizer: rows [B, H, Tq] of Tk logits z and a null logit s per row ----------------------

Dims rows(index_t B, index_t H, index_t R, index_t m) {
  Dims d;
  d.B = B, d.H = H, d.Tq = R, d.Tk = m;
  return d;
}

void gen_normalizer(Case& c, Rng& rng, const std::function<double(index_t row)>& s, double z_level,
                    bool neg_inf_rows) {
  const Dims& d = c.dims;
  c.inputs["z"] = make_tensor(c.dtype, {d.B, d.H, d.Tq, d.Tk}, [&](index_t i) {
    const index_t row = i / d.Tk;
    return neg_inf_rows && row % 3 == 0 ? -kInf : z_level + rng.normal();
  });
  c.inputs["s"] = make_tensor(c.dtype, {d.B, d.H, d.Tq}, [&](index_t row) { return s ? s(row) : rng.normal(); });
}

void add_normalizer(std::vector<Regime>& out) {
  const std::vector<std::string> ops = {"normalizer"};
  const Dims least = rows(1, 1, 1, 1);
  auto reg = [&](std::string name, std::string desc, std::string targets, std::vector<std::pair<std::string, Dims>> v,
                 std::function<void(Case&, int, Rng&)> gen) {
    out.push_back(make_regime(std::move(name), ops, std::move(desc), std::move(targets), {}, std::move(v), least,
                              std::move(gen)));
  };
  reg("typical", "randn logits and null logits", "gross errors only", {{"", rows(1, 2, 32, 64)}},
      [](Case& c, int, Rng& r) { gen_normalizer(c, r, nullptr, 0, false); });
  reg("null_far", "null logits 100 above and 100 below the logits, alternating rows",
      "a null kept out of the max (overflow); a null added linearly", {{"", rows(1, 2, 32, 64)}},
      [](Case& c, int, Rng& r) { gen_normalizer(c, r, [](index_t row) { return row % 2 ? 100.0 : -100.0; }, 0, false); });
  reg("null_infinite", "null logits +inf and -inf, alternating rows", "NaN from inf - inf",
      {{"", rows(1, 2, 16, 64)}},
      [](Case& c, int, Rng& r) { gen_normalizer(c, r, [](index_t row) { return row % 2 ? kInf : -kInf; }, 0, false); });
  reg("masked_rows", "every third row of logits all -inf", "NaN (0/0) on fully masked rows", {{"", rows(1, 2, 32, 64)}},
      [](Case& c, int, Rng& r) { gen_normalizer(c, r, nullptr, 0, true); });
  reg("lse_underflow", "logits near -100, null logits -200: the LSE below f32's e^x underflow (-88.7)",
      "unshifted exponentials; log(sum) in f32", {{"", rows(1, 2, 32, 64)}},
      [](Case& c, int, Rng& r) { gen_normalizer(c, r, [](index_t) { return -200.0; }, -100, false); });
  std::vector<std::pair<std::string, Dims>> v;
  for (index_t m : {1, 63, 64, 65, 127, 128, 129}) v.push_back({"m=" + std::to_string(m), rows(1, 1, 8, m)});
  reg("row_length_boundary", "row lengths at and around 64 and 128", "a partial vector tile read or padded with 0",
      v, [](Case& c, int, Rng& r) { gen_normalizer(c, r, nullptr, 0, false); });
}

// ---- psi and psi_backward: p_null [B, H, T] (or probs [B, H, Tq, Tk] for the mass estimator) ----

void gen_psi(Case& c, Rng& rng, int mode) {
  // mode 0: p_null uniform; 1: p_null exactly 0 or 1; 2: mass estimator, rows of probs summing to
  // 1 up to rounding (psi at its kink 0); 3: mass estimator, random sub-stochastic rows
  const Dims& d = c.dims;
  if (mode <= 1) {
    c.inputs["p_null"] = make_tensor(c.dtype, {d.B, d.H, d.Tq},
                                     [&](index_t i) { return mode == 0 ? rng.uniform() : static_cast<double>(i % 2); });
  } else {
    c.options["estimator"] = "\"mass\"";
    std::vector<double> w(static_cast<std::size_t>(d.Tk));
    io::StoredTensor p = make_tensor(c.dtype, {d.B, d.H, d.Tq, d.Tk}, [](index_t) { return 0.0; });
    for (index_t row = 0; row < d.B * d.H * d.Tq; ++row) {
      double sum = 0;
      for (double& x : w) sum += (x = rng.uniform());
      const double keep = mode == 2 ? 1.0 : rng.uniform();
      for (index_t j = 0; j < d.Tk; ++j)
        p.values[row * d.Tk + j] = io::round_to_dtype(keep * w[static_cast<std::size_t>(j)] / sum, c.dtype);
    }
    c.inputs["probs"] = p;
  }
  if (c.op == "psi_backward") c.inputs["grad_psi"] = randn(c.dtype, {d.B, d.Tq}, rng);
}

void add_psi(std::vector<Regime>& out) {
  const std::vector<std::string> ops = {"psi", "psi_backward"};
  const Dims least = rows(1, 1, 1, 1);
  auto reg = [&](std::string name, std::string desc, std::string targets, Dims start, std::vector<std::string> needs,
                 int mode) {
    out.push_back(make_regime(std::move(name), ops, std::move(desc), std::move(targets), std::move(needs),
                              {{"", start}}, least, [mode](Case& c, int, Rng& r) { gen_psi(c, r, mode); }));
  };
  reg("typical", "p_null uniform in [0, 1] over 4 heads", "the mean over heads (a sum, or the wrong axis)",
      rows(2, 4, 64, 0), {"batch"}, 0);
  reg("p_null_edges", "p_null exactly 0 and 1", "a clamp or a log that breaks at the ends of [0, 1]", rows(1, 4, 64, 0),
      {}, 1);
  reg("one_head", "H = 1", "a mean over H - 1 or an unbiased variance", rows(1, 1, 64, 0), {}, 0);
  reg("mass_at_kink", "mass estimator with rows of probabilities summing to 1 (psi at 0 up to rounding)",
      "a mass estimator that goes negative (no clamp at 0), or a gradient through the clamp", rows(1, 2, 16, 64),
      {"mass"}, 2);
  reg("mass_substochastic", "mass estimator with rows summing to a random fraction of 1", "the mass estimator's sign",
      rows(1, 2, 16, 64), {"mass"}, 3);
}

// ---- the depth ops: sources [L, N, d], logits g_old [L, N], psi [L, N] --------------------------

Dims depth_dims(index_t L, index_t N, index_t d) {
  Dims x;
  x.L = L, x.N = N, x.d = d;
  return x;
}

struct DepthSpec {
  std::function<double(index_t i, index_t t, Rng&)> g;    ///< g_old[i, t] (empty: randn)
  std::function<double(index_t i, index_t t, Rng&)> psi;  ///< psi[i, t] (empty: uniform)
  bool coupling = true;
  std::map<std::string, std::string> options;
  bool grad_alpha = false;
};

void gen_depth(Case& c, const DepthSpec& s, Rng& rng) {
  const Dims& d = c.dims;
  if (c.op != "coupling") c.inputs["sources"] = randn(c.dtype, {d.L, d.N, d.d}, rng);
  c.inputs["g_old"] = make_tensor(c.dtype, {d.L, d.N}, [&](index_t k) {
    return s.g ? s.g(k / d.N, k % d.N, rng) : rng.normal();
  });
  if (s.coupling || c.op == "coupling")
    c.inputs["psi"] = make_tensor(c.dtype, {d.L, d.N}, [&](index_t k) {
      return s.psi ? s.psi(k / d.N, k % d.N, rng) : rng.uniform();
    });
  if (c.op != "coupling") c.options["coupling"] = s.coupling ? "true" : "false";
  for (const auto& [k, v] : s.options) c.options[k] = v;
  if (c.op == "depth_backward") {
    c.inputs["grad_h"] = randn(c.dtype, {d.N, d.d}, rng);
    if (s.grad_alpha) {
      c.inputs["grad_alpha"] = randn(c.dtype, {d.L, d.N}, rng);
      c.inputs["grad_alpha_null"] = randn(c.dtype, {d.N}, rng);
    }
  }
}

void add_depth(std::vector<Regime>& out) {
  const std::vector<std::string> ops = {"depth", "depth_backward", "coupling"};
  const std::vector<std::string> routing = {"depth", "depth_backward"};
  const Dims least = depth_dims(1, 1, 1);
  auto reg = [&](std::string name, std::vector<std::string> o, std::string desc, std::string targets,
                 std::vector<std::string> needs, Dims start, DepthSpec spec) {
    out.push_back(make_regime(std::move(name), std::move(o), std::move(desc), std::move(targets), std::move(needs),
                              {{"", start}}, least, [spec](Case& c, int, Rng& r) { gen_depth(c, spec, r); }));
  };
  reg("typical", ops, "randn logits and sources, psi uniform, coupled (paper v2)", "gross errors only", {"coupling"},
      depth_dims(4, 64, 64), {});
  DepthSpec plain;
  plain.coupling = false;
  reg("uncoupled", routing, "depth softmax1 without the psi coupling (AoS)", "the depth null dropped (softmax, not softmax1)",
      {}, depth_dims(4, 64, 64), plain);
  reg("one_source", ops, "a single source (L = 1: the embedding alone)", "a centring over L - 1, 0/0 in the mean",
      {"coupling"}, depth_dims(1, 32, 64), {});
  DepthSpec dom;
  dom.g = [](index_t i, index_t, Rng& r) { return i == 1 ? 40.0 + r.normal() : r.normal(); };
  reg("dominant_source", ops, "one source 40 above the others (its weight near 1, the null near 0)",
      "a max not subtracted (overflow); the null lost to rounding", {"coupling"}, depth_dims(4, 32, 64), dom);
  DepthSpec eq;
  eq.g = [](index_t, index_t, Rng&) { return 0.0; };
  eq.psi = [](index_t, index_t, Rng&) { return 0.5; };
  reg("equal_logits", ops, "every logit 0 and every psi 0.5 (uniform weights, centred psi 0)",
      "ties broken by index; a centring that divides by a zero spread", {"coupling"}, depth_dims(4, 32, 64), eq);
  DepthSpec clamp;
  clamp.options = {{"profile", "\"authors_code\""}, {"beta", "20"}};
  clamp.g = [](index_t i, index_t t, Rng& r) {
    const double edge[] = {50.0, -50.0, 60.0, -60.0, 49.5};
    return (i + t) % 2 ? edge[static_cast<std::size_t>((i + t) % 5)] : r.normal();
  };
  reg("clamp_edges", ops, "the authors' profile (score clamp 50, beta cap 10) with logits at and past +-50 and beta 20",
      "a clamp that passes its gradient, or clamps the wrong side; beta's cap", {"coupling"}, depth_dims(4, 32, 64), clamp);
  DepthSpec ends;
  ends.psi = [](index_t i, index_t t, Rng&) { return static_cast<double>((i + t) % 2); };
  reg("psi_ends", ops, "psi exactly 0 and 1", "a coupling that breaks at the ends of [0, 1]", {"coupling"},
      depth_dims(4, 32, 64), ends);
  DepthSpec cot;
  cot.grad_alpha = true;
  reg("cotangent_alpha", {"depth_backward"}, "depth_backward with incoming gradients of alpha and alpha_null",
      "the weights' own gradient paths dropped", {"grad_alpha"}, depth_dims(4, 32, 64), cot);
}

// ---- the pseudo-query ops: g = <w, RMSNorm(sources) * gain> ------------------------------------

void gen_pseudo_query(Case& c, Rng& rng, double scale, bool zero_rows, bool gain) {
  const Dims& d = c.dims;
  c.inputs["sources"] = make_tensor(c.dtype, {d.L, d.N, d.d}, [&](index_t i) {
    return zero_rows && (i / d.d) % 3 == 0 ? 0.0 : scale * rng.normal();
  });
  c.inputs["w"] = randn(c.dtype, {d.d}, rng);
  if (gain) c.inputs["gain"] = make_tensor(c.dtype, {d.d}, [&](index_t) { return 1.0 + 0.1 * rng.normal(); });
  if (c.op == "pseudo_query_backward") c.inputs["grad_g"] = randn(c.dtype, {d.L, d.N}, rng);
}

void add_pseudo_query(std::vector<Regime>& out) {
  const std::vector<std::string> ops = {"pseudo_query", "pseudo_query_backward"};
  const Dims least = depth_dims(1, 1, 1);
  auto reg = [&](std::string name, std::string desc, std::string targets, std::vector<std::string> needs,
                 std::vector<std::pair<std::string, Dims>> v, double scale, bool zero_rows, bool gain) {
    out.push_back(make_regime(std::move(name), ops, std::move(desc), std::move(targets), std::move(needs), std::move(v),
                              least, [=](Case& c, int, Rng& r) { gen_pseudo_query(c, r, scale, zero_rows, gain); }));
  };
  reg("typical", "randn sources and w, gain near 1", "gross errors only", {"gain"}, {{"", depth_dims(4, 32, 64)}}, 1,
      false, true);
  reg("no_gain", "no RMSNorm gain", "a gain assumed present", {}, {{"", depth_dims(4, 32, 64)}}, 1, false, false);
  reg("zero_rows", "every third source row all 0 (RMS 0: eps alone)", "eps added outside the root; 0/0",
      {"gain"}, {{"", depth_dims(4, 32, 64)}}, 1, true, true);
  reg("huge_sources", "sources of scale 1e4 (their squares overflow f16)", "the mean of squares accumulated in 16 bits",
      {"gain"}, {{"", depth_dims(4, 32, 64)}}, 1e4, false, true);
  reg("tiny_sources", "sources of scale 1e-4 (RMS near sqrt(eps))", "eps applied twice or not at all", {"gain"},
      {{"", depth_dims(4, 32, 64)}}, 1e-4, false, true);
  std::vector<std::pair<std::string, Dims>> v;
  for (index_t w : {1, 63, 64, 65, 127, 128, 129}) v.push_back({"d=" + std::to_string(w), depth_dims(2, 8, w)});
  reg("width_boundary", "widths d at and around 64 and 128", "a partial vector tile in the norm or the dot product",
      {"gain"}, v, 1, false, true);
}

// ---- the fused AttnRes ops: sources [L, N, d], the pseudo-query w [d], gain [d] -----------------

struct AttnResSpec {
  double w_scale = 0.3;     ///< the pseudo-query's scale (large: peaked weights)
  bool zero_rows = false;   ///< every third source row all 0
  bool coupled = false;     ///< OASIS: softmax1, psi, incoming gradients of alpha and alpha_null
};

void gen_attn_res(Case& c, const AttnResSpec& s, Rng& rng) {
  const Dims& d = c.dims;
  c.inputs["sources"] = make_tensor(c.dtype, {d.L, d.N, d.d}, [&](index_t i) {
    return s.zero_rows && (i / d.d) % 3 == 0 ? 0.0 : rng.normal() * (1.0 + static_cast<double>(i / (d.N * d.d)));
  });
  c.inputs["w"] = randn(c.dtype, {d.d}, rng, s.w_scale);
  c.inputs["gain"] = make_tensor(c.dtype, {d.d}, [&](index_t) { return 1.0 + 0.1 * rng.normal(); });
  if (s.coupled) {
    c.options["normalizer"] = "\"softmax1\"";
    c.options["coupling"] = "true";
    c.inputs["psi"] = make_tensor(c.dtype, {d.L, d.N}, [&](index_t) { return rng.uniform(); });
  }
  if (c.op == "attn_res_backward") {
    c.inputs["grad_h"] = randn(c.dtype, {d.N, d.d}, rng);
    if (s.coupled) {
      c.inputs["grad_alpha"] = randn(c.dtype, {d.L, d.N}, rng);
      c.inputs["grad_alpha_null"] = randn(c.dtype, {d.N}, rng);
    }
  }
}

void add_attn_res(std::vector<Regime>& out) {
  const std::vector<std::string> ops = {"attn_res", "attn_res_backward"};
  const Dims least = depth_dims(1, 1, 1);
  auto reg = [&](std::string name, std::string desc, std::string targets, std::vector<std::string> needs,
                 std::vector<std::pair<std::string, Dims>> v, AttnResSpec spec) {
    out.push_back(make_regime(std::move(name), ops, std::move(desc), std::move(targets), std::move(needs), std::move(v),
                              least, [spec](Case& c, int, Rng& r) { gen_attn_res(c, spec, r); }));
  };
  reg("fused_typical", "fla's AttnRes: randn sources growing with depth, w and gain, softmax over depth",
      "gross errors only; grad_sources without the keys' part", {"gain"}, {{"", depth_dims(4, 32, 64)}}, {});
  reg("fused_coupled", "OASIS: softmax1 with psi, and incoming gradients of alpha and alpha_null",
      "the depth null dropped; the coupling or the weights' gradient paths dropped", {"gain", "coupling", "grad_alpha"},
      {{"", depth_dims(4, 32, 64)}}, {0.3, false, true});
  reg("fused_peaked", "a pseudo-query of scale 4 (one weight near 1)", "a max not subtracted (overflow)", {"gain"},
      {{"", depth_dims(4, 32, 64)}}, {4.0, false, false});
  reg("fused_zero_rows", "every third source row all 0 (RMS 0: eps alone, logit 0)", "eps outside the root; 0/0",
      {"gain"}, {{"", depth_dims(4, 32, 64)}}, {0.3, true, false});
  std::vector<std::pair<std::string, Dims>> v;
  for (index_t w : {1, 63, 64, 65, 127, 128, 129}) v.push_back({"d=" + std::to_string(w), depth_dims(3, 8, w)});
  reg("fused_width_boundary", "widths d at and around 64 and 128", "a partial vector tile in the norm, the dot or the mix",
      {"gain"}, v, {});
}

// ---- Block AttnRes: blocks [L, N, d] (b_0 .. b_{L-1}), the partial b_n^{i-1} [N, d], w, gain ---

struct BlockSpec {
  double base = 2.0;       ///< block k's scale is 1 + (base - 1) k for base <= 2, base^k above (sums over sublayers)
  bool coupled = false;    ///< OASIS: softmax1, psi, incoming gradients of alpha and alpha_null
};

/// Variant 0: a layer after its block's first (the partial present, the last source); variant 1: a
/// block's first layer (the blocks alone).
void gen_block_attn_res(Case& c, const BlockSpec& s, int variant, Rng& rng) {
  const Dims& d = c.dims;
  const bool partial = variant == 0;
  const index_t n = d.L + (partial ? 1 : 0);
  auto block_scale = [&](index_t k) {
    const double x = static_cast<double>(k);
    return s.base <= 2.0 ? 1.0 + (s.base - 1.0) * x : std::pow(s.base, x);
  };
  c.inputs["blocks"] = make_tensor(c.dtype, {d.L, d.N, d.d}, [&](index_t i) { return rng.normal() * block_scale(i / (d.N * d.d)); });
  // the partial sums fewer sublayers than a completed block: half the last block's scale
  if (partial) c.inputs["partial"] = randn(c.dtype, {d.N, d.d}, rng, 0.5 * block_scale(d.L - 1));
  c.inputs["w"] = randn(c.dtype, {d.d}, rng, 0.3);
  c.inputs["gain"] = make_tensor(c.dtype, {d.d}, [&](index_t) { return 1.0 + 0.1 * rng.normal(); });
  if (s.coupled) {
    c.options["normalizer"] = "\"softmax1\"";
    c.options["coupling"] = "true";
    c.inputs["psi"] = make_tensor(c.dtype, {n, d.N}, [&](index_t) { return rng.uniform(); });
  }
  if (c.op == "block_attn_res_backward") {
    c.inputs["grad_h"] = randn(c.dtype, {d.N, d.d}, rng);
    if (s.coupled) {
      c.inputs["grad_alpha"] = randn(c.dtype, {n, d.N}, rng);
      c.inputs["grad_alpha_null"] = randn(c.dtype, {d.N}, rng);
    }
  }
}

void add_block_attn_res(std::vector<Regime>& out) {
  const std::vector<std::string> ops = {"block_attn_res", "block_attn_res_backward"};
  const Dims least = depth_dims(1, 1, 1);
  auto reg = [&](std::string name, std::string desc, std::string targets, std::vector<std::string> needs, index_t m,
                 BlockSpec spec) {
    out.push_back(make_regime(std::move(name), ops, std::move(desc), std::move(targets), std::move(needs),
                              {{"partial", depth_dims(m, 32, 64)}, {"first_layer", depth_dims(m, 32, 64)}}, least,
                              [spec](Case& c, int variant, Rng& r) { gen_block_attn_res(c, spec, variant, r); }));
  };
  reg("block_typical", "Kimi's Block AttnRes: 4 block summaries growing with depth, the partial (or none: a block's first layer)",
      "the partial dropped or its weight not alpha's last row; its gradient the mix only; a block's gradient in the wrong block",
      {"gain"}, 4, {});
  reg("block_coupled", "OASIS on blocks: softmax1 with psi over the blocks and the partial, incoming gradients of alpha",
      "psi's or grad_alpha's rows misaligned with the stack (the partial's row not the last); the depth null dropped",
      {"gain", "coupling", "grad_alpha"}, 4, {2.0, true});
  reg("block_one_block", "m = 1: the embedding b_0 and the first block's partial, or the embedding alone",
      "a loop over m - 1 blocks; a softmax over one source", {"gain"}, 1, {});
  reg("block_large_sums", "block summaries of scale 16^k (sums over many sublayers), the partial half the last",
      "the mean of squares in 16 bits (overflow); the mix's large terms against the small", {"gain"}, 3,
      {16.0, false});
}

}  // namespace

void add_other_regimes(std::vector<Regime>& out) {
  add_normalizer(out);
  add_psi(out);
  add_depth(out);
  add_pseudo_query(out);
  add_attn_res(out);
  add_block_attn_res(out);
}

}  // namespace oasis::verify::fuzz::detail
