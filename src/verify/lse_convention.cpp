// src/verify/lse_convention.cpp — the LSE conventions of lse_convention.hpp.
#include "lse_convention.hpp"

#include <cmath>
#include <limits>

#include "oasis/ops/error_bounds.hpp"
#include "oasis/ops/prob_bounds.hpp"

namespace oasis::verify::detail {

const std::vector<std::string> kLseOptionKeys = {"lse_null", "lse_base"};

std::string LseConvention::describe() const {
  if (is_default()) return "";
  return std::string(keys_only ? "keys only" : "null included") + ", base " + (base2 ? "2" : "e");
}

LseConvention lse_convention(const Options& o) {
  LseConvention c;
  const std::string n = o.string("lse_null", "included"), b = o.string("lse_base", "e");
  OASIS_REQUIRE(n == "included" || n == "excluded", "lse_null",
                "must be \"included\" (LSE1 = log(e^s + sum e^z), the default) or \"excluded\" (log sum e^z over "
                "the visible keys), got \"", n, "\"");
  OASIS_REQUIRE(b == "e" || b == "2", "lse_base", "must be \"e\" (the default) or \"2\" (the LSE / ln 2), got \"", b, "\"");
  c.keys_only = n == "excluded";
  c.base2 = b == "2";
  return c;
}

bool keys_lse_from_probs(const mp50& lse1, const std::vector<mp50>& p, mp50& out) {
  if (lse1 > mp50(0) && !is_finite(lse1)) return false;
  mp50 sum(0);
  for (const mp50& x : p) sum += x;
  using std::log;
  out = sum > mp50(0) ? lse1 + log(sum) : mp50(-std::numeric_limits<double>::infinity());
  return true;
}

void to_convention(const LseConvention& cv, const RowLogits& g, const mp50* keys_mp, LseRow& row) {
  if (cv.is_default()) return;
  const auto m = static_cast<std::size_t>(g.m);
  const bool null_term = g.kind == RowNorm::softmax1 && g.p_null > 0 && std::isfinite(g.s);
  double zabs = null_term ? g.p_null * std::abs(g.s) : 0.0;
  if (cv.keys_only && g.kind == RowNorm::softmax1) {
    if (row.exact) {
      OASIS_REQUIRE(keys_mp, "oracle", "an exact row's keys-only LSE was not computed");  // cannot happen
      row.value_mp = *keys_mp;
      row.value = static_cast<double>(*keys_mp);
    } else {  // as the fast oracle's LSE1: M + log1p(sum of the terms other than the maximal one)
      double M = -std::numeric_limits<double>::infinity();
      std::size_t arg = m;
      for (std::size_t j = 0; j < m; ++j)
        if (g.z[j] > M) M = g.z[j], arg = j;
      double rest = 0;
      for (std::size_t j = 0; j < m; ++j)
        if (j != arg && !std::isinf(g.z[j])) rest += std::exp(g.z[j] - M);
      row.value = std::isinf(M) ? M : M + std::log1p(rest);
    }
    row.wc = row.R = 0;  // a row with no visible key: -inf, exact
    zabs = 0;
    if (std::isfinite(row.value)) {
      std::vector<double> q(m, 0.0);  // the keys-only probabilities
      for (std::size_t j = 0; j < m; ++j) {
        q[j] = std::isinf(g.z[j]) ? 0.0 : std::exp(g.z[j] - row.value);
        zabs += q[j] * std::abs(g.z[j]);
      }
      row.wc = bounds::row_bound(bounds::Precision{1.0, 0.0}, RowNorm::softmax, g.z, g.zc, g.m, 0.0, 0.0, q.data(), 0.0,
                                 row.value).lse;
      row.R = bounds::prob_row(RowNorm::softmax, g.z, g.zeta2, g.m, 0.0, 0.0, g.sigma, q.data(), 0.0, row.value, false).lse;
    }
  } else {
    for (std::size_t j = 0; j < m; ++j)
      if (!std::isinf(g.z[j])) zabs += g.p[j] * std::abs(g.z[j]);
  }
  if (cv.base2) {
    constexpr double L = 1.4426950408889634;  // log2(e)
    if (row.exact) {
      using std::log;
      row.value_mp = row.value_mp / log(mp50(2));
      row.value = static_cast<double>(row.value_mp);
    } else {
      row.value *= L;
    }
    if (std::isfinite(row.value)) {
      row.wc = L * (row.wc + 2.0 * bounds::kSecondOrder * zabs) + 2.0 * std::abs(row.value);
      row.R = std::sqrt(L * L * (row.R * row.R + 2.0 * zabs * zabs) + 2.0 * row.value * row.value);
    }
  }
}

Tensor<double> lse1_of(const LseConvention& cv, const AttentionOptions& opt, const Tensor<double>& lse) {
  OASIS_REQUIRE(lse.rank() == 3, "lse", "must be [B, H, Tq], got ", shape_str(lse.shape()));
  Tensor<double> r = lse;
  const bool null = opt.normalizer == RowNorm::softmax1;
  for (index_t i = 0; i < r.size(); ++i) {
    if (cv.base2) r[i] *= 0.69314718055994531;  // ln 2
    if (!cv.keys_only || !null) continue;
    const index_t h = (i / r.dim(2)) % r.dim(1);
    const double s = opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
    if (std::isinf(s)) {
      r[i] = s > 0 ? s : r[i];
      continue;
    }
    const double M = std::max(s, r[i]);
    r[i] = M + std::log1p(std::exp(-std::abs(s - r[i])));
  }
  return r;
}

void lse_cotangents(const LseConvention& cv, const AttentionResult<mp50>& fwd, RowNorm kind, const Tensor<double>& g,
                    const Tensor<double>* dpn, Tensor<mp50>& dlse1, Tensor<mp50>& dpn1) {
  using std::log;
  dlse1 = g.cast<mp50>();
  dpn1 = dpn ? dpn->cast<mp50>() : Tensor<mp50>(g.shape());
  const mp50 L = mp50(1) / log(mp50(2));
  const index_t Tk = fwd.probs.dim(3);
  for (index_t r = 0; r < g.size(); ++r) {
    if (cv.base2) dlse1[r] *= L;
    if (!cv.keys_only || kind != RowNorm::softmax1 || g[r] == 0.0) continue;
    mp50 sum(0);
    for (index_t j = 0; j < Tk; ++j) sum += fwd.probs[r * Tk + j];
    if (sum > mp50(0)) {
      dpn1[r] -= dlse1[r] / sum;
      continue;
    }
    OASIS_REQUIRE(!is_pos_inf(fwd.lse[r]), "grad_lse", "a keys-only LSE's gradient on a head whose null logit is +inf "
                  "is not supported (flat row ", r, ")");
    dlse1[r] = mp50(0);  // no visible key: LSE_keys = -inf, a constant
  }
}

}  // namespace oasis::verify::detail
