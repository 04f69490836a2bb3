// tests/verify/merge_zoo.hpp — the split-KV merge zoo of tests/verify/test_attention_merge.cpp (op
// attention_merge, docs/verify.md "The split-KV merge"): partials of random attention, correct float
// merges and the mistakes reported against sink kernels.
//
// Correct: log_space (FlashInfer / vLLM merge_attn_states: M = max(s, lse_i), w = e^{lse_i - M},
// L = M + log(sum)); exp2 (everything in base 2: lse and s times log2(e), exp2, log2, the LSE back
// times ln 2); online (FlashDecoding's combine: a running (m, l, acc) over the splits, rescaled,
// started from the null's (s, 1, 0)); cascade (vLLM's merge_attn_states, FlashInfer's
// merge_state_in_place applied split after split: the running (out, lse) from the null's (0, s),
// its LSE rounded to float at every step, p_null = e^{s - L}); with sink_in split0, each of them
// without the null term (the null already in split 0's partial); weights16 (log_space with the
// weights rounded to bf16 before the products: correct under policy p16 for a bf16 out).
// Mistakes: linear (log(sum e^{lse_i} + e^s): overflows at large sinks); sink_every_split (the null
// once per split: sum + S e^{s - M}); sink_twice (2 e^{s - M}: rocm-libraries #12227's empty split
// counting the sink again); sink_omitted; nan_read (an empty split's out read: 0 * NaN); no_max
// (e^{lse_i} e^{-M}: each weight without the maximum subtracted); sink_partial_max (e^{s - m}
// against the partials' maximum m only: sgl-kernel-xpu #235's overflow).
#pragma once

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/core/tensor.hpp"

namespace merge_zoo {

using oasis::index_t;
using oasis::Tensor;
namespace io = oasis::io;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Exact partials (double, nats, keys only) of B = 2, H = 4 rows: split i holds `keys` keys, the
/// last split `last` (uneven lengths), scores N(shift_i, 1.5^2) (shift_i = +shift even i, -shift
/// odd i), values N(0, 1); `one_empty`: per row split (row mod S) without a key; `rows_empty`:
/// every third row with no key at all.
struct Parts {
  index_t S, B = 2, H = 4, Tq, dv = 64;
  std::vector<double> lse, out, sinks;
  index_t rows() const { return B * H * Tq; }
};

inline Parts make_parts(std::uint64_t seed, index_t S, index_t Tq, std::vector<double> sinks, bool one_empty = false,
                        bool rows_empty = false, double shift = 0, index_t keys = 16, index_t last = 5) {
  Parts p;
  p.S = S, p.Tq = Tq, p.sinks = std::move(sinks);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  const index_t R = p.rows();
  p.lse.assign(static_cast<std::size_t>(S * R), 0.0);
  p.out.assign(static_cast<std::size_t>(S * R * p.dv), 0.0);
  for (index_t i = 0; i < S; ++i)
    for (index_t r = 0; r < R; ++r) {
      double* o = p.out.data() + (i * R + r) * p.dv;
      double& l = p.lse[static_cast<std::size_t>(i * R + r)];
      if ((one_empty && i == r % S) || (rows_empty && r % 3 == 0)) {
        l = -kInf;
        for (index_t x = 0; x < p.dv; ++x) o[x] = std::nan("");
        continue;
      }
      const index_t n = i == S - 1 ? last : keys;
      std::vector<double> z(static_cast<std::size_t>(n));
      double M = -kInf, sum = 0;
      for (double& x : z) M = std::max(M, x = (i % 2 ? -shift : shift) + 1.5 * nd(rng));
      for (double x : z) sum += std::exp(x - M);
      l = M + std::log(sum);
      for (index_t j = 0; j < n; ++j) {
        const double pj = std::exp(z[static_cast<std::size_t>(j)] - l);
        for (index_t x = 0; x < p.dv; ++x) o[x] += pj * nd(rng);
      }
    }
  return p;
}

/// The stored inputs: out_parts in `od`, lse_parts in `ld` (split0: the null seeded into split 0's
/// partial first; base2: the LSEs divided by ln 2), null_logits [H] in f32.
inline io::TensorMap inputs(const Parts& p, io::DType od = io::DType::f32, io::DType ld = io::DType::f32,
                            bool split0 = false, bool base2 = false) {
  const index_t R = p.rows();
  std::vector<double> lse = p.lse, out = p.out;
  for (index_t r = 0; r < R && split0; ++r) {
    const double s = p.sinks[static_cast<std::size_t>((r / p.Tq) % p.H)], l = lse[static_cast<std::size_t>(r)];
    if (!std::isfinite(s)) continue;
    const double L0 = std::isinf(l) ? s : std::max(l, s) + std::log1p(std::exp(-std::abs(l - s)));
    for (index_t x = 0; x < p.dv; ++x) {
      double& o = out[static_cast<std::size_t>(r * p.dv + x)];
      o = std::isinf(l) ? 0.0 : o * std::exp(l - L0);
    }
    lse[static_cast<std::size_t>(r)] = L0;
  }
  if (base2)
    for (double& l : lse) l /= 0.69314718055994531;
  auto stored = [](io::DType d, oasis::Shape sh, const std::vector<double>& v) {
    Tensor<double> t(std::move(sh), v);
    for (double& x : t.storage()) x = io::round_to_dtype(x, d);
    return io::StoredTensor{d, t};
  };
  return {{"out_parts", stored(od, {p.S, p.B, p.H, p.Tq, p.dv}, out)},
          {"lse_parts", stored(ld, {p.S, p.B, p.H, p.Tq}, lse)},
          {"null_logits", stored(io::DType::f32, {p.H}, p.sinks)}};
}

enum class Kind {
  log_space, exp2, online, cascade,  // correct (split0: with sink_in "split0")
  weights16,                         // log_space with the weights rounded to bf16 before the products (p16)
  linear, sink_every_split, sink_twice, sink_omitted, nan_read, no_max, sink_partial_max
};

inline const char* name(Kind k) {
  static const char* n[] = {"log_space", "exp2", "online", "cascade", "weights16", "linear", "sink_every_split", "sink_twice", "sink_omitted",
                            "nan_read", "no_max", "sink_partial_max"};
  return n[static_cast<int>(k)];
}

/// One merge in float32 on the stored inputs; outputs rounded to `od`. mode: sink_in.
inline io::TensorMap merge(Kind k, const io::TensorMap& in, const std::string& mode = "merge", bool base2 = false,
                           io::DType od = io::DType::f32) {
  const Tensor<double>& op = in.at("out_parts").values;
  const Tensor<double>& lp = in.at("lse_parts").values;
  const index_t S = op.dim(0), B = op.dim(1), H = op.dim(2), Tq = op.dim(3), dv = op.dim(4), R = B * H * Tq;
  const float ln2 = 0.693147181f, log2e = 1.44269504f, finf = INFINITY;
  Tensor<double> out({B, H, Tq, dv}), lse({B, H, Tq}), pn({B, H, Tq});
  for (index_t r = 0; r < R; ++r) {
    const float s = mode == "none" ? -finf : static_cast<float>(in.at("null_logits").values[(r / Tq) % H]);
    const bool merge_null = mode == "merge" && s > -finf;
    std::vector<float> z(static_cast<std::size_t>(S)), w(z.size(), 0.0f);
    for (index_t i = 0; i < S; ++i) {
      const float x = static_cast<float>(lp[i * R + r]);
      z[static_cast<std::size_t>(i)] = base2 && !std::isinf(x) ? x * ln2 : x;
    }
    float M = merge_null ? s : -finf, Mp = -finf;
    for (float x : z) Mp = std::max(Mp, x);
    M = std::max(M, Mp);
    float sum = 0, w0 = 0, L = 0;
    std::vector<float> acc(static_cast<std::size_t>(dv), 0.0f);
    auto o = [&](index_t i, index_t x) { return static_cast<float>(op[(i * R + r) * dv + x]); };
    if (k == Kind::online) {  // running (m, l, acc) over the splits, from the null's state (s, 1, 0)
      float m = merge_null ? s : -finf, l = merge_null ? 1.0f : 0.0f;
      for (index_t i = 0; i < S; ++i) {
        const float zi = z[static_cast<std::size_t>(i)];
        if (std::isinf(zi)) continue;
        const float mn = std::max(m, zi), c = std::exp(m - mn), e = std::exp(zi - mn);
        l = l * c + e;
        for (index_t x = 0; x < dv; ++x) acc[static_cast<std::size_t>(x)] = acc[static_cast<std::size_t>(x)] * c + e * o(i, x);
        m = mn;
      }
      const bool none = std::isinf(m);  // no term: the documented zero
      for (index_t x = 0; x < dv; ++x) out[r * dv + x] = none ? 0.0f : acc[static_cast<std::size_t>(x)] / l;
      lse[r] = none ? m : m + std::log(l);
      pn[r] = none || s == -finf ? 0.0f : std::exp(s - m) / l;
      continue;
    }
    if (k == Kind::cascade) {  // pairwise merges into a running (out, lse)
      float Lc = merge_null ? s : -finf;
      for (index_t i = 0; i < S; ++i) {
        const float zi = z[static_cast<std::size_t>(i)];
        if (std::isinf(zi)) continue;
        const float m = std::max(Lc, zi), wa = std::exp(Lc - m), wb = std::exp(zi - m), sum2 = wa + wb;
        for (index_t x = 0; x < dv; ++x)
          acc[static_cast<std::size_t>(x)] = (wa * acc[static_cast<std::size_t>(x)] + wb * o(i, x)) / sum2;
        Lc = m + std::log(sum2);
      }
      for (index_t x = 0; x < dv; ++x) out[r * dv + x] = acc[static_cast<std::size_t>(x)];
      lse[r] = Lc;
      pn[r] = mode == "none" || s == -finf || Lc == -finf ? 0.0f : std::exp(s - Lc);
      continue;
    }
    if (std::isinf(M)) {  // no term: the documented zero
      lse[r] = M;
      continue;
    }
    if (k == Kind::exp2) {  // base 2 throughout
      const float s2 = s * log2e;
      float M2 = merge_null ? s2 : -finf;
      std::vector<float> z2(z.size());
      for (index_t i = 0; i < S; ++i) {
        const float x = static_cast<float>(lp[i * R + r]);
        z2[static_cast<std::size_t>(i)] = base2 || std::isinf(x) ? x : x * log2e;
        M2 = std::max(M2, z2[static_cast<std::size_t>(i)]);
      }
      for (index_t i = 0; i < S; ++i)
        if (!std::isinf(z2[static_cast<std::size_t>(i)])) sum += w[static_cast<std::size_t>(i)] = std::exp2(z2[static_cast<std::size_t>(i)] - M2);
      w0 = merge_null ? std::exp2(s2 - M2) : 0.0f;
      sum += w0;
      L = (M2 + std::log2(sum)) * ln2;
      pn[r] = mode == "none" ? 0.0f : std::exp2(s2 - M2) / sum;
    } else {
      const float base = k == Kind::sink_partial_max ? Mp : M;
      for (index_t i = 0; i < S; ++i) {
        const float zi = z[static_cast<std::size_t>(i)];
        if (std::isinf(zi) && k != Kind::nan_read) continue;
        float wi = k == Kind::linear ? std::exp(zi) : k == Kind::no_max ? std::exp(zi) * std::exp(-base) : std::exp(zi - base);
        sum += w[static_cast<std::size_t>(i)] = wi;
      }
      const float e0 = s == -finf ? 0.0f : k == Kind::linear ? std::exp(s) : k == Kind::no_max ? std::exp(s) * std::exp(-base) : std::exp(s - base);
      w0 = !merge_null || k == Kind::sink_omitted ? 0.0f
           : k == Kind::sink_every_split       ? static_cast<float>(S) * e0
           : k == Kind::sink_twice             ? 2.0f * e0
                                               : e0;
      sum += w0;
      L = k == Kind::linear ? std::log(sum) : base + std::log(sum);
      pn[r] = mode == "none" ? 0.0f : k == Kind::sink_omitted ? std::exp(s - L) : e0 / sum;
    }
    lse[r] = L;
    for (index_t i = 0; i < S; ++i) {
      float p = w[static_cast<std::size_t>(i)] / sum;
      if (k == Kind::weights16) p = static_cast<float>(io::round_to_dtype(p, io::DType::bf16));
      if (p == 0.0f && k != Kind::nan_read) continue;
      for (index_t x = 0; x < dv; ++x) acc[static_cast<std::size_t>(x)] += p * o(i, x);
    }
    for (index_t x = 0; x < dv; ++x) out[r * dv + x] = acc[static_cast<std::size_t>(x)];
  }
  auto stored = [od](Tensor<double> t) {
    for (double& x : t.storage()) x = io::round_to_dtype(static_cast<double>(static_cast<float>(x)), od);
    return io::StoredTensor{od, t};
  };
  return {{"out", stored(out)}, {"lse", stored(lse)}, {"p_null", stored(pn)}};
}

}  // namespace merge_zoo
