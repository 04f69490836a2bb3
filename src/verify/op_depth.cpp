// src/verify/op_depth.cpp — ops "coupling" (g = g_old - beta Dpsi) and "depth" (the coupled depth
// router h = sum_i alpha_i s_i) (SPEC §3–4).
#include <cmath>
#include <map>

#include "engine.hpp"
#include "oasis/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {

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

namespace {

CompareReport run_depth(const std::string& op, const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const Options& o = c.options;
  const CompareOptions& copt = c.compare;
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

}  // namespace

OpSpec coupling_op() {
  return {"coupling",
          {{"g_old", "[n,N]"}, {"psi", "[n,N]"}},
          {{"g", "[n,N]"}, {"dpsi", "[n,N]"}},
          kDepthOptionKeys,
          "kinds: initial|attention|headless per candidate; profile: paper_v2 (default) | authors_code",
          [](const OpCall& c) { return run_depth("coupling", c); }};
}

OpSpec depth_op() {
  return {"depth",
          {{"sources", "[n,N,d]"}, {"g_old", "[n,N]"}, {"psi", "[n,N]", false}},
          {{"h", "[N,d]"}, {"alpha", "[n,N]"}, {"alpha_null", "[N]"}, {"g", "[n,N]"}, {"dpsi", "[n,N]"}},
          kDepthOptionKeys,
          "as coupling, plus coupling (true|false); psi is needed when coupling",
          [](const OpCall& c) { return run_depth("depth", c); }};
}

}  // namespace oasis::verify::detail
