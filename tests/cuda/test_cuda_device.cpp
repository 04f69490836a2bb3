// CUDA backend, device tests: the device-pointer entry point, the psi reduction and one
// full AttnRes sublayer forward against a host composition of the core functions (float: the
// plain reference; long double: the oracle). Each test skips with the reason when no device is
// present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/backend.hpp"
#include "oasis/cuda.hpp"
#include "oasis/instances.hpp"
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

// --- one AttnRes sublayer: host composition of the core (oasis/model/layers.hpp semantics) -------

template <class T>
Tensor<T> linear_rows(const Tensor<T>& x, const Tensor<T>& W) {  // [N, in] W[out, in]^T
  const index_t N = x.dim(0), in = x.dim(1), out = W.dim(0);
  Tensor<T> y({N, out});
  for (index_t r = 0; r < N; ++r)
    for (index_t o = 0; o < out; ++o) {
      T acc(0);
      for (index_t c = 0; c < in; ++c) acc += W(o, c) * x(r, c);
      y(r, o) = acc;
    }
  return y;
}

template <class T>
void rms_rows(Tensor<T>& x, index_t width, const Tensor<T>& gain, double eps) {  // in place, rows of `width`
  std::vector<T> y(static_cast<std::size_t>(width));
  for (index_t r = 0; r < x.size() / width; ++r) {
    rms_norm_row(x.data() + r * width, width, gain.empty() ? nullptr : gain.data(), KeyNormOptions{eps, false}, y.data());
    for (index_t c = 0; c < width; ++c) x[r * width + c] = y[static_cast<std::size_t>(c)];
  }
}

template <class T>
void rope_rows(Tensor<T>& x, index_t H, index_t dh, index_t Tn, cuda::Rope rope, double theta) {
  using std::cos; using std::pow; using std::sin;
  if (rope == cuda::Rope::none) return;
  const index_t half = dh / 2;
  for (index_t r = 0; r < x.dim(0); ++r)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < half; ++i) {
        const T a = T(static_cast<double>(r % Tn)) * pow(T(theta), T(static_cast<double>(-2 * i)) / T(static_cast<double>(dh)));
        const index_t c1 = rope == cuda::Rope::interleaved ? 2 * i : i, c2 = rope == cuda::Rope::interleaved ? 2 * i + 1 : i + half;
        T* p = x.ptr(r) + h * dh;
        const T x1 = p[c1], x2 = p[c2];
        p[c1] = x1 * cos(a) - x2 * sin(a);
        p[c2] = x2 * cos(a) + x1 * sin(a);
      }
}

template <class T>
struct HostSublayer {
  Tensor<T> h, alpha, out, p_null, psi;
};

template <class T>
HostSublayer<T> host_sublayer(const Tensor<float>& sources_f, const Tensor<float>& psi_f, const std::vector<SourceKind>& kinds,
                              const cuda::SublayerWeights& wf, const cuda::SublayerOptions& opt) {
  const Tensor<T> sources = sources_f.cast<T>(), psi = psi_f.cast<T>();
  auto cast = [](const Tensor<float>& t) { return t.cast<T>(); };
  const index_t N = sources.dim(1), d = sources.dim(2), B = opt.batch, Tn = N / B;
  Tensor<T> g_old = pseudo_query_logits(sources, cast(wf.pseudo_query), cast(wf.key_gain), opt.key_norm);
  if (!opt.depth.coupling && std::isfinite(opt.depth.coupling_options.score_clamp)) {  // model::finish_route
    const T lim(opt.depth.coupling_options.score_clamp);
    for (index_t i = 0; i < g_old.size(); ++i) g_old[i] = g_old[i] > lim ? lim : (g_old[i] < -lim ? -lim : g_old[i]);
  }
  const DepthRoute<T> route = attn_res_route(sources, g_old, psi, kinds, opt.depth);
  Tensor<T> x = route.h;
  rms_rows(x, d, cast(wf.norm), opt.norm_eps);
  HostSublayer<T> r{route.h, route.alpha, {}, {}, {}};
  if (opt.kind == cuda::SublayerKind::mlp) {
    const Tensor<T> a = linear_rows(x, cast(wf.gate)), b = linear_rows(x, cast(wf.up));
    Tensor<T> m(a.shape());
    for (index_t i = 0; i < a.size(); ++i) m[i] = a[i] * sigmoid(a[i]) * b[i];
    r.out = linear_rows(m, cast(wf.down));
    return r;
  }
  const index_t H = opt.n_heads, Hkv = opt.n_kv_heads ? opt.n_kv_heads : H, dh = opt.d_head ? opt.d_head : d / H;
  Tensor<T> q = linear_rows(x, cast(wf.wq)), k = linear_rows(x, cast(wf.wk));
  const Tensor<T> v = linear_rows(x, cast(wf.wv));
  if (!wf.q_norm.empty()) {
    rms_rows(q, dh, cast(wf.q_norm), opt.norm_eps);
    rms_rows(k, dh, cast(wf.k_norm), opt.norm_eps);
  }
  rope_rows(q, H, dh, Tn, opt.rope, opt.rope_theta);
  rope_rows(k, Hkv, dh, Tn, opt.rope, opt.rope_theta);
  auto heads = [&](const Tensor<T>& rows, index_t nh) {
    Tensor<T> t({B, nh, Tn, dh});
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < nh; ++h)
        for (index_t s = 0; s < Tn; ++s)
          for (index_t c = 0; c < dh; ++c) t(b, h, s, c) = rows(b * Tn + s, h * dh + c);
    return t;
  };
  AttentionOptions ao;
  ao.normalizer = opt.token_normalizer;
  ao.causal = opt.causal;
  const AttentionResult<T> att = token_attention(heads(q, H), heads(k, Hkv), heads(v, Hkv), ao);
  Tensor<T> merged({N, H * dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t s = 0; s < Tn; ++s)
        for (index_t c = 0; c < dh; ++c) merged(b * Tn + s, h * dh + c) = att.out(b, h, s, c);
  r.out = linear_rows(merged, cast(wf.wo));
  r.p_null = att.p_null;
  r.psi = null_statistic(att.p_null);
  return r;
}

struct SublayerCase {
  std::string name;
  cuda::SublayerOptions opt;
  bool qk_norm = false;
  double pq_scale = 0.5;  ///< spread of the pseudo-query: 12 gives |g_old| ~ 100, beyond a [-50, 50] clamp
};

std::vector<SublayerCase> sublayer_cases() {
  cuda::SublayerOptions base;
  base.batch = 2;
  base.n_heads = 4;
  base.n_kv_heads = 2;
  base.d_head = 64;
  base.depth.beta = 2.0;
  cuda::SublayerOptions inter = base;
  inter.rope = cuda::Rope::interleaved;
  inter.n_kv_heads = 4;
  inter.depth.coupling_options = CouplingOptions::authors_code();
  cuda::SublayerOptions vanilla = base;
  vanilla.token_normalizer = RowNorm::softmax;
  vanilla.depth.normalizer = RowNorm::softmax;
  vanilla.depth.coupling = false;
  vanilla.rope = cuda::Rope::none;
  cuda::SublayerOptions mlp = base;
  mlp.kind = cuda::SublayerKind::mlp;
  mlp.depth.coupling = false;  // uncoupled authors_code convention: g_old clamped to [-50, 50]
  mlp.depth.coupling_options = CouplingOptions::authors_code();
  return {{"oasis_rotate_half_gqa", base, false},
          {"oasis_qk_norm", base, true},
          {"authors_interleaved", inter, false},
          {"vanilla_no_rope", vanilla, false},
          {"mlp_swiglu_clamped_router", mlp, false, 12.0}};
}

/// Per-tensor rule for the composed sublayer: max |x - x_hp| <= 2 max |x_ref - x_hp| + floor,
/// floor = gamma_K max_i |x_hp,i| with K the length of the last reduction (docs/cuda.md).
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
  const index_t n = 4, B = c.opt.batch, Tn = 24, N = B * Tn, d = 128, dh = c.opt.d_head;
  const index_t H = c.opt.n_heads, Hkv = c.opt.n_kv_heads ? c.opt.n_kv_heads : H, d_ff = 192;
  std::mt19937_64 rng = make_rng(std::hash<std::string>{}(c.name) % 1000003ULL);
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::headless,
                                      SourceKind::attention};
  const Tensor<float> sources = randn<float>({n, N, d}, rng), psi = uniform<float>({n, N}, rng, 0.0, 1.0);
  cuda::SublayerWeights w;
  const double ws = 1.0 / std::sqrt(static_cast<double>(d));
  w.pseudo_query = randn<float>({d}, rng, c.pq_scale);
  w.key_gain = uniform<float>({d}, rng, 0.5, 1.5);
  w.norm = uniform<float>({d}, rng, 0.5, 1.5);
  w.wq = randn<float>({H * dh, d}, rng, ws);
  w.wk = randn<float>({Hkv * dh, d}, rng, ws);
  w.wv = randn<float>({Hkv * dh, d}, rng, ws);
  w.wo = randn<float>({d, H * dh}, rng, 1.0 / std::sqrt(static_cast<double>(H * dh)));
  if (c.qk_norm) {
    w.q_norm = uniform<float>({dh}, rng, 0.5, 1.5);
    w.k_norm = uniform<float>({dh}, rng, 0.5, 1.5);
  }
  w.gate = randn<float>({d_ff, d}, rng, ws);
  w.up = randn<float>({d_ff, d}, rng, ws);
  w.down = randn<float>({d, d_ff}, rng, 1.0 / std::sqrt(static_cast<double>(d_ff)));

  const cuda::SublayerResult got = cuda::attn_res_sublayer(sources, psi, kinds, w, c.opt);
  const HostSublayer<float> ref = host_sublayer<float>(sources, psi, kinds, w, c.opt);
  const HostSublayer<long double> hp = host_sublayer<long double>(sources, psi, kinds, w, c.opt);
  OASIS_EXPECT_PARITY(sublayer_rule("h", got.route.h, ref.h, hp.h, n));
  OASIS_EXPECT_PARITY(sublayer_rule("alpha", got.route.alpha, ref.alpha, hp.alpha, n));
  const bool attention = c.opt.kind == cuda::SublayerKind::attention;
  OASIS_EXPECT_PARITY(sublayer_rule("out", got.out, ref.out, hp.out, attention ? H * dh : d_ff));
  if (attention) {
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
