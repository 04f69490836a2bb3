// tests/verify/test_fail_fast.cpp — a wrong answer fails fast (docs/policies.md, "Failing fast"):
// gross bugs over 4096 keys finish FAIL-certain with no row recomputed in mp50, the mp50 fallback
// stays within its budget (CompareOptions::mp50_budget), and what the budget leaves undecided is
// reported as UNDECIDED, never PASS. The work is asserted with the report's deterministic counters
// (CompareReport::mp50_rows, mp50_work), not with wall time.
#include <gtest/gtest.h>

#include <string>

#include "attention_zoo.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
namespace zoo = oasis::zoo;
using oasis::index_t;

namespace {

verify::CompareReport check(const zoo::Case& c, const io::TensorMap& out, const verify::CompareOptions& co = {}) {
  return verify::check("attention", zoo::inputs_of(c), out, io::json::parse(zoo::options_json(c)), co);
}

io::TensorMap outputs(const zoo::Impl& im, const zoo::Case& c) {
  oasis::AttentionOptions o = c.opt;
  o.return_probs = true;
  return zoo::outputs_of(zoo::attention(im, c.q, c.k, c.v, o), io::DType::f32, {"out", "lse", "p_null"});
}

/// The library's double attention stored as float64: its errors are of the order of the double
/// oracle's own error bound, so that some of its elements are undecided by the fast oracle.
io::TensorMap f64_outputs(const zoo::Case& c) {
  oasis::AttentionOptions o = c.opt;
  const auto r = oasis::token_attention(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), o);
  return {{"out", {io::DType::f64, r.out}}, {"lse", {io::DType::f64, r.lse}}, {"p_null", {io::DType::f64, r.p_null}}};
}

index_t undecided(const verify::CompareReport& r) {
  index_t n = 0;
  for (const auto& t : r.tensors) n += t.undecided;
  return n;
}

}  // namespace

// Every mutant of the zoo over 4096 keys with sinks of +6 (where a backward without the null in D
// stalled a check for more than 600 s): FAIL-certain, and not one row recomputed in mp50; the
// correct implementation at the same size passes, also without mp50.
TEST(FailFast, GrossForwardBugsOver4096KeysNeedNoMp50) {
  zoo::Case c = zoo::make_case("fail_fast_4096", 1, 4, 2, 24, 4096, 64, true, true, 1.0, 1.0, 41);
  c.opt.null_logits.assign(4, 6.0);
  const verify::CompareReport ok = check(c, outputs(zoo::Impl{"online", zoo::Algo::online, 64}, c));
  EXPECT_TRUE(ok.passed) << verify::format_report(ok);
  EXPECT_EQ(ok.mp50_rows, 0);
  for (const zoo::Impl& m : zoo::mutants()) {
    SCOPED_TRACE(m.name);
    const verify::CompareReport r = check(c, outputs(m, c));
    EXPECT_EQ(verify::verdict_word(r), "FAIL-certain") << verify::format_report(r);
    EXPECT_EQ(r.mp50_rows, 0) << r.oracle;
    EXPECT_EQ(r.mp50_work, 0.0);
    EXPECT_NE(r.oracle.find("0 of 96 rows recomputed in mp50"), std::string::npos) << r.oracle;
  }
}

// An all-wrong output (every element moved far outside its bound) lists only `show` mismatches and
// counts every element: the failing path formats no more than the passing one.
TEST(FailFast, AllWrongListsShowMismatchesAndCountsAll) {
  const zoo::Case c = zoo::make_case("all_wrong", 1, 2, 2, 16, 256, 32, true, true, 1.0, 1.0, 43);
  io::TensorMap out = outputs(zoo::Impl{"plain"}, c);
  auto& o = out.at("out");
  for (index_t i = 0; i < o.values.size(); ++i) o.values[i] = o.values[i] * 1.5 + 1.0;
  verify::CompareOptions co;
  co.show = 3;
  const verify::CompareReport r = check(c, out, co);
  ASSERT_EQ(r.tensors.size(), 3u);
  for (const auto& t : r.tensors) {
    if (t.name != "out") continue;
    EXPECT_EQ(t.checked, t.elements);
    EXPECT_EQ(t.violations_certain, t.elements);
    EXPECT_EQ(t.first_mismatches.size(), 3u);
    EXPECT_NE(t.first_mismatches[0].find("out[0, 0, 0, 0]"), std::string::npos) << t.first_mismatches[0];
  }
  EXPECT_EQ(r.mp50_rows, 0);
}

// The mp50 fallback within its budget: the library's own float64 outputs leave elements undecided;
// by default their rows are recomputed and the verdict is PASS; with a budget of k rows' work
// exactly k rows are recomputed and the rest stay undecided (UNDECIDED, listed, never PASS); with
// no budget at all, none.
TEST(FailFast, Mp50FallbackKeepsToItsBudget) {
  zoo::Case c = zoo::make_case("budget", 2, 4, 2, 9, 13, 16, true, true, 1.0, 1.0, 77);
  const io::TensorMap out = f64_outputs(c);
  const verify::CompareReport full = check(c, out);
  ASSERT_TRUE(full.passed) << verify::format_report(full);
  ASSERT_GT(full.mp50_rows, 2) << full.oracle;
  const double row_work = full.mp50_work / static_cast<double>(full.mp50_rows);
  EXPECT_EQ(row_work, 13.0 * (16 + 16));  // Tk (d_h + d_v) per row

  verify::CompareOptions co;
  co.mp50_budget = 2 * row_work;
  const verify::CompareReport part = check(c, out, co);
  EXPECT_FALSE(part.passed);
  EXPECT_EQ(part.mp50_rows, 2);
  EXPECT_GT(undecided(part), 0);
  EXPECT_EQ(verify::verdict_word(part), "UNDECIDED") << verify::format_report(part);

  co.mp50_budget = 0;
  const verify::CompareReport none = check(c, out, co);
  EXPECT_EQ(none.mp50_rows, 0);
  EXPECT_EQ(verify::verdict_word(none), "UNDECIDED");
  EXPECT_GE(undecided(none), undecided(part));
  const std::string text = verify::format_report(none);
  EXPECT_NE(text.find("over the budget"), std::string::npos) << text;
  EXPECT_NE(text.find("undecided: "), std::string::npos) << text;
  EXPECT_NE(verify::report_json(none).find("\"first_undecided\":[\""), std::string::npos);

  co.mp50_budget = 1e30;
  co.mp50_memory = 0;  // not even one row's values
  EXPECT_EQ(check(c, out, co).mp50_rows, 0);
}

// A tensor already FAIL-certain sends none of its undecided elements to mp50: the library's
// float64 outputs (which hold undecided elements, above) with every other element moved far off
// make every tensor FAIL-certain; their undecided elements stay so, counted and explained.
TEST(FailFast, CertainTensorsSendNothingToMp50) {
  zoo::Case c = zoo::make_case("certain", 2, 4, 2, 9, 13, 16, true, true, 1.0, 1.0, 77);
  io::TensorMap all_wrong = f64_outputs(c);
  for (auto& [name, t] : all_wrong)
    for (index_t i = 0; i < t.values.size(); i += 2) t.values[i] += 1.0;  // every other element far off
  const verify::CompareReport r = check(c, all_wrong);
  EXPECT_EQ(verify::verdict_word(r), "FAIL-certain") << verify::format_report(r);
  EXPECT_EQ(r.mp50_rows, 0) << verify::format_report(r);
  EXPECT_GT(undecided(r), 0) << verify::format_report(r);
  EXPECT_NE(verify::format_report(r).find("tensor already FAIL-certain"), std::string::npos) << verify::format_report(r);
}
