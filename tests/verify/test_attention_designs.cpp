// tests/verify/test_attention_designs.cpp — the zoo of correct forward designs written the way real
// kernels are written (docs/tolerances.md, "Designs of real kernels"): each passes the default
// policy and is never FAIL-certain, at T from 1 to 4096, in f32, f16 and bf16; the same designs with
// a mistake fail. Designs: FlashAttention-2 online softmax (exp2, key blocks), split-KV decoding with
// a rescaled merge, P rounded to 16 bits before P·V, and GPU fast math (ex2.approx-class exp2,
// every subnormal result flushed to zero).
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "attention_zoo.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
namespace zoo = oasis::zoo;
using oasis::index_t;

namespace {

/// The design's outputs stored in d, on inputs stored in d (their values must be exact in d).
verify::CompareReport check(const zoo::Case& c, const zoo::Impl& im, io::DType d, const verify::CompareOptions& co = {}) {
  oasis::AttentionOptions o = c.opt;
  o.return_probs = false;
  const zoo::Result r = zoo::storage(zoo::attention(im, c.q, c.k, c.v, o), d);
  return verify::check("attention", zoo::inputs_of(c, d), zoo::outputs_of(r, d, {"out", "lse", "p_null"}),
                       io::json::parse(zoo::options_json(c)), co);
}

/// A case whose inputs and sinks are exact in d.
zoo::Case case_in(zoo::Case c, io::DType d) {
  c = zoo::rounded_to(std::move(c), d);
  for (double& s : c.opt.null_logits) s = oasis::io::round_to_dtype(s, d);
  return c;
}

double worst(const verify::CompareReport& r) {
  double w = 0;
  for (const auto& t : r.tensors) w = std::max(w, t.worst_ratio);
  return w;
}

zoo::Impl fast_math(zoo::Impl im) {
  im.name += "_fastmath";
  im.ftz = im.fast_exp = true;
  return im;
}

/// The designs in d: FlashAttention-2 (online, 64-key blocks), split-KV (8 chunks, merged once) and
/// fast math on the online kernel; with 16-bit inputs also P rounded to d before P·V (tensor-core
/// FlashAttention) and torch eager code (scores, probabilities and P·V stored in d).
std::vector<zoo::Impl> designs(io::DType d) {
  std::vector<zoo::Impl> z = {{"fa2_online", zoo::Algo::online, 64}, {"split_kv8", zoo::Algo::split_k, 8},
                              fast_math({"fa2_online", zoo::Algo::online, 64})};
  if (d == io::DType::f32) return z;
  zoo::Impl p16{"online_p16", zoo::Algo::online, 64};
  p16.p16 = true;
  p16.p16_type = d;
  zoo::Impl eager{"torch_eager", zoo::Algo::eager16};
  eager.p16 = true;
  eager.p16_type = d;
  z.push_back(p16);
  z.push_back(eager);
  return z;
}

}  // namespace

// A fast-math kernel flushes out = 3e-44 (a sink of 100 over keys of logit ~0: every weight is
// e^-100, subnormal in float32) to 0. That is the kernel's arithmetic, not a mistake: PASS. A sink
// of 20 leaves weights of e^-20, normal: there a zero output is wrong, and fails.
TEST(AttentionDesigns, FlushToZeroIsNotAMistake) {
  zoo::Case c = zoo::make_case("ftz_sink_100", 1, 2, 2, 1, 64, 16, false, true, 0.1, 1.0, 71);
  c.opt.null_logits.assign(2, 100.0);
  const zoo::Impl ftz = fast_math({"fa2_online", zoo::Algo::online, 64});
  oasis::AttentionOptions o = c.opt;
  const zoo::Result r = zoo::attention(ftz, c.q, c.k, c.v, o);
  for (index_t i = 0; i < r.out.size(); ++i) ASSERT_EQ(r.out[i], 0.0f) << "the emulation does not flush at " << i;
  const auto exact = oasis::token_attention(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), o);
  double biggest = 0;
  for (index_t i = 0; i < exact.out.size(); ++i) biggest = std::max(biggest, std::abs(exact.out[i]));
  EXPECT_GT(biggest, 1e-45) << "the case has no subnormal output to flush";
  EXPECT_LT(biggest, 1.2e-38);
  const verify::CompareReport ok = check(c, ftz, io::DType::f32);
  EXPECT_TRUE(ok.passed) << verify::format_report(ok);
  c.opt.null_logits.assign(2, 20.0);
  verify::CompareReport bad = verify::check(
      "attention", zoo::inputs_of(c), zoo::outputs_of(zoo::attention(ftz, c.q, c.k, c.v, c.opt), io::DType::f32, {"p_null"}),
      io::json::parse(zoo::options_json(c)));
  ASSERT_TRUE(bad.passed) << verify::format_report(bad);  // p_null is right; only out is zeroed below
  io::TensorMap zeros = zoo::outputs_of(zoo::attention(ftz, c.q, c.k, c.v, c.opt), io::DType::f32, {"out"});
  for (auto& [name, t] : zeros)
    for (index_t i = 0; i < t.values.size(); ++i) t.values[i] = 0.0;
  bad = verify::check("attention", zoo::inputs_of(c), zeros, io::json::parse(zoo::options_json(c)));
  EXPECT_EQ(verify::verdict_word(bad), "FAIL-certain") << verify::format_report(bad);
}

// Every design passes at every row length in every dtype, and is never FAIL-certain; the worst
// err/bound per design and dtype is printed (the table of docs/tolerances.md).
TEST(AttentionDesigns, CorrectDesignsPassEverywhere) {
  struct Shape {
    const char* name;
    index_t Tq, Tk;
    bool causal;
  };
  const Shape shapes[] = {{"T1", 1, 1, false},       {"T8", 8, 8, true},           {"T16", 16, 16, true},
                          {"T64", 64, 64, true},     {"T512", 64, 512, true},      {"decode4096", 1, 4096, false}};
  for (io::DType d : {io::DType::f32, io::DType::bf16, io::DType::f16})
    for (const zoo::Impl& im : designs(d))
      for (const Shape& sh : shapes) {
        const zoo::Case c = case_in(zoo::make_case(std::string(sh.name), 1, 4, 2, sh.Tq, sh.Tk, 64, sh.causal, true, 1.0,
                                                   1.0, 500 + static_cast<std::uint64_t>(sh.Tk)), d);
        SCOPED_TRACE(im.name + " " + std::string(io::to_string(d)) + " " + sh.name);
        const verify::CompareReport r = check(c, im, d);
        EXPECT_TRUE(r.passed) << verify::format_report(r);
        std::printf("design %-20s %-4s %-10s %-12s worst err/bound %.3g\n", im.name.c_str(),
                    std::string(io::to_string(d)).c_str(), sh.name, verify::verdict_word(r).c_str(), worst(r));
      }
}

// Teeth: every design with a mistake fails the default policy at every row length >= 8, in every
// dtype: the sink dropped, counted twice, scaled by sm_scale or indexed per kv head, the diagonal
// masked, the window off by one, the LSE without the null. Rows of 8 to 64 keys, sinks uniform in
// [-3, 3] (gpt-oss) and stratified (zoo::stratified_sinks: one of the 4 heads' above 1.5 at every
// seed; with independent draws the LSE without a null of at most -1 passed a bf16 check, at some
// seeds), 4 query heads on 2 kv heads.
TEST(AttentionDesigns, MistakesFailEveryDesign) {
  const std::pair<const char*, zoo::Bug> bugs[] = {
      {"sink_dropped", zoo::Bug::null_dropped},         {"sink_twice", zoo::Bug::null_twice},
      {"sink_times_scale", zoo::Bug::sink_times_scale}, {"sink_per_kv_head", zoo::Bug::sink_per_kv_head},
      {"diagonal_masked", zoo::Bug::causal_no_diagonal}, {"window_off_by_one", zoo::Bug::window_off_by_one},
      {"lse_without_sink", zoo::Bug::lse_without_null}};
  int missed = 0;
  for (io::DType d : {io::DType::f32, io::DType::bf16, io::DType::f16})
    for (const zoo::Impl& design : designs(d))
      for (index_t T : {8, 16, 32, 48, 64})
        for (const auto& [bug_name, bug] : bugs) {
          zoo::Case c0 = zoo::make_case("teeth", 1, 4, 2, T, T, 64, true, true, 1.0, 1.0, 600 + static_cast<std::uint64_t>(T));
          c0.opt.null_logits = zoo::stratified_sinks(4, -3.0, 3.0, 700 + static_cast<std::uint64_t>(T));
          zoo::Case c = case_in(std::move(c0), d);
          if (bug == zoo::Bug::window_off_by_one) c.opt.window = T / 2;
          zoo::Impl im = design;
          im.bug = bug;
          SCOPED_TRACE(design.name + " " + std::string(io::to_string(d)) + " T" + std::to_string(T) + " " + bug_name);
          verify::CompareReport r = check(c, im, d);
          if (r.passed) {
            ++missed;
            std::printf("MISSED %-20s %-4s T%-3ld %-18s worst err/bound %.3g\n", design.name.c_str(),
                        std::string(io::to_string(d)).c_str(), static_cast<long>(T), bug_name, worst(r));
          }
          EXPECT_FALSE(r.passed) << verify::format_report(r);
        }
  std::printf("mistakes missed: %d\n", missed);
}

// Outputs near the bottom of the double range: sinks of 400 to 715 push a correct float64 attention's
// `out` to 1e-174 .. 1e-311, where the squared weights of the probabilistic bound once underflowed
// (err/bound up to 2e6 on correct code). It passes under both oracles; the same output with the
// sink counted twice fails (where `out` is normal: a subnormal one may be flushed to zero).
TEST(AttentionDesigns, OutputsNearTheBottomOfTheDoubleRange) {
  for (double sink : {400.0, 550.0, 715.0}) {
    zoo::Case c = zoo::make_case("tiny_out", 1, 2, 2, 8, 64, 16, true, true, 1.0, 1.0, 7);
    c.opt.null_logits.assign(2, sink);
    const auto r = oasis::token_attention(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), c.opt);
    ASSERT_LT(std::abs(r.out[0]), 1e-160);
    const io::TensorMap out{{"out", {io::DType::f64, r.out}}, {"p_null", {io::DType::f64, r.p_null}}};
    io::TensorMap twice = out;
    for (index_t i = 0; i < r.out.size(); ++i) twice.at("out").values[i] *= 0.5;  // the null counted twice: p_null ~ 1
    for (verify::Oracle o : {verify::Oracle::fast, verify::Oracle::mp50}) {
      SCOPED_TRACE("sink " + std::to_string(sink) + (o == verify::Oracle::fast ? " fast" : " mp50"));
      verify::CompareOptions co;
      co.oracle = o;
      const verify::CompareReport ok = verify::check("attention", zoo::inputs_of(c), out, io::json::parse(zoo::options_json(c)), co);
      EXPECT_TRUE(ok.passed) << verify::format_report(ok);
      const verify::CompareReport bad =
          verify::check("attention", zoo::inputs_of(c), twice, io::json::parse(zoo::options_json(c)), co);
      if (std::abs(r.out[0]) > std::numeric_limits<double>::min())  // subnormal: may be flushed (docs/policies.md)
        EXPECT_EQ(verify::verdict_word(bad), "FAIL-certain") << verify::format_report(bad);
      std::printf("tiny out: sink %g %s worst err/bound %.3g (oracle: %s)\n", sink, o == verify::Oracle::fast ? "fast" : "mp50",
                  worst(ok), ok.oracle.c_str());
    }
  }
}

// No false alarm over random shapes: 40 seeds of Tq 1..40 over Tk = Tq or longer (decode, chunked
// prefill), causal or not, batch 1 and 2, sinks in [-3, 3] shifted by 0, +-12 or +30 (outputs and
// probabilities far below f16's smallest normal, 6.1e-5), every design in every dtype: each run
// passes the default policy. Before the subnormal probabilities of 16-bit storage were admitted
// (an absolute u16 n16 per probability), torch eager code in f16 failed with sinks of +12.
TEST(AttentionDesigns, CorrectDesignsPassOverRandomShapes) {
  int runs = 0;
  double w = 0;
  for (int seed = 0; seed < 40; ++seed) {
    const index_t Tq = 1 + seed % 40, Tk = seed % 3 == 0 ? Tq : Tq + (seed * 7) % 90;
    const double shift = seed % 4 == 0 ? 12.0 : seed % 4 == 1 ? -12.0 : seed % 4 == 2 ? 30.0 : 0.0;
    for (io::DType d : {io::DType::f32, io::DType::bf16, io::DType::f16})
      for (const zoo::Impl& im : designs(d)) {
        zoo::Case c0 = zoo::make_case("random", 1 + seed % 2, 4, 2, Tq, Tk, 64, seed % 2 == 1, true, 1.0, 1.0,
                                      7000 + static_cast<std::uint64_t>(seed));
        for (double& s : c0.opt.null_logits) s += shift;
        const verify::CompareReport r = check(case_in(c0, d), im, d);
        EXPECT_TRUE(r.passed) << "seed " << seed << " " << im.name << " " << io::to_string(d) << "\n" << verify::format_report(r);
        w = std::max(w, worst(r));
        ++runs;
      }
  }
  std::printf("designs over random shapes: %d runs, worst err/bound %.3g\n", runs, w);
}
