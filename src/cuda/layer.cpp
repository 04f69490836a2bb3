// src/cuda/layer.cpp — one Full-AttnRes sublayer forward on the device (oasis/cuda.hpp).
//
//   g_old_i = w_l^T RMSNorm_key(v_i)                                  (pseudo-query logits)
//   h_l     = sum_i alpha_i v_i,  alpha = depth normaliser(g_old - beta Dpsi)   (the router)
//   x       = RMSNorm(h_l) * norm                                     (the sublayer's pre-norm)
//   attention: q, k, v = x W_q^T, x W_k^T, x W_v^T  (cuBLAS SGEMM, float32, no TF32)
//              optional per-head q/k RMSNorm, RoPE at positions t = 0..T-1,
//              A = token attention (fused kernel), psi = mean_h p_null, out = A W_o^T
//   mlp:       out = (silu(x W_gate^T) * (x W_up^T)) W_down^T
// The semantics are those of oasis::model::attention_sublayer / mlp_sublayer (oasis/model/layers.hpp)
// for a sublayer without KV cache (pos0 = 0).
#include <cublas_v2.h>

#include <cmath>
#include <memory>

#include "device_util.hpp"
#include "oasis/cuda.hpp"

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

void require_matrix(const Tensor<float>& W, index_t rows, index_t cols, const char* arg) {
  OASIS_REQUIRE(W.rank() == 2 && W.dim(0) == rows && W.dim(1) == cols, arg, "shape ", shape_str(W.shape()),
                " is not [", rows, ", ", cols, "]");
  require_finite(W, arg);
}
void require_vector(const Tensor<float>& g, index_t n, const char* arg) {
  OASIS_REQUIRE(g.empty() || (g.rank() == 1 && g.dim(0) == n), arg, "shape ", shape_str(g.shape()), " is not [", n,
                "] (or empty)");
  require_finite(g, arg);
}

}  // namespace

SublayerResult attn_res_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const SublayerWeights& w,
                                 const SublayerOptions& opt) {
  // --- validation (before any device work) ---
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  OASIS_REQUIRE(n > 0 && N > 0 && d > 0, "sources", "empty dimension in ", shape_str(sources.shape()));
  OASIS_REQUIRE(opt.batch > 0 && N % opt.batch == 0, "batch", "B = ", opt.batch, " must be positive and divide N = ", N);
  const index_t B = opt.batch, T = N / B;
  OASIS_REQUIRE(w.pseudo_query.rank() == 1 && w.pseudo_query.dim(0) == d, "pseudo_query", "shape ",
                shape_str(w.pseudo_query.shape()), " is not [d] = [", d, "]");
  require_finite(w.pseudo_query, "pseudo_query");
  require_vector(w.key_gain, d, "key_gain");
  require_vector(w.norm, d, "norm");
  OASIS_REQUIRE(std::isfinite(opt.key_norm.eps) && opt.key_norm.eps > 0, "key_norm.eps", "must be finite and positive");
  OASIS_REQUIRE(std::isfinite(opt.norm_eps) && opt.norm_eps > 0, "norm_eps", "must be finite and positive");
  const index_t H = opt.n_heads, Hkv = opt.n_kv_heads ? opt.n_kv_heads : opt.n_heads;
  const index_t dh = opt.d_head ? opt.d_head : (H > 0 ? d / H : 0);
  const bool attention = opt.kind == SublayerKind::attention;
  const bool qk_norm = !w.q_norm.empty() || !w.k_norm.empty();
  index_t d_ff = 0;
  if (attention) {
    detail::require_cuda_normalizer(opt.token_normalizer, "token_normalizer");
    OASIS_REQUIRE(H > 0, "n_heads", "must be positive, got ", H);
    OASIS_REQUIRE(opt.n_kv_heads >= 0 && Hkv > 0 && H % Hkv == 0, "n_kv_heads", "must divide n_heads = ", H, ", got ",
                  opt.n_kv_heads);
    OASIS_REQUIRE(opt.d_head > 0 || (d % H == 0), "d_head", "is 0 (derived) but n_heads = ", H,
                  " does not divide d = ", d);
    OASIS_REQUIRE(dh > 0 && dh <= detail::kMaxHeadDim, "d_head", "must be in [1, ", detail::kMaxHeadDim, "], got ", dh);
    OASIS_REQUIRE(opt.rope == Rope::none || dh % 2 == 0, "d_head", "RoPE needs an even head width, got ", dh);
    OASIS_REQUIRE(opt.rope == Rope::none || (std::isfinite(opt.rope_theta) && opt.rope_theta > 1), "rope_theta",
                  "must be finite and > 1");
    require_matrix(w.wq, H * dh, d, "wq");
    require_matrix(w.wk, Hkv * dh, d, "wk");
    require_matrix(w.wv, Hkv * dh, d, "wv");
    require_matrix(w.wo, d, H * dh, "wo");
    OASIS_REQUIRE(!qk_norm || (!w.q_norm.empty() && !w.k_norm.empty()), "q_norm",
                  "q_norm and k_norm are given together (qk-norm) or both empty");
    if (qk_norm) {
      require_vector(w.q_norm, dh, "q_norm");
      require_vector(w.k_norm, dh, "k_norm");
    }
    detail::require_int(B, "batch", "B", 65535);
    detail::require_int(H, "n_heads", "H", 65535);
    detail::require_int(N * H * dh, "sources", "N * H * d_h");
  } else {
    OASIS_REQUIRE(w.gate.rank() == 2 && w.gate.dim(0) > 0, "gate", "shape ", shape_str(w.gate.shape()),
                  " is not [d_ff, d]");
    d_ff = w.gate.dim(0);
    require_matrix(w.gate, d_ff, d, "gate");
    require_matrix(w.up, d_ff, d, "up");
    require_matrix(w.down, d, d_ff, "down");
    detail::require_int(N * d_ff, "gate", "N * d_ff");
  }
  // The router: logits of the sources are computed on the device; their validation is that of
  // attn_res_route with finite g_old (finite sources and weights give finite logits).
  const Tensor<float> g_placeholder({n, N});  // shape-only stand-in for the g_old checks
  detail::RouteSetup setup = detail::check_route_args(sources, g_placeholder, psi, kinds, opt.depth);
  // As oasis::model::finish_route: a convention with a score clamp clamps g_old even without coupling.
  setup.clamp_uncoupled = !opt.depth.coupling && std::isfinite(opt.depth.coupling_options.score_clamp);
  detail::require_device();

  // --- depth routing ---
  SublayerResult res;
  DeviceBuffer<float> ds = to_device(sources), dpsi = to_device(psi), dw = to_device(w.pseudo_query);
  DeviceBuffer<float> dkg = to_device(w.key_gain), dg_old(static_cast<std::size_t>(n * N));
  check(detail::launch_pseudo_query_logits(ds.get(), static_cast<int>(n), static_cast<int>(N), static_cast<int>(d),
                                           dw.get(), w.key_gain.empty() ? nullptr : dkg.get(),
                                           static_cast<float>(opt.key_norm.eps), dg_old.get(), nullptr),
        "pseudo-query logits launch");
  const detail::DeviceRoute route = detail::route_device(ds.get(), dg_old.get(), dpsi.get(), n, N, d, setup, opt.depth);
  res.route = detail::download_route(route, n, N, d);
  res.g_old = Tensor<float>({n, N});
  dg_old.download(res.g_old.data());

  // --- the sublayer ---
  Cublas cb;
  DeviceBuffer<float> dnorm = to_device(w.norm), x(static_cast<std::size_t>(N * d));
  check(detail::launch_rms_norm(route.h.get(), static_cast<int>(N), static_cast<int>(d),
                                w.norm.empty() ? nullptr : dnorm.get(), static_cast<float>(opt.norm_eps), x.get(), nullptr),
        "pre-norm launch");
  DeviceBuffer<float> out(static_cast<std::size_t>(N * d));
  if (attention) {
    DeviceBuffer<float> wq = to_device(w.wq), wk = to_device(w.wk), wv = to_device(w.wv), wo = to_device(w.wo);
    DeviceBuffer<float> q(static_cast<std::size_t>(N * H * dh)), k(static_cast<std::size_t>(N * Hkv * dh)),
        v(static_cast<std::size_t>(N * Hkv * dh));
    linear(cb, x.get(), N, d, wq.get(), H * dh, q.get());
    linear(cb, x.get(), N, d, wk.get(), Hkv * dh, k.get());
    linear(cb, x.get(), N, d, wv.get(), Hkv * dh, v.get());
    DeviceBuffer<float> qn = to_device(w.q_norm), kn = to_device(w.k_norm);
    if (qk_norm) {
      check(detail::launch_rms_norm(q.get(), static_cast<int>(N * H), static_cast<int>(dh), qn.get(),
                                    static_cast<float>(opt.norm_eps), q.get(), nullptr), "q-norm launch");
      check(detail::launch_rms_norm(k.get(), static_cast<int>(N * Hkv), static_cast<int>(dh), kn.get(),
                                    static_cast<float>(opt.norm_eps), k.get(), nullptr), "k-norm launch");
    }
    if (opt.rope != Rope::none) {
      // inv_freq_i = theta^(-2i/d_h) in float, as oasis::model::rope with T = float.
      std::vector<float> inv_freq(static_cast<std::size_t>(dh / 2));
      for (index_t i = 0; i < dh / 2; ++i)
        inv_freq[static_cast<std::size_t>(i)] =
            std::pow(static_cast<float>(opt.rope_theta), static_cast<float>(-2 * i) / static_cast<float>(dh));
      DeviceBuffer<float> dfreq = to_device(inv_freq);
      const bool inter = opt.rope == Rope::interleaved;
      check(detail::launch_rope(q.get(), static_cast<int>(N), static_cast<int>(T), static_cast<int>(H),
                                static_cast<int>(dh), inter, dfreq.get(), nullptr), "RoPE launch");
      check(detail::launch_rope(k.get(), static_cast<int>(N), static_cast<int>(T), static_cast<int>(Hkv),
                                static_cast<int>(dh), inter, dfreq.get(), nullptr), "RoPE launch");
      check(cudaDeviceSynchronize(), "RoPE kernels");  // dfreq is freed at scope end
    }
    // Attention over the rows [N, H d_h] directly: element (b, h, t, c) at ((b T + t) H + h) d_h + c.
    DeviceBuffer<float> merged(static_cast<std::size_t>(N * H * dh)), lse(static_cast<std::size_t>(B * H * T)),
        pn(static_cast<std::size_t>(B * H * T)), psi_l(static_cast<std::size_t>(B * T));
    detail::AttentionLaunch a;
    a.in_type = detail::InType::f32;
    a.q = q.get(); a.k = k.get(); a.v = v.get();
    a.B = static_cast<int>(B); a.H = static_cast<int>(H); a.H_kv = static_cast<int>(Hkv);
    a.Tq = static_cast<int>(T); a.Tk = static_cast<int>(T); a.d_h = static_cast<int>(dh); a.d_v = static_cast<int>(dh);
    a.q_st = H * dh; a.q_sh = dh; a.q_sb = T * H * dh;
    a.k_st = Hkv * dh; a.k_sh = dh; a.k_sb = T * Hkv * dh;
    a.v_st = Hkv * dh; a.v_sh = dh; a.v_sb = T * Hkv * dh;
    a.o_st = H * dh; a.o_sh = dh; a.o_sb = T * H * dh;
    a.softmax1 = opt.token_normalizer == RowNorm::softmax1;
    a.causal = opt.causal;
    a.scale = 1.0f / std::sqrt(static_cast<float>(dh));
    a.out = merged.get(); a.lse = lse.get(); a.p_null = pn.get();
    check(detail::launch_attention(a, nullptr), "fused attention launch");
    check(detail::launch_null_statistic(pn.get(), static_cast<int>(B), static_cast<int>(H), static_cast<int>(T),
                                        psi_l.get(), nullptr), "psi launch");
    linear(cb, merged.get(), N, H * dh, wo.get(), d, out.get());
    res.p_null = Tensor<float>({B, H, T});
    res.lse = Tensor<float>({B, H, T});
    res.psi = Tensor<float>({B, T});
    pn.download(res.p_null.data());
    lse.download(res.lse.data());
    psi_l.download(res.psi.data());
  } else {
    DeviceBuffer<float> wg = to_device(w.gate), wu = to_device(w.up), wd = to_device(w.down);
    DeviceBuffer<float> ga(static_cast<std::size_t>(N * d_ff)), up(static_cast<std::size_t>(N * d_ff));
    linear(cb, x.get(), N, d, wg.get(), d_ff, ga.get());
    linear(cb, x.get(), N, d, wu.get(), d_ff, up.get());
    check(detail::launch_swiglu(ga.get(), up.get(), N * d_ff, ga.get(), nullptr), "SwiGLU launch");
    linear(cb, ga.get(), N, d_ff, wd.get(), d, out.get());
  }
  res.out = Tensor<float>({N, d});
  out.download(res.out.data());
  check(cudaDeviceSynchronize(), "sublayer kernels");
  return res;
}

}  // namespace oasis::cuda
