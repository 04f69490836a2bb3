// The backend registry (oasis/backends/registry.hpp) and the recipe of docs/architecture.md, "A new
// backend in one folder": the echo backend (echo_backend.cpp) is registered after the library's
// backends and reached by its name; registration rejects a taken or empty name and a missing op;
// an unavailable table throws naming "backend" with its reason; and the parity rule that the
// suite applies to echo has power over it: echo with one mistake per op fails it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attention_parity.hpp"
#include "echo_backend.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/grad/instances.hpp"
#include "oasis_test.hpp"
#include "parity_bound.hpp"
#include "parity_rule.hpp"

namespace oasis::test {
namespace {

std::vector<std::string> registered_names() {
  std::vector<std::string> names;
  for (const BackendOps* b : registered_backends()) names.emplace_back(b->name);
  return names;
}

TEST(BackendRegistry, EchoIsRegisteredAfterTheLibrarysBackends) {
  EXPECT_EQ(registered_names(), (std::vector<std::string>{"reference", "cpu_fast", "cuda", "echo"}));
  EXPECT_EQ(&backend_ops("echo"), registered_backends().back());
  EXPECT_TRUE(backend_available(backend_ops("echo")));
  for (const Backend b : {Backend::reference, Backend::cpu_fast, Backend::cuda}) {
    EXPECT_EQ(&backend_ops(b), &backend_ops(to_string(b)));
    EXPECT_EQ(backend_available(b), backend_available(backend_ops(b)));
  }
  const std::vector<std::string> suite = parity_backends();
  EXPECT_NE(std::find(suite.begin(), suite.end(), "echo"), suite.end());
}

TEST(BackendRegistry, RejectsATakenOrEmptyNameAndAMissingOp) {
  const std::vector<std::string> before = registered_names();
  EXPECT_EQ(thrown_argument([] { register_backend(echo_backend()); }), "backend");
  BackendOps t = echo_backend();
  t.name = "cpu_fast";
  EXPECT_EQ(thrown_argument([&] { register_backend(t); }), "backend");
  t.name = "";
  EXPECT_EQ(thrown_argument([&] { register_backend(t); }), "backend");
  t.name = "echo_without_routing";
  t.attn_res_route = nullptr;
  EXPECT_EQ(thrown_argument([&] { register_backend(t); }), "backend");
  EXPECT_EQ(registered_names(), before);
  EXPECT_EQ(thrown_argument([] { backend_ops("no_such_backend"); }), "backend");
  EXPECT_EQ(thrown_argument([] { parse_backend("echo"); }), "backend");  // Backend names the library's only
}

TEST(BackendRegistry, UnavailableTableThrowsNamingBackendWithTheReason) {
  BackendOps off = echo_backend();
  off.name = "off";
  off.available = [](std::string* why) {
    if (why) *why = "switched off";
    return false;
  };
  EXPECT_FALSE(backend_available(off));
  EXPECT_EQ(backend_unavailable_reason(off), "switched off");
  const AttentionInputs in = make_inputs(attention_cases()[0], 1);
  try {
    token_attention(off, in.q, in.k, in.v, in.opt);
    FAIL() << "an unavailable backend ran";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find("off is not available: switched off"), std::string::npos) << e.what();
  }
}

// --- echo with one mistake per op: the null logits ignored (forward and backward), the coupling
// left out of the routing ----------------------------------------------------------------------

AttentionOptions without_null_logits(AttentionOptions opt) {
  opt.null_logits.clear();
  return opt;
}

BackendOps wrong_echo() {
  BackendOps w = echo_backend();
  w.name = "wrong_echo";
  w.token_attention = [](const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                         const AttentionOptions& opt) { return oasis::token_attention(q, k, v, without_null_logits(opt)); };
  w.token_attention_backward = [](const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                  const AttentionCotangents<float>& d, const AttentionOptions& opt) {
    return oasis::token_attention_backward(q, k, v, d, without_null_logits(opt));
  };
  w.attn_res_route = [](const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                        const std::vector<SourceKind>& kinds, const DepthOptions& opt) {
    DepthOptions o = opt;
    o.coupling = false;
    return oasis::attn_res_route(sources, g_old, psi, kinds, o);
  };
  return w;
}

bool all_pass(const std::vector<::testing::AssertionResult>& rs) {
  return std::all_of(rs.begin(), rs.end(), [](const ::testing::AssertionResult& r) { return bool(r); });
}

TEST(BackendRecipe, TheParityRuleRejectsEchoWithAMistakeInEachOp) {
  const BackendOps& echo = echo_backend();
  const BackendOps wrong = wrong_echo();
  const AttentionCase c = attention_cases()[0];  // softmax1 with per-head null logits
  ASSERT_TRUE(c.null_logits);
  const AttentionInputs in = make_inputs(c, salt_of(c.name));
  EXPECT_TRUE(all_pass(attention_parity<mp50>(token_attention(echo, in.q, in.k, in.v, in.opt), in)));
  EXPECT_FALSE(all_pass(attention_parity<mp50>(token_attention(wrong, in.q, in.k, in.v, in.opt), in)));

  using HP = long double;
  std::mt19937_64 rng = make_rng(salt_of(c.name) + 1);
  const AttentionCotangents<float> d{randn<float>(in.q.shape(), rng), randn<float>({c.B, c.H, c.Tq}, rng),
                                     randn<float>({c.B, c.H, c.Tq}, rng)};
  const Tensor<HP> q = in.q.cast<HP>(), k = in.k.cast<HP>(), v = in.v.cast<HP>();
  const AttentionGrads<HP> hp =
      token_attention_backward(q, k, v, AttentionCotangents<HP>{d.out.cast<HP>(), d.lse.cast<HP>(), d.p_null.cast<HP>()},
                               in.opt);
  AttentionOptions fo = in.opt;
  fo.return_probs = true;  // the bounds need the oracle's probabilities
  const AttentionResult<HP> hp_fwd = token_attention(q, k, v, fo);
  const AttentionGrads<float> ref = token_attention_backward(in.q, in.k, in.v, d, in.opt);
  auto backward_ok = [&](const BackendOps& b) {
    const AttentionGrads<float> got = token_attention_backward(b, in.q, in.k, in.v, d, in.opt);
    return fast_parity::check_attention_backward(in.q, in.k, in.v, d, in.opt, got, ref, hp, hp_fwd).ok;
  };
  EXPECT_TRUE(backward_ok(echo));
  EXPECT_FALSE(backward_ok(wrong));

  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::headless,
                                      SourceKind::attention};
  DepthOptions opt;
  opt.beta = 3.0;  // strong coupling
  const Tensor<float> sources = randn<float>({4, 23, 40}, rng), g_old = randn<float>({4, 23}, rng, 2.0);
  const Tensor<float> psi = uniform<float>({4, 23}, rng, 0.0, 1.0);
  const DepthRoute<float> route_ref = attn_res_route(sources, g_old, psi, kinds, opt);
  const DepthRoute<mp50> route_hp =
      attn_res_route(sources.cast<mp50>(), g_old.cast<mp50>(), psi.cast<mp50>(), kinds, opt);
  const bounds::DepthRouteBounds rb = bounds::depth_route_bounds(sources, psi, kinds, opt, route_hp);
  auto route_ok = [&](const BackendOps& b) {
    const DepthRoute<float> got = attn_res_route(b, sources, g_old, psi, kinds, opt);
    return all_pass({within_twice_reference("h", got.h, route_ref.h, route_hp.h, rb.h),
                     within_twice_reference("alpha", got.alpha, route_ref.alpha, route_hp.alpha, rb.alpha),
                     within_twice_reference("g", got.g, route_ref.g, route_hp.g, rb.g)});
  };
  EXPECT_TRUE(route_ok(echo));
  EXPECT_FALSE(route_ok(wrong));
}

}  // namespace
}  // namespace oasis::test
