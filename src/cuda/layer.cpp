// src/cuda/layer.cpp — one Full-AttnRes sublayer forward on the device (oasis/backends/cuda.hpp), from the
// model's own types (oasis::model::ModelConfig, AttentionWeights, MlpWeights):
//
//   g_old_i = w_l^T RMSNorm_key(v_i)                                  (pseudo-query logits)
//   h_l     = sum_i alpha_i v_i,  alpha = depth normaliser(g_old - beta Dpsi)   (the router)
//   x       = RMSNorm(h_l) * norm                                     (the sublayer's pre-norm)
//   attention: q, k, v = x W_q^T, x W_k^T, x W_v^T  (cuBLAS SGEMM, float32, no TF32)
//              optional per-head q/k RMSNorm, RoPE at positions t = 0..T-1,
//              A = causal token attention (fused kernel), psi = mean_h p_null, out = A W_o^T
//   mlp:       out = (silu(x W_gate^T) * (x W_up^T)) W_down^T
// The semantics are those of oasis::model::kimi_route followed by attention_sublayer /
// mlp_sublayer (oasis/model/router.hpp, layers.hpp) for a sublayer without KV cache (pos0 = 0);
// the depth options are the model's (model::router_depth_options).
#include <cublas_v2.h>

#include <cmath>
#include <utility>

#include "device_util.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/model/router.hpp"

namespace oasis::cuda {
namespace {

using detail::DeviceBuffer;
using detail::check;
using detail::to_device;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("oasis cuda: ") + what + " failed: cuBLAS status " + std::to_string(static_cast<int>(s)));
}

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() {
    check_cublas(cublasCreate(&h), "cublasCreate");
    check_cublas(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // float32, no TF32
  }
  ~Cublas() { if (h) cublasDestroy(h); }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
};

/// Y [rows, out] = X [rows, in] W^T, W [out, in], all row-major.
void linear(const Cublas& cb, const float* X, index_t rows, index_t in, const float* W, index_t out, float* Y) {
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: Y^T [out, rows] = W [out, in] X^T [in, rows]; W row-major is W^T column-major.
  check_cublas(cublasSgemm(cb.h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows),
                           static_cast<int>(in), &one, W, static_cast<int>(in), X, static_cast<int>(in), &zero, Y,
                           static_cast<int>(out)),
               "cublasSgemm");
}

/// A weight the model dereferences: it must be given.
const Tensor<float>& required(const Tensor<float>* w, const char* arg) {
  OASIS_REQUIRE(w != nullptr, arg, "is null (the sublayer needs this weight)");
  return *w;
}
void require_matrix(const Tensor<float>* W, index_t rows, index_t cols, const char* arg) {
  const Tensor<float>& w = required(W, arg);
  OASIS_REQUIRE(w.rank() == 2 && w.dim(0) == rows && w.dim(1) == cols, arg, "shape ", shape_str(w.shape()),
                " is not [", rows, ", ", cols, "]");
  require_finite(w, arg);
}
/// A gain: [n], or empty (no gain, as the model's rms_norm).
void require_gain(const Tensor<float>& g, index_t n, const char* arg) {
  OASIS_REQUIRE(g.empty() || (g.rank() == 1 && g.dim(0) == n), arg, "shape ", shape_str(g.shape()), " is not [", n,
                "] (or empty)");
  require_finite(g, arg);
}
const float* gain_or_null(const DeviceBuffer<float>& d, const Tensor<float>& g) { return g.empty() ? nullptr : d.get(); }

/// What the router's validation establishes (before any device work).
struct RouterPlan {
  index_t n = 0, N = 0, d = 0, B = 0, T = 0;
  DepthOptions depth;
  detail::RouteSetup setup;
  Tensor<float> key_gain;  ///< empty: none
};

/// The checks shared by both sublayer kinds: the configuration, the sources and the router.
RouterPlan check_router(const Tensor<float>& sources, const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                        index_t batch, const KimiRouter& router, const model::ModelConfig& cfg) {
  cfg.validate();
  OASIS_REQUIRE(cfg.attn_res(), "variant", to_string(cfg.variant),
                " has no depth routing (a standard residual stream); the sublayer routes over depth");
  OASIS_REQUIRE(cfg.router != model::RouterFamily::authors_code, "router",
                "the CUDA sublayer implements the Kimi pseudo-query router (kimi_full, kimi_block), got authors_code "
                "(use the reference model)");
  RouterPlan p;
  require_rank(sources, 3, "sources", "[n, N, d]");
  p.n = sources.dim(0);
  p.N = sources.dim(1);
  p.d = sources.dim(2);
  OASIS_REQUIRE(p.n > 0 && p.N > 0 && p.d > 0, "sources", "empty dimension in ", shape_str(sources.shape()));
  OASIS_REQUIRE(p.d == cfg.d_model, "sources", "width d = ", p.d, " differs from d_model = ", cfg.d_model);
  OASIS_REQUIRE(batch > 0 && p.N % batch == 0, "batch", "B = ", batch, " must be positive and divide N = ", p.N);
  p.B = batch;
  p.T = p.N / batch;
  const Tensor<float>& w = required(router.query, "query");
  OASIS_REQUIRE(w.rank() == 1 && w.dim(0) == p.d, "query", "shape ", shape_str(w.shape()), " is not [d] = [", p.d, "]");
  require_finite(w, "query");
  if (router.key_gain) p.key_gain = *router.key_gain;
  require_gain(p.key_gain, p.d, "key_gain");
  // The router's logits are computed on the device; their validation is attn_res_route's with
  // finite g_old (finite sources and weights give finite logits).
  p.depth = model::router_depth_options(cfg, router.theta);
  const Tensor<float> g_placeholder({p.n, p.N});  // shape-only stand-in for the g_old checks
  p.setup = detail::check_route_args(sources, g_placeholder, psi, kinds, p.depth);
  p.setup.clamp_uncoupled = model::clamps_uncoupled_logits(p.depth);
  return p;
}

/// The sublayer's input on the device: the router (g_old, then the routing) and the pre-norm
/// x = RMSNorm(h_l) * norm, with the routing tensors and g_old downloaded into `result`.
struct RoutedInput {
  detail::DeviceRoute route;  ///< h_l [N, d] and the routing on the device
  DeviceBuffer<float> x;      ///< [N, d]
  SublayerResult result;
};

RoutedInput route_and_norm(const RouterPlan& p, const Tensor<float>& sources, const Tensor<float>& psi,
                           const KimiRouter& router, const Tensor<float>& norm, const model::ModelConfig& cfg) {
  RoutedInput in{detail::DeviceRoute(p.n, p.N, p.d), DeviceBuffer<float>(static_cast<std::size_t>(p.N * p.d)), {}};
  DeviceBuffer<float> ds = to_device(sources), dpsi = to_device(psi), dw = to_device(*router.query);
  DeviceBuffer<float> dkg = to_device(p.key_gain), dnorm = to_device(norm);
  DeviceBuffer<float> dg_old(static_cast<std::size_t>(p.n * p.N));
  check(detail::launch_pseudo_query_logits(ds.get(), static_cast<int>(p.n), static_cast<int>(p.N),
                                           static_cast<int>(p.d), dw.get(), gain_or_null(dkg, p.key_gain),
                                           static_cast<float>(cfg.key_norm.eps), dg_old.get(), nullptr),
        "pseudo-query logits launch");
  detail::DeviceRoute& r = in.route;
  detail::launch_attn_res_route(ds.get(), dg_old.get(), dpsi.get(), p.n, p.N, p.d, p.setup, p.depth, r.h.get(),
                                r.alpha.get(), r.alpha_null.get(), r.g.get(), r.dpsi.get(), nullptr);
  check(detail::launch_rms_norm(r.h.get(), static_cast<int>(p.N), static_cast<int>(p.d), gain_or_null(dnorm, norm),
                                static_cast<float>(cfg.norm_eps), in.x.get(), nullptr),
        "pre-norm launch");
  in.result.route = r.download();  // synchronous: the inputs above may be freed at return
  in.result.g_old = Tensor<float>({p.n, p.N});
  dg_old.download(in.result.g_old.data());
  return in;
}

}  // namespace

SublayerResult attn_res_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, index_t batch, const KimiRouter& router,
                                 const model::AttentionWeights<float>& w, const model::ModelConfig& cfg) {
  // --- validation (before any device work) ---
  const RouterPlan p = check_router(sources, psi, kinds, batch, router, cfg);
  const index_t N = p.N, d = p.d, B = p.B, T = p.T;
  const index_t H = cfg.n_heads, Hkv = cfg.kv_heads(), dh = cfg.head_dim();  // validated by cfg.validate()
  detail::require_cuda_normalizer(cfg.token_norm(), "token_normalizer");
  OASIS_REQUIRE(cfg.psi_estimator == model::PsiEstimator::p_null, "psi_estimator",
                "the CUDA sublayer computes psi from p_null, got ", to_string(cfg.psi_estimator));
  OASIS_REQUIRE(dh <= detail::kMaxHeadDim, "d_head", "must be in [1, ", detail::kMaxHeadDim, "], got ", dh);
  OASIS_REQUIRE(!w.gate_w && !w.gate_b, "gate_w",
                "the CUDA sublayer has no gated attention (a baseline of the reference model only)");
  OASIS_REQUIRE(!w.sink_k && !w.sink_v, "sink_k",
                "the CUDA sublayer has no prefix sink (a baseline of the reference model only)");
  require_gain(required(w.norm, "norm"), d, "norm");
  require_matrix(w.wq, H * dh, d, "wq");
  require_matrix(w.wk, Hkv * dh, d, "wk");
  require_matrix(w.wv, Hkv * dh, d, "wv");
  require_matrix(w.wo, d, H * dh, "wo");
  if (cfg.qk_norm) {  // as the model: the q/k norms are read only with qk_norm
    require_gain(required(w.q_norm, "q_norm"), dh, "q_norm");
    require_gain(required(w.k_norm, "k_norm"), dh, "k_norm");
  }
  detail::require_int(B, "batch", "B", 65535);
  detail::require_int(H, "n_heads", "H", 65535);
  detail::require_int(N * H * dh, "sources", "N * H * d_h");
  detail::require_device();

  // --- depth routing and pre-norm ---
  RoutedInput in = route_and_norm(p, sources, psi, router, *w.norm, cfg);
  const DeviceBuffer<float>& x = in.x;
  SublayerResult& res = in.result;

  // --- projections, q/k norm, RoPE ---
  Cublas cb;
  DeviceBuffer<float> wq = to_device(*w.wq), wk = to_device(*w.wk), wv = to_device(*w.wv), wo = to_device(*w.wo);
  DeviceBuffer<float> q(static_cast<std::size_t>(N * H * dh)), k(static_cast<std::size_t>(N * Hkv * dh)),
      v(static_cast<std::size_t>(N * Hkv * dh));
  linear(cb, x.get(), N, d, wq.get(), H * dh, q.get());
  linear(cb, x.get(), N, d, wk.get(), Hkv * dh, k.get());
  linear(cb, x.get(), N, d, wv.get(), Hkv * dh, v.get());
  if (cfg.qk_norm) {
    DeviceBuffer<float> qn = to_device(*w.q_norm), kn = to_device(*w.k_norm);
    check(detail::launch_rms_norm(q.get(), static_cast<int>(N * H), static_cast<int>(dh), gain_or_null(qn, *w.q_norm),
                                  static_cast<float>(cfg.norm_eps), q.get(), nullptr), "q-norm launch");
    check(detail::launch_rms_norm(k.get(), static_cast<int>(N * Hkv), static_cast<int>(dh), gain_or_null(kn, *w.k_norm),
                                  static_cast<float>(cfg.norm_eps), k.get(), nullptr), "k-norm launch");
    check(cudaDeviceSynchronize(), "q/k-norm kernels");  // qn, kn are freed at scope end
  }
  {
    // inv_freq_i = theta^(-2i/d_h) in float, as oasis::model::rope with T = float.
    std::vector<float> inv_freq(static_cast<std::size_t>(dh / 2));
    for (index_t i = 0; i < dh / 2; ++i)
      inv_freq[static_cast<std::size_t>(i)] =
          std::pow(static_cast<float>(cfg.rope_theta), static_cast<float>(-2 * i) / static_cast<float>(dh));
    DeviceBuffer<float> dfreq = to_device(inv_freq);
    const bool inter = cfg.rope == model::RopeLayout::interleaved;
    check(detail::launch_rope(q.get(), static_cast<int>(N), static_cast<int>(T), static_cast<int>(H),
                              static_cast<int>(dh), inter, dfreq.get(), nullptr), "RoPE launch");
    check(detail::launch_rope(k.get(), static_cast<int>(N), static_cast<int>(T), static_cast<int>(Hkv),
                              static_cast<int>(dh), inter, dfreq.get(), nullptr), "RoPE launch");
    check(cudaDeviceSynchronize(), "RoPE kernels");  // dfreq is freed at scope end
  }

  // --- causal attention over the rows [N, H d_h] in place: (b, h, t, c) at ((b T + t) H + h) d_h + c ---
  DeviceBuffer<float> merged(static_cast<std::size_t>(N * H * dh)), lse(static_cast<std::size_t>(B * H * T)),
      pn(static_cast<std::size_t>(B * H * T)), psi_l(static_cast<std::size_t>(B * T));
  detail::AttentionLaunch a;
  a.in_type = io::DType::f32;
  a.q = q.get(); a.k = k.get(); a.v = v.get();
  a.B = static_cast<int>(B); a.H = static_cast<int>(H); a.H_kv = static_cast<int>(Hkv);
  a.Tq = static_cast<int>(T); a.Tk = static_cast<int>(T); a.d_h = static_cast<int>(dh); a.d_v = static_cast<int>(dh);
  a.q_st = H * dh; a.q_sh = dh; a.q_sb = T * H * dh;
  a.k_st = Hkv * dh; a.k_sh = dh; a.k_sb = T * Hkv * dh;
  a.v_st = Hkv * dh; a.v_sh = dh; a.v_sb = T * Hkv * dh;
  a.o_st = H * dh; a.o_sh = dh; a.o_sb = T * H * dh;
  a.softmax1 = cfg.token_norm() == RowNorm::softmax1;
  a.causal = true;
  a.scale = 1.0f / std::sqrt(static_cast<float>(dh));
  a.out = merged.get(); a.lse = lse.get(); a.p_null = pn.get();
  check(detail::launch_attention(a, nullptr), "fused attention launch");
  check(detail::launch_null_statistic(pn.get(), static_cast<int>(B), static_cast<int>(H), static_cast<int>(T),
                                      psi_l.get(), nullptr), "psi launch");
  DeviceBuffer<float> out(static_cast<std::size_t>(N * d));
  linear(cb, merged.get(), N, H * dh, wo.get(), d, out.get());
  res.p_null = Tensor<float>({B, H, T});
  res.lse = Tensor<float>({B, H, T});
  res.psi = Tensor<float>({B, T});
  res.out = Tensor<float>({N, d});
  pn.download(res.p_null.data());
  lse.download(res.lse.data());
  psi_l.download(res.psi.data());
  out.download(res.out.data());
  check(cudaDeviceSynchronize(), "sublayer kernels");
  return std::move(res);
}

SublayerResult attn_res_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, index_t batch, const KimiRouter& router,
                                 const model::MlpWeights<float>& w, const model::ModelConfig& cfg) {
  // --- validation (before any device work) ---
  const RouterPlan p = check_router(sources, psi, kinds, batch, router, cfg);
  const index_t N = p.N, d = p.d;
  require_gain(required(w.norm, "norm"), d, "norm");
  const Tensor<float>& gate = required(w.gate, "gate");
  OASIS_REQUIRE(gate.rank() == 2 && gate.dim(0) > 0, "gate", "shape ", shape_str(gate.shape()), " is not [d_ff, d]");
  const index_t d_ff = gate.dim(0);
  require_matrix(w.gate, d_ff, d, "gate");
  require_matrix(w.up, d_ff, d, "up");
  require_matrix(w.down, d, d_ff, "down");
  detail::require_int(N * d_ff, "gate", "N * d_ff");
  detail::require_device();

  // --- depth routing and pre-norm ---
  RoutedInput in = route_and_norm(p, sources, psi, router, *w.norm, cfg);
  const DeviceBuffer<float>& x = in.x;
  SublayerResult& res = in.result;

  // --- SwiGLU ---
  Cublas cb;
  DeviceBuffer<float> wg = to_device(*w.gate), wu = to_device(*w.up), wd = to_device(*w.down);
  DeviceBuffer<float> ga(static_cast<std::size_t>(N * d_ff)), up(static_cast<std::size_t>(N * d_ff)),
      out(static_cast<std::size_t>(N * d));
  linear(cb, x.get(), N, d, wg.get(), d_ff, ga.get());
  linear(cb, x.get(), N, d, wu.get(), d_ff, up.get());
  check(detail::launch_swiglu(ga.get(), up.get(), N * d_ff, ga.get(), nullptr), "SwiGLU launch");
  linear(cb, ga.get(), N, d_ff, wd.get(), d, out.get());
  res.out = Tensor<float>({N, d});
  out.download(res.out.data());
  check(cudaDeviceSynchronize(), "sublayer kernels");
  return std::move(res);
}

}  // namespace oasis::cuda
