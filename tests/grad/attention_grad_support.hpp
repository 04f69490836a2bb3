// tests/grad/attention_grad_support.hpp — token-attention instances of the backward tests
// (docs/spec.md §8): the cases, inputs in [B, H, T, d] with their cotangents, the library's
// backward in any layout, the loss, and the mp50 finite-difference check of every gradient with
// its derived tolerance (fd_support.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "fd_support.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"

namespace oasis::attention_grad_test {

using R = mp50;
namespace fd = oasis::test::fd;

/// Base seed of the random cases; OASIS_GRAD_SEED overrides it (printed on failure).
inline std::uint64_t base_seed() {
  const char* s = std::getenv("OASIS_GRAD_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 1500;
}

struct Case {
  std::string name;
  index_t B, H, H_kv, Tq, Tk, d_h, d_v;
  RowNorm norm = RowNorm::softmax1;
  bool causal = false, padding = false, sinks = false, bias = false, dlse = false, dp_null = false;
  index_t window = 0;
  AttentionLayout layout = AttentionLayout::bhtd;
  double q_scale = 1.0;
};

/// One instance: inputs in [B, H, T, d] order as doubles (exact in float), options, cotangents.
struct Instance {
  Tensor<double> q, k, v, dout, dlse, dpn;
  AttentionOptions opt;
};

inline Instance make_instance(const Case& c, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  Instance I;
  I.q = oasis::test::randn<float>({c.B, c.H, c.Tq, c.d_h}, rng, c.q_scale).cast<double>();
  I.k = oasis::test::randn<float>({c.B, c.H_kv, c.Tk, c.d_h}, rng).cast<double>();
  I.v = oasis::test::randn<float>({c.B, c.H_kv, c.Tk, c.d_v}, rng).cast<double>();
  I.dout = oasis::test::randn<float>({c.B, c.H, c.Tq, c.d_v}, rng).cast<double>();
  if (c.dlse) I.dlse = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng).cast<double>();
  if (c.dp_null) I.dpn = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng).cast<double>();
  I.opt.normalizer = c.norm;
  I.opt.causal = c.causal;
  I.opt.window = c.window;
  I.opt.layout = c.layout;
  if (c.padding) {
    for (index_t b = 0; b < c.B; ++b) I.opt.key_lengths.push_back(1 + static_cast<index_t>(rng() % c.Tk));
    if (c.norm == RowNorm::softmax1) I.opt.key_lengths[0] = 0;  // a fully padded sequence: p_null = 1
  }
  if (c.sinks)  // multiples of 2^-5: s +- 2^-40 stays exact in the double options
    for (index_t h = 0; h < c.H; ++h) I.opt.null_logits.push_back(std::ldexp(static_cast<double>(rng() % 129) - 64.0, -5));
  if (c.bias) {  // [1, H, Tq, Tk] multiples of 2^-5 with a few -inf (masked) entries
    I.opt.bias = Tensor<double>({1, c.H, c.Tq, c.Tk});
    for (index_t i = 0; i < I.opt.bias.size(); ++i)
      I.opt.bias[i] = rng() % 7 == 0 && c.norm == RowNorm::softmax1 ? neg_inf<double>()
                                                                     : std::ldexp(static_cast<double>(rng() % 65) - 32.0, -5);
  }
  return I;
}

/// The API takes the layout of the options; tests hold everything in [B, H, T, d].
template <class T>
Tensor<T> to_layout(const Tensor<T>& x, const AttentionOptions& o) {
  return o.layout == AttentionLayout::bthd ? swap_head_time(x) : x;
}

template <class T>
AttentionCotangents<T> cotangents(const Instance& I) {
  return {to_layout(I.dout.cast<T>(), I.opt), I.dlse.cast<T>(), I.dpn.cast<T>()};
}

/// The library's backward in T, gradients returned in [B, H, T, d].
template <class T>
AttentionGrads<T> library_backward(const Instance& I, bool return_scores = false) {
  AttentionOptions o = I.opt;
  o.return_probs = return_scores;
  AttentionGrads<T> g = token_attention_backward(to_layout(I.q.cast<T>(), o), to_layout(I.k.cast<T>(), o),
                                                 to_layout(I.v.cast<T>(), o), cotangents<T>(I), o);
  g.q = to_layout(g.q, o);
  g.k = to_layout(g.k, o);
  g.v = to_layout(g.v, o);
  return g;
}

/// The loss f = sum dO . out + sum dLSE lse + sum dP p_null in mp50 (rows of a fully masked plain
/// softmax have lse = -inf and no gradient: their lse term is left out).
inline R loss(const Tensor<R>& q, const Tensor<R>& k, const Tensor<R>& v, const AttentionOptions& opt, const Instance& I) {
  const AttentionResult<R> a = token_attention(to_layout(q, opt), to_layout(k, opt), to_layout(v, opt), opt);
  const Tensor<R> out = to_layout(a.out, opt);
  R f(0);
  for (index_t i = 0; i < out.size(); ++i) f += R(I.dout[i]) * out[i];
  for (index_t i = 0; i < a.lse.size(); ++i) {
    if (!I.dlse.empty() && is_finite(a.lse[i])) f += R(I.dlse[i]) * a.lse[i];
    if (!I.dpn.empty()) f += R(I.dpn[i]) * a.p_null[i];
  }
  return f;
}

/// Rows of the softmax functional: categories of row (b, h, t) with their incoming gradients
/// c_j = <dO_t, v_j> (keys) and dP_t (the null), for the M3 bound (fd_support.hpp).
struct RowInfo {
  std::vector<index_t> keys;  // visible (unmasked) keys
  std::vector<double> c;      // per key
  double c_null = 0, dlse = 0;
  bool has_null = false;
};

inline std::vector<RowInfo> row_infos(const Instance& I) {
  const AttentionShape s{I.q.dim(0), I.q.dim(1), I.k.dim(1), I.q.dim(2), I.k.dim(2), I.q.dim(3), I.v.dim(3)};
  AttentionOptions o = I.opt;
  o.layout = AttentionLayout::bhtd;
  std::vector<RowInfo> rows;
  const index_t group = s.H / s.H_kv;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        RowInfo r;
        r.has_null = o.normalizer == RowNorm::softmax1;
        const KeyRange kr = visible_range(s, o, b, t);
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (std::isinf(attention_bias(o, b, h, t, j))) continue;
          double x = 0;
          for (index_t c = 0; c < s.d_v; ++c) x += I.dout(b, h, t, c) * I.v(b, h / group, j, c);
          r.keys.push_back(j);
          r.c.push_back(x);
        }
        r.c_null = I.dpn.empty() ? 0.0 : I.dpn(b, h, t);
        r.dlse = I.dlse.empty() ? 0.0 : I.dlse(b, h, t);
        rows.push_back(r);
      }
  return rows;
}

/// M3 of one row whose logit slopes are slope(j) for key j and slope_null for the null.
inline double row_m3(const RowInfo& r, const std::function<double(index_t)>& slope, double slope_null) {
  std::vector<fd::Category> cats;
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    fd::Category k;
    k.c = fd::around(r.c[i]);
    k.a = fd::around(slope(r.keys[i]));
    cats.push_back(k);
  }
  if (r.has_null) {
    fd::Category k;
    k.c = fd::around(r.c_null);
    k.a = fd::around(slope_null);
    cats.push_back(k);
  }
  return fd::row_third_derivative_bound(cats, r.dlse);
}

/// Every analytic gradient of `g` (mp50, [B, H, T, d]) against the central difference of the loss
/// (null logits and bias first, then k, v, q: the cheap coordinates where a wrong row backward shows).
inline fd::Summary fd_check(const Instance& I, const AttentionGrads<R>& g, long stop_after = 0) {
  const index_t B = I.q.dim(0), H = I.q.dim(1), Hkv = I.k.dim(1), Tq = I.q.dim(2), Tk = I.k.dim(2), dh = I.q.dim(3),
                dv = I.v.dim(3), group = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const Tensor<R> q = I.q.cast<R>(), k = I.k.cast<R>(), v = I.v.cast<R>();
  const std::vector<RowInfo> rows = row_infos(I);
  auto row = [&](index_t b, index_t h, index_t t) -> const RowInfo& { return rows[static_cast<std::size_t>((b * H + h) * Tq + t)]; };
  // rounding model: n_ops roundings, |logit| <= Z, F_abs >= sum |terms|, G_abs a derivative scale
  double Z = 0, F_abs = 0, amax = 0;
  for (index_t i = 0; i < q.size(); ++i) amax = std::max(amax, scale * std::abs(I.q[i]));
  for (index_t i = 0; i < k.size(); ++i) amax = std::max(amax, scale * std::abs(I.k[i]));
  for (const RowInfo& r : rows) {
    double cm = std::abs(r.c_null);
    for (double x : r.c) cm = std::max(cm, std::abs(x));
    F_abs += cm + std::abs(r.dlse) * 64;
  }
  Z = 64;  // |scores| <= |q| |k| sqrt(d_h) + |bias| + |s| stays far below 64 for the inputs here
  fd::Tolerance tol;
  tol.n_ops = 4.0 * static_cast<double>(B * H * Tq * Tk * (dh + dv + 16));
  tol.Z = Z;
  tol.F_abs = F_abs;
  tol.G_abs = F_abs * (1 + amax) * 8;
  fd::Summary sum;
  sum.stop_after = stop_after;
  auto check = [&](const std::string& name, const R& analytic, const std::function<R(const R&)>& f, double M3) {
    if (sum.done()) return;
    const R D = fd::central_difference(f);
    fd::Tolerance t = tol;
    t.M3 = M3;
    sum.add(name, analytic, D, t.value(static_cast<double>(D)));
  };
  AttentionOptions opt = I.opt;
  if (opt.normalizer == RowNorm::softmax1)
    for (index_t h = 0; h < H; ++h) {
      double M3 = 0;
      for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < Tq; ++t) M3 += row_m3(row(b, h, t), [](index_t) { return 0.0; }, 1.0);
      const double s0 = opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
      check("dnull[" + std::to_string(h) + "]", g.null_logits[h],
            [&](const R& e) {
              AttentionOptions o = opt;
              o.null_logits.assign(static_cast<std::size_t>(H), 0.0);
              if (!opt.null_logits.empty()) o.null_logits = opt.null_logits;
              o.null_logits[static_cast<std::size_t>(h)] = s0 + static_cast<double>(e);  // exact: s0 = k 2^-5
              return loss(q, k, v, o, I);
            },
            M3);
    }
  if (!opt.bias.empty())
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tq; ++t)
        for (index_t j = 0; j < Tk; ++j) {
          if (std::isinf(opt.bias(0, h, t, j))) continue;
          double M3 = 0;
          for (index_t b = 0; b < B; ++b)
            M3 += row_m3(row(b, h, t), [&](index_t key) { return key == j ? 1.0 : 0.0; }, 0.0);
          check("dbias" + oasis::test::index_str(opt.bias.shape(), opt.bias.offset(0, h, t, j)),
                g.bias(0, h, t, j),
                [&](const R& e) {
                  AttentionOptions o = opt;
                  o.bias(0, h, t, j) += static_cast<double>(e);  // exact: multiples of 2^-5
                  return loss(q, k, v, o, I);
                },
                M3);
        }
  for (index_t b = 0; b < B; ++b)
    for (index_t hk = 0; hk < Hkv; ++hk)
      for (index_t j = 0; j < Tk; ++j) {
        for (index_t c = 0; c < dh; ++c) {
          double M3 = 0;
          for (index_t h = hk * group; h < (hk + 1) * group; ++h)
            for (index_t t = 0; t < Tq; ++t)
              M3 += row_m3(row(b, h, t), [&](index_t key) { return key == j ? scale * I.q(b, h, t, c) : 0.0; }, 0.0);
          check("dk" + oasis::test::index_str(k.shape(), k.offset(b, hk, j, c)), g.k(b, hk, j, c),
                [&](const R& e) { Tensor<R> x = k; x(b, hk, j, c) += e; return loss(q, x, v, opt, I); }, M3);
        }
        for (index_t c = 0; c < dv; ++c)  // the loss is linear in v: M3 = 0
          check("dv" + oasis::test::index_str(v.shape(), v.offset(b, hk, j, c)), g.v(b, hk, j, c),
                [&](const R& e) { Tensor<R> x = v; x(b, hk, j, c) += e; return loss(q, k, x, opt, I); }, 0.0);
      }
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tq; ++t)
        for (index_t c = 0; c < dh; ++c) {
          const double M3 = row_m3(row(b, h, t), [&](index_t j) { return scale * I.k(b, h / group, j, c); }, 0.0);
          check("dq" + oasis::test::index_str(q.shape(), q.offset(b, h, t, c)), g.q(b, h, t, c),
                [&](const R& e) { Tensor<R> x = q; x(b, h, t, c) += e; return loss(x, k, v, opt, I); }, M3);
        }
  return sum;
}

}  // namespace oasis::attention_grad_test
