// src/verify/op_depth.cpp — ops "coupling" (g = g_old - beta Dpsi), "depth" (the coupled depth
// router h = sum_i alpha_i s_i) (docs/spec.md §3–4) and "attn_res" (the fused AttnRes routing: the
// logits g_old = scale w^T RMSNorm(s_i) computed by the kernel itself, then depth), checked token by
// token: the fast oracle routes each token in double (the reference's own arithmetic, its
// worst-case bound at u = 2^-53 folded into each decision), the mp50 oracle routes a one-token
// problem in mp50.
#include <cmath>
#include <functional>
#include <map>

#include "attn_res_support.hpp"
#include "ops.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"
#include "oasis/ops/prob_bounds.hpp"

namespace oasis::verify::detail {

namespace {

using bounds::Precision;

/// One token of a depth-routing call: the reference and the u-free pieces of its bounds
/// (oasis/ops/error_bounds.hpp depth_token_bound and oasis/ops/prob_bounds.hpp at u = 1), assembled per
/// precision as in attention_oracle.hpp.
struct TokenRow {
  index_t t = 0;
  bool exact = false;
  std::vector<double> g, dpsi, alpha, h;
  double alpha_null = 0;
  std::vector<mp50> g_mp, dpsi_mp, alpha_mp, h_mp;
  mp50 alpha_null_mp;
  bounds::DepthTokenBound tb;
  bounds::ProbRow pr;
  std::vector<double> G1, V1, absv, hR, rho_h;
  double rho = 0;
  /// attn_res: the logits' error's part of rb.p, rb.p_null and G1 (at u = 1), the probabilistic
  /// bound's deterministic term
  std::vector<double> dgp, dgh;
  double dgp_null = 0;
};

struct DepthCall {
  const Tensor<double>* sources;  ///< null for op coupling
  const Tensor<double>& g_old;
  const Tensor<double>& psi;
  const std::vector<SourceKind>& kinds;
  const DepthOptions& opt;
  index_t n, N, d;
  bounds::BetaBound beta1;        ///< beta and its error at u = 1
  const Tensor<double>* g_err1 = nullptr;                ///< attn_res: the kernel's logit error at u = 1 [n, N]
  std::function<Tensor<mp50>(index_t t)> exact_logits;   ///< attn_res: token t's exact logits [n, 1]
};

enum class Kind { h, alpha, alpha_null, g, dpsi };

/// The pieces of a token whose reference g, dpsi, alpha, alpha_null (and h) are set; the mixing
/// sums over the sources when there are sources.
void token_pieces(const DepthCall& c, TokenRow& r, const double* psi) {
  std::vector<double> ge;
  if (c.g_err1)
    for (index_t i = 0; i < c.n; ++i) ge.push_back((*c.g_err1)(i, r.t));
  r.tb = bounds::depth_token_bound(Precision{1.0, 0.0}, c.beta1, psi, c.kinds, c.opt, r.g.data(), r.dpsi.data(),
                                   r.alpha.data(), r.alpha_null, ge.empty() ? nullptr : ge.data());
  r.dgp.assign(static_cast<std::size_t>(c.n), 0.0);
  if (!ge.empty()) {  // the worst-case line's part from the logits' error: with it minus without it
    const bounds::DepthTokenBound t0 = bounds::depth_token_bound(Precision{1.0, 0.0}, c.beta1, psi, c.kinds, c.opt,
                                                                 r.g.data(), r.dpsi.data(), r.alpha.data(), r.alpha_null);
    for (std::size_t i = 0; i < r.dgp.size(); ++i) r.dgp[i] = std::max(0.0, r.tb.rb.p[i] - t0.rb.p[i]);
    r.dgp_null = std::max(0.0, r.tb.rb.p_null - t0.rb.p_null);
  }
  r.pr = bounds::prob_depth_row(r.tb, c.beta1, c.opt, r.g.data(), r.dpsi.data(), r.alpha.data(), r.alpha_null);
  r.rho = 4.0 * r.tb.rb.rel_max * oasis::unit_roundoff<double>() + 1e-9;
  if (!c.sources) return;
  const std::size_t d = static_cast<std::size_t>(c.d);
  std::vector<double> X1(d, 0.0), X2(d, 0.0), Y2(d, 0.0);
  r.G1.assign(d, 0.0);
  r.V1 = r.absv = r.hR = r.rho_h = r.dgh = r.G1;
  double sw = 0, sp = 0;
  for (index_t i = 0; i < c.n; ++i) {
    const auto iu = static_cast<std::size_t>(i);
    const double a = r.alpha[iu], w = a * a * r.pr.kappa2[iu], gp = r.tb.rb.p[iu];
    sw += w;
    sp += a;
    const double* si = c.sources->ptr(i, r.t);
    for (std::size_t x = 0; x < d; ++x) {
      const double v = si[x], av = std::abs(v);
      r.V1[x] += a * av;
      r.G1[x] += gp * av;
      r.dgh[x] += r.dgp[iu] * av;
      r.absv[x] += av;
      X1[x] += w * v;
      X2[x] += (w + a * a) * v * v;
      Y2[x] += a * v * v;
    }
  }
  const Precision dp = Precision::of<double>();
  for (std::size_t x = 0; x < d; ++x) {
    const double A = r.h[x];
    r.hR[x] = bounds::prob_mix_from_sums(r.pr, r.alpha_null, A, r.V1[x], X1[x], X2[x], sw, Y2[x], sp);
    const double eA = bounds::kSecondOrder * (dp.u * (r.G1[x] + static_cast<double>(c.n) * r.V1[x]) + dp.p_floor * r.absv[x]) +
                      bounds::underflow_floor(dp, c.n);
    const double mag = X2[x] + 2.0 * std::abs(A * X1[x]) + A * A * sw + A * A * (2.0 + sp) +
                       r.pr.sigma * r.pr.sigma * sp * (Y2[x] + A * A * (2.0 + sp));
    const double R2 = r.hR[x] * r.hR[x];
    r.rho_h[x] = r.rho + 4.0 * eA / std::max(r.V1[x] + std::abs(A), std::numeric_limits<double>::min()) +
                 (R2 > 0 ? bounds::mix_cancellation(c.n) * mag / R2 : 0.0);
  }
}

/// The fast oracle: the reference routing in double for token t.
TokenRow fast_token(const DepthCall& c, index_t t) {
  TokenRow r;
  r.t = t;
  Vec<double> g(c.n), ps(c.n);
  for (index_t i = 0; i < c.n; ++i) {
    g[i] = c.g_old(i, t);
    ps[i] = c.psi(i, t);
  }
  const DepthWeights<double> w = depth_weights(g, ps, c.kinds, c.opt);
  r.g.assign(w.g.data(), w.g.data() + c.n);
  r.dpsi.assign(w.dpsi.data(), w.dpsi.data() + c.n);
  r.alpha.assign(w.alpha.data(), w.alpha.data() + c.n);
  r.alpha_null = w.alpha_null;
  if (c.sources) {
    r.h.assign(static_cast<std::size_t>(c.d), 0.0);
    for (index_t i = 0; i < c.n; ++i) {
      const double a = r.alpha[static_cast<std::size_t>(i)];
      const double* si = c.sources->ptr(i, t);
      for (index_t x = 0; x < c.d; ++x) r.h[static_cast<std::size_t>(x)] += a * si[x];
    }
  }
  token_pieces(c, r, ps.data());
  return r;
}

/// The mp50 oracle for token t (the routing of a one-token problem).
TokenRow mp50_token(const DepthCall& c, index_t t) {
  TokenRow r;
  r.t = t;
  r.exact = true;
  const index_t d = c.sources ? c.d : 1;
  Tensor<mp50> src({c.n, 1, d}), g({c.n, 1}), ps({c.n, 1});
  std::vector<double> psd(static_cast<std::size_t>(c.n));
  for (index_t i = 0; i < c.n; ++i) {
    g(i, 0) = mp50(c.g_old(i, t));
    ps(i, 0) = mp50(c.psi(i, t));
    psd[static_cast<std::size_t>(i)] = c.psi(i, t);
    if (c.sources)
      for (index_t x = 0; x < d; ++x) src(i, 0, x) = mp50((*c.sources)(i, t, x));
  }
  if (c.exact_logits) g = c.exact_logits(t);
  const DepthRoute<mp50> ref = attn_res_route(src, g, ps, c.kinds, c.opt);
  auto copy = [&](const Tensor<mp50>& from, std::vector<mp50>& mp, std::vector<double>& dd, index_t count, bool column) {
    mp.resize(static_cast<std::size_t>(count));
    dd.resize(mp.size());
    for (index_t i = 0; i < count; ++i) {
      mp[static_cast<std::size_t>(i)] = column ? from(i, 0) : from(0, i);
      dd[static_cast<std::size_t>(i)] = static_cast<double>(mp[static_cast<std::size_t>(i)]);
    }
  };
  copy(ref.g, r.g_mp, r.g, c.n, true);
  copy(ref.dpsi, r.dpsi_mp, r.dpsi, c.n, true);
  copy(ref.alpha, r.alpha_mp, r.alpha, c.n, true);
  r.alpha_null_mp = ref.alpha_null[0];
  r.alpha_null = static_cast<double>(r.alpha_null_mp);
  if (c.sources) copy(ref.h, r.h_mp, r.h, d, false);
  token_pieces(c, r, psd.data());
  r.rho = 0;
  std::fill(r.rho_h.begin(), r.rho_h.end(), 0.0);
  return r;
}

struct Target {
  Kind kind;
  std::string name;
  const StoredTensor* got;
  Precision pr;
  DType in = DType::f32;  ///< a 16-bit type of the inputs: every intermediate may be stored in it (policies.md)
};

index_t elems_per_token(const DepthCall& c, Kind k) { return k == Kind::h ? c.d : k == Kind::alpha_null ? 1 : c.n; }

bool judge(const DepthCall& c, const TokenRow& r, const Target& tg, index_t e, Policy policy, TensorCheck& chk) {
  static const Precision dp = Precision::of<double>();
  const auto eu = static_cast<std::size_t>(e);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double hi = 0, wc = 0, own = 0, prob = nan, mix = 0, rho = r.rho;
  const mp50* exact = nullptr;
  index_t flat = 0;
  const bool null = c.opt.normalizer == RowNorm::softmax1;
  switch (tg.kind) {
    case Kind::h: {
      hi = r.h[eu];
      if (r.exact) exact = &r.h_mp[eu];
      auto hb = [&](const Precision& p) {
        return bounds::kSecondOrder * (p.u * (r.G1[eu] + static_cast<double>(c.n) * r.V1[eu]) + p.p_floor * r.absv[eu]) +
               bounds::underflow_floor(p, c.n);
      };
      wc = hb(tg.pr);
      own = hb(dp);
      prob = bounds::kSecondOrder * (kLambda * tg.pr.u * r.hR[eu] + tg.pr.u * r.dgh[eu]) + tg.pr.p_floor * r.absv[eu] +
             bounds::underflow_floor(tg.pr, c.n);
      mix = r.V1[eu];
      rho = r.rho_h[eu];
      flat = r.t * c.d + e;
      break;
    }
    case Kind::alpha:
      hi = r.alpha[eu];
      if (r.exact) exact = &r.alpha_mp[eu];
      wc = tg.pr.u * r.tb.rb.p[eu] + tg.pr.p_floor;
      own = dp.u * r.tb.rb.p[eu] + dp.p_floor;
      prob = bounds::kSecondOrder * kLambda * tg.pr.u * r.pr.p[eu] + tg.pr.u * r.dgp[eu] + tg.pr.p_floor;
      flat = e * c.N + r.t;
      break;
    case Kind::alpha_null:
      hi = r.alpha_null;
      if (r.exact) exact = &r.alpha_null_mp;
      if (null) {
        wc = tg.pr.u * r.tb.rb.p_null + tg.pr.p_floor;
        own = dp.u * r.tb.rb.p_null + dp.p_floor;
        prob = bounds::kSecondOrder * kLambda * tg.pr.u * r.pr.p_null + tg.pr.u * r.dgp_null + tg.pr.p_floor;
      } else {
        prob = 0;
      }
      flat = r.t;
      break;
    case Kind::g:
      hi = r.g[eu];
      if (r.exact) exact = &r.g_mp[eu];
      wc = tg.pr.u * r.tb.g[eu];
      own = dp.u * r.tb.g[eu];
      flat = e * c.N + r.t;
      break;
    case Kind::dpsi:
      hi = r.dpsi[eu];
      if (r.exact) exact = &r.dpsi_mp[eu];
      wc = tg.pr.u * r.tb.dpsi[eu];
      own = dp.u * r.tb.dpsi[eu];
      flat = e * c.N + r.t;
      break;
  }
  RefValue ref{hi, 0.0, r.exact ? 0.0 : own, exact};
  if (exact && std::isfinite(hi)) ref.lo = static_cast<double>(*exact - mp50(hi));
  return chk.add(flat, ref,
                 allowed_terms(tg.got->dtype, policy, wc, prob, tg.kind == Kind::h ? mix : 0.0, r.exact ? 0.0 : rho, tg.in));
}

CompareReport route_report(const std::string& op, const DepthCall& c, const std::map<std::string, std::pair<Kind, Shape>>& known,
                           const TensorMap& out, const CompareOptions& copt, DType in16);

CompareReport run_depth(const std::string& op, const OpCall& call) {
  const TensorMap &in = call.inputs, &out = call.outputs;
  const Options& o = call.options;
  const CompareOptions& copt = call.compare;
  const bool coupling_only = op == "coupling";
  const StoredTensor& g_old = need(in, "g_old", op);
  require_rank(g_old.values, 2, "g_old", "[n, N]");
  const index_t n = g_old.values.dim(0), N = g_old.values.dim(1);
  const Tensor<double>* sources = coupling_only ? nullptr : &need(in, "sources", op).values;
  DepthOptions dopt = parse_depth_options(o, true);
  if (coupling_only) OASIS_REQUIRE(dopt.coupling, "coupling", "op coupling always couples");
  Tensor<double> psi_zero;
  const Tensor<double>* psi = nullptr;
  if (const StoredTensor* p = maybe(in, "psi")) psi = &p->values;
  else {
    OASIS_REQUIRE(!dopt.coupling, "psi", "op ", op, " with coupling needs input tensor 'psi' [n, N]");
    psi_zero = Tensor<double>(Shape{n, N});
    psi = &psi_zero;
  }
  const std::vector<SourceKind> kinds = parse_kinds(o, n);
  index_t d = 1;
  if (sources) {
    check_route_shapes(*sources, g_old.values, *psi, kinds);
    require_finite(*sources, "sources");
    d = sources->dim(2);
  } else {
    OASIS_REQUIRE(psi->shape() == g_old.values.shape(), "psi", "shape ", shape_str(psi->shape()), " does not match g_old ",
                  shape_str(g_old.values.shape()));
    OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(), " entries, the inputs have n = ", n);
  }
  const DepthCall c{sources, g_old.values, *psi, kinds, dopt, n, N, d, bounds::beta_bound(dopt, 1.0)};

  std::map<std::string, std::pair<Kind, Shape>> known = {{"g", {Kind::g, {n, N}}}, {"dpsi", {Kind::dpsi, {n, N}}}};
  if (!coupling_only) {
    known["h"] = {Kind::h, {N, d}};
    known["alpha"] = {Kind::alpha, {n, N}};
    known["alpha_null"] = {Kind::alpha_null, {N}};
  }
  return route_report(op, c, known, out, copt, input16({coupling_only ? DType::f32 : need(in, "sources", op).dtype, g_old.dtype}));
}

/// Judges the outputs of `out` named in `known` token by token (the fast oracle, then mp50 for the
/// tokens it leaves undecided; `in16`: the inputs' 16-bit type).
CompareReport route_report(const std::string& op, const DepthCall& c, const std::map<std::string, std::pair<Kind, Shape>>& known,
                           const TensorMap& out, const CompareOptions& copt, DType in16) {
  const index_t n = c.n, N = c.N, d = c.d;
  CompareReport rep;
  rep.op = op;
  std::vector<Target> targets;
  std::vector<std::size_t> slot;
  for (const auto& [name, t] : out) {
    auto it = known.find(name);
    if (it == known.end()) continue;  // an input held in the same file
    if (t.values.shape() != it->second.second) {
      rep.tensors.push_back(shape_mismatch(name, t, it->second.second));
      continue;
    }
    targets.push_back({it->second.first, name, &t, t.dtype == DType::f64 ? Precision::flushing<double>() : Precision::flushing<float>(),
                       in16});
    slot.push_back(rep.tensors.size());
    rep.tensors.emplace_back();
  }
  const std::vector<index_t> tokens = sample_rows(N, copt.sample, copt.seed);
  auto fresh = [&] {
    std::vector<TensorCheck> v;
    for (const Target& t : targets) v.emplace_back(t.name, *t.got, copt.show);
    return v;
  };
  std::vector<TensorCheck> checks = fresh();
  struct Open { index_t token, target, elem; };
  std::vector<Open> open;
  const bool mp = copt.oracle == Oracle::mp50;
  const double work = static_cast<double>(tokens.size()) * static_cast<double>(n) * static_cast<double>(d);
#pragma omp parallel if (tokens.size() > 1 && (mp || work > 1e6))
  {
    std::vector<TensorCheck> mine = fresh();
    std::vector<Open> undecided;
#pragma omp for schedule(dynamic, 16)
    for (std::size_t x = 0; x < tokens.size(); ++x) {
      const TokenRow r = mp ? mp50_token(c, tokens[x]) : fast_token(c, tokens[x]);
      for (std::size_t ti = 0; ti < targets.size(); ++ti)
        for (index_t e = 0; e < elems_per_token(c, targets[ti].kind); ++e)
          if (!judge(c, r, targets[ti], e, copt.policy, mine[ti])) undecided.push_back({tokens[x], static_cast<index_t>(ti), e});
    }
#pragma omp critical(oasis_depth_merge)
    {
      for (std::size_t i = 0; i < checks.size(); ++i) checks[i].merge(mine[i]);
      open.insert(open.end(), undecided.begin(), undecided.end());
    }
  }
  const auto spans = group_by(open, [](const Open& x) { return x.token; });  // [first, last) per token
#pragma omp parallel if (spans.size() > 1)
  {
    std::vector<TensorCheck> mine = fresh();
#pragma omp for schedule(dynamic, 1)
    for (std::size_t x = 0; x < spans.size(); ++x) {
      const TokenRow r = mp50_token(c, open[spans[x].first].token);
      for (std::size_t y = spans[x].first; y < spans[x].second; ++y)
        (void)judge(c, r, targets[static_cast<std::size_t>(open[y].target)], open[y].elem, copt.policy,
                    mine[static_cast<std::size_t>(open[y].target)]);
    }
#pragma omp critical(oasis_depth_merge)
    for (std::size_t i = 0; i < checks.size(); ++i) checks[i].merge(mine[i]);
  }
  rep.oracle = mp ? "mp50"
                  : "fast (double, its own error bound folded in; " + std::to_string(spans.size()) + " of " +
                        std::to_string(tokens.size()) + " tokens recomputed in mp50)";
  for (std::size_t ti = 0; ti < targets.size(); ++ti) {
    const Kind k = targets[ti].kind;
    rep.tensors[slot[ti]] = checks[ti].finish(bound_name(targets[ti].got->dtype, copt.policy, k == Kind::h || k == Kind::alpha || k == Kind::alpha_null, k == Kind::h, targets[ti].in));
  }
  if (copt.sample > 0 && copt.sample < N) {
    rep.sample.rows = static_cast<index_t>(tokens.size());
    rep.sample.total = N;
    rep.sample.seed = copt.seed;
    rep.sample.row_kind = "(token)";
    for (index_t t : tokens) rep.sample.which.push_back("(" + std::to_string(t) + ")");
  }
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

}  // namespace

/// Op attn_res: the logits computed per token (double for the fast oracle, mp50 for the exact
/// one), their error at u = 1 entering the depth bounds as an error already in g_old.
CompareReport attn_res_report(const OpCall& call, const std::string& op, const std::string& what) {
  const AttnResCall a = attn_res_call(call, op, what);
  const Tensor<double> g = attn_res_logits<double>(a), err1 = attn_res_logit_err1(a);
  DepthCall c{&a.sources->values, g, a.psi, a.kinds, a.depth, a.n, a.N, a.d, bounds::beta_bound(a.depth, 1.0)};
  c.g_err1 = &err1;
  c.exact_logits = [&a](index_t t) { return attn_res_token_logits<mp50>(a, t); };
  const std::map<std::string, std::pair<Kind, Shape>> known = {
      {"h", {Kind::h, {a.N, a.d}}}, {"alpha", {Kind::alpha, {a.n, a.N}}}, {"alpha_null", {Kind::alpha_null, {a.N}}}};
  return route_report(op, c, known, call.outputs, call.compare, a.in16);
}

OpSpec attn_res_op() {
  std::vector<std::string> keys = kDepthOptionKeys;
  keys.insert(keys.end(), {"eps", "scale"});
  OpSpec s{"attn_res",
          {{"sources", "[n,N,d]"}, {"w", "[d]"}, {"gain", "[d]", false}, {"psi", "[n,N]", false}},
          {{"h", "[N,d]"}, {"alpha", "[n,N]"}, {"alpha_null", "[N]"}},
          keys,
          "fused AttnRes (fla's naive_attnres): g_i = scale w^T RMSNorm(s_i) (eps 1e-6, scale 1), then depth;\n"
          "                normalizer softmax (default, fla) | softmax1; coupling defaults to whether psi is given",
          [](const OpCall& c) { return attn_res_report(c, "attn_res"); }};
  s.samples_rows = true;
  return s;
}

OpSpec coupling_op() {
  OpSpec s{"coupling",
          {{"g_old", "[n,N]"}, {"psi", "[n,N]"}},
          {{"g", "[n,N]"}, {"dpsi", "[n,N]"}},
          kDepthOptionKeys,
          "kinds: initial|attention|headless per candidate; profile: paper_v2 (default) | authors_code",
          [](const OpCall& c) { return run_depth("coupling", c); }};
  s.samples_rows = true;
  return s;
}

OpSpec depth_op() {
  OpSpec s{"depth",
          {{"sources", "[n,N,d]"}, {"g_old", "[n,N]"}, {"psi", "[n,N]", false}},
          {{"h", "[N,d]"}, {"alpha", "[n,N]"}, {"alpha_null", "[N]"}, {"g", "[n,N]"}, {"dpsi", "[n,N]"}},
          kDepthOptionKeys,
          "as coupling, plus coupling (true|false); psi is needed when coupling",
          [](const OpCall& c) { return run_depth("depth", c); }};
  s.samples_rows = true;
  return s;
}

}  // namespace oasis::verify::detail
