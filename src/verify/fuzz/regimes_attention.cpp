// src/verify/fuzz/regimes_attention.cpp — the regimes of the attention ops (attention,
// attention_backward): where the sink (null logit), the masks, the lengths and
// the head layout break kernels. docs/fuzz.md gives each regime's bug class and report.
#include <algorithm>
#include <cmath>
#include <limits>

#include "regimes.hpp"

namespace oasis::verify::fuzz::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// How an attention case is built; a regime sets what differs from the typical user's case.
struct AttnSpec {
  index_t ratio = 1;  ///< H / Hkv
  bool causal = true;
  index_t window = 0;
  /// null logit of head h of H (empty: standard normal per head)
  std::function<double(index_t h, index_t H, io::DType d)> sink;
  int order = 0;  ///< +1: keep Tq > Tk (empty causal rows), -1: keep Tq < Tk, at every size the shrinker tries
  /// Every visible logit near this value (0: q, k standard normal, logits of order 1).
  double logit_level = 0;
  bool key_length_zero = false;   ///< key_lengths: 0 for even batch elements, about half for odd
  bool bias_masked_rows = false;  ///< a bias [B, H, Tq, Tk] whose every third row is all -inf
  bool grad_lse = false, grad_p_null = false;  ///< attention_backward's optional cotangents
};

/// Visible logits near `level`: q = c u + e_q and k = -u + 0.01 e_k with u a random sign vector
/// and c = -level / sqrt(dh), so q.k scale = level + N(0, 1 + (0.01 c)^2) roughly: a spread of
/// about 0.01 |level| / sqrt(dh) (75 at -6e4 with dh = 64), far from the sentinels and the sinks.
void fill_qk_at_level(Case& c, double level, Rng& rng) {
  const Dims& d = c.dims;
  std::vector<double> u(static_cast<std::size_t>(d.dh));
  for (double& x : u) x = rng.uniform() < 0.5 ? -1.0 : 1.0;
  const double cq = -level / std::sqrt(static_cast<double>(d.dh));
  c.inputs["q"] = make_tensor(c.dtype, {d.B, d.H, d.Tq, d.dh},
                              [&](index_t i) { return cq * u[static_cast<std::size_t>(i % d.dh)] + rng.normal(); });
  c.inputs["k"] = make_tensor(c.dtype, {d.B, d.Hkv, d.Tk, d.dh},
                              [&](index_t i) { return -u[static_cast<std::size_t>(i % d.dh)] + 0.01 * rng.normal(); });
}

void gen_attention(Case& c, const AttnSpec& s, Rng& rng) {
  Dims& d = c.dims;
  d.H = d.Hkv * s.ratio;
  if (s.order > 0) d.Tq = std::max(d.Tq, d.Tk + 1);
  if (s.order < 0) d.Tk = std::max(d.Tk, d.Tq + 1);
  if (d.dv == 0) d.dv = d.dh;
  if (s.logit_level != 0) {
    fill_qk_at_level(c, s.logit_level, rng);
  } else {
    c.inputs["q"] = randn(c.dtype, {d.B, d.H, d.Tq, d.dh}, rng);
    c.inputs["k"] = randn(c.dtype, {d.B, d.Hkv, d.Tk, d.dh}, rng);
  }
  c.inputs["v"] = randn(c.dtype, {d.B, d.Hkv, d.Tk, d.dv}, rng);
  c.inputs["null_logits"] = make_tensor(c.dtype, {d.H}, [&](index_t h) {
    return s.sink ? s.sink(h, d.H, c.dtype) : rng.normal();
  });
  c.options["causal"] = s.causal ? "true" : "false";
  if (s.window > 0) c.options["window"] = std::to_string(s.window);
  if (s.key_length_zero) {
    std::string kl = "[";
    for (index_t b = 0; b < d.B; ++b) kl += (b ? ", " : "") + std::to_string(b % 2 == 0 ? 0 : d.Tk / 2 + 1);
    c.options["key_lengths"] = kl + "]";
  }
  if (s.bias_masked_rows)
    c.inputs["bias"] = make_tensor(c.dtype, {d.B, d.H, d.Tq, d.Tk}, [&](index_t i) {
      const index_t row = i / d.Tk;
      return row % 3 == 0 ? -kInf : rng.normal();
    });
  if (c.op == "attention_backward") {
    c.inputs["grad_out"] = randn(c.dtype, {d.B, d.H, d.Tq, d.dv}, rng);
    if (s.grad_lse) c.inputs["grad_lse"] = randn(c.dtype, {d.B, d.H, d.Tq}, rng);
    if (s.grad_p_null) c.inputs["grad_p_null"] = randn(c.dtype, {d.B, d.H, d.Tq}, rng);
  }
}

Dims attn_dims(index_t B, index_t Hkv, index_t Tq, index_t Tk, index_t dh = 64) {
  Dims d;
  d.B = B, d.Hkv = Hkv, d.H = Hkv, d.Tq = Tq, d.Tk = Tk, d.dh = dh, d.dv = dh;
  return d;
}

Dims attn_least() { return attn_dims(1, 1, 1, 1, 1); }

/// A regime of both attention ops whose variants differ by a spec and sizes.
void add_attn(std::vector<Regime>& out, std::string name, std::string description, std::string targets,
              std::vector<std::string> needs, std::vector<std::pair<std::string, Dims>> variants,
              std::function<AttnSpec(int variant)> spec, std::vector<std::string> ops = {"attention", "attention_backward"}) {
  out.push_back(make_regime(std::move(name), std::move(ops), std::move(description), std::move(targets), std::move(needs),
                            std::move(variants), attn_least(),
                            [spec](Case& c, int v, Rng& rng) { gen_attention(c, spec(v), rng); }));
}

/// A finite null logit near the top of what dtype d holds (or `x` when d holds it).
double capped(double x, io::DType d) { return std::copysign(std::min(std::fabs(x), 0.9 * dtype_max(d)), x); }

}  // namespace

void add_attention_regimes(std::vector<Regime>& out) {
  const std::vector<std::string> base = {"causal"};
  const std::vector<std::string> sink = {"causal", "null_logits"};
  auto plus = [&](std::vector<std::string> more) {
    std::vector<std::string> v = base;
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  add_attn(out, "typical", "what users' own tests feed: randn q, k, v and sinks, causal, H = Hkv, no padding",
           "gross errors only (the baseline: most sink bugs pass here)", base, {{"", attn_dims(1, 2, 128, 128)}},
           [](int) { return AttnSpec{}; });
  add_attn(out, "noncausal", "randn q, k, v and sinks, no mask", "masks applied when causal is false",
           {"noncausal", "null_logits"}, {{"", attn_dims(1, 2, 96, 96)}}, [](int) {
             AttnSpec s;
             s.causal = false;
             return s;
           });
  add_attn(out, "sink_far_above", "null logits 30 and 100 above the logits (p_null near 1)",
           "a sink kept out of the running max (e^(s - m) overflows); a sink added linearly", sink,
           {{"s=+30", attn_dims(1, 2, 64, 64)}, {"s=+100", attn_dims(1, 2, 64, 64)}}, [](int v) {
             AttnSpec s;
             s.sink = [v](index_t, index_t, io::DType) { return v == 0 ? 30.0 : 100.0; };
             return s;
           });
  add_attn(out, "sink_far_below", "null logits 30 and 100 below the logits (p_null near 0)",
           "a sink added linearly (den + s goes negative); a sink used as a score bias", sink,
           {{"s=-30", attn_dims(1, 2, 64, 64)}, {"s=-100", attn_dims(1, 2, 64, 64)}}, [](int v) {
             AttnSpec s;
             s.sink = [v](index_t, index_t, io::DType) { return v == 0 ? -30.0 : -100.0; };
             return s;
           });
  add_attn(out, "sink_infinite", "null logits +inf on even heads (all mass on the null), -inf on odd (no null)",
           "NaN from inf - inf in the running max or the LSE", plus({"null_logits", "infinite_null"}), {{"", attn_dims(1, 2, 64, 64)}},
           [](int) {
             AttnSpec s;
             s.sink = [](index_t h, index_t, io::DType) { return h % 2 == 0 ? kInf : -kInf; };
             return s;
           });
  add_attn(out, "sink_zero", "null logits exactly 0 (softmax1's own null; in 16-bit inputs, where 0 reads as unset)",
           "a sink silently dropped when its value is 0 (treated as absent)", sink, {{"", attn_dims(1, 2, 64, 64)}},
           [](int) {
             AttnSpec s;
             s.sink = [](index_t, index_t, io::DType) { return 0.0; };
             return s;
           });
  add_attn(out, "huge_sink", "finite null logits of 1e4 and near the dtype's largest value, of both signs",
           "a split-KV merge that overflows on a large sink (sum of e^lse_i + e^s in linear space)", sink,
           {{"s=+1e4", attn_dims(1, 2, 256, 256)}, {"s=+max", attn_dims(1, 2, 256, 256)},
            {"s=-max", attn_dims(1, 2, 256, 256)}},
           [](int v) {
             AttnSpec s;
             s.sink = [v](index_t, index_t, io::DType d) {
               return v == 0 ? capped(1e4, d) : v == 1 ? capped(3e38, d) : capped(-3e38, d);
             };
             return s;
           });
  add_attn(out, "key_length_zero", "key_lengths 0 for even batch elements (rows with no visible key), Tk/2+1 for odd",
           "NaN (0/0) on fully masked rows", plus({"key_lengths", "batch"}), {{"", attn_dims(2, 2, 64, 64)}}, [](int) {
             AttnSpec s;
             s.key_length_zero = true;
             return s;
           });
  add_attn(out, "bias_masked_rows", "a bias [B, H, Tq, Tk] whose every third row is all -inf, randn elsewhere",
           "NaN (0/0) on fully masked rows; a wrong grad_bias", plus({"bias"}), {{"", attn_dims(1, 2, 48, 48)}}, [](int) {
             AttnSpec s;
             s.bias_masked_rows = true;
             return s;
           });
  add_attn(out, "empty_rows_causal", "causal with Tq > Tk: the first Tq - Tk queries see no key (bottom-right)",
           "NaN on fully masked rows; a causal mask aligned top-left", plus({"tq_gt_tk"}), {{"", attn_dims(1, 2, 80, 64)}},
           [](int) {
             AttnSpec s;
             s.order = 1;
             return s;
           });
  add_attn(out, "lse_underflow", "every logit near -100 and null logits -200: the LSE lies below -88.7, where f32 e^x underflows",
           "a kernel that exponentiates unshifted logits, or an LSE formed as log(sum) in f32", sink,
           {{"", attn_dims(1, 2, 64, 64)}}, [](int) {
             AttnSpec s;
             s.logit_level = -100;
             s.sink = [](index_t, index_t, io::DType) { return -200.0; };
             return s;
           });
  add_attn(out, "below_sentinel", "causal, every visible logit near -6e4 and null logits below them: masked keys at a -5e4 sentinel would dominate",
           "a -5e4 (or -1e4, finfo.min/2) mask sentinel instead of -inf", sink, {{"", attn_dims(1, 2, 64, 64)}}, [](int) {
             AttnSpec s;
             s.logit_level = -6e4;
             s.sink = [](index_t, index_t, io::DType d) { return capped(-7e4, d); };
             return s;
           });
  {
    std::vector<std::pair<std::string, Dims>> v;
    for (index_t L : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257})
      v.push_back({"T=" + std::to_string(L), attn_dims(1, 2, L, L)});
    add_attn(out, "tile_boundary", "causal Tq = Tk at lengths just below, at and above the tile sizes 16, 32, 64, 128, 256",
             "a padded (partial) tile scored 0 instead of -inf; an off-by-one at the last tile", base, v,
             [](int) { return AttnSpec{}; });
    // without the causal bound no mask covers the keys past Tk: a padded tile scored 0 shows here
    add_attn(out, "tile_boundary_noncausal", "Tq = Tk at the same lengths, no mask",
             "a padded (partial) tile scored 0 instead of -inf (the causal bound hides it)", {"noncausal"}, v, [](int) {
               AttnSpec s;
               s.causal = false;
               return s;
             });
  }
  add_attn(out, "decode", "one query against Tk keys (Tk 65, 1000, 4096), causal bottom-right",
           "a sink dropped on the decode path; a split-KV merge; a causal mask aligned top-left", plus({"decode"}),
           {{"Tk=65", attn_dims(1, 2, 1, 65)}, {"Tk=1000", attn_dims(1, 2, 1, 1000)}, {"Tk=4096", attn_dims(1, 2, 1, 4096)}},
           [](int) {
             AttnSpec s;
             s.order = -1;
             return s;
           });
  add_attn(out, "chunked_prefill", "causal Tq < Tk (a chunk of queries after a cached prefix)",
           "a causal mask aligned top-left (j <= t instead of j <= t + Tk - Tq)", plus({"decode"}),
           {{"Tq=64,Tk=200", attn_dims(1, 2, 64, 200)}, {"Tq=16,Tk=129", attn_dims(1, 2, 16, 129)}},
           [](int) {
             AttnSpec s;
             s.order = -1;
             return s;
           });
  {
    std::vector<std::pair<std::string, Dims>> v;
    const std::vector<index_t> W = {1, 2, 63, 64, 65, 127, 128, 129};
    for (index_t w : W) v.push_back({"W=" + std::to_string(w), attn_dims(1, 2, 128, 128)});
    add_attn(out, "window_edges", "causal sliding windows W of 1, 2, 63-65, 127-129 over 128 keys",
             "a window off by one (W counts the query's own key); a window applied without the causal bound",
             plus({"window"}), v, [W](int i) {
               AttnSpec s;
               s.window = W[static_cast<std::size_t>(i)];
               return s;
             });
  }
  add_attn(out, "gqa", "grouped queries, H / Hkv = 2 and 8, distinct sinks on the heads of a group",
           "a sink indexed per kv head (sinks[h / group]); K/V of the wrong group", plus({"gqa", "null_logits"}),
           {{"H/Hkv=2", attn_dims(1, 2, 64, 64)}, {"H/Hkv=8", attn_dims(1, 1, 64, 64)}}, [](int v) {
             AttnSpec s;
             s.ratio = v == 0 ? 2 : 8;
             return s;
           });
  add_attn(out, "mqa", "multi-query: one K/V head for four query heads", "a sink indexed per kv head; K/V broadcast",
           plus({"gqa", "null_logits"}), {{"", attn_dims(1, 1, 64, 64)}}, [](int) {
             AttnSpec s;
             s.ratio = 4;
             return s;
           });
  add_attn(out, "batch", "B = 3 with distinct sequences", "a batch stride error; grad_null_logits not summed over the batch",
           plus({"batch"}), {{"", attn_dims(3, 2, 64, 64)}}, [](int) { return AttnSpec{}; });
  add_attn(out, "long_sequence", "causal T = 1024 (the long end of users' sizes)",
           "accumulators too narrow for long sums (dSink reduced in bf16)", base, {{"", attn_dims(1, 2, 1024, 1024)}},
           [](int) { return AttnSpec{}; });
  add_attn(out, "cotangent_lse", "attention_backward with an incoming gradient of the LSE",
           "dSink (and dQ, dK) without the dLSE term", plus({"grad_lse"}), {{"", attn_dims(1, 2, 64, 64)}}, [](int) {
             AttnSpec s;
             s.grad_lse = true;
             return s;
           }, {"attention_backward"});
  add_attn(out, "cotangent_p_null", "attention_backward with an incoming gradient of p_null (psi's path)",
           "the p_null path of the backward dropped", plus({"grad_p_null"}), {{"", attn_dims(1, 2, 64, 64)}}, [](int) {
             AttnSpec s;
             s.grad_p_null = true;
             return s;
           }, {"attention_backward"});
}

}  // namespace oasis::verify::fuzz::detail
