// src/verify/fuzz/regimes_merge.cpp — the regimes of op attention_merge in form A (the merge of
// split-KV partials out_parts [S, B, H, Tq, dv], lse_parts [S, B, H, Tq] and the null logits
// [H]): sinks far above the partials (rocm-libraries #12227, sgl-kernel-xpu #235: e^{s - m}
// overflows), empty splits whose out is garbage, fully masked rows, the sink seeded into split 0,
// base-2 partials, partials of very different scales. docs/fuzz.md gives each regime's bug class.
#include <cmath>
#include <limits>

#include "regimes.hpp"

namespace oasis::verify::fuzz::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// How a merge case is built; a regime sets what differs from the typical one.
struct MergeSpec {
  std::function<double(index_t h, io::DType d, Rng& rng)> sink;  ///< null logit of head h (empty: N(0, 1))
  bool one_empty = false;  ///< per row, split (row mod S) has no visible key: lse -inf, out NaN
  bool rows_empty = false; ///< every third row: every split empty
  bool split0 = false;     ///< sink_in "split0": split 0's partial holds the null
  bool base2 = false;      ///< parts_lse_base "2"
  double shift = 0;        ///< split i's scores shifted by +shift (even i) or -shift (odd i)
};

/// Partials of random attention: split i of row r holds 16 keys (the last of several splits 9:
/// uneven lengths) with scores N(shift_i, 1.5^2) and values N(0, 1); lse_i = log sum_j e^{z_j} and
/// out_i = sum_j e^{z_j - lse_i} v_j, computed in double and stored in the case's dtype.
void gen_merge(Case& c, const MergeSpec& m, Rng& rng) {
  const Dims& d = c.dims;
  const index_t R = d.B * d.H * d.Tq;
  std::vector<double> s(static_cast<std::size_t>(d.H));
  for (index_t h = 0; h < d.H; ++h) s[static_cast<std::size_t>(h)] = m.sink ? m.sink(h, c.dtype, rng) : rng.normal();
  std::vector<double> lse(static_cast<std::size_t>(d.S * R)), out(static_cast<std::size_t>(d.S * R * d.dv));
  std::vector<double> z(16), v(static_cast<std::size_t>(16 * d.dv));
  for (index_t i = 0; i < d.S; ++i)
    for (index_t r = 0; r < R; ++r) {
      double* o = out.data() + (i * R + r) * d.dv;
      double& l = lse[static_cast<std::size_t>(i * R + r)];
      if ((m.one_empty && d.S > 1 && i == r % d.S) || (m.rows_empty && r % 3 == 0)) {
        l = -kInf;
        for (index_t x = 0; x < d.dv; ++x) o[x] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      const index_t n = i == d.S - 1 && d.S > 1 ? 9 : 16;
      const double shift = i % 2 == 0 ? m.shift : -m.shift;
      double M = -kInf, sum = 0;
      for (index_t j = 0; j < n; ++j) M = std::max(M, z[static_cast<std::size_t>(j)] = shift + 1.5 * rng.normal());
      for (index_t j = 0; j < n; ++j) sum += std::exp(z[static_cast<std::size_t>(j)] - M);
      l = M + std::log(sum);
      for (double& x : v) x = rng.normal();
      for (index_t x = 0; x < d.dv; ++x) {
        double a = 0;
        for (index_t j = 0; j < n; ++j) a += std::exp(z[static_cast<std::size_t>(j)] - l) * v[static_cast<std::size_t>(j * d.dv + x)];
        o[x] = a;
      }
      const double sh = s[static_cast<std::size_t>((r / d.Tq) % d.H)];
      if (m.split0 && i == 0 && std::isfinite(sh)) {  // the null seeded into split 0: (M, S) = (s, 1) first
        const double L0 = std::max(l, sh) + std::log1p(std::exp(-std::abs(l - sh)));
        for (index_t x = 0; x < d.dv; ++x) o[x] *= std::exp(l - L0);
        l = L0;
      }
      if (m.base2) l /= 0.69314718055994531;  // ln 2
    }
  c.inputs["out_parts"] = make_tensor(c.dtype, {d.S, d.B, d.H, d.Tq, d.dv}, [&](index_t k) { return out[static_cast<std::size_t>(k)]; });
  c.inputs["lse_parts"] = make_tensor(c.dtype, {d.S, d.B, d.H, d.Tq}, [&](index_t k) { return lse[static_cast<std::size_t>(k)]; });
  c.inputs["null_logits"] = make_tensor(c.dtype, {d.H}, [&](index_t h) { return s[static_cast<std::size_t>(h)]; });
  if (m.split0) c.options["sink_in"] = "\"split0\"";
  if (m.base2) c.options["parts_lse_base"] = "\"2\"";
}

Dims merge_dims(index_t S, index_t B, index_t H, index_t Tq, index_t dv = 64) {
  Dims d;
  d.S = S, d.B = B, d.H = H, d.Tq = Tq, d.dv = dv;
  return d;
}

/// A finite null logit near the top of what dtype d holds.
double near_max(io::DType d) { return 0.9 * dtype_max(d); }

}  // namespace

void add_merge_regimes(std::vector<Regime>& out) {
  auto reg = [&](std::string name, std::string description, std::string targets, std::vector<std::string> needs,
                 std::vector<std::pair<std::string, Dims>> variants, index_t least_S,
                 std::function<MergeSpec(int variant)> spec) {
    out.push_back(make_regime(std::move(name), {"attention_merge"}, std::move(description), std::move(targets),
                              std::move(needs), std::move(variants), merge_dims(least_S, 1, 1, 1, 1),
                              [spec](Case& c, int v, Rng& rng) { gen_merge(c, spec(v), rng); }));
  };
  const std::vector<std::string> sink = {"null_logits"};
  reg("typical", "S = 4 partials of random attention (16 keys each, the last 9), sinks N(0, 1)", "gross errors only",
      sink, {{"", merge_dims(4, 2, 4, 16)}}, 1, [](int) { return MergeSpec{}; });
  reg("huge_sink", "null logits 1e4 and near the dtype's largest value, far above every partial's LSE (p_null = 1)",
      "e^s or e^{s - m} with m the partials' maximum only (overflow: sgl-kernel-xpu #235); a linear-space merge",
      sink, {{"s=+1e4", merge_dims(4, 2, 4, 8)}, {"s=max", merge_dims(4, 2, 4, 8)}}, 1, [](int v) {
        MergeSpec m;
        m.sink = [v](index_t, io::DType d, Rng&) { return v == 0 ? 1e4 : near_max(d); };
        return m;
      });
  reg("empty_split", "per row one split with no visible key: lse_parts -inf and out_parts NaN",
      "0 * NaN: an empty split's garbage out read; the sink counted by the empty split (rocm-libraries #12227)", sink,
      {{"", merge_dims(4, 2, 4, 16)}}, 2, [](int) {
        MergeSpec m;
        m.one_empty = true;
        return m;
      });
  reg("all_empty", "every third row with every split empty (fully masked); sinks -inf on even heads, N(0, 1) on odd",
      "NaN (0/0, inf - inf) on a fully masked row; out not 0, lse not the null logit (or -inf without one)",
      {"null_logits", "infinite_null"}, {{"", merge_dims(4, 2, 4, 12)}}, 1, [](int) {
        MergeSpec m;
        m.rows_empty = true;
        m.sink = [](index_t h, io::DType, Rng& r) { return h % 2 == 0 ? -kInf : r.normal(); };
        return m;
      });
  reg("sink_split0", "sink_in split0: split 0's partial seeded with the null (its LSE and out hold it), sinks N(0, 2^2)",
      "the null added again at the merge (counted twice), or p_null not recovered from it", sink,
      {{"", merge_dims(4, 2, 4, 16)}}, 1, [](int) {
        MergeSpec m;
        m.split0 = true;
        m.sink = [](index_t, io::DType, Rng& r) { return 2.0 * r.normal(); };
        return m;
      });
  reg("base2_parts", "parts_lse_base 2: lse_parts in base 2 (Triton-style partials)",
      "base-2 partials read as nats (or the sink left in nats against them)", sink, {{"", merge_dims(4, 2, 4, 16)}}, 1,
      [](int) {
        MergeSpec m;
        m.base2 = true;
        return m;
      });
  reg("uneven_scales", "partial LSEs near +80 and -80 (alternating splits), sinks N(0, 1)",
      "weights e^{lse_i} without the maximum (overflow in 16 bits, underflow of the small splits)", sink,
      {{"", merge_dims(4, 2, 4, 16)}}, 2, [](int) {
        MergeSpec m;
        m.shift = 80;
        return m;
      });
}

}  // namespace oasis::verify::fuzz::detail
