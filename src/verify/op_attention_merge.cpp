// src/verify/op_attention_merge.cpp — op "attention_merge": the merge of split-KV decoding partials
// (docs/spec.md §1, "Fused (online) evaluation"; docs/verify.md, "The split-KV merge"; the bounds:
// docs/tolerances.md, "The split-KV merge"). Form A (inputs out_parts, lse_parts) judges the merge
// alone, here; form B (inputs q, k, v) a split-KV kernel split by split and at the merge
// (op_attention_merge_split.cpp).
//
// Per row (b, h, t), with the partials' LSEs z_i in nats (-inf: a split with no visible key, whose
// out_i is never read) and the null logit s of head h:
//   sink_in merge    L = log(e^s + sum_i e^{z_i}),  out = sum_i e^{z_i - L} out_i,  p_null = e^{s - L}
//   sink_in split0   z_0 already holds e^s:  L = log sum_i e^{z_i}, out and p_null as above
//   sink_in none     plain softmax: no s, p_null = 0
// The merge is the row normaliser of spec.md §1 over the logits z_i (and s), the partials being exact
// inputs: its LSE and p_null take row_bound / prob_row (oasis/ops/error_bounds.hpp, prob_bounds.hpp)
// and out the bound of a mixture sum_i w_i out_i, as op attention's out.
#include <cmath>
#include <cstring>
#include <limits>

#include "lse_convention.hpp"
#include "ops.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/ops/prob_bounds.hpp"

namespace oasis::verify::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr const char* kOp = "attention_merge";

enum class Mode { merge, split0, none };

/// Form A's call, validated.
struct MergeCall {
  const Tensor<double>& outp;  ///< out_parts [S, B, H, Tq, dv]
  const Tensor<double>& lsep;  ///< lse_parts [S, B, H, Tq], in the base of parts_lse_base
  Mode mode;
  bool base2;                  ///< parts_lse_base = "2"
  LseConvention lse;
  std::vector<double> s;       ///< null logit per head (-inf for sink_in none)
  index_t S, B, H, Tq, dv;
  index_t rows() const { return B * H * Tq; }
  const double* o(index_t i, index_t r) const { return outp.data() + (i * rows() + r) * dv; }
  double z2(index_t i, index_t r) const { return lsep[i * rows() + r]; }  ///< as stored
};

/// The u-free pieces of every row's bounds (worst case: the bound is u times the piece; R in units of u).
struct Pieces {
  std::vector<double> lse_wc, lse_R, pn_wc, pn_R;  ///< per row
  std::vector<double> G1, V1, absv, out_R;         ///< per row and column c of out
  std::vector<index_t> n;                          ///< non-empty splits per row
  double max_rel = 0;                              ///< largest u-free relative bound of a weight
};

/// The references of the three outputs, in double, and in mp50 when exact.
struct Refs {
  Tensor<double> out, lse, pn;
  Tensor<mp50> out_mp, lse_mp, pn_mp;
};

Mode parse_mode(const std::string& m) {
  OASIS_REQUIRE(m == "merge" || m == "split0" || m == "none", "sink_in",
                "must be \"merge\" (the null logit added once, at the merge; the default), \"split0\" (split 0's "
                "partial already holds it in its LSE and out) or \"none\" (plain softmax), got \"", m, "\"");
  return m == "merge" ? Mode::merge : m == "split0" ? Mode::split0 : Mode::none;
}

bool parse_parts_base2(const Options& o) {
  const std::string b = o.string("parts_lse_base", "e");
  OASIS_REQUIRE(b == "e" || b == "2", "parts_lse_base", "must be \"e\" (lse_parts in nats, the default) or \"2\" (in "
                "base 2, as Triton-style kernels store them), got \"", b, "\"");
  return b == "2";
}

std::string at(std::initializer_list<index_t> ix) { return shape_str(Shape(ix)); }

/// The null logits of the heads: input tensor null_logits [H] or the option (default 0, Softmax1).
std::vector<double> null_logits_of(const Options& o, const TensorMap& in, Mode mode, index_t H) {
  std::vector<double> s = o.numbers("null_logits");
  if (maybe(in, "null_logits")) {
    const StoredTensor& t = need(in, "null_logits", kOp);
    OASIS_REQUIRE(s.empty(), "null_logits", "given both as input tensor and as option");
    OASIS_REQUIRE(t.values.rank() == 1 && t.values.dim(0) == H, "null_logits", "input tensor must have shape [H] = [",
                  H, "], got ", shape_str(t.values.shape()));
    s = t.values.storage();
  }
  if (mode == Mode::none) {
    OASIS_REQUIRE(s.empty(), "null_logits", "given but sink_in is \"none\" (plain softmax: no null category)");
    return std::vector<double>(static_cast<std::size_t>(H), -kInf);
  }
  if (s.empty()) s.assign(static_cast<std::size_t>(H), 0.0);
  OASIS_REQUIRE(static_cast<index_t>(s.size()) == H, "null_logits", "has ", s.size(), " entries, the partials have H = ",
                H, " heads");
  for (double x : s)
    OASIS_REQUIRE(mode != Mode::split0 || !(x > 0 && std::isinf(x)), "null_logits",
                  "+inf with sink_in \"split0\": split 0's LSE would be +inf (give sink_in \"merge\")");
  return s;
}

/// Form A's inputs and options, every inconsistency a named error before anything is allocated.
MergeCall validate(const OpCall& call, Mode mode, bool base2) {
  const TensorMap& in = call.inputs;
  const Options& o = call.options;
  for (const char* k : {"split_size", "causal", "key_lengths", "scale", "window", "layout"})
    OASIS_REQUIRE(!o.has(k), k, "is an option of form B (q, k, v given); form A (out_parts, lse_parts) merges given partials");
  for (const char* t : {"bias", "mask"})
    OASIS_REQUIRE(!in.count(t), t, "is an input of form B (q, k, v given); form A merges given partials");
  OASIS_REQUIRE(in.count("out_parts") && in.count("lse_parts"), in.count("out_parts") ? "lse_parts" : "out_parts",
                "form A needs both out_parts [S, B, H, Tq, dv] and lse_parts [S, B, H, Tq] (the inputs hold: ",
                names_of(in), ")");
  const StoredTensor& op = in.at("out_parts");  // NaN allowed where the split is empty (below)
  const StoredTensor& lp = in.at("lse_parts");  // NaN and +inf refused by name below
  const Shape& os = op.values.shape();
  const Shape& ls = lp.values.shape();
  OASIS_REQUIRE(os.size() == 5, "out_parts", "must be [S, B, H, Tq, dv], got ", shape_str(os));
  OASIS_REQUIRE(ls.size() == 4, "lse_parts", "must be [S, B, H, Tq], got ", shape_str(ls));
  OASIS_REQUIRE(os[0] >= 1, "out_parts", "holds no split (S = 0)");
  OASIS_REQUIRE(ls[0] == os[0], "lse_parts", "has S = ", ls[0], " splits, out_parts has S = ", os[0]);
  OASIS_REQUIRE(ls[1] == os[1] && ls[2] == os[2] && ls[3] == os[3], "lse_parts", "shape ", shape_str(ls),
                " is not out_parts' [S, B, H, Tq] (out_parts: ", shape_str(os), ")");
  const LseConvention cv = lse_convention(o);
  OASIS_REQUIRE(!(mode == Mode::split0 && cv.keys_only), "lse_null",
                "\"excluded\" with sink_in \"split0\": the keys-only LSE would be recovered from split 0's LSE by the "
                "cancellation log(e^{lse_0} - e^s); give sink_in \"merge\" or lse_null \"included\"");
  MergeCall c{op.values, lp.values, mode, base2, cv, null_logits_of(o, in, mode, os[2]), os[0], os[1], os[2], os[3], os[4]};
  const index_t R = c.rows();
  for (index_t i = 0; i < c.S; ++i)
    for (index_t r = 0; r < R; ++r) {
      const index_t b = r / (c.H * c.Tq), h = (r / c.Tq) % c.H, t = r % c.Tq;
      const double z = c.z2(i, r);
      OASIS_REQUIRE(!std::isnan(z) && !(z > 0 && std::isinf(z)), "lse_parts", "lse_parts", at({i, b, h, t}), " is ", z,
                    "; a partial's LSE is finite, or -inf for a split with no visible key");
      if (std::isinf(z)) {
        OASIS_REQUIRE(!(mode == Mode::split0 && i == 0 && std::isfinite(c.s[static_cast<std::size_t>(h)])), "lse_parts",
                      "lse_parts", at({0, b, h, t}), " is -inf with sink_in \"split0\", but split 0 holds the null logit ",
                      c.s[static_cast<std::size_t>(h)]);
        continue;
      }
      const double* oi = c.o(i, r);
      for (index_t x = 0; x < c.dv; ++x)
        OASIS_REQUIRE(std::isfinite(oi[x]), "out_parts", "out_parts", at({i, b, h, t, x}), " is ", oi[x],
                      " in a split with a visible key (lse_parts", at({i, b, h, t}), " = ", z,
                      "); only an empty split's out (lse -inf) is not read");
    }
  return c;
}

double log_1p(double x) { return std::log1p(x); }
mp50 log_1p(const mp50& x) { return log(mp50(1) + x); }

/// One row of the merge in T (double: the fast oracle; mp50: the exact one): z the partials' LSEs in
/// nats (-inf: empty), w the weights e^{z_i - L}, L the LSE with the null (sink_in merge, split0), pn
/// p_null, out. The maximum M includes the null logit (sink_in merge); L = M + log1p(the terms other
/// than the maximal one, whose exponential is exactly 1).
template <class T>
void merge_row(const MergeCall& c, index_t r, const std::vector<T>& z, std::vector<T>& w, T& L, T& pn, std::vector<T>& out) {
  using std::exp;
  const double s = c.s[static_cast<std::size_t>((r / c.Tq) % c.H)];
  const bool merge = c.mode == Mode::merge;
  w.assign(static_cast<std::size_t>(c.S), T(0));
  out.assign(static_cast<std::size_t>(c.dv), T(0));
  pn = T(0);
  T M = merge ? T(s) : T(-kInf);
  index_t arg = -1;  // -1: the null (or no term)
  for (index_t i = 0; i < c.S; ++i)
    if (z[static_cast<std::size_t>(i)] > M) M = z[static_cast<std::size_t>(i)], arg = i;
  if (M == T(-kInf)) {  // no term: plain softmax's documented zero (spec.md §1)
    L = M;
    return;
  }
  if (M == T(kInf)) {  // a +inf null logit: all the mass on the null, out = 0
    L = M;
    pn = T(1);
    return;
  }
  T rest(0);
  for (index_t i = 0; i < c.S; ++i) {
    const auto iu = static_cast<std::size_t>(i);
    if (z[iu] == T(-kInf)) continue;
    w[iu] = exp(z[iu] - M);
    if (i != arg) rest += w[iu];
  }
  const T w0 = merge && s > -kInf ? T(exp(T(s) - M)) : T(0);
  if (arg >= 0) rest += w0;
  L = M + log_1p(rest);
  const T S = T(1) + rest;
  for (auto& x : w) x /= S;
  if (merge) pn = w0 / S;
  else if (c.mode == Mode::split0 && s > -kInf) pn = T(exp(T(s) - M)) / S;
  for (index_t i = 0; i < c.S; ++i) {
    const auto iu = static_cast<std::size_t>(i);
    if (w[iu] == T(0)) continue;  // an empty split (its out is not read) or an underflowed weight
    const double* oi = c.o(i, r);
    for (index_t x = 0; x < c.dv; ++x) out[static_cast<std::size_t>(x)] += w[iu] * T(oi[x]);
  }
}

/// The bound pieces of row r from its reference (double copies): z in nats, w, pn, L (with the null),
/// out; `lr` the LSE in the default convention, turned into the call's (keys_mp: an exact row's
/// keys-only LSE). The base-2 partials' conversion z_i = lse2_i ln 2 (a rounded constant, a product)
/// is an error 2u |z_i| already in each logit; the null logit's conversion to T (and by log2(e)) u |s|
/// (3u |s|). sink_in split0: the null is no term of the normaliser sum, p_null = e^{s - M} / S with
/// the sum's relative error sigma.
void row_pieces(const MergeCall& c, index_t r, const std::vector<double>& z, const std::vector<double>& w, double pn,
                double L, const std::vector<double>& out, LseRow& lr, const mp50* keys_mp, Pieces& P) {
  const auto S = static_cast<std::size_t>(c.S);
  const double s = c.s[static_cast<std::size_t>((r / c.Tq) % c.H)];
  const bool merge = c.mode == Mode::merge, fs = std::isfinite(s);
  std::vector<double> zerr(S, 0.0), zeta2(S, 0.0);
  double shared = c.base2 && fs ? std::abs(s) : 0.0, M = -kInf, sig = 0;
  index_t n = 0;
  for (std::size_t i = 0; i < S; ++i) {
    if (std::isinf(z[i])) continue;
    ++n;
    M = std::max(M, z[i]);
    if (!c.base2) continue;
    zerr[i] = 2.0 * std::abs(z[i]);
    zeta2[i] = z[i] * z[i];
    shared = std::max(shared, std::abs(z[i]));
  }
  const double s_err = fs ? (c.base2 ? 3.0 : 1.0) * std::abs(s) : 0.0, zeta2_s = fs ? (c.base2 ? 2.0 : 1.0) * s * s : 0.0;
  const RowNorm kind = merge ? RowNorm::softmax1 : RowNorm::softmax;
  const double pn_term = merge ? pn : 0.0;
  const bounds::RowBound b1 = bounds::row_bound(bounds::Precision{1.0, 0.0}, kind, z.data(), zerr.data(), c.S, s, s_err,
                                                w.data(), pn_term, L);
  const bounds::ProbRow pr = bounds::prob_row(kind, z.data(), zeta2.data(), c.S, s, zeta2_s, shared, w.data(), pn_term, L, false);
  const auto ru = static_cast<std::size_t>(r);
  P.max_rel = std::max(P.max_rel, b1.rel_max);
  P.n[ru] = n;
  if (merge) {
    P.pn_wc[ru] = b1.p_null;
    P.pn_R[ru] = pr.p_null;
  } else if (c.mode == Mode::split0 && fs && n > 0) {
    for (std::size_t i = 0; i < S; ++i)
      if (!std::isinf(z[i])) sig += w[i] * (std::abs(z[i] - M) + 2.0 + zerr[i]);
    sig += static_cast<double>(n - 1);
    P.pn_wc[ru] = bounds::kSecondOrder * (std::abs(s - M) + 2.0 + s_err + sig + 2.0) * pn;
    const double k0 = bounds::prob_kappa2(zeta2_s, s, M);
    P.pn_R[ru] = pn * std::sqrt(k0 + pr.sk + pr.lambda_terms + (s - L) * (s - L) + 4.0 + shared * shared);
  }
  lr.wc = b1.lse;
  lr.R = pr.lse;
  to_convention(c.lse, RowLogits{kind, z.data(), zerr.data(), zeta2.data(), c.S, s, shared, w.data(), pn_term}, keys_mp, lr);
  P.lse_wc[ru] = lr.wc;
  P.lse_R[ru] = lr.R;
  const double* o0 = c.o(0, r);
  const index_t stride = c.rows() * c.dv;
  for (index_t x = 0; x < c.dv; ++x) {
    const auto k = static_cast<std::size_t>(r * c.dv + x);
    double G1 = 0, V1 = 0, absv = 0;
    for (std::size_t i = 0; i < S; ++i) {
      if (std::isinf(z[i])) continue;
      const double a = std::abs(o0[static_cast<index_t>(i) * stride + x]);
      G1 += b1.p[i] * a;
      V1 += w[i] * a;
      absv += a;
    }
    P.G1[k] = G1, P.V1[k] = V1, P.absv[k] = absv;
    P.out_R[k] = bounds::prob_mix(pr, w.data(), o0 + x, stride, c.S, pn_term, out[static_cast<std::size_t>(x)]);
  }
}

/// Every row's reference (in double, or in mp50 when `exact`) and bound pieces.
void references(const MergeCall& c, bool exact, Refs& ref, Pieces& P) {
  const index_t R = c.rows();
  const Shape stat{c.B, c.H, c.Tq}, full{c.B, c.H, c.Tq, c.dv};
  ref.out = Tensor<double>(full), ref.lse = Tensor<double>(stat), ref.pn = Tensor<double>(stat);
  if (exact) ref.out_mp = Tensor<mp50>(full), ref.lse_mp = Tensor<mp50>(stat), ref.pn_mp = Tensor<mp50>(stat);
  const auto Ru = static_cast<std::size_t>(R), Cu = static_cast<std::size_t>(R * c.dv);
  P.lse_wc.assign(Ru, 0.0), P.lse_R = P.pn_wc = P.pn_R = P.lse_wc;
  P.G1.assign(Cu, 0.0), P.V1 = P.absv = P.out_R = P.G1;
  P.n.assign(Ru, 0);
  const mp50 ln2 = log(mp50(2));
  const auto S = static_cast<std::size_t>(c.S);
  std::vector<double> zd(S), wd, outd;
  std::vector<mp50> zm(S), wm, outm;
  for (index_t r = 0; r < R; ++r) {
    double L = 0, pn = 0;
    LseRow lr;
    mp50 keys(-kInf);
    if (exact) {
      for (std::size_t i = 0; i < S; ++i) {
        const double z = c.z2(static_cast<index_t>(i), r);
        zm[i] = c.base2 && std::isfinite(z) ? mp50(z) * ln2 : mp50(z);
        zd[i] = static_cast<double>(zm[i]);
      }
      mp50 Lm, pm;
      merge_row(c, r, zm, wm, Lm, pm, outm);
      // the keys-only LSE, log sum_i e^{z_i} (sink_in merge with lse_null excluded)
      mp50 Mz(-kInf), sum(0);
      for (const mp50& z : zm) Mz = z > Mz ? z : Mz;
      if (Mz > mp50(-kInf)) {
        for (const mp50& z : zm)
          if (z > mp50(-kInf)) sum += exp(z - Mz);
        keys = Mz + log(sum);
      }
      wd.resize(S), outd.resize(static_cast<std::size_t>(c.dv));
      for (std::size_t i = 0; i < S; ++i) wd[i] = static_cast<double>(wm[i]);
      for (index_t x = 0; x < c.dv; ++x) {
        outd[static_cast<std::size_t>(x)] = static_cast<double>(outm[static_cast<std::size_t>(x)]);
        ref.out_mp[r * c.dv + x] = outm[static_cast<std::size_t>(x)];
      }
      L = static_cast<double>(Lm), pn = static_cast<double>(pm);
      ref.pn_mp[r] = pm;
      lr = LseRow{L, Lm, true, 0, 0};
    } else {
      for (std::size_t i = 0; i < S; ++i) {
        const double z = c.z2(static_cast<index_t>(i), r);
        zd[i] = c.base2 && std::isfinite(z) ? z * 0.69314718055994531 : z;  // ln 2
      }
      merge_row(c, r, zd, wd, L, pn, outd);
      lr = LseRow{L, mp50(0), false, 0, 0};
    }
    row_pieces(c, r, zd, wd, pn, L, outd, lr, exact ? &keys : nullptr, P);
    ref.lse[r] = lr.value, ref.pn[r] = pn;
    if (exact) ref.lse_mp[r] = lr.value_mp;
    for (index_t x = 0; x < c.dv; ++x) ref.out[r * c.dv + x] = outd[static_cast<std::size_t>(x)];
  }
}

/// The bounds at precision pr: the worst case (u_prob = 0) or the probabilistic E at unit roundoff
/// u_prob (with the worst case's underflow floors); u_w > 0 adds to out's E the weights rounded to a
/// 16-bit type of unit roundoff u_w before the products, 1.02 u_w sum_i w_i |out_ic| (policy p16).
BoundMap assemble(const MergeCall& c, const Pieces& P, const bounds::Precision& pr, double u_prob, double u_w = 0) {
  const Shape stat{c.B, c.H, c.Tq};
  Tensor<double> out({c.B, c.H, c.Tq, c.dv}), lse(stat), pn(stat);
  const double lam = bounds::kSecondOrder * kLambda * u_prob;
  const bool has_null = c.mode != Mode::none;
  for (index_t r = 0; r < c.rows(); ++r) {
    const auto ru = static_cast<std::size_t>(r);
    const index_t n = P.n[ru];
    lse[r] = u_prob > 0 ? lam * P.lse_R[ru] : pr.u * P.lse_wc[ru];
    pn[r] = has_null ? (u_prob > 0 ? lam * P.pn_R[ru] : pr.u * P.pn_wc[ru]) + pr.p_floor : 0.0;
    for (index_t x = 0; x < c.dv; ++x) {
      const auto k = static_cast<std::size_t>(r * c.dv + x);
      const double floors = pr.p_floor * P.absv[k] + bounds::underflow_floor(pr, n);
      out[r * c.dv + x] = u_prob > 0 ? lam * P.out_R[k] + bounds::kSecondOrder * u_w * P.V1[k] + floors
                                     : bounds::kSecondOrder * (pr.u * (P.G1[k] + static_cast<double>(n) * P.V1[k]) +
                                                               pr.p_floor * P.absv[k]) +
                                           bounds::underflow_floor(pr, n);
    }
  }
  return {{"out", out}, {"lse", lse}, {"p_null", pn}};
}

CompareReport run_merge(const OpCall& call, Mode mode, bool base2) {
  const MergeCall c = validate(call, mode, base2);
  const CompareOptions& copt = call.compare;
  // The kernel under judgement may flush subnormal results (bounds::Precision::flushing). With 16-bit
  // lse_parts the weights, and every intermediate, may be in that type (the probabilistic term at
  // u_in, the certain line at the wider of it and the output's, as attention's with 16-bit inputs).
  // 16-bit out_parts are values, exact in float32: a merge multiplies them by float32 weights (type
  // promotion). One that rounds the weights to a 16-bit out's type D first is admitted by policy
  // p16, as attention's P rounded before P V (1.02 u_D sum_i w_i |out_ic| more).
  const DType in16 = input16({call.inputs.at("lse_parts").dtype});
  const StoredTensor* got_out = maybe(call.outputs, "out");
  const double u_w = copt.policy == Policy::p16 && got_out && is16(got_out->dtype) ? unit_roundoff(got_out->dtype) : 0.0;
  auto bounds_at = [&](const Pieces& P, bool prob) {
    return [&c, &P, prob, in16, u_w](bool wide) {
      const bounds::Precision pr = wide ? bounds::Precision::flushing<double>() : bounds::Precision::flushing<float>();
      return assemble(c, P, pr, prob ? (is16(in16) ? unit_roundoff(in16) : pr.u) : 0.0, u_w);
    };
  };
  CompareReport rep;
  rep.op = kOp;
  std::string fallback;
  const double work = static_cast<double>(c.rows()) * static_cast<double>(c.S) * static_cast<double>(c.dv + 2);
  if (copt.oracle == Oracle::fast) {
    // The fast oracle: the merge in double, its own worst-case bound at u = 2^-53 folded into each
    // decision; the terms known within rho (their weights' relative error, and 1e-9 for the
    // cancellation in the expanded sums of prob_mix). Undecided elements: the op in mp50.
    Refs ref;
    Pieces P;
    references(c, false, ref, P);
    const BoundMap own = assemble(c, P, bounds::Precision::of<double>(), 0.0);
    PlainBounds pb(bounds_at(P, false)), pp(bounds_at(P, true));
    const double rho = 1e-9 + 8.0 * oasis::unit_roundoff<double>() * P.max_rel;
    const index_t undecided = compare_outputs(
        rep, call.outputs,
        {{"out", {&ref.out, &own.at("out"), 1.0}}, {"lse", {&ref.lse, &own.at("lse"), 1.0}}, {"p_null", {&ref.pn, &own.at("p_null"), 1.0}}},
        pb, copt, rho, copt.policy == Policy::worst_case ? nullptr : &pp, in16);
    if (undecided == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    const double bytes = static_cast<double>(sizeof(mp50)) * static_cast<double>(c.rows()) * static_cast<double>(c.dv + 2);
    if (!mp50_fallback(rep, kOp, undecided, work, bytes, copt, "the merge's rows", fallback)) return rep;
  }
  Refs ref;
  Pieces P;
  references(c, true, ref, P);
  PlainBounds pb(bounds_at(P, false)), pp(bounds_at(P, true));
  compare_outputs(rep, call.outputs, {{"out", &ref.out_mp}, {"lse", &ref.lse_mp}, {"p_null", &ref.pn_mp}}, pb, copt,
                  copt.policy == Policy::worst_case ? nullptr : &pp, in16);
  rep.oracle = "mp50" + fallback;
  return rep;
}

/// Whether input `name`, if present, is also held with the outputs with the same contents (a
/// configuration whose inputs and outputs are one file).
bool held_as_output(const TensorMap& in, const TensorMap& out, const std::string& name) {
  auto a = in.find(name);
  if (a == in.end()) return true;
  auto b = out.find(name);
  return b != out.end() && a->second.values.shape() == b->second.values.shape() &&
         std::memcmp(a->second.values.data(), b->second.values.data(),
                     sizeof(double) * static_cast<std::size_t>(a->second.values.size())) == 0;
}

CompareReport run(const OpCall& call) {
  const TensorMap &in = call.inputs, &out = call.outputs;
  const bool form_b = in.count("q") || in.count("k") || in.count("v");
  const bool parts = in.count("out_parts") || in.count("lse_parts");
  OASIS_REQUIRE(form_b || parts, "inputs", "op attention_merge takes either the partials (form A: out_parts, lse_parts) "
                "or the attention inputs of a split-KV kernel (form B: q, k, v); the inputs hold: ", names_of(in));
  OASIS_REQUIRE(!(form_b && parts) || (held_as_output(in, out, "out_parts") && held_as_output(in, out, "lse_parts")),
                "inputs", "hold both the partials (out_parts, lse_parts: form A) and q, k, v (form B); give one form");
  const Mode mode = parse_mode(call.options.string("sink_in", "merge"));
  const bool base2 = parse_parts_base2(call.options);
  if (form_b) return attention_merge_split_report(call, mode == Mode::merge ? "merge" : mode == Mode::split0 ? "split0" : "none", base2);
  CompareReport rep = run_merge(call, mode, base2);
  const LseConvention cv = lse_convention(call.options);
  for (auto& t : rep.tensors)
    if (t.name == "lse" && !cv.is_default()) t.bound += "; LSE " + cv.describe();
  for (const char* name : {"out_parts", "lse_parts"})
    if (out.count(name))
      rep.notes.push_back(std::string("'") + name + "' is an input of form A (the partials merged); not compared");
  return rep;
}

}  // namespace

OpSpec attention_merge_op() {
  return {"attention_merge",
          {{"out_parts", "[S,B,H,Tq,dv] (form A)", false},
           {"lse_parts", "[S,B,H,Tq] (form A)", false},
           {"q", "[B,H,Tq,dh] (form B)", false},
           {"k", "[B,Hkv,Tk,dh] (form B)", false},
           {"v", "[B,Hkv,Tk,dv] (form B)", false},
           {"null_logits", "[H]", false},
           {"bias", "[Tq,Tk] or [B|1,H|1,Tq,Tk] (form B)", false},
           {"mask", "as bias (form B)", false}},
          {{"out_parts", "[S,B,H,Tq,dv] (form B)"},
           {"lse_parts", "[S,B,H,Tq] (form B)"},
           {"out", "[B,H,Tq,dv]"},
           {"lse", "[B,H,Tq]"},
           {"p_null", "[B,H,Tq]"}},
          {"sink_in", "parts_lse_base", "null_logits", "lse_null", "lse_base", "split_size", "causal", "key_lengths",
           "scale", "window", "layout"},
          "the merge of split-KV partials. Form A (inputs out_parts, lse_parts): the merge alone; form B (inputs q, k,\n"
          "                v): a split-KV kernel's partials (split_size keys each) judged as op attention split by split,\n"
          "                and its merge as op attention; sink_in: merge (default: the null logit added once, at the\n"
          "                merge) | split0 (split 0's partial holds it) | none (plain softmax); parts_lse_base: e (default)\n"
          "                | 2; null_logits, lse_null, lse_base: as attention; a split with lse_parts -inf is empty: its\n"
          "                out_parts is not read (NaN allowed there)",
          run};
}

}  // namespace oasis::verify::detail
