// The model layers' backward (oasis/grad/layers_backward.hpp) in float and double against mp50 on
// the same inputs, within derived bounds, plus the transpose identity of RoPE, two wrong
// backwards the bounds reject, and storage rounding taken straight through. (Every layer is also
// checked against mp50 finite differences inside the whole model, test_model_backward.cpp.)
//
// Derived bounds (first order, inputs and incoming gradients exact in T, every bound x 1.02 plus
// 2 denorm_min(T)): a recursive sum of n products has absolute error <= n u sum |terms|; exp
// within 2u (docs/tolerances.md).
//   linear    dx_rc = sum_o dy_ro W_oc:   nout u sum_o |dy_ro W_oc|;   dW_oc = sum_r dy_ro x_rc:  N u sum_r |dy_ro x_rc|
//   RoPE      R^T dy is the forward rope on S dy (S exact), so its bound is the forward's rule
//             (oasis::model::rope with an ErrorModel): 2 ||dy_r||_inf (dc + gamma_2) per row,
//             dc = 2u + (3 + ln theta) u max_angle
//   SwiGLU    sg = sigmoid(a) (relative 4u), s = a sg (5u), f = sg + s (1 - sg):
//             |df| <= 4u sg + 7u |s| + u |f|  (|d(1 - sg)| <= 4u sg + u (1 - sg), |d(s(1 - sg))| <= 7u |s|);
//             da = (dm b) f:  |dm b| |df| + 2u |da|;   db = dm s:  6u |dm s|
//   RMSNorm   per row (per head for the q/k norm) rms_norm_row_backward is the pseudo-query
//             backward with one candidate, dL/dg = 1 and w = dy (dy_c = 1 w_c exactly), so its
//             bound is bounds::pseudo_query_logits_backward_bounds' (docs/tolerances.md,
//             "Backward"); evaluated in float32 (ModelConfig::norm_float32) that bound includes
//             float32 arithmetic and the casts of x, gain and dy. dgain sums the rows' terms in T:
//             the rows' bounds plus (rows) u sum_r |dy_rc xhat_rc| (x 1.02).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/layers_backward.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/model/model.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis_test.hpp"

using namespace oasis;
namespace om = oasis::model;
using R = mp50;

namespace {

template <class T> double floor_of() { return 2 * static_cast<double>(std::numeric_limits<T>::denorm_min()); }

/// max over elements of |x - ref| / bound, with the first violation named.
struct Ratio {
  double worst = 0;
  std::string first;
  template <class T>
  void add(const std::string& name, const Tensor<T>& x, const Tensor<R>& ref, const Tensor<double>& bound) {
    for (index_t i = 0; i < x.size(); ++i) {
      const double e = std::abs(static_cast<double>(R(x[i]) - ref[i]));
      const double r = bound[i] > 0 ? e / bound[i] : (e > 0 ? INFINITY : 0);
      if (r > 1 && first.empty())
        first = name + "[" + std::to_string(i) + "]: |err| " + std::to_string(e) + " bound " + std::to_string(bound[i]);
      worst = std::max(worst, std::isnan(r) ? INFINITY : r);
    }
  }
};

template <class T>
Ratio linear_case(std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  const index_t N = 6, nin = 8, nout = 5;
  const Tensor<T> x = oasis::test::randn<T>({N, nin}, rng), W = oasis::test::randn<T>({nout, nin}, rng),
                  dy = oasis::test::randn<T>({N, nout}, rng);
  const om::LinearGrads<T> g = om::linear_backward(x, W, dy);
  const om::LinearGrads<R> h = om::linear_backward(x.template cast<R>(), W.template cast<R>(), dy.template cast<R>());
  const double u = unit_roundoff<T>();
  Tensor<double> bx({N, nin}), bw({nout, nin});
  for (index_t r = 0; r < N; ++r)
    for (index_t o = 0; o < nout; ++o)
      for (index_t c = 0; c < nin; ++c) {
        bx(r, c) += std::abs(static_cast<double>(dy(r, o)) * static_cast<double>(W(o, c)));
        bw(o, c) += std::abs(static_cast<double>(dy(r, o)) * static_cast<double>(x(r, c)));
      }
  for (index_t i = 0; i < bx.size(); ++i) bx[i] = 1.02 * static_cast<double>(nout) * u * bx[i] + floor_of<T>();
  for (index_t i = 0; i < bw.size(); ++i) bw[i] = 1.02 * static_cast<double>(N) * u * bw[i] + floor_of<T>();
  Ratio q;
  q.add("dx", g.x, h.x, bx);
  q.add("dW", g.W, h.W, bw);
  return q;
}

template <class T>
Ratio rope_case(std::uint64_t seed, om::RopeLayout layout) {
  auto rng = oasis::test::make_rng(seed);
  const index_t H = 2, dh = 8, Tn = 6, pos0 = 3, N = 2 * Tn;
  const double theta = 10000;
  const Tensor<T> dy = oasis::test::randn<T>({N, H * dh}, rng);
  const Tensor<T> g = om::rope_backward(dy, H, dh, Tn, pos0, layout, theta);
  const Tensor<R> h = om::rope_backward(dy.template cast<R>(), H, dh, Tn, pos0, layout, theta);
  // the forward's rule on S dy (the same magnitudes as dy)
  const om::Rows<T> e = om::rope(om::Rows<T>{dy, std::vector<double>(static_cast<std::size_t>(N), 0.0)}, H, dh, Tn, pos0,
                                 layout, theta, om::ErrorModel{unit_roundoff<T>()});
  Tensor<double> b({N, H * dh});
  for (index_t r = 0; r < N; ++r)
    for (index_t c = 0; c < H * dh; ++c) b(r, c) = 1.02 * e.e[static_cast<std::size_t>(r)] + floor_of<T>();
  Ratio q;
  q.add("rope_backward", g, h, b);
  return q;
}

template <class T>
Ratio swiglu_case(std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  const Tensor<T> a = oasis::test::randn<T>({6, 7}, rng, 3.0), b = oasis::test::randn<T>({6, 7}, rng),
                  dm = oasis::test::randn<T>({6, 7}, rng);
  const om::SwiGluGrads<T> g = om::swiglu_backward(a, b, dm);
  const om::SwiGluGrads<R> h = om::swiglu_backward(a.template cast<R>(), b.template cast<R>(), dm.template cast<R>());
  const double u = unit_roundoff<T>();
  Tensor<double> ba(a.shape()), bb(a.shape());
  for (index_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), sg = 1 / (1 + std::exp(-x)), s = x * sg, f = sg + s * (1 - sg);
    const double dmb = std::abs(static_cast<double>(dm[i]) * static_cast<double>(b[i]));
    ba[i] = 1.02 * (dmb * (4 * u * sg + 7 * u * std::abs(s) + u * std::abs(f)) + 2 * u * dmb * std::abs(f)) + floor_of<T>();
    bb[i] = 1.02 * 6 * u * std::abs(static_cast<double>(dm[i]) * s) + floor_of<T>();
  }
  Ratio q;
  q.add("da", g.a, h.a, ba);
  q.add("db", g.b, h.b, bb);
  return q;
}

/// rms_norm_backward (per_head: head_rms_norm_backward with 2 heads), evaluated in float32 when
/// f32, against mp50's exact backward (header: the bound).
template <class T>
Ratio rms_norm_case(std::uint64_t seed, bool f32, bool per_head) {
  auto rng = oasis::test::make_rng(seed);
  const index_t N = 5, H = per_head ? 2 : 1, w = 8, W = H * w;
  const Tensor<T> x = oasis::test::randn<T>({N, W}, rng), gain = oasis::test::uniform<T>({w}, rng, 0.5, 1.5),
                  dy = oasis::test::randn<T>({N, W}, rng);
  const KeyNormOptions opt{1e-6, f32}, exact{1e-6, false};
  const om::NormGrads<T> g = per_head ? om::head_rms_norm_backward(x, H, w, gain, opt, dy) : om::rms_norm_backward(x, gain, opt, dy);
  const om::NormGrads<R> h = per_head ? om::head_rms_norm_backward(x.template cast<R>(), H, w, gain.template cast<R>(), exact,
                                                                   dy.template cast<R>())
                                      : om::rms_norm_backward(x.template cast<R>(), gain.template cast<R>(), exact,
                                                              dy.template cast<R>());
  Tensor<double> bx({N, W}), bg({w}), terms({w});
  Tensor<T> one({1, 1});
  one[0] = T(1);
  for (index_t r = 0; r < N; ++r)
    for (index_t hh = 0; hh < H; ++hh) {
      Tensor<T> xs({1, 1, w}), wv({w});
      for (index_t c = 0; c < w; ++c) {
        xs[c] = x(r, hh * w + c);
        wv[c] = dy(r, hh * w + c);
      }
      const bounds::PseudoQueryBackwardBounds b = bounds::pseudo_query_logits_backward_bounds(xs, wv, gain, one, opt);
      double ss = 0;
      for (index_t c = 0; c < w; ++c) ss += static_cast<double>(xs[c]) * static_cast<double>(xs[c]);
      const double inv = 1 / std::sqrt(ss / static_cast<double>(w) + 1e-6);
      for (index_t c = 0; c < w; ++c) {
        bx(r, hh * w + c) = b.sources[c];
        bg[c] += b.gain[c];
        terms[c] += std::abs(static_cast<double>(wv[c]) * static_cast<double>(xs[c]) * inv);
      }
    }
  for (index_t c = 0; c < w; ++c) bg[c] += 1.02 * static_cast<double>(N * H) * unit_roundoff<T>() * terms[c];
  Ratio q;
  q.add(per_head ? "head_rms_norm dx" : "rms_norm dx", g.x, h.x, bx);
  q.add(per_head ? "head_rms_norm dgain" : "rms_norm dgain", g.gain, h.gain, bg);
  return q;
}

template <class T>
void within_bounds(const char* tname) {
  double worst = 0;
  for (std::uint64_t s = 0; s < 20; ++s) {
    for (const Ratio& q : {linear_case<T>(300 + s), rope_case<T>(400 + s, om::RopeLayout::rotate_half),
                           rope_case<T>(500 + s, om::RopeLayout::interleaved), swiglu_case<T>(600 + s)}) {
      EXPECT_LE(q.worst, 1.0) << tname << " seed " << s << ": " << q.first;
      worst = std::max(worst, q.worst);
    }
  }
  std::printf("layer backward (%s) vs mp50: worst err / derived bound %.3g\n", tname, worst);
  double worst_norm = 0, worst_f32 = 0;
  for (std::uint64_t s = 0; s < 20; ++s)
    for (bool per_head : {false, true})
      for (bool f32 : {false, true}) {
        const Ratio q = rms_norm_case<T>(700 + 4 * s + 2 * per_head + f32, f32, per_head);
        EXPECT_LE(q.worst, 1.0) << tname << (f32 ? " float32-evaluated" : "") << " seed " << s << ": " << q.first;
        (f32 ? worst_f32 : worst_norm) = std::max(f32 ? worst_f32 : worst_norm, q.worst);
      }
  std::printf("RMSNorm backward (%s) vs mp50: worst err / derived bound %.3g (evaluated in float32: %.3g)\n", tname,
              worst_norm, worst_f32);
}

TEST(LayersBackward, FloatAndDoubleWithinDerivedBounds) {
  within_bounds<float>("float");
  within_bounds<double>("double");
}

/// RoPE's backward is the transpose of its forward: <R x, y> = <x, R^T y> (mp50, 1e-40 relative).
TEST(LayersBackward, RopeBackwardIsTheTranspose) {
  for (om::RopeLayout layout : {om::RopeLayout::rotate_half, om::RopeLayout::interleaved}) {
    auto rng = oasis::test::make_rng(77);
    const index_t H = 2, dh = 6, Tn = 5, N = 10;
    const Tensor<R> x = oasis::test::randn<double>({N, H * dh}, rng).cast<R>(),
                    y = oasis::test::randn<double>({N, H * dh}, rng).cast<R>();
    const Tensor<R> rx = om::rope(om::Rows<R>{x, {}}, H, dh, Tn, 2, layout, 500.0, om::ErrorModel{}).x;
    const Tensor<R> rty = om::rope_backward(y, H, dh, Tn, 2, layout, 500.0);
    R a(0), b(0), mag(0);
    for (index_t i = 0; i < x.size(); ++i) {
      a += rx[i] * y[i];
      b += x[i] * rty[i];
      mag += abs(x[i] * rty[i]);
    }
    EXPECT_LE(static_cast<double>(abs(a - b)), 1e-40 * static_cast<double>(mag)) << om::to_string(layout);
  }
}

/// Two wrong backwards are rejected by the same bounds: RoPE's forward rotation in place of its
/// transpose, and silu' without its second term (da = dm b sigmoid(a)).
TEST(LayersBackward, WrongBackwardsFail) {
  auto rng = oasis::test::make_rng(91);
  const index_t H = 2, dh = 8, Tn = 6, N = 12;
  const Tensor<float> dy = oasis::test::randn<float>({N, H * dh}, rng);
  const Tensor<float> wrong = om::rope(om::Rows<float>{dy, {}}, H, dh, Tn, 3, om::RopeLayout::rotate_half, 1e4,
                                       om::ErrorModel{}).x;
  const Tensor<R> h = om::rope_backward(dy.cast<R>(), H, dh, Tn, 3, om::RopeLayout::rotate_half, 1e4);
  const om::Rows<float> e = om::rope(om::Rows<float>{dy, std::vector<double>(N, 0.0)}, H, dh, Tn, 3,
                                     om::RopeLayout::rotate_half, 1e4, om::ErrorModel{unit_roundoff<float>()});
  Tensor<double> b({N, H * dh});
  for (index_t r = 0; r < N; ++r)
    for (index_t c = 0; c < H * dh; ++c) b(r, c) = 1.02 * e.e[static_cast<std::size_t>(r)];
  Ratio q;
  q.add("rope forward as backward", wrong, h, b);
  EXPECT_GT(q.worst, 1e3);

  const Tensor<float> a = oasis::test::randn<float>({4, 5}, rng, 3.0), bb = oasis::test::randn<float>({4, 5}, rng),
                      dm = oasis::test::randn<float>({4, 5}, rng);
  Tensor<float> da(a.shape());
  for (index_t i = 0; i < a.size(); ++i) da[i] = dm[i] * bb[i] * sigmoid(a[i]);
  const om::SwiGluGrads<R> hs = om::swiglu_backward(a.cast<R>(), bb.cast<R>(), dm.cast<R>());
  double worst = 0;
  for (index_t i = 0; i < a.size(); ++i) {
    const double x = a[i], sg = 1 / (1 + std::exp(-x)), s = x * sg, f = sg + s * (1 - sg), dmb = std::abs(dm[i] * bb[i]);
    const double u = unit_roundoff<float>();
    const double bound = 1.02 * (dmb * (4 * u * sg + 7 * u * std::abs(s) + u * std::abs(f)) + 2 * u * dmb * std::abs(f));
    worst = std::max(worst, std::abs(static_cast<double>(R(da[i]) - hs.a[i])) / bound);
  }
  EXPECT_GT(worst, 1e3);
}

/// Storage rounding is straight through (layers_backward.hpp): with a bfloat16 `store` the MLP
/// sublayer's backward equals the plain one in every gradient that reads no stored value, and
/// W_down's gradient is the outer product of dL/dout with the stored hidden rows; the attention
/// sublayer's W_o gradient is that with its stored heads (bitwise); the identity rounding changes
/// nothing.
TEST(LayersBackward, StorageRoundingIsStraightThrough) {
  auto bf16 = [](double x) { return oasis::io::round_to_dtype(x, oasis::io::DType::bf16); };
  om::ModelConfig cfg;
  cfg.d_model = 8;
  cfg.n_heads = 2;
  cfg.d_ff = 12;
  cfg.n_blocks = 1;
  cfg.qk_norm = true;
  cfg.init_std = 0.4;
  const om::Model<double> m = om::Model<double>::initialized(cfg, 21);
  auto rng = oasis::test::make_rng(22);
  const index_t B = 2, Tn = 4, N = B * Tn, d = cfg.d_model;
  const Tensor<double> h = oasis::test::randn<double>({N, d}, rng), dout = oasis::test::randn<double>({N, d}, rng),
                       dpsi = oasis::test::randn<double>({B, Tn}, rng);
  auto same = [](const Tensor<double>& a, const Tensor<double>& b, const char* what) {
    for (index_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) return ::testing::AssertionFailure() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
    return ::testing::AssertionSuccess();
  };
  const om::MlpWeights<double> Wm = m.mlp_weights(0);
  const om::MlpSublayerGrads<double> mp = om::mlp_sublayer_backward(h, Wm, cfg, dout);
  const om::MlpSublayerGrads<double> ms = om::mlp_sublayer_backward(h, Wm, cfg, dout, +bf16);
  EXPECT_TRUE(same(ms.h, mp.h, "mlp dh"));
  EXPECT_TRUE(same(ms.norm, mp.norm, "mlp dnorm"));
  EXPECT_TRUE(same(ms.gate, mp.gate, "mlp dgate"));
  EXPECT_TRUE(same(ms.up, mp.up, "mlp dup"));
  om::Rows<double> hid = om::mlp_hidden(om::Rows<double>{h, {}}, Wm, cfg, om::ErrorModel{});
  om::store_values(hid.x, +bf16);
  EXPECT_TRUE(same(ms.down, om::linear_backward(hid.x, *Wm.down, dout).W, "mlp ddown"));
  bool differs = false;
  for (index_t i = 0; i < ms.down.size(); ++i) differs = differs || ms.down[i] != mp.down[i];
  EXPECT_TRUE(differs) << "bfloat16 storage does not reach W_down's gradient";

  const om::AttentionWeights<double> Wa = m.attn_weights(0);
  const om::AttentionSublayerGrads<double> ap = om::attention_sublayer_backward(h, B, Tn, Wa, cfg, dout, dpsi);
  const om::AttentionSublayerGrads<double> ai =
      om::attention_sublayer_backward(h, B, Tn, Wa, cfg, dout, dpsi, +[](double x) { return x; });
  EXPECT_TRUE(same(ai.h, ap.h, "attention dh (identity rounding)"));
  EXPECT_TRUE(same(ai.wq, ap.wq, "attention dwq (identity rounding)"));
  om::KVCache<double> kv;
  om::SublayerOptions so;
  so.store = +bf16;
  const om::AttentionSublayer<double> fwd = om::attention_sublayer(om::Rows<double>{h, {}}, B, Tn, 0, Wa, cfg, kv, om::ErrorModel{}, so);
  const om::AttentionSublayerGrads<double> as = om::attention_sublayer_backward(h, B, Tn, Wa, cfg, dout, dpsi, +bf16);
  EXPECT_TRUE(same(as.wo, om::linear_backward(fwd.heads.x, *Wa.wo, dout).W, "attention dwo"));
}

}  // namespace
