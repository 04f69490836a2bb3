// oasis-demo — a real demonstration of the core oracle through its public API:
//  1. the docs/spec.md §3 teaching example (OASIS vs AoS depth weights), double vs 50-digit reference;
//  2. a routing trace over a few random layers: token Softmax1 attention per layer gives p_null,
//     psi feeds the coupled depth router of the next layer (paper_v2 and authors_code centring).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "oasis/oasis.hpp"

using namespace oasis;

namespace {

void teaching_example() {
  std::printf("== docs/spec.md §3 teaching example: psi = (0.8, 0.2), old logits 0, beta = 1, depth Softmax1 ==\n");
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::attention};
  Vec<double> g = Vec<double>::Zero(3), psi(3);
  psi << 0.0, 0.8, 0.2;
  DepthOptions oasis_opt = depth_options(Variant::oasis);
  oasis_opt.beta = 1.0;
  const DepthWeights<double> o = depth_weights(g, psi, kinds, oasis_opt);
  const DepthWeights<double> a = depth_weights(g, psi, kinds, depth_options(Variant::aos));
  Vec<mp50> gm = Vec<mp50>::Zero(3), psim(3);
  psim << 0, mp50(8) / 10, mp50(2) / 10;
  const DepthWeights<mp50> om = depth_weights(gm, psim, kinds, oasis_opt);
  const char* names[] = {"initial state", "branch 1 (high null)", "branch 2 (low null)"};
  std::printf("%-22s %10s %10s %12s %12s %10s\n", "candidate", "new logit", "AoS", "OASIS", "OASIS(mp50)", "|diff|");
  for (int i = 0; i < 3; ++i)
    std::printf("%-22s %10.4f %10.4f %12.6f %12.6f %10.1e\n", names[i], o.g[i], a.alpha[i], o.alpha[i],
                to_double(om.alpha[i]), std::abs(o.alpha[i] - to_double(om.alpha[i])));
  std::printf("%-22s %10.4f %10.4f %12.6f %12.6f %10.1e\n\n", "null state", 0.0, a.alpha_null, o.alpha_null,
              to_double(om.alpha_null), std::abs(o.alpha_null - to_double(om.alpha_null)));
}

void routing_trace(Centring centring) {
  std::printf("== routing trace: 4 attention layers, B=1, H=4, T=6, d_h=8, causal, centring=%s ==\n",
              std::string(to_string(centring)).c_str());
  std::mt19937_64 rng(7);
  std::normal_distribution<double> N01(0.0, 1.0);
  const index_t H = 4, T = 6, dh = 8, d = H * dh, L = 4;
  auto randn = [&](Shape s, double sd) {
    Tensor<double> t(std::move(s));
    for (index_t i = 0; i < t.size(); ++i) t[i] = sd * N01(rng);
    return t;
  };
  std::vector<Tensor<double>> sources{randn({T, d}, 1.0)};  // v_0: embedding
  std::vector<SourceKind> kinds{SourceKind::initial};
  std::vector<Tensor<double>> psis{Tensor<double>({T})};
  DepthOptions dopt = depth_options(Variant::oasis);
  dopt.coupling_options = centring == Centring::paper_v2 ? CouplingOptions::paper_v2() : CouplingOptions::authors_code();
  dopt.beta = 2.0;  // a trained-looking coupling strength, so that the effect is visible
  std::printf("%5s %5s %-34s %10s %10s %10s\n", "layer", "token", "alpha (initial, 1, 2, ...)", "alpha_null", "psi_new", "max|Dpsi|");
  for (index_t l = 1; l <= L; ++l) {
    const index_t n = static_cast<index_t>(sources.size());
    Tensor<double> S({n, T, d}), g({n, T}), psi({n, T});
    for (index_t i = 0; i < n; ++i)
      for (index_t t = 0; t < T; ++t) {
        for (index_t c = 0; c < d; ++c) S(i, t, c) = sources[static_cast<std::size_t>(i)](t, c);
        psi(i, t) = psis[static_cast<std::size_t>(i)][t];
      }
    const Tensor<double> w = randn({d}, 0.3);
    g = pseudo_query_logits(S, w);
    const DepthRoute<double> r = attn_res_route(S, g, psi, kinds, dopt);
    // the layer's attention branch on the routed input (identity projections, heads split)
    Tensor<double> q({1, H, T, dh});
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T; ++t)
        for (index_t c = 0; c < dh; ++c) q(0, h, t, c) = r.h(t, h * dh + c) * (1.0 + 0.5 * static_cast<double>(l));
    AttentionOptions aopt = attention_options(Variant::oasis);
    aopt.causal = true;
    const AttentionResult<double> a = token_attention(q, q, q, aopt);
    const Tensor<double> psi_new = null_statistic(a.p_null);
    Tensor<double> out({T, d});
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T; ++t)
        for (index_t c = 0; c < dh; ++c) out(t, h * dh + c) = a.out(0, h, t, c);
    for (index_t t = 0; t < T; t += 2) {
      std::string al;
      char buf[32];
      for (index_t i = 0; i < n; ++i) { std::snprintf(buf, sizeof buf, "%s%.3f", i ? " " : "", r.alpha(i, t)); al += buf; }
      double max_dpsi = 0;  // how far the coupling moved the candidates of this token
      for (index_t i = 0; i < n; ++i) max_dpsi = std::max(max_dpsi, std::abs(r.dpsi(i, t)));
      std::printf("%5lld %5lld %-34s %10.4f %10.4f %10.4f\n", static_cast<long long>(l), static_cast<long long>(t),
                  al.c_str(), r.alpha_null[t], psi_new(0, t), max_dpsi);
    }
    sources.push_back(out);
    kinds.push_back(SourceKind::attention);
    psis.push_back(psi_new.reshaped({T}));
  }
  std::printf("\n");
}

}  // namespace

int main() {
  try {
    teaching_example();
    routing_trace(Centring::paper_v2);
    routing_trace(Centring::authors_code);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "oasis-demo: %s\n", e.what());
    return 1;
  }
  return 0;
}
