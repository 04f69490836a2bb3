// tests/fuzz/zoo_cases.hpp — hand-made cases of the regimes of docs/fuzz.md, built here without the
// fuzzer's generators, so that the zoo's kernels (bug_zoo.hpp) are judged by check() alone: every
// correct kernel passes each case, every bug fails the case of its regime.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis_random.hpp"

namespace oasis::fuzz_zoo {

/// One case of op attention or attention_backward.
struct ZooCase {
  std::string name;
  index_t B = 1, H = 2, Hkv = 1, Tq = 8, Tk = 8, d = 8;
  bool causal = true;
  index_t window = 0;
  std::vector<index_t> len;   ///< key_lengths
  std::vector<double> sinks;  ///< one per query head (empty: uniform in [-3, 3])
  /// Logits: q ~ N(0, q_sd^2), k ~ N(0, 1); shift != 0 puts every logit within O(1) of `shift`:
  /// q = c u + N(0, 1), k = -u + N(0, (0.01 / max(1, |c|))^2) with u a random sign vector and
  /// c = -shift / sqrt(d), so that scale <q, k> = shift + N(0, 1) + O(0.01) at the default scale
  /// 1 / sqrt(d) (k's noise scaled down by c: unscaled it would spread the logits by 0.01 |shift| / sqrt(d)).
  double q_sd = 1.0, shift = 0.0;
  bool bias = false;  ///< a [Tq, Tk] bias N(0, 1) with -inf at (t, 0) for odd t
  bool grad_lse = false, grad_p_null = false;
  bool stored_forward = false;  ///< backward: also the forward's out and lse as inputs (from `fwd`)
};

inline io::StoredTensor in_dtype(const Tensor<double>& t, io::DType d) {
  io::StoredTensor s{d, t};
  for (index_t i = 0; i < s.values.size(); ++i) s.values[i] = io::round_to_dtype(s.values[i], d);
  return s;
}

/// The inputs (stored in `d`; null logits in f32) and the options of case c for `op`.
inline io::TensorMap zoo_inputs(const ZooCase& c, const std::string& op, io::DType d, std::uint64_t seed) {
  auto rng = test::make_rng(seed);
  Tensor<double> q = test::randn<double>({c.B, c.H, c.Tq, c.d}, rng, c.q_sd), k = test::randn<double>({c.B, c.Hkv, c.Tk, c.d}, rng),
                 v = test::randn<double>({c.B, c.Hkv, c.Tk, c.d}, rng);
  if (c.shift != 0) {
    std::vector<double> u(static_cast<std::size_t>(c.d));
    for (double& x : u) x = rng() % 2 ? 1.0 : -1.0;
    const double cq = -c.shift / std::sqrt(static_cast<double>(c.d));
    for (index_t i = 0; i < q.size(); ++i) q[i] = cq * u[static_cast<std::size_t>(i % c.d)] + q[i] / c.q_sd;
    const double kn = 0.01 / std::max(1.0, std::abs(cq));
    for (index_t i = 0; i < k.size(); ++i) k[i] = -u[static_cast<std::size_t>(i % c.d)] + kn * k[i];
  }
  io::TensorMap in{{"q", in_dtype(q, d)}, {"k", in_dtype(k, d)}, {"v", in_dtype(v, d)}};
  std::vector<double> s = c.sinks;
  std::uniform_real_distribution<double> ud(-3.0, 3.0);
  if (s.empty())
    for (index_t h = 0; h < c.H; ++h) s.push_back(ud(rng));
  in.emplace("null_logits", in_dtype(Tensor<double>({c.H}, s), io::DType::f32));
  if (c.bias) {
    Tensor<double> b = test::randn<double>({c.Tq, c.Tk}, rng);
    for (index_t t = 1; t < c.Tq; t += 2) b(t, 0) = -std::numeric_limits<double>::infinity();
    in.emplace("bias", in_dtype(b, d));
  }
  if (op == "attention_backward") {
    in.emplace("grad_out", in_dtype(test::randn<double>({c.B, c.H, c.Tq, c.d}, rng), d));
    if (c.grad_lse) in.emplace("grad_lse", in_dtype(test::randn<double>({c.B, c.H, c.Tq}, rng), d));
    if (c.grad_p_null) in.emplace("grad_p_null", in_dtype(test::randn<double>({c.B, c.H, c.Tq}, rng), d));
  }
  return in;
}

/// The case's options: causal, window, key_lengths.
inline io::json::Value zoo_options(const ZooCase& c) {
  std::string s = std::string("{\"causal\": ") + (c.causal ? "true" : "false");
  if (c.window > 0) s += ", \"window\": " + std::to_string(c.window);
  if (!c.len.empty()) {
    s += ", \"key_lengths\": [";
    for (std::size_t i = 0; i < c.len.size(); ++i) s += (i ? ", " : "") + std::to_string(c.len[i]);
    s += "]";
  }
  return io::json::parse(s + "}");
}

/// The cases, one or more per regime of docs/fuzz.md.
inline std::vector<ZooCase> zoo_cases() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<ZooCase> z;
  // name, B, H, Hkv, Tq, Tk; then the fields that differ from the defaults
  auto add = [&](const char* name, index_t B, index_t H, index_t Hkv, index_t Tq, index_t Tk) -> ZooCase& {
    ZooCase c;
    c.name = name, c.B = B, c.H = H, c.Hkv = Hkv, c.Tq = Tq, c.Tk = Tk;
    z.push_back(c);
    return z.back();
  };
  add("basic_gqa", 2, 4, 2, 16, 16);
  add("noncausal", 1, 2, 2, 5, 9).causal = false;
  add("sinks_far_above", 1, 2, 2, 4, 6).sinks = {30.0, 100.0};
  add("sinks_far_below", 1, 2, 2, 4, 6).sinks = {-30.0, -100.0};
  add("infinite_sinks", 1, 2, 1, 4, 6).sinks = {inf, -inf};
  ZooCase& im = add("infinite_sinks_masked", 2, 2, 1, 4, 6);
  im.len = {0, 3}, im.sinks = {-inf, inf};
  add("zero_sinks", 1, 2, 2, 4, 6).sinks = {0.0, 0.0};
  add("key_length_0", 2, 2, 2, 4, 6).len = {0, 4};
  add("tq_gt_tk_causal", 1, 2, 2, 8, 3);
  ZooCase& lo = add("lse_below_88", 1, 2, 2, 4, 6);
  lo.sinks = {-100.0, -95.0}, lo.shift = -100.0;
  ZooCase& se = add("below_sentinel", 1, 2, 2, 4, 6);
  se.sinks = {-6.0e4, -6.2e4}, se.shift = -6.0e4;
  add("huge_sinks", 1, 2, 2, 4, 6).sinks = {1.0e4, -1.0e4};
  add("huge_sinks_1e30", 1, 2, 2, 2, 3).sinks = {1.0e30, -1.0e30};
  add("tile_65", 1, 1, 1, 3, 65).causal = false;
  add("tile_129_decode", 1, 2, 1, 1, 129);
  add("tile_128_prefill", 1, 1, 1, 128, 128).d = 4;
  add("decode", 1, 2, 2, 1, 40);
  add("chunked_prefill", 1, 2, 1, 8, 70);
  add("window", 1, 2, 2, 20, 20).window = 3;
  add("window_decode", 1, 2, 2, 3, 80).window = 70;
  add("mqa_8", 1, 8, 1, 3, 5);
  add("bias", 1, 2, 2, 4, 6).bias = true;
  ZooCase& gl = add("grad_lse", 2, 2, 1, 4, 6);
  gl.len = {0, 6}, gl.grad_lse = true;
  add("grad_p_null", 2, 2, 1, 4, 6).grad_p_null = true;
  ZooCase& gb = add("grad_both_far_above", 1, 2, 2, 4, 6);
  gb.sinks = {30.0, 100.0}, gb.grad_lse = true, gb.grad_p_null = true;
  return z;
}

}  // namespace oasis::fuzz_zoo
