// CUDA backend, device tests: the device-pointer entry point, the psi reduction and one
// full AttnRes sublayer forward against the model's own functions (oasis::model::kimi_route,
// attention_sublayer, mlp_sublayer; float: the plain reference; long double: the oracle). Each
// test skips with the reason when no device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/backends/backend.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/model/router.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"

namespace oasis::test {
namespace {

#define OASIS_SKIP_WITHOUT_CUDA()                                                                     \
  if (std::string why; !cuda::available(&why)) GTEST_SKIP() << "backend cuda is not available: " << why

template <class T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(std::size_t n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess); }
  ~DeviceArray() { cudaFree(p); }
};

// The device entry point runs the same kernel as Backend::cuda: bitwise-equal results (GQA,
// causal, padding, null logits; and with a window, a bias with masked rows, in [B, T, H, d]).
TEST(CudaDeviceApi, EqualsTheHostEntryPointBitwise) {
  OASIS_SKIP_WITHOUT_CUDA();
  for (const index_t ci : {0, 14}) {
    const AttentionCase c = attention_cases()[static_cast<std::size_t>(ci)];
    SCOPED_TRACE(c.name);
    AttentionInputs in = make_inputs(c, 11);
    in.opt.return_probs = false;
    const AttentionResult<float> host = token_attention(Backend::cuda, in.q, in.k, in.v, in.opt);
    std::vector<float> bias(static_cast<std::size_t>(in.opt.bias.size()));
    for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(in.opt.bias[static_cast<index_t>(i)]);
    DeviceArray<float> q(in.q.size()), k(in.k.size()), v(in.v.size()), out(host.out.size()), lse(host.lse.size()),
        pn(host.p_null.size()), nulls(c.H), psi(static_cast<std::size_t>(c.B * c.Tq)), db(bias.size() + 1);
    DeviceArray<int> lens(c.B);
    std::vector<float> nl(in.opt.null_logits.begin(), in.opt.null_logits.end());
    std::vector<int> kl(in.opt.key_lengths.begin(), in.opt.key_lengths.end());
    cudaMemcpy(q.p, in.q.data(), in.q.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(k.p, in.k.data(), in.k.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(v.p, in.v.data(), in.v.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(nulls.p, nl.data(), nl.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(lens.p, kl.data(), kl.size() * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemcpy(db.p, bias.data(), bias.size() * sizeof(float), cudaMemcpyHostToDevice);
    cuda::DeviceAttention a;
    a.q = q.p; a.k = k.p; a.v = v.p;
    a.layout = in.opt.layout;
    a.shape = check_attention_args(in.q, in.k, in.v, in.opt);
    a.null_logits = nl.empty() ? nullptr : nulls.p;
    a.causal = c.causal;
    a.key_lengths = kl.empty() ? nullptr : lens.p;
    a.window = in.opt.window;
    if (!bias.empty()) {
      a.bias = db.p;
      a.bias_shape = in.opt.bias.shape();
    }
    a.out = out.p; a.lse = lse.p; a.p_null = pn.p;
    cuda::token_attention_device(a);
    cuda::null_statistic_device(pn.p, c.B, c.H, c.Tq, psi.p);
    AttentionResult<float> dev{Tensor<float>(host.out.shape()), Tensor<float>(host.lse.shape()),
                               Tensor<float>(host.p_null.shape()), {}};
    Tensor<float> dpsi({c.B, c.Tq});
    ASSERT_EQ(cudaMemcpy(dev.out.data(), out.p, dev.out.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaMemcpy(dev.lse.data(), lse.p, dev.lse.size() * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(dev.p_null.data(), pn.p, dev.p_null.size() * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(dpsi.data(), psi.p, dpsi.size() * sizeof(float), cudaMemcpyDeviceToHost);
    EXPECT_TRUE(exactly_equal("out", dev.out, host.out));
    EXPECT_TRUE(exactly_equal("lse", dev.lse, host.lse));
    EXPECT_TRUE(exactly_equal("p_null", dev.p_null, host.p_null));
    // psi: the same sequential sum over heads and division as oasis::null_statistic<float>.
    EXPECT_TRUE(exactly_equal("psi", dpsi, null_statistic(host.p_null)));
    EXPECT_TRUE(exactly_equal("psi(host)", cuda::null_statistic(host.p_null), null_statistic(host.p_null)));
  }
}

template <class T>
T* upload(const Tensor<T>& t) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), static_cast<std::size_t>(t.size()) * sizeof(T)), cudaSuccess);
  cudaMemcpy(p, t.data(), static_cast<std::size_t>(t.size()) * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <class T>
Tensor<T> download(const T* p, Shape s) {
  Tensor<T> t(std::move(s));
  EXPECT_EQ(cudaMemcpy(t.data(), p, static_cast<std::size_t>(t.size()) * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return t;
}

// The device routing and pseudo-query entry points run the kernels of the host entry points.
TEST(CudaDeviceApi, RouteAndPseudoQueryEqualTheHostEntryPointsBitwise) {
  OASIS_SKIP_WITHOUT_CUDA();
  const index_t n = 5, N = 70, d = 96;
  std::mt19937_64 rng = make_rng(12);
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::headless,
                                      SourceKind::attention, SourceKind::headless};
  const Tensor<float> sources = randn<float>({n, N, d}, rng), w = randn<float>({d}, rng, 0.3);
  const Tensor<float> psi = uniform<float>({n, N}, rng, 0.0, 1.0);
  DepthOptions opt;
  opt.beta = 1.5;
  const Tensor<float> g_host = cuda::pseudo_query_logits(sources, w);
  const DepthRoute<float> r_host = attn_res_route(Backend::cuda, sources, g_host, psi, kinds, opt);
  float *ds = upload(sources), *dw = upload(w), *dpsi_in = upload(psi);
  float *g_old = upload(Tensor<float>({n, N})), *h = upload(Tensor<float>({N, d})), *alpha = upload(Tensor<float>({n, N}));
  float *an = upload(Tensor<float>({N})), *g = upload(Tensor<float>({n, N})), *dpsi = upload(Tensor<float>({n, N}));
  cuda::pseudo_query_logits_device(ds, n, N, d, dw, nullptr, KeyNormOptions{}, g_old);
  cuda::attn_res_route_device(ds, g_old, dpsi_in, n, N, d, kinds, opt, h, alpha, an, g, dpsi);
  EXPECT_TRUE(exactly_equal("g_old", download(g_old, {n, N}), g_host));
  EXPECT_TRUE(exactly_equal("h", download(h, {N, d}), r_host.h));
  EXPECT_TRUE(exactly_equal("alpha", download(alpha, {n, N}), r_host.alpha));
  EXPECT_TRUE(exactly_equal("alpha_null", download(an, {N}), r_host.alpha_null));
  EXPECT_TRUE(exactly_equal("g", download(g, {n, N}), r_host.g));
  EXPECT_TRUE(exactly_equal("dpsi", download(dpsi, {n, N}), r_host.dpsi));
  // g and Dpsi: the reference's operations in the reference's order (no contraction): bitwise.
  const DepthRoute<float> ref = attn_res_route(sources, g_host, psi, kinds, opt);
  EXPECT_TRUE(exactly_equal("g(reference)", r_host.g, ref.g));
  EXPECT_TRUE(exactly_equal("dpsi(reference)", r_host.dpsi, ref.dpsi));
  for (float* p : {ds, dw, dpsi_in, g_old, h, alpha, an, g, dpsi}) cudaFree(p);
}

// Scores that overflow float (q.k = NaN or +inf) are rejected naming "scores", as the reference does.
TEST(CudaDeviceApi, OverflowedScoresAreRejectedLikeTheReference) {
  OASIS_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng = make_rng(13);
  const Tensor<float> q = randn<float>({1, 2, 8, 64}, rng, 1e20), k = randn<float>({1, 2, 8, 64}, rng, 1e20);
  const Tensor<float> v = randn<float>({1, 2, 8, 64}, rng);
  for (const Backend b : {Backend::reference, Backend::cuda}) {
    try {
      token_attention(b, q, k, v);
      ADD_FAILURE() << to_string(b) << ": overflowed scores were accepted";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.argument(), "scores") << to_string(b) << ": " << e.what();
    }
  }
}

// A row whose visible scores all overflow to -inf is a fully masked row, as in the reference:
// plain softmax gives the documented zero with MaskedRow::zero and throws "scores" with
// MaskedRow::error (the host cannot see it before the launch: every key of the row is visible).
TEST(CudaDeviceApi, RowOfNegativeInfiniteScoresIsAFullyMaskedRow) {
  OASIS_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng = make_rng(17);
  Tensor<float> q = randn<float>({1, 1, 4, 64}, rng), k({1, 1, 6, 64}, 1e20f);
  const Tensor<float> v = randn<float>({1, 1, 6, 64}, rng);
  for (index_t c = 0; c < 64; ++c) q(0, 0, 2, c) = -1e20f;  // query 2: every product is -1e40 -> -inf
  AttentionOptions opt;
  opt.normalizer = RowNorm::softmax;
  opt.scale = 1.0;
  opt.masked_row = MaskedRow::zero;
  const AttentionResult<float> ref = token_attention(Backend::reference, q, k, v, opt);
  const AttentionResult<float> got = token_attention(Backend::cuda, q, k, v, opt);
  EXPECT_EQ(got.lse(0, 0, 2), -std::numeric_limits<float>::infinity());
  for (index_t c = 0; c < 64; ++c) EXPECT_EQ(got.out(0, 0, 2, c), 0.0f) << c;
  EXPECT_EQ(ref.lse(0, 0, 2), got.lse(0, 0, 2));
  opt.masked_row = MaskedRow::error;
  for (const Backend b : {Backend::reference, Backend::cuda}) {
    try {
      token_attention(b, q, k, v, opt);
      ADD_FAILURE() << to_string(b) << ": a row of -inf scores was accepted with MaskedRow::error";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.argument(), "scores") << to_string(b) << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("fully masked row"), std::string::npos) << e.what();
    }
  }
}

// --- one AttnRes sublayer against the model (oasis/model/router.hpp, layers.hpp) -------------------

/// The weights of one sublayer and its router in scalar T, and the model's views of them.
template <class T>
struct SublayerWeights {
  Tensor<T> query, key_gain, norm, wq, wk, wv, wo, q_norm, k_norm, gate, up, down;
  model::AttentionWeights<T> attention(bool qk_norm) const {
    return {&norm, &wq, &wk, &wv, &wo, qk_norm ? &q_norm : nullptr, qk_norm ? &k_norm : nullptr};
  }
  model::MlpWeights<T> mlp() const { return {&norm, &gate, &up, &down}; }
  template <class U>
  SublayerWeights<U> cast() const {
    return {query.template cast<U>(), key_gain.template cast<U>(), norm.template cast<U>(), wq.template cast<U>(),
            wk.template cast<U>(),    wv.template cast<U>(),       wo.template cast<U>(),   q_norm.template cast<U>(),
            k_norm.template cast<U>(), gate.template cast<U>(),    up.template cast<U>(),   down.template cast<U>()};
  }
};

template <class T>
struct ModelSublayer {
  Tensor<T> h, alpha, out, p_null, psi;
};

/// The model's sublayer l in scalar T: kimi_route over the sources, then attention_sublayer (a
/// fresh KV cache, positions from 0) or mlp_sublayer.
template <class T>
ModelSublayer<T> model_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                const std::vector<SourceKind>& kinds, index_t B, const SublayerWeights<float>& wf,
                                double theta, const model::ModelConfig& cfg, bool attention) {
  const SublayerWeights<T> w = wf.template cast<T>();
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  std::vector<model::DepthSource<T>> candidates(static_cast<std::size_t>(n));
  std::vector<const model::DepthSource<T>*> ptrs;
  for (index_t i = 0; i < n; ++i) {
    model::DepthSource<T>& c = candidates[static_cast<std::size_t>(i)];
    c.v.x = Tensor<T>({N, d});
    c.psi = Tensor<T>({N});
    for (index_t t = 0; t < N; ++t) {
      for (index_t k = 0; k < d; ++k) c.v.x(t, k) = T(sources(i, t, k));
      c.psi[t] = T(psi(i, t));
    }
    c.kind = kinds[static_cast<std::size_t>(i)];
    ptrs.push_back(&c);
  }
  const model::ErrorModel off;
  const model::RouteResult<T> r = model::kimi_route(ptrs, w.query, w.key_gain, theta, cfg, off);
  ModelSublayer<T> out{r.route.h, r.route.alpha, {}, {}, {}};
  if (attention) {
    model::KVCache<T> cache;
    const model::AttentionSublayer<T> a =
        model::attention_sublayer(r.h, B, N / B, 0, w.attention(cfg.qk_norm), cfg, cache, off);
    out.out = a.out.x;
    out.p_null = a.p_null;
    out.psi = a.psi;
  } else {
    out.out = model::mlp_sublayer(r.h, w.mlp(), cfg, off).x;
  }
  return out;
}

struct SublayerCase {
  std::string name;
  model::ModelConfig cfg;
  bool attention = true;
  bool key_gain = true;   ///< the router's key norm has a gain
  double pq_scale = 0.5;  ///< spread of the pseudo-query: 12 gives |g_old| ~ 100, beyond a [-50, 50] clamp
};

std::vector<SublayerCase> sublayer_cases() {
  model::ModelConfig base;  // variant oasis: softmax1 over tokens and depth, coupled (paper_v2)
  base.d_model = 128;
  base.n_heads = 4;
  base.n_kv_heads = 2;
  base.d_head = 64;
  base.d_ff = 192;
  base.beta = 2.0;
  model::ModelConfig qk = base;
  qk.qk_norm = true;
  model::ModelConfig inter = base;
  inter.rope = model::RopeLayout::interleaved;
  inter.n_kv_heads = 4;
  inter.coupling = CouplingOptions::authors_code();
  model::ModelConfig vanilla = base;
  vanilla.variant = Variant::vanilla_attnres;  // softmax over tokens and depth, no coupling
  vanilla.rope_theta = 500000.0;
  model::ModelConfig mlp = base;
  mlp.variant = Variant::aos;  // uncoupled; the authors_code convention clamps g_old to [-50, 50]
  mlp.coupling = CouplingOptions::authors_code();
  return {{"oasis_rotate_half_gqa", base},
          {"oasis_qk_norm", qk},
          {"authors_interleaved", inter},
          {"vanilla_softmax_theta_5e5_no_key_gain", vanilla, true, false},
          {"mlp_swiglu_clamped_router", mlp, false, true, 12.0}};
}

/// Per-tensor rule for the sublayer: max |x - x_hp| <= 2 max |x_ref - x_hp| + floor,
/// floor = K u max_i |x_hp,i| with K the length of the last reduction (docs/cuda.md).
template <class L>
::testing::AssertionResult sublayer_rule(const std::string& name, const Tensor<float>& got, const Tensor<float>& ref,
                                         const Tensor<L>& hp, index_t K) {
  double e = 0, er = 0, mx = 0;
  if (got.shape() != hp.shape() || ref.shape() != hp.shape())
    return ::testing::AssertionFailure() << name << ": shape " << shape_str(got.shape()) << " vs " << shape_str(hp.shape());
  for (index_t i = 0; i < hp.size(); ++i) {
    const double h = static_cast<double>(hp[i]);
    e = std::max(e, abs_err(got[i], h));
    er = std::max(er, abs_err(ref[i], h));
    mx = std::max(mx, std::abs(h));
    if (std::isnan(got[i])) return ::testing::AssertionFailure() << name << "[" << i << "] is NaN";
  }
  const double u = std::ldexp(1.0, -24), floor = static_cast<double>(K) * u * mx;
  if (e <= 2 * er + floor)
    return ::testing::AssertionSuccess() << name << ": max |err| " << e << " reference " << er << " floor " << floor;
  return ::testing::AssertionFailure() << name << ": max |err| " << e << " > 2 * " << er << " + " << floor;
}

void PrintTo(const SublayerCase& c, std::ostream* os) { *os << c.name; }

class SublayerParity : public ::testing::TestWithParam<SublayerCase> {};

TEST_P(SublayerParity, WithinTwiceReferenceErrorPlusFloor) {
  const SublayerCase& c = GetParam();
  OASIS_SKIP_WITHOUT_CUDA();
  const index_t n = 4, B = 2, Tn = 24, N = B * Tn, d = c.cfg.d_model, dh = c.cfg.head_dim();
  const index_t H = c.cfg.n_heads, Hkv = c.cfg.kv_heads(), d_ff = c.cfg.d_ff;
  std::mt19937_64 rng = make_rng(std::hash<std::string>{}(c.name) % 1000003ULL);
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::headless,
                                      SourceKind::attention};
  const Tensor<float> sources = randn<float>({n, N, d}, rng), psi = uniform<float>({n, N}, rng, 0.0, 1.0);
  SublayerWeights<float> w;
  const double ws = 1.0 / std::sqrt(static_cast<double>(d));
  w.query = randn<float>({d}, rng, c.pq_scale);
  if (c.key_gain) w.key_gain = uniform<float>({d}, rng, 0.5, 1.5);
  w.norm = uniform<float>({d}, rng, 0.5, 1.5);
  w.wq = randn<float>({H * dh, d}, rng, ws);
  w.wk = randn<float>({Hkv * dh, d}, rng, ws);
  w.wv = randn<float>({Hkv * dh, d}, rng, ws);
  w.wo = randn<float>({d, H * dh}, rng, 1.0 / std::sqrt(static_cast<double>(H * dh)));
  w.q_norm = uniform<float>({dh}, rng, 0.5, 1.5);
  w.k_norm = uniform<float>({dh}, rng, 0.5, 1.5);
  w.gate = randn<float>({d_ff, d}, rng, ws);
  w.up = randn<float>({d_ff, d}, rng, ws);
  w.down = randn<float>({d, d_ff}, rng, 1.0 / std::sqrt(static_cast<double>(d_ff)));
  const double theta = c.cfg.theta_init;
  const cuda::KimiRouter router{&w.query, &w.key_gain, theta};

  const cuda::SublayerResult got =
      c.attention ? cuda::attn_res_sublayer(sources, psi, kinds, B, router, w.attention(c.cfg.qk_norm), c.cfg)
                  : cuda::attn_res_sublayer(sources, psi, kinds, B, router, w.mlp(), c.cfg);
  const auto ref = model_sublayer<float>(sources, psi, kinds, B, w, theta, c.cfg, c.attention);
  const auto hp = model_sublayer<long double>(sources, psi, kinds, B, w, theta, c.cfg, c.attention);
  OASIS_EXPECT_PARITY(sublayer_rule("h", got.route.h, ref.h, hp.h, n));
  OASIS_EXPECT_PARITY(sublayer_rule("alpha", got.route.alpha, ref.alpha, hp.alpha, n));
  OASIS_EXPECT_PARITY(sublayer_rule("out", got.out, ref.out, hp.out, c.attention ? H * dh : d_ff));
  if (c.attention) {
    OASIS_EXPECT_PARITY(sublayer_rule("p_null", got.p_null, ref.p_null, hp.p_null, Tn));
    OASIS_EXPECT_PARITY(sublayer_rule("psi", got.psi, ref.psi, hp.psi, Tn + H));
  } else {
    EXPECT_TRUE(got.p_null.empty() && got.psi.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, SublayerParity, ::testing::ValuesIn(sublayer_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace oasis::test
